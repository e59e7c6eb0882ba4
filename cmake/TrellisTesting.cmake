# Test helpers. Every test gets a label (unit, mpi, multihost, ...) and a TIMEOUT, so a hang
# fails the test instead of blocking CI.
#
# MPI tests run through CMake's MPIEXEC_* variables. Open MPI refuses to run as root unless
# told; the two OMPI_ALLOW_RUN_AS_ROOT* variables say so without a uid check at configure
# time, and --oversubscribe lets 4 ranks share this 2-core machine.
set(TRELLIS_MPIEXEC_FLAGS --oversubscribe --bind-to none
    --mca btl self,vader,tcp --mca btl_vader_single_copy_mechanism none
    CACHE STRING "Extra mpiexec flags for tests")
set(TRELLIS_MPI_TEST_ENV
  "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;TRELLIS_LOG_LEVEL=warn")

add_library(trellis_test_main STATIC ${PROJECT_SOURCE_DIR}/tests/harness/unit_main.cpp)
target_link_libraries(trellis_test_main PUBLIC GTest::gtest trellis_flags)
add_library(trellis_mpi_test_main STATIC ${PROJECT_SOURCE_DIR}/tests/harness/mpi_main.cpp)
target_link_libraries(trellis_mpi_test_main PUBLIC GTest::gtest MPI::MPI_C trellis_flags)

# trellis_add_unit_test(NAME SOURCES ... [LIBS ...] [TIMEOUT s] [LABELS ...])
# A GoogleTest binary that needs no MPI. Registered as one CTest test per binary, which is
# much faster to run on 2 cores than one process per TEST().
function(trellis_add_unit_test name)
  cmake_parse_arguments(A "" "TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT 120)
  endif()
  add_executable(${name} ${A_SOURCES})
  target_link_libraries(${name} PRIVATE trellis_test_main ${A_LIBS})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  add_test(NAME ${name} COMMAND ${name} --gtest_brief=1)
  set_tests_properties(${name} PROPERTIES TIMEOUT ${A_TIMEOUT} LABELS "unit;${A_LABELS}"
    ENVIRONMENT "TRELLIS_TEST_DATA=${PROJECT_SOURCE_DIR}/tests/data;TRELLIS_SHARED=${PROJECT_SOURCE_DIR}/../shared")
endfunction()

# trellis_add_mpi_test(NAME NP n SOURCES ... [LIBS ...] [TIMEOUT s] [LABELS ...] [ARGS ...])
# A GoogleTest binary run by mpiexec with n ranks through the shared MPI-aware main
# (tests/harness/mpi_main.cpp), which fails a test on every rank if it failed on any.
function(trellis_add_mpi_test name)
  cmake_parse_arguments(A "" "NP;TIMEOUT" "SOURCES;LIBS;LABELS;ARGS" ${ARGN})
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT 180)
  endif()
  if(NOT TARGET ${name})
    add_executable(${name} ${A_SOURCES})
    target_link_libraries(${name} PRIVATE trellis_mpi_test_main ${A_LIBS})
    target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  endif()
  set(test_name ${name}_np${A_NP})
  add_test(NAME ${test_name}
    COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${A_NP} ${TRELLIS_MPIEXEC_FLAGS}
            ${MPIEXEC_PREFLAGS} $<TARGET_FILE:${name}> ${MPIEXEC_POSTFLAGS} ${A_ARGS})
  set_tests_properties(${test_name} PROPERTIES TIMEOUT ${A_TIMEOUT} LABELS "mpi;${A_LABELS}"
    PROCESSORS ${A_NP} ENVIRONMENT "${TRELLIS_MPI_TEST_ENV};TRELLIS_TEST_DATA=${PROJECT_SOURCE_DIR}/tests/data")
endfunction()

# trellis_add_multihost_test(NAME COMMAND ... [TIMEOUT s])
# A test that runs on the emulated cluster (scripts/cluster). It needs root for network
# namespaces; the command exits 77 to report "skipped" when it cannot run.
function(trellis_add_multihost_test name)
  cmake_parse_arguments(A "" "TIMEOUT" "COMMAND" ${ARGN})
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT 300)
  endif()
  add_test(NAME ${name} COMMAND ${A_COMMAND})
  set_tests_properties(${name} PROPERTIES TIMEOUT ${A_TIMEOUT} LABELS multihost
    SKIP_RETURN_CODE 77 RESOURCE_LOCK emulated_cluster RUN_SERIAL TRUE
    ENVIRONMENT "TRELLIS_BUILD_DIR=${PROJECT_BINARY_DIR};TRELLIS_LOG_LEVEL=warn")
endfunction()

# trellis_add_benchmark(NAME SOURCES ... [LIBS ...]) - a Google Benchmark binary (not a test).
function(trellis_add_benchmark name)
  cmake_parse_arguments(A "" "" "SOURCES;LIBS" ${ARGN})
  if(TRELLIS_BUILD_BENCHMARKS)
    add_executable(${name} ${A_SOURCES})
    target_link_libraries(${name} PRIVATE benchmark::benchmark trellis_flags ${A_LIBS})
  endif()
endfunction()
