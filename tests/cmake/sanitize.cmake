# The unit tests under sanitizers (scripts/sanitize.sh builds build-asan/ and build-tsan/; label
# "sanitize"): a representative set under AddressSanitizer + UBSan — the parsers, kernels,
# dispatchers, routing, KV cache, scheduler and generator — and the threaded parts under
# ThreadSanitizer: the thread pool, the communication thread, in-process ranks and collectives,
# the step path, the overlap executors and the serving engine loop.
add_test(NAME sanitize_asan_ubsan
         COMMAND ${CMAKE_SOURCE_DIR}/scripts/sanitize.sh address,undefined
                 "*Protocol*:*Fp8Rows*:*BeatSockets*:*HeaderDeadline*:*Tokeniz*:*Jinja*:*ChatTemplate*:*Safetensors*:*Loader*:*Ops*:*Matmul*:*EpDispatcher*:*RunExperts*:*Router*:*Scheduler*:*KvCache*:*Sampler*:*Generator*:*StepRunner*:*FutureMap*:*OverlapSchedule*:*EpMalformed*:*StreamWaker*:*RequestStream*")
set_tests_properties(sanitize_asan_ubsan PROPERTIES TIMEOUT 2400 LABELS "sanitize")
add_test(NAME sanitize_tsan
         COMMAND ${CMAKE_SOURCE_DIR}/scripts/sanitize.sh thread
                 "*ThreadPool*:*BeatSockets*:*HeaderDeadline*:*ClientSocket*:*SplitTimes*:*CommThread*:*Inproc*:*StepRunner*:*OverlapGenerate*:*LlmEngine*:*EpGenerate*:*Affinity*:*FutureMap*:*OverlapSchedule*:*EpDispatcherSbo*:*StreamWaker*:*RequestStream*")
set_tests_properties(sanitize_tsan PROPERTIES TIMEOUT 2400 LABELS "sanitize")
