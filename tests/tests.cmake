# Tests beyond the GoogleTest binary; included from the top-level CMakeLists after enable_testing().
# Each area registers its own in tests/cmake/<area>.cmake.

# The kernels' instruction sets, as DUET_MATMUL_ISA names them: the numerics tests run once per set
# (tests/cmake/isa.cmake, golden.cmake).
set(DUET_ISAS avx512bf16 avx512bf16-emulated avx512 avx2 scalar)

file(GLOB _duet_test_cmake CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/cmake/*.cmake)
foreach(_f ${_duet_test_cmake})
  include(${_f})
endforeach()
