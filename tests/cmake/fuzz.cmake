# The libFuzzer targets (fuzz/, clang with ASan and UBSan): their seed corpora replayed and each
# target fuzzed for 10 s (label "fuzz"). Needs clang; reported skipped without it.
find_program(DUET_CLANG clang++)
if(DUET_CLANG)
  add_test(NAME fuzz_smoke COMMAND ${CMAKE_SOURCE_DIR}/fuzz/ci.sh)
  set_tests_properties(fuzz_smoke PROPERTIES TIMEOUT 1500 LABELS "fuzz")
endif()
