# The OpenAI-client integration tests of `trellis serve` (tests/serve/openai_client_test.py):
# the official `openai` package and curl against a server the test starts itself, on the real
# SmolLM2 GGUF. Included from tests/serve/CMakeLists.txt.
#
# Python: the project venv made by scripts/setup-peers (it has openai, llama-cpp-python). If
# CMake ran before the venv existed, the python3 on PATH is cached here instead; the test then
# re-runs itself with the venv's Python, so the order of setup and configure does not matter.
# Without openai or the model the tests exit 77 (skipped), unless TRELLIS_REQUIRE_PEERS=1.
find_program(TRELLIS_SERVE_TEST_PYTHON NAMES python3 python
  HINTS "$ENV{XDG_CACHE_HOME}/trellis/venv/bin" "$ENV{HOME}/.cache/trellis/venv/bin"
  DOC "Python with the openai package for the trellis serve tests (the project venv)")
if(TRELLIS_SERVE_TEST_PYTHON)
  set(_serve_test ${CMAKE_CURRENT_LIST_DIR}/openai_client_test.py)
  add_test(NAME serve_openai_1x1
    COMMAND ${TRELLIS_SERVE_TEST_PYTHON} ${_serve_test} --trellis $<TARGET_FILE:trellis> --np 1)
  set_tests_properties(serve_openai_1x1 PROPERTIES
    LABELS "python;serve" TIMEOUT 240 SKIP_RETURN_CODE 77 PROCESSORS 2)
  # pp=2 x tp=3 under scripts/mpirun-local (--allow-run-as-root as root, --oversubscribe).
  add_test(NAME serve_openai_pp2tp3
    COMMAND ${TRELLIS_SERVE_TEST_PYTHON} ${_serve_test} --trellis $<TARGET_FILE:trellis>
            --np 6 --pp 2 --tp 3 --mpirun ${PROJECT_SOURCE_DIR}/scripts/mpirun-local)
  set_tests_properties(serve_openai_pp2tp3 PROPERTIES
    LABELS "python;serve;mpi" TIMEOUT 300 SKIP_RETURN_CODE 77 PROCESSORS 6)
endif()
