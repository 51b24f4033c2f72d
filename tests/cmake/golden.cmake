# Golden logits: the engine against the independent NumPy reference in tests/reference/, one
# ctest per architecture so that `ctest -j` runs them side by side. Debian's python3 carries NumPy;
# a pyenv python3 earlier on PATH may not, hence the explicit default.
set(DUET_PYTHON /usr/bin/python3 CACHE FILEPATH "Python 3 with NumPy, for the reference tests")

set(_duet_ref_dir ${CMAKE_SOURCE_DIR}/tests/reference)

add_test(NAME reference_selftest COMMAND ${DUET_PYTHON} ${_duet_ref_dir}/selftest.py)
set_tests_properties(reference_selftest PROPERTIES TIMEOUT 60 LABELS "golden")

# Once per instruction set of the kernels (DUET_ISAS, tests/cmake/isa.cmake): each checks the
# numerics that instruction set uses (bf16-rounded product inputs on avx512bf16 and its emulation);
# a CPU without it reports the test skipped.
foreach(_duet_isa ${DUET_ISAS})
  foreach(_duet_arch qwen3_moe mixtral deepseek_v2 deepseek_v3)
    set(_duet_name golden_logits_${_duet_arch}_${_duet_isa})
    add_test(NAME ${_duet_name}
             COMMAND ${DUET_PYTHON} ${_duet_ref_dir}/golden_test.py --duet $<TARGET_FILE:duet>
                     --isa ${_duet_isa} -k ${_duet_arch})
    set_tests_properties(${_duet_name} PROPERTIES TIMEOUT 120 LABELS "golden" SKIP_RETURN_CODE 77)
  endforeach()
endforeach()

# The prompts the C++ tests compare numerics on (tests/engine/decisive_prompts.json) are decisive.
add_test(NAME decisive_prompts
         COMMAND ${DUET_PYTHON} ${_duet_ref_dir}/decisive_prompts.py --duet $<TARGET_FILE:duet> check)
set_tests_properties(decisive_prompts PROPERTIES TIMEOUT 300 LABELS "golden")
