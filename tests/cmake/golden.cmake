# Golden logits: the engine against the independent NumPy reference in tests/reference/, one
# ctest per architecture so that `ctest -j` runs them side by side. Debian's python3 carries NumPy;
# a pyenv python3 earlier on PATH may not, hence the explicit default.
set(DUET_PYTHON /usr/bin/python3 CACHE FILEPATH "Python 3 with NumPy, for the reference tests")

set(_duet_ref_dir ${CMAKE_SOURCE_DIR}/tests/reference)

add_test(NAME reference_selftest COMMAND ${DUET_PYTHON} ${_duet_ref_dir}/selftest.py)
set_tests_properties(reference_selftest PROPERTIES TIMEOUT 60 LABELS "golden")

foreach(_duet_arch qwen3_moe mixtral deepseek_v2)
  add_test(NAME golden_logits_${_duet_arch}
           COMMAND ${DUET_PYTHON} ${_duet_ref_dir}/golden_test.py --duet $<TARGET_FILE:duet> -k ${_duet_arch})
  set_tests_properties(golden_logits_${_duet_arch} PROPERTIES TIMEOUT 120 LABELS "golden")
endforeach()
