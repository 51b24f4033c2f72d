# The distributed runtime over MPI: a GoogleTest program that mpirun starts on several ranks
# (label "mpi"). The in-process tests live in duet_tests like every other unit test.
if(MPI_CXX_FOUND)
  add_executable(duet_mpi_tests ${CMAKE_SOURCE_DIR}/tests/dist/mpi_dist_main.cpp
                                ${CMAKE_SOURCE_DIR}/tests/dist/mpi_ep_generate.cpp
                                ${CMAKE_SOURCE_DIR}/tests/dist/mpi_ep_failure.cpp)
  target_include_directories(duet_mpi_tests PRIVATE ${CMAKE_SOURCE_DIR}/tests)
  target_link_libraries(duet_mpi_tests PRIVATE duet_lib GTest::gtest GTest::gtest_main)
  target_compile_definitions(duet_mpi_tests PRIVATE DUET_SOURCE_DIR="${CMAKE_SOURCE_DIR}")

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

  # Rank 1 dies right after MPI starts, before duet's start-up collectives: rank 0 must report it
  # after 5 watchdog times (5 s here), not hang.
  add_test(NAME mpi_startup_dead_rank
           COMMAND ${_duet_mpirun} --enable-recovery -np 2 $<TARGET_FILE:duet_mpi_tests>
                   --gtest_filter=MpiStartup.RankDeadBeforeSetUpIsReported)
  set_tests_properties(mpi_startup_dead_rank PROPERTIES
      TIMEOUT 60 LABELS "mpi" ENVIRONMENT "${_duet_mpi_env}"
      PASS_REGULAR_EXPRESSION "start-up failed after [5-7]\\.[0-9] s on rank 0: start-up: the heartbeat's communicator: rank 0 of 2 waited [5-6][0-9][0-9][0-9] ms for the other ranks to join; one died or never started")

  # Rank 1 stops before it starts MPI: rank 0's MPI_Init, which waits for every rank, is given
  # up after 5 watchdog times (5 s here) with a clear error instead of hanging.
  add_test(NAME mpi_startup_stopped_before_init
           COMMAND ${_duet_mpirun} -np 2 $<TARGET_FILE:duet_mpi_tests>
                   --gtest_filter=MpiStartup.RankStoppedBeforeMpiStartsIsReported)
  set_tests_properties(mpi_startup_stopped_before_init PROPERTIES
      TIMEOUT 60 LABELS "mpi" ENVIRONMENT "${_duet_mpi_env}"
      PASS_REGULAR_EXPRESSION "error: start-up: rank 0: MPI did not start within 5\\.0 s")

  # Rank 1 stops mid-collective: rank 0 must name the collective and the silent rank within the
  # 1 s watchdog, then the job aborts (non-zero exit), hence a check of the output instead of the
  # status.
  add_test(NAME mpi_watchdog_stopped_rank
           COMMAND ${_duet_mpirun} -np 2 $<TARGET_FILE:duet_mpi_tests>
                   --gtest_filter=MpiWatchdog.StoppedRankIsReported)
  set_tests_properties(mpi_watchdog_stopped_rank PROPERTIES
      TIMEOUT 60 LABELS "mpi" ENVIRONMENT "${_duet_mpi_env}"
      PASS_REGULAR_EXPRESSION "watchdog fired after [0-2]\\.[0-9]+ s on rank 0: all_reduce: rank 0 of 2 waited 1[0-9][0-9][0-9] ms for its peers; rank 1 sent no heartbeat")
  # The ranks wait in different collectives, both alive: the watchdog still fires (out of step).
  add_test(NAME mpi_watchdog_out_of_step
           COMMAND ${_duet_mpirun} -np 2 $<TARGET_FILE:duet_mpi_tests>
                   --gtest_filter=MpiWatchdog.OutOfStepRanksAreReported)
  set_tests_properties(mpi_watchdog_out_of_step PROPERTIES
      TIMEOUT 60 LABELS "mpi" ENVIRONMENT "${_duet_mpi_env}"
      PASS_REGULAR_EXPRESSION "watchdog fired after [0-2]\\.[0-9]+ s on rank [01]: [a-z_]+: rank [01] of 2 waited 1[0-9][0-9][0-9] ms for its peers; every rank has waited over 1000 ms in collectives that do not finish")
  # A rank that is busy for 2.5 s before a barrier and an all_reduce (watchdog 1 s) is alive:
  # the others wait for it; the beats' own TCP connections alone show the peers alive.
  add_test(NAME mpi_heartbeat_busy_rank
           COMMAND ${_duet_mpirun} -np 3 $<TARGET_FILE:duet_mpi_tests>
                   --gtest_filter=MpiHeartbeat.*)
  set_tests_properties(mpi_heartbeat_busy_rank PROPERTIES
                       TIMEOUT 60 LABELS "mpi" ENVIRONMENT "${_duet_mpi_env}")

  # Expert parallelism over MPI equals the single-rank tokens (3 architectures x 2 all-to-all
  # algorithms; pure EP, DP attention, an idle rank), also with a rank busy in the prefill for
  # 2.5 watchdog times, and with single-batch overlap and bf16 rows.
  foreach(_n 2 4)
    add_test(NAME mpi_ep_generate_np${_n}
             COMMAND ${_duet_mpirun} -np ${_n} $<TARGET_FILE:duet_mpi_tests>
                     --gtest_filter=*MpiEpGenerate.*:MpiEpBusy.*:MpiEpSbo.*)
    set_tests_properties(mpi_ep_generate_np${_n} PROPERTIES
                         TIMEOUT 120 LABELS "mpi" ENVIRONMENT "${_duet_mpi_env}")
  endforeach()

  # A rank dies or stops in decode step 2 of an EP generation; each job ends with the failure,
  # so these check the printed lines (a gtest failure on any rank fails them too). Under a
  # plain mpirun, mpirun tears the job down after a SIGKILL: the script prints how long after.
  add_test(NAME mpi_ep_killed_rank
           COMMAND sh ${CMAKE_SOURCE_DIR}/tests/dist/mpirun_after_kill.sh
                   ${_duet_mpirun} -np 4 $<TARGET_FILE:duet_mpi_tests>
                   --gtest_filter=MpiEpFailure.KilledRank)
  set_tests_properties(mpi_ep_killed_rank PROPERTIES
      TIMEOUT 60 LABELS "mpi" ENVIRONMENT "${_duet_mpi_env}"
      PASS_REGULAR_EXPRESSION
      "job ended [0-9]\\.[0-9]+ s after the kill; mpirun exited with status [1-9]"
      FAIL_REGULAR_EXPRESSION "\\[  FAILED  \\]")
  # With --enable-recovery mpirun keeps the survivors running: their watchdog (the default) must
  # name the dead rank.
  add_test(NAME mpi_ep_killed_rank_recovery
           COMMAND ${_duet_mpirun} --enable-recovery -np 4 $<TARGET_FILE:duet_mpi_tests>
                   --gtest_filter=MpiEpFailure.KilledRank)
  set_tests_properties(mpi_ep_killed_rank_recovery PROPERTIES
      TIMEOUT 60 LABELS "mpi" ENVIRONMENT "${_duet_mpi_env}"
      PASS_REGULAR_EXPRESSION
      "rank [023]: generate failed after [0-4]\\.[0-9]+ s: [^\n]*rank 1 sent no heartbeat"
      FAIL_REGULAR_EXPRESSION "\\[  FAILED  \\]")
  # SIGSTOP, which mpirun does not notice: the default watchdog (4 s of silence) names the
  # waiting collective and the silent rank within it.
  add_test(NAME mpi_ep_stopped_rank
           COMMAND ${_duet_mpirun} -np 4 $<TARGET_FILE:duet_mpi_tests>
                   --gtest_filter=MpiEpFailure.StoppedRank)
  set_tests_properties(mpi_ep_stopped_rank PROPERTIES
      TIMEOUT 60 LABELS "mpi" ENVIRONMENT "${_duet_mpi_env}"
      PASS_REGULAR_EXPRESSION
      "rank [023]: generate failed after [0-4]\\.[0-9]+ s: [a-z_]+: rank [023] of 4 waited [0-9]+ ms for its peers; rank 1 sent no heartbeat"
      FAIL_REGULAR_EXPRESSION "\\[  FAILED  \\]")
endif()
