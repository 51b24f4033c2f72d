# The unit tests under sanitizers (scripts/sanitize.sh builds build-asan/ and build-tsan/; label
# "sanitize"): a representative set under AddressSanitizer + UBSan — the parsers, kernels,
# dispatchers, routing, KV cache, scheduler and generator — and the threaded parts under
# ThreadSanitizer: the thread pool, the communication thread, in-process ranks and collectives,
# the step path, the overlap executors and the serving engine loop.
# Each builds its own tree first, both at once beside the rest of the suite: on the Emerald
# Rapids VM (2 cores) of 2026-11-27, in a fresh clone, TSan's took 1482 s and ASan's had 6 of its
# 179 objects left to compile at 2400 s, hence an hour each.
add_test(NAME sanitize_asan_ubsan
         COMMAND ${CMAKE_SOURCE_DIR}/scripts/sanitize.sh address,undefined
                 "*Protocol*:*Fp8Rows*:*BeatSockets*:*HeaderDeadline*:*Tokeniz*:*Jinja*:*ChatTemplate*:*Safetensors*:*Loader*:*Ops*:*Matmul*:*EpDispatcher*:*RunExperts*:*Router*:*Scheduler*:*KvCache*:*Sampler*:*Generator*:*StepRunner*:*FutureMap*:*OverlapSchedule*:*EpMalformed*:*StreamWaker*:*RequestStream*")
set_tests_properties(sanitize_asan_ubsan PROPERTIES TIMEOUT 3600 LABELS "sanitize")
add_test(NAME sanitize_tsan
         COMMAND ${CMAKE_SOURCE_DIR}/scripts/sanitize.sh thread
                 "*ThreadPool*:*BeatSockets*:*HeaderDeadline*:*ClientSocket*:*SplitTimes*:*CommThread*:*Inproc*:*StepRunner*:*OverlapGenerate*:*LlmEngine*:*EpGenerate*:*Affinity*:*FutureMap*:*OverlapSchedule*:*EpDispatcherSbo*:*StreamWaker*:*RequestStream*")
set_tests_properties(sanitize_tsan PROPERTIES TIMEOUT 3600 LABELS "sanitize")
