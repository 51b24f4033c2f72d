# The OpenAI-compatible server driven by the official openai npm client (tests/npm/serve/).
# Needs node and npm, and the npm registry on the first run (the packages are cached outside
# the repo); without them the test fails rather than skips.
# This one with a short --header-timeout, which the slow-client test (a byte every 0.5 s in the
# headers, in the body) runs against.
add_test(NAME serve_openai_client
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/npm/serve/run_serve_test.sh $<TARGET_FILE:duet>
                 --header-timeout 6)
set_tests_properties(serve_openai_client PROPERTIES TIMEOUT 600 LABELS "npm")

# The same client with the scheduler's other modes: steps one after another (no overlapped
# scheduler), and multi-step decoding with and without it; the client test checks every
# request's tokens against the same request alone, stop strings and max_tokens included.
add_test(NAME serve_openai_client_plain_schedule
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/npm/serve/run_serve_test.sh $<TARGET_FILE:duet>
                 --disable-overlap-schedule)
add_test(NAME serve_openai_client_multistep
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/npm/serve/run_serve_test.sh $<TARGET_FILE:duet>
                 --num-scheduler-steps 4)
add_test(NAME serve_openai_client_multistep_plain
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/npm/serve/run_serve_test.sh $<TARGET_FILE:duet>
                 --num-scheduler-steps 3 --disable-overlap-schedule)
# Tokens streamed in batches of 4 (--stream-interval): chunks of several tokens, stop strings
# across them.
add_test(NAME serve_openai_client_stream_interval
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/npm/serve/run_serve_test.sh $<TARGET_FILE:duet>
                 --stream-interval 4)
set_tests_properties(serve_openai_client_plain_schedule serve_openai_client_multistep
                     serve_openai_client_multistep_plain serve_openai_client_stream_interval
                     PROPERTIES TIMEOUT 600 LABELS "npm")

# The same client on Kimi K2's layout (model_type kimi_k2, tiktoken.model and no tokenizer.json):
# completions and chat through its tokenizer and its markers' template.
add_test(NAME serve_openai_client_kimi_k2
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/npm/serve/run_serve_test.sh $<TARGET_FILE:duet>)
set_tests_properties(serve_openai_client_kimi_k2 PROPERTIES TIMEOUT 600 LABELS "npm"
                     ENVIRONMENT "DUET_SERVE_TEST_ARCH=kimi_k2")

# The same client against two ranks (data-parallel attention, experts split over the ranks),
# started by duet itself under mpirun: requests spread over the ranks get their single-rank
# tokens, aborts reach the rank that holds the request.
if(MPI_CXX_FOUND)
  add_test(NAME serve_openai_client_dp2_mpi
           COMMAND bash ${CMAKE_SOURCE_DIR}/tests/npm/serve/run_serve_test.sh $<TARGET_FILE:duet>
                   --data-parallel-size 2 --enable-expert-parallel)
  set_tests_properties(serve_openai_client_dp2_mpi PROPERTIES TIMEOUT 600 LABELS "npm;mpi")
  # Multi-step over MPI ranks: every rank runs the same number of steps per call.
  add_test(NAME serve_openai_client_dp2_mpi_multistep
           COMMAND bash ${CMAKE_SOURCE_DIR}/tests/npm/serve/run_serve_test.sh $<TARGET_FILE:duet>
                   --data-parallel-size 2 --enable-expert-parallel --num-scheduler-steps 4)
  set_tests_properties(serve_openai_client_dp2_mpi_multistep PROPERTIES TIMEOUT 600
                       LABELS "npm;mpi")
endif()

# A minute of `duet bench soak` (64 streaming clients, hang-ups, slow readers, a KV cache small
# enough to force preemption) against the tiny preset: nothing lost, mixed or leaked. The
# 10-minute, 256-client soak of the README is the same script with more seconds and clients.
add_test(NAME serve_soak
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/server/soak_test.sh $<TARGET_FILE:duet> 60 64)
set_tests_properties(serve_soak PROPERTIES TIMEOUT 300 LABELS "soak" PASS_REGULAR_EXPRESSION "PASS: soak")

# The same soak against a --batch-invariant server, with --exact: every request that runs to its
# end streams exactly its text alone (the default server flips ~1 % of them at near-ties).
add_test(NAME serve_soak_exact
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/server/soak_test.sh $<TARGET_FILE:duet> 45 64 exact)
set_tests_properties(serve_soak_exact PROPERTIES TIMEOUT 300 LABELS "soak"
                     PASS_REGULAR_EXPRESSION "PASS: soak")
