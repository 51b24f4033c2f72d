# The distributed runtime over MPI: a GoogleTest program that mpirun starts on several ranks
# (label "mpi"). The in-process tests live in duet_tests like every other unit test.
if(MPI_CXX_FOUND)
  add_executable(duet_mpi_tests ${CMAKE_SOURCE_DIR}/tests/dist/mpi_dist_main.cpp)
  target_include_directories(duet_mpi_tests PRIVATE ${CMAKE_SOURCE_DIR}/tests)
  target_link_libraries(duet_mpi_tests PRIVATE duet_lib GTest::gtest GTest::gtest_main)

  # Root in a container needs the two OMPI_ALLOW_* variables; --oversubscribe lets 4 ranks share
  # 2 cores.
  set(_duet_mpirun ${MPIEXEC_EXECUTABLE} --oversubscribe)
  set(_duet_mpi_env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
                    OMPI_MCA_rmaps_base_oversubscribe=1)
  foreach(_n 2 3 4)
    add_test(NAME mpi_collectives_np${_n}
             COMMAND ${_duet_mpirun} -np ${_n} $<TARGET_FILE:duet_mpi_tests>
                     --gtest_filter=MpiDist.*)
    set_tests_properties(mpi_collectives_np${_n} PROPERTIES
                         TIMEOUT 120 LABELS "mpi" ENVIRONMENT "${_duet_mpi_env}")
  endforeach()

  # Rank 1 stops mid-collective: rank 0 must name the collective within the 1 s watchdog, then
  # the job aborts (non-zero exit), hence a check of the output instead of the status.
  add_test(NAME mpi_watchdog_stopped_rank
           COMMAND ${_duet_mpirun} -np 2 $<TARGET_FILE:duet_mpi_tests>
                   --gtest_filter=MpiWatchdog.*)
  set_tests_properties(mpi_watchdog_stopped_rank PROPERTIES
      TIMEOUT 60 LABELS "mpi" ENVIRONMENT "${_duet_mpi_env}"
      PASS_REGULAR_EXPRESSION "watchdog fired after [0-2]\\.[0-9]+ s on rank 0: all_reduce: rank 0 of 2 waited 1000 ms")
endif()
