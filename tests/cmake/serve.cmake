# The OpenAI-compatible server driven by the official openai npm client (tests/npm/serve/).
# Needs node and npm, and the npm registry on the first run (the packages are cached outside
# the repo); without them the test fails rather than skips.
add_test(NAME serve_openai_client
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/npm/serve/run_serve_test.sh $<TARGET_FILE:duet>)
set_tests_properties(serve_openai_client PROPERTIES TIMEOUT 600 LABELS "npm")
