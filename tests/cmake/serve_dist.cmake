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
endif()
