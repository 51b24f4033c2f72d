# The OpenAI-compatible server driven by the official openai npm client (tests/npm/serve/).
# Needs node and npm, and the npm registry on the first run (the packages are cached outside
# the repo); without them the test fails rather than skips.
add_test(NAME serve_openai_client
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/npm/serve/run_serve_test.sh $<TARGET_FILE:duet>)
set_tests_properties(serve_openai_client PROPERTIES TIMEOUT 600 LABELS "npm")

# The same client against two ranks (data-parallel attention, experts split over the ranks),
# started by duet itself under mpirun: requests spread over the ranks get their single-rank
# tokens, aborts reach the rank that holds the request.
if(MPI_CXX_FOUND)
  add_test(NAME serve_openai_client_dp2_mpi
           COMMAND bash ${CMAKE_SOURCE_DIR}/tests/npm/serve/run_serve_test.sh $<TARGET_FILE:duet>
                   --data-parallel-size 2 --enable-expert-parallel)
  set_tests_properties(serve_openai_client_dp2_mpi PROPERTIES TIMEOUT 600 LABELS "npm;mpi")
endif()
