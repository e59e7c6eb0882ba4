# The OpenAI-client integration tests of `trellis serve` (tests/serve/openai_client_test.py):
# the official `openai` package and curl against a server the test starts itself, on the real
# SmolLM2 GGUF. Included from tests/serve/CMakeLists.txt.
#
# Python: TRELLIS_PEER_PYTHON (cmake/TrellisDeps.cmake: the project venv of scripts/setup-peers,
# which has openai). Should it lack openai, the test re-runs itself with the venv's Python.
# Without openai or the model the tests exit 77 (skipped), unless TRELLIS_REQUIRE_PEERS=1.
if(TRELLIS_PEER_PYTHON)
  set(_serve_test ${CMAKE_CURRENT_LIST_DIR}/openai_client_test.py)
  add_test(NAME serve_openai_1x1
    COMMAND ${TRELLIS_PEER_PYTHON} ${_serve_test} --trellis $<TARGET_FILE:trellis> --np 1)
  set_tests_properties(serve_openai_1x1 PROPERTIES
    LABELS "python;serve" TIMEOUT 240 SKIP_RETURN_CODE 77 PROCESSORS 2)
  # pp=2 x tp=3 under scripts/mpirun-local (--allow-run-as-root as root, --oversubscribe);
  # stopped by SIGUSR1 to mpirun, the graceful stop under Open MPI (docs/serve.md).
  add_test(NAME serve_openai_pp2tp3
    COMMAND ${TRELLIS_PEER_PYTHON} ${_serve_test} --trellis $<TARGET_FILE:trellis>
            --np 6 --pp 2 --tp 3 --mpirun ${PROJECT_SOURCE_DIR}/scripts/mpirun-local --signal-to launcher)
  set_tests_properties(serve_openai_pp2tp3 PROPERTIES
    LABELS "python;serve;mpi" TIMEOUT 300 SKIP_RETURN_CODE 77 PROCESSORS 6)
  # SWIFT behind the server: every check of the 1x1 suite (but the seeded one) with
  # `serve --swift`, drafting forced on, greedy answers equal to a plain `trellis run` with
  # the same (batch-invariant) kernels.
  add_test(NAME serve_openai_swift
    COMMAND ${TRELLIS_PEER_PYTHON} ${_serve_test} --trellis $<TARGET_FILE:trellis> --np 1
            --set kernels.batch_invariant=true --set swift.min_speedup=0 --set swift.calibration_steps=1
            --set swift.gamma=8 --set swift.skip_ratio=0.2 --serve-flag=--swift)
  set_tests_properties(serve_openai_swift PROPERTIES
    LABELS "python;serve" TIMEOUT 240 SKIP_RETURN_CODE 77 PROCESSORS 2)
endif()
