# Compiler flags shared by every target, applied through an INTERFACE target so that
# nothing leaks into the dependencies' own builds.
add_library(trellis_flags INTERFACE)
target_compile_options(trellis_flags INTERFACE
  -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wno-missing-field-initializers)
if(TRELLIS_NATIVE)
  include(CheckCXXCompilerFlag)
  check_cxx_compiler_flag(-march=native TRELLIS_HAS_MARCH_NATIVE)
  if(TRELLIS_HAS_MARCH_NATIVE)
    target_compile_options(trellis_flags INTERFACE -march=native)
  endif()
endif()
target_compile_definitions(trellis_flags INTERFACE
  TRELLIS_VERSION="${PROJECT_VERSION}"
  OMPI_SKIP_MPICXX=1 MPICH_SKIP_MPICXX=1
  TRELLIS_SOURCE_DIR="${PROJECT_SOURCE_DIR}")

# trellis_add_layer(NAME [DEPS layer...] [EXTERNAL target...])
# One static library per layer. Public headers live in <layer>/include/trellis/<layer>/.
# Layer DEPS are linked PRIVATE: a layer sees only what it asked for, never what a lower
# layer happens to use. EXTERNAL libraries are PUBLIC only when a public header needs them.
function(trellis_add_layer name)
  cmake_parse_arguments(A "" "" "SOURCES;DEPS;PRIVATE_EXTERNAL;PUBLIC_EXTERNAL" ${ARGN})
  add_library(trellis_${name} STATIC ${A_SOURCES})
  target_include_directories(trellis_${name}
    PUBLIC $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>
    PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
  target_link_libraries(trellis_${name} PRIVATE trellis_flags)
  foreach(dep IN LISTS A_DEPS)
    target_link_libraries(trellis_${name} PRIVATE trellis_${dep})
    # Public headers of this layer may name types of the layers below (Deadline, Topology),
    # so their include directories travel with it; their code does not.
    target_include_directories(trellis_${name} PUBLIC
      $<TARGET_PROPERTY:trellis_${dep},INTERFACE_INCLUDE_DIRECTORIES>)
  endforeach()
  if(A_PRIVATE_EXTERNAL)
    target_link_libraries(trellis_${name} PRIVATE ${A_PRIVATE_EXTERNAL})
  endif()
  if(A_PUBLIC_EXTERNAL)
    target_link_libraries(trellis_${name} PUBLIC ${A_PUBLIC_EXTERNAL})
  endif()
endfunction()
