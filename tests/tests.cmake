# Tests beyond the GoogleTest binary; included from the top-level CMakeLists after enable_testing().
# Each area registers its own in tests/cmake/<area>.cmake.
file(GLOB _duet_test_cmake CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/cmake/*.cmake)
foreach(_f ${_duet_test_cmake})
  include(${_f})
endforeach()
