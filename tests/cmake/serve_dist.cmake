# `duet serve` on two MPI ranks with one rank hung (SIGSTOP) or killed (SIGKILL) mid-request:
# in-flight streams end with an error and new requests get 503 within 10 s (label "mpi"; curl is
# the client).
if(MPI_CXX_FOUND)
  foreach(_signal STOP KILL)
    string(TOLOWER ${_signal} _name)
    add_test(NAME serve_dead_rank_${_name}_mpi
             COMMAND bash ${CMAKE_SOURCE_DIR}/tests/dist/serve_dead_rank.sh $<TARGET_FILE:duet>
                     ${_signal})
    set_tests_properties(serve_dead_rank_${_name}_mpi PROPERTIES TIMEOUT 120 LABELS "mpi"
                         PASS_REGULAR_EXPRESSION "PASS: error after")
  endforeach()
  # --dist-timeout 8: a hung rank is given up on after 8 s, not the default 4.
  add_test(NAME serve_dead_rank_stop_timeout_mpi
           COMMAND bash ${CMAKE_SOURCE_DIR}/tests/dist/serve_dead_rank.sh $<TARGET_FILE:duet>
                   STOP 8)
  set_tests_properties(serve_dead_rank_stop_timeout_mpi PROPERTIES TIMEOUT 120 LABELS "mpi"
                       PASS_REGULAR_EXPRESSION "PASS: error after")
endif()

# The same client against two in-process ranks with each overlap mode, thresholds low enough that
# the concurrent requests' steps run as two micro-batches, every one of them (--dbo-split
# thresholds; the client test checks that every request gets its single-request tokens).
foreach(_mode two-batch-overlap dbo)
  add_test(NAME serve_openai_client_dp2_${_mode}
           COMMAND bash ${CMAKE_SOURCE_DIR}/tests/npm/serve/run_serve_test.sh $<TARGET_FILE:duet>
                   --data-parallel-size 2 --enable-expert-parallel --distributed-backend inproc
                   --enable-${_mode} --dbo-decode-token-threshold 2
                   --dbo-prefill-token-threshold 2 --dbo-split thresholds)
  set_tests_properties(serve_openai_client_dp2_${_mode} PROPERTIES TIMEOUT 600 LABELS "npm")
endforeach()
# Multi-step decoding composed with DBO over two in-process ranks, the split chosen by measurement
# (--dbo-split auto, the default: the step times travel with the overlapped scheduler's
# agreements).
add_test(NAME serve_openai_client_dp2_dbo_multistep
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/npm/serve/run_serve_test.sh $<TARGET_FILE:duet>
                 --data-parallel-size 2 --enable-expert-parallel --distributed-backend inproc
                 --enable-dbo --dbo-decode-token-threshold 2 --dbo-prefill-token-threshold 2
                 --num-scheduler-steps 4)
set_tests_properties(serve_openai_client_dp2_dbo_multistep PROPERTIES TIMEOUT 600 LABELS "npm")
