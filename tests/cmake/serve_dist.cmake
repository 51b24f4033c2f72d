# `duet serve` on two MPI ranks with one rank hung mid-request: in-flight streams end with an
# error and new requests get 503 within 10 s (label "mpi"; curl is the client).
if(MPI_CXX_FOUND)
  add_test(NAME serve_dead_rank_mpi
           COMMAND bash ${CMAKE_SOURCE_DIR}/tests/dist/serve_dead_rank.sh $<TARGET_FILE:duet>)
  set_tests_properties(serve_dead_rank_mpi PROPERTIES TIMEOUT 120 LABELS "mpi"
                       PASS_REGULAR_EXPRESSION "PASS: error after")
endif()
