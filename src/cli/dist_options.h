// The model-loading and distributed-run flags that serve, generate and bench latency share, and
// the launch they describe: a single rank, ranks as threads of this process
// (`--distributed-backend inproc`), or the processes of an mpirun job (`mpi`, the default: a
// command not yet under mpirun re-executes itself as `mpirun -np N`; under a user's `mpirun
// --hostfile ...` it joins that job).
#pragma once

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "core/thread_pool.h"
#include "dist/dist_context.h"
#include "engine/step_runner.h"
#include "model/model.h"
#include "moe/ep_dispatcher.h"
#include "moe/expert_placement.h"

namespace duet {

struct DistOptions {
  int data_parallel_size = 0;  // 0: not given (one rank, or the mpirun job's size)
  bool enable_expert_parallel = false;
  std::string backend = "mpi";  // inproc | mpi
  std::string all2all = "high_throughput";
  int64_t ll_max_tokens = 256;  // low_latency: buffer capacity per expert per source rank
  bool repack = true;           // LoadOptions::repack; --no-repack clears it
  bool mmap = false;            // LoadOptions::mmap; --mmap
  // --quantization: LoadOptions::quantization (parse_quantization)
  std::string quantization = "none";
  // --batch-invariant: every product sums in one order whatever the batch
  // (set_matmul_batch_invariant), so a greedy request's text is the same alone and under load;
  // implies --no-repack (panels are never read).
  bool batch_invariant = false;
  // Not a flag; serve sets it. Under the mpirun duet starts itself, the other ranks keep running
  // when one dies (--enable-recovery), so that they name it and rank 0 answers 503. The batch
  // commands go without: there a failed or dead rank ends the job with a non-zero exit status
  // (mpirun_argv says why).
  bool keep_serving_when_a_rank_dies = false;
  // Two-micro-batch overlap (needs --enable-expert-parallel; one of the two at most).
  bool enable_two_batch_overlap = false;   // --enable-two-batch-overlap (SGLang's TBO)
  bool enable_dbo = false;                 // --enable-dbo (vLLM's DBO)
  int64_t dbo_decode_token_threshold = 32;
  int64_t dbo_prefill_token_threshold = 512;
  double tbo_token_distribution_threshold = 0.48;
  std::string dbo_split = "auto";  // --dbo-split auto | thresholds (MicroBatchPolicy::measured)
  std::string trace_file;  // --trace-file: a Chrome trace per rank ("" = none)
  // Single-batch overlap (SGLang's SBO; needs --enable-expert-parallel).
  bool enable_single_batch_overlap = false;  // --enable-single-batch-overlap
  int sbo_combine_chunks = 0;            // --sbo-combine-chunks: 0 = SBO's choice (1 without SBO)
  // --sbo-shared-experts: auto | dispatch | combine | serial
  std::string sbo_shared_experts = "auto";
  // --sbo-own-experts-last: auto (combine with --enable-single-batch-overlap) | combine | both |
  // off
  std::string sbo_own_experts_last = "auto";
  std::string all2all_dtype = "f32";        // --all2all-dtype: f32 | bf16 | fp8
  std::string all2all_combine_dtype;        // --all2all-combine-dtype: empty = all2all_dtype
  int comm_cores = 0;  // --comm-cores: cores of each rank kept for its communication thread
  // --dist-timeout: how long a rank may be silent, or every rank's collectives make no progress,
  // before the others give up (the watchdog time; SGLang's --dist-timeout).
  double dist_timeout = 4.0;
};

// The watchdog time --dist-timeout gives.
std::chrono::milliseconds dist_watchdog(const DistOptions& o);

// What the single-batch overlap flags of `o` come to: the combine's chunks (low_latency steps)
// and where the shared experts run (unset: the executor's order). Without
// --enable-single-batch-overlap only what is forced; with it, chunked transfers (up to
// kSboCombineChunks, one per kSboMinChunkBytes of the step's returning rows, in steps not split
// into micro-batches, unless --sbo-combine-chunks forces a number), the experts whose rows are
// all the rank's own last in steps that travel whole, and the shared experts beside the dispatch
// (with DBO: the executor's order, beside the combine).
struct SboSettings {
  int combine_chunks = 1;
  int64_t min_chunk_bytes = 0;  // EpDispatcherOptions::min_chunk_bytes: SBO's choice only
  bool chunk_micro_batches = true;  // EpDispatcherOptions::chunk_micro_batches: false by choice
  bool own_experts_last = false;    // EpDispatcherOptions::own_experts_last
  bool own_rows_beside_dispatch = false;  // EpDispatcherOptions::own_rows_beside_dispatch
  std::optional<SharedExpertsAt> shared_experts_at;
};
constexpr int kSboCombineChunks = 8;
constexpr int64_t kSboMinChunkBytes = int64_t{128} << 10;
SboSettings resolve_sbo(const DistOptions& o);

// The expert-parallel dispatcher options of `o` (algorithm, capacity, row dtype, chunks).
EpDispatcherOptions ep_dispatcher_options(const DistOptions& o);

// Registers --data-parallel-size, --enable-expert-parallel, --distributed-backend,
// --all2all-backend, --ll-max-tokens, --no-repack, --quantization and the overlap flags
// (--enable-two-batch-overlap,
// --enable-dbo, --dbo-decode-token-threshold, --dbo-prefill-token-threshold,
// --tbo-token-distribution-threshold) on `cmd`.
void add_dist_options(CLI::App* cmd, DistOptions& o);

// Runs `fn` once per rank of the run `o` describes for the model in model_dir, with that rank's
// context, or with nullptr for a plain single-rank run. Inconsistent flags (data parallelism
// without --enable-expert-parallel, a world size that does not divide the model's experts or
// exceeds them, MPI missing, -np differing from --data-parallel-size) throw duet::Error before
// any rank starts. Under MPI a rank whose fn throws ends the whole job with the error
// (mpi_abort); with threads the first failing rank's error is rethrown.
void launch_ranks(const DistOptions& o, const std::string& model_dir,
                  const std::function<void(DistContext*)>& fn);

// One rank's share of the model: only its experts' weights, and where its steps run: the group
// (its coordinator, and a factory of expert-parallel dispatchers that reach the other ranks, one
// per micro-batch slot); a default StepGroup on a single rank.
struct RankModel {
  ExpertPlacement placement;
  std::unique_ptr<Model> model;
  StepGroup group;
  std::unique_ptr<Trace> trace;  // with --trace-file; group.trace and the communicator record here
};

// The overlap settings of `o` (no coordinator, no dispatchers: a single rank's group).
StepGroup step_group(const DistOptions& o);

// step_group(o) joined to the ranks of `ctx` (null: a single rank): its coordinator, and a
// factory of expert-parallel dispatchers (ep_dispatcher_options(o)) over its communicator.
StepGroup rank_step_group(const DistOptions& o, DistContext* ctx,
                          const ExpertPlacement& placement);

// Loads this rank's part of the model and prints the start-up report on stderr: which experts
// the rank holds, its weight bytes against the whole model's, and the process's resident memory.
RankModel load_rank_model(const std::string& model_dir, const DistOptions& o, DistContext* ctx);

// With --trace-file: writes this rank's trace (trace_path_for_rank) and stops the communicator
// recording into it; prints where it went. Call it on every rank once the run is over.
void finish_trace(RankModel& rm, const DistOptions& o, DistContext* ctx);

// Compute threads for one rank: `requested` if > 0, else this process's cores shared among the
// ranks that run as its threads, less --comm-cores.
int rank_threads(int requested, const DistOptions& o, const DistContext* ctx);

// With --comm-cores N (N > 0, several ranks): pins the rank's communication thread to the last N
// cores of its share of this process's cores, and `pool` (its workers and the calling thread) to
// the others (split_cores). Throws duet::Error if the share has no core left for compute. Does
// nothing otherwise: the communication thread and the pool share the cores, unpinned.
void split_rank_cores(const DistOptions& o, DistContext* ctx, ThreadPool& pool);

}  // namespace duet
