# Every CI machine runs the numerics tests (the GoogleTest ones below and the golden logits,
# golden.cmake) once per instruction set of DUET_ISAS (tests/tests.cmake) its CPU has, the AVX-512
# BF16 kernels at least through their bit-exact emulation wherever AVX-512 exists; a set the CPU
# lacks is reported skipped (exit code 77).
# The tests whose results depend on the kernels' numerics: whole forward passes (greedy tokens of
# every architecture, paged and batched, with expert parallelism and the serving engine) and the
# products that read packed panels or run grouped. The kernels' own tests cover every instruction
# set in one run already.
set(_duet_numerics_filter
    "AllArchs/GeneratorTest.*:Arch/PagedForwardTest.*:Archs/*:LlmEngineTest.*:LlmEngineDp.*:Ranks/LlmEngineDpTest.*:MatmulPanelsTest.*:GroupedMatmulTest.*")
# The one-token kernels' prefetches (into L1 and into L2, kernels/simd_impl.h, on by default on
# Intel's CPUs only) are forced off in the native AVX-512 BF16 and the AVX2 runs and on in the
# others, so that every CPU runs the int8/int4 kernels both ways, and the bf16 rows both ways
# wherever a run off and one on reach them (the suite's other tests run this CPU's default).
foreach(_duet_isa ${DUET_ISAS})
  if(_duet_isa STREQUAL "avx512bf16" OR _duet_isa STREQUAL "avx2")
    set(_duet_prefetch 0)
    set(_duet_prefetch_l2 0)
  else()
    set(_duet_prefetch 4096)
    set(_duet_prefetch_l2 16384)
  endif()
  add_test(NAME numerics_${_duet_isa} COMMAND duet_tests --gtest_filter=${_duet_numerics_filter})
  set_tests_properties(numerics_${_duet_isa} PROPERTIES
                       ENVIRONMENT "DUET_TEST_ISA=${_duet_isa};DUET_ONE_TOKEN_PREFETCH=${_duet_prefetch};DUET_ONE_TOKEN_PREFETCH_L2=${_duet_prefetch_l2}"
                       SKIP_RETURN_CODE 77
                       TIMEOUT 300 LABELS "isa")
endforeach()
