#include "cli/dist_options.h"

#include <cstdio>
#include <fstream>

#include "core/affinity.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "dist/inproc_backend.h"
#include "dist/launcher.h"
#include "dist/mpi_backend.h"
#include "kernels/matmul.h"
#include "model/config.h"
#include "moe/wire_rows.h"

namespace duet {

namespace {

// This process's resident set in bytes (VmRSS), 0 if /proc does not tell.
uint64_t resident_bytes() {
  std::ifstream status("/proc/self/status");
  std::string key;
  while (status >> key) {
    if (key == "VmRSS:") {
      uint64_t kib = 0;
      status >> kib;
      return kib * 1024;
    }
    status.ignore(1 << 16, '\n');
  }
  return 0;
}

// ", sbo: dispatch and combine in up to 8 chunks of 128+ KiB in whole steps, shared experts
// beside the dispatch" or "".
std::string describe_sbo(const DistOptions& o) {
  const SboSettings s = resolve_sbo(o);
  std::string d;
  if (s.combine_chunks > 1) {
    d += "dispatch and combine in " + std::string(s.min_chunk_bytes > 0 ? "up to " : "") +
         std::to_string(s.combine_chunks) + " chunks";
    if (s.min_chunk_bytes > 0) d += " of " + std::to_string(s.min_chunk_bytes >> 10) + "+ KiB";
    if (!s.chunk_micro_batches) d += " in whole steps";
  }
  if (s.own_experts_last) {
    if (!d.empty()) d += ", ";
    d += s.own_rows_beside_dispatch
             ? "own experts beside the dispatch and the combine in whole transfers"
             : "own experts last in whole transfers";
  }
  if (s.shared_experts_at) {
    if (!d.empty()) d += ", ";
    switch (*s.shared_experts_at) {
      case SharedExpertsAt::kSerial:
        d += "shared experts before the dispatch";
        break;
      case SharedExpertsAt::kExperts:
        d += "shared experts in the experts' jobs";
        break;
      case SharedExpertsAt::kCombine:
        d += "shared experts beside the combine";
        break;
      case SharedExpertsAt::kDispatch:
        d += "shared experts beside the dispatch";
        break;
    }
  }
  return d.empty() ? d : ", sbo: " + d;
}

// Throws if `world` ranks cannot share the model's experts.
void check_overlap(const DistOptions& o) {
  if (o.enable_two_batch_overlap && o.enable_dbo)
    DUET_ERROR("--enable-two-batch-overlap and --enable-dbo are alternatives: choose one");
  if ((o.enable_two_batch_overlap || o.enable_dbo) && !o.enable_expert_parallel) {
    DUET_ERROR((o.enable_dbo ? "--enable-dbo" : "--enable-two-batch-overlap")
               << " overlaps the experts' all-to-all and needs --enable-expert-parallel");
  }
  const bool sbo = o.enable_single_batch_overlap || o.sbo_combine_chunks > 1 ||
                   o.sbo_shared_experts != "auto" || o.sbo_own_experts_last != "auto" ||
                   o.all2all_dtype != "f32" || !o.all2all_combine_dtype.empty();
  parse_all2all_dtype(o.all2all_dtype);
  if (!o.all2all_combine_dtype.empty()) parse_all2all_dtype(o.all2all_combine_dtype);
  if (o.sbo_shared_experts != "auto" && o.sbo_shared_experts != "dispatch" &&
      o.sbo_shared_experts != "combine" && o.sbo_shared_experts != "serial") {
    DUET_ERROR("--sbo-shared-experts: '" << o.sbo_shared_experts
                                         << "' is not auto, dispatch, combine or serial");
  }
  if (o.sbo_own_experts_last != "auto" && o.sbo_own_experts_last != "combine" &&
      o.sbo_own_experts_last != "both" && o.sbo_own_experts_last != "off") {
    DUET_ERROR("--sbo-own-experts-last: '" << o.sbo_own_experts_last
                                           << "' is not auto, combine, both or off");
  }
  if (sbo && !o.enable_expert_parallel) {
    DUET_ERROR(
        "--enable-single-batch-overlap, --sbo-combine-chunks, --sbo-shared-experts, "
        "--sbo-own-experts-last, "
        "--all2all-dtype and --all2all-combine-dtype shape the experts' all-to-all and "
        "need --enable-expert-parallel");
  }
  if (!(o.dist_timeout >= 1.0 && o.dist_timeout <= 3600.0))
    DUET_ERROR("--dist-timeout must be in [1, 3600] seconds, got " << o.dist_timeout);
  if (o.dbo_decode_token_threshold < 2 || o.dbo_prefill_token_threshold < 2)
    DUET_ERROR("--dbo-decode-token-threshold and --dbo-prefill-token-threshold must be >= 2 "
               "(two micro-batches of at least one token)");
  if (!(o.tbo_token_distribution_threshold >= 0.0 && o.tbo_token_distribution_threshold <= 0.5))
    DUET_ERROR("--tbo-token-distribution-threshold must be in [0, 0.5], got "
               << o.tbo_token_distribution_threshold);
  if (o.dbo_split != "auto" && o.dbo_split != "thresholds")
    DUET_ERROR("--dbo-split: '" << o.dbo_split << "' is not auto or thresholds");
}

void check_world(const DistOptions& o, const std::string& model_dir, int world) {
  parse_quantization(o.quantization);  // throws on a bad value, before any rank loads
  check_overlap(o);
  if (world <= 1) return;
  if (!o.enable_expert_parallel) {
    DUET_ERROR("--data-parallel-size "
               << world
               << " needs --enable-expert-parallel: duet "
                  "spreads the experts over the ranks (data parallelism with replicated experts "
                  "is not supported)");
  }
  const ModelConfig c = load_config(model_dir);
  place_experts(c.n_expert, world);  // throws with the reason
  parse_all2all_backend(o.all2all);
}

}  // namespace

void add_dist_options(CLI::App* cmd, DistOptions& o) {
  cmd->add_option("--data-parallel-size", o.data_parallel_size,
                  "Ranks, each with its own requests and KV cache (default 1, or mpirun's -np)")
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--enable-expert-parallel", o.enable_expert_parallel,
                "Spread the routed experts over the ranks");
  cmd->add_flag("--no-repack{false}", o.repack,
                "Multiply attention, dense MLP and output weights as stored, without the copy "
                "re-laid as panels at load (slower from a few sequences on; saves that memory)");
  cmd->add_flag("--mmap", o.mmap,
                "Multiply the weights in place in the model files' mapping instead of copies in "
                "huge pages made at load: no copy, and processes on one host share the file's "
                "pages, but decode reads them in 4 KiB pages (1.25-1.3x slower at batch 1 on "
                "Zen 4); quantized matrices are copies either way");
  cmd->add_option("--quantization", o.quantization,
                  "Quantize the weights at load: none (default) | int8 | int4 | int4_pure "
                  "(groups of 32 columns, each with an f16 scale under one f32 factor per row: "
                  "Q8_0's and Q4_0's bytes; every linear layer but the embeddings and routers, "
                  "MLA's kv_b split by head; int4 keeps the output head at int8, as Q4_0 keeps "
                  "it at 6 bits, int4_pure makes it int4 too)");
  cmd->add_flag("--batch-invariant", o.batch_invariant,
                "Batch-invariant products (as vLLM's batch-invariant mode): a sequence's logits, "
                "and a greedy request's text, are the same alone and in any batch; prefill is "
                "slower (implies --no-repack)");
  cmd->add_option("--distributed-backend", o.backend,
                  "mpi (processes under mpirun, the default) | inproc (threads)")
      ->check(CLI::IsMember({"mpi", "inproc"}));
  cmd->add_flag("--enable-two-batch-overlap", o.enable_two_batch_overlap,
                "Split steps in two micro-batches interleaved stage by stage on one thread, one's "
                "computation hiding the other's expert all-to-all (SGLang's TBO)");
  cmd->add_flag("--enable-dbo", o.enable_dbo,
                "Split steps in two micro-batches on two threads that hand over at each transfer "
                "(vLLM's dual batch overlap)");
  cmd->add_option("--dbo-decode-token-threshold", o.dbo_decode_token_threshold,
                  "Fewest tokens of a decode-only batch that is split (default 32)");
  cmd->add_option("--dbo-prefill-token-threshold", o.dbo_prefill_token_threshold,
                  "Fewest tokens of a batch with a prefill that is split (default 512)");
  cmd->add_option("--tbo-token-distribution-threshold", o.tbo_token_distribution_threshold,
                  "Below this share of tokens in the smaller half, cut a sequence in two "
                  "(default 0.48)");
  cmd->add_option("--dbo-split", o.dbo_split,
                  "Which steps past the thresholds are split: auto (those that run faster split "
                  "than whole, timed as they run, the other re-tried for 2 steps in 32) or "
                  "thresholds (all of them, as vLLM does); default auto");
  cmd->add_option("--trace-file", o.trace_file,
                  "Write a Chrome trace (Perfetto, chrome://tracing) of the steps, each "
                  "micro-batch's operations and the transfers; one file per rank (PATH.rankN)");
  cmd->add_flag("--enable-single-batch-overlap", o.enable_single_batch_overlap,
                "Hide the all-to-all inside each batch (SGLang's SBO): dispatch and combine "
                "travel in chunks of experts, each chunk computed while the others travel "
                "(low_latency), the shared experts run while the dispatch's first chunk travels");
  cmd->add_option("--sbo-combine-chunks", o.sbo_combine_chunks,
                  "Chunks of local experts low_latency's dispatch and combine travel in, each "
                  "computed as soon as its rows arrive and sent back as soon as its experts ran, "
                  "at most one per expert (1 = one transfer; default with SBO: up to 8, one per "
                  "128 KiB of the step's returning rows; else 1)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--sbo-shared-experts", o.sbo_shared_experts,
                  "Where the shared experts run: while the dispatch or the combine travels, "
                  "or serial (before the dispatch, beside neither: no overlap at all, the "
                  "baseline for measuring); auto: the dispatch, with DBO the combine");
  cmd->add_option("--sbo-own-experts-last", o.sbo_own_experts_last,
                  "Steps whose transfers go whole: combine (run the experts with rows from "
                  "other ranks first, send the combine as soon as they ran, and the experts "
                  "whose rows are all this rank's while it travels) | both (low_latency: also "
                  "the row counts sent ahead, and half of those experts run while the other "
                  "ranks' rows travel) | off | auto (combine with --enable-single-batch-overlap)");
  cmd->add_option("--all2all-dtype", o.all2all_dtype,
                  "Element type of the rows dispatch and combine carry: f32 (default) | bf16 "
                  "(half the bytes; rows rounded to bf16) | fp8 (E4M3 with a scale per 128 "
                  "values, as DeepEP's fp8 dispatch: 0.27 of the bytes)");
  cmd->add_option("--all2all-combine-dtype", o.all2all_combine_dtype,
                  "The combine's rows, where they differ from --all2all-dtype's (e.g. fp8 "
                  "dispatch with a bf16 combine, as DeepEP and DeepSeek-V3 run them)");
  cmd->add_option("--comm-cores", o.comm_cores,
                  "Cores of each rank kept for its communication thread, the compute pool pinned "
                  "to the others (default 0: they share the cores, unpinned)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--dist-timeout", o.dist_timeout,
                  "Seconds a rank may be silent (no heartbeat), or every rank's collectives make "
                  "no progress, before the others stop with an error (default 4; 1 to 3600)");
  cmd->add_option("--all2all-backend", o.all2all,
                  "Expert dispatch algorithm: high_throughput (default) | low_latency")
      ->check(CLI::IsMember({"high_throughput", "low_latency"}));
  cmd->add_option("--ll-max-tokens", o.ll_max_tokens,
                  "low_latency: tokens per rank per step it can carry (default 256)")
      ->check(CLI::PositiveNumber);
}

std::chrono::milliseconds dist_watchdog(const DistOptions& o) {
  return std::chrono::milliseconds(static_cast<int64_t>(o.dist_timeout * 1000.0));
}

void launch_ranks(const DistOptions& o, const std::string& model_dir,
                  const std::function<void(DistContext*)>& fn) {
  if (o.backend == "mpi" && launched_by_mpirun()) {
    DistContext ctx = make_mpi_context(dist_watchdog(o));
    const int world = ctx.world_size();
    try {
      if (o.data_parallel_size > 0 && o.data_parallel_size != world) {
        DUET_ERROR("--data-parallel-size " << o.data_parallel_size << " but mpirun started "
                                           << world << " ranks");
      }
      check_world(o, model_dir, world);
      fn(world > 1 ? &ctx : nullptr);
    } catch (const std::exception& e) {
      if (world == 1) throw;
      mpi_abort(e.what());
    }
    return;
  }
  const int world = std::max(1, o.data_parallel_size);
  check_world(o, model_dir, world);
  if (world == 1) {
    fn(nullptr);
  } else if (o.backend == "inproc") {
    run_ranks(
        world, [&](DistContext& ctx) { fn(&ctx); }, dist_watchdog(o));
  } else {
    if (!mpi_available())
      DUET_ERROR(
          "--distributed-backend mpi: this duet was built without MPI (install "
          "libopenmpi-dev and rebuild), or use --distributed-backend inproc");
    relaunch_under_mpirun(
        world, o.keep_serving_when_a_rank_dies);  // comes back as the job's ranks, under mpirun
  }
}

StepGroup step_group(const DistOptions& o) {
  StepGroup g;
  g.overlap = o.enable_dbo                 ? OverlapMode::kDbo
              : o.enable_two_batch_overlap ? OverlapMode::kTbo
                                           : OverlapMode::kNone;
  g.micro_batch.decode_token_threshold = o.dbo_decode_token_threshold;
  g.micro_batch.prefill_token_threshold = o.dbo_prefill_token_threshold;
  g.tbo_distribution_threshold = o.tbo_token_distribution_threshold;
  g.micro_batch.measured = o.dbo_split == "auto";
  g.shared_experts_at = resolve_sbo(o).shared_experts_at;
  return g;
}

SboSettings resolve_sbo(const DistOptions& o) {
  SboSettings s;
  s.combine_chunks = o.sbo_combine_chunks > 0          ? o.sbo_combine_chunks
                     : o.enable_single_batch_overlap ? kSboCombineChunks
                                                     : 1;
  if (o.sbo_combine_chunks == 0 && o.enable_single_batch_overlap) {
    s.min_chunk_bytes = kSboMinChunkBytes;
    s.chunk_micro_batches = false;
  }
  s.own_experts_last = o.sbo_own_experts_last == "combine" || o.sbo_own_experts_last == "both" ||
                       (o.sbo_own_experts_last == "auto" && o.enable_single_batch_overlap);
  s.own_rows_beside_dispatch = o.sbo_own_experts_last == "both";
  if (o.sbo_shared_experts == "dispatch") {
    s.shared_experts_at = SharedExpertsAt::kDispatch;
  } else if (o.sbo_shared_experts == "combine") {
    s.shared_experts_at = SharedExpertsAt::kCombine;
  } else if (o.sbo_shared_experts == "serial") {
    s.shared_experts_at = SharedExpertsAt::kSerial;
  } else if (o.enable_single_batch_overlap && !o.enable_dbo) {
    // Beside the dispatch's first chunk, the wait no chunk hides (measured against beside the
    // combine's last chunk: 40 % less waiting, 1-2 % faster).
    s.shared_experts_at = SharedExpertsAt::kDispatch;
  }
  return s;
}

EpDispatcherOptions ep_dispatcher_options(const DistOptions& o) {
  EpDispatcherOptions eo;
  eo.backend = parse_all2all_backend(o.all2all);
  eo.max_tokens_per_rank = o.ll_max_tokens;
  eo.row_dtype = parse_all2all_dtype(o.all2all_dtype);
  if (!o.all2all_combine_dtype.empty())
    eo.combine_dtype = parse_all2all_dtype(o.all2all_combine_dtype);
  const SboSettings sbo = resolve_sbo(o);
  eo.combine_chunks = sbo.combine_chunks;
  eo.min_chunk_bytes = sbo.min_chunk_bytes;
  eo.chunk_micro_batches = sbo.chunk_micro_batches;
  eo.own_experts_last = sbo.own_experts_last;
  eo.own_rows_beside_dispatch = sbo.own_rows_beside_dispatch;
  return eo;
}

StepGroup rank_step_group(const DistOptions& o, DistContext* ctx,
                          const ExpertPlacement& placement) {
  StepGroup g = step_group(o);
  if (!ctx) return g;
  const EpDispatcherOptions eo = ep_dispatcher_options(o);
  Communicator* comm = &ctx->comm();
  g.coord = &ctx->coord();
  g.dispatchers = [comm, placement, eo](int) {
    return std::make_unique<EpDispatcher>(*comm, placement, eo);
  };
  return g;
}

RankModel load_rank_model(const std::string& model_dir, const DistOptions& o, DistContext* ctx) {
  RankModel rm;
  const int world = ctx ? ctx->world_size() : 1;
  const int rank = ctx ? ctx->rank() : 0;
  const ModelConfig c = load_config(model_dir);
  rm.placement = place_experts(c.n_expert, world);
  // Process-wide, before any product; the panels batch-invariant products never read are not
  // packed.
  if (o.batch_invariant) set_matmul_batch_invariant(true);
  LoadOptions lo{rm.placement.begin(rank), rm.placement.end(rank), o.repack && !o.batch_invariant,
                 parse_quantization(o.quantization), o.mmap};
  rm.group = rank_step_group(o, ctx, rm.placement);
  if (!o.trace_file.empty()) {
    rm.trace = std::make_unique<Trace>(rank);
    rm.group.trace = rm.trace.get();
    if (ctx) ctx->comm().set_trace(rm.trace.get());
  }
  rm.model = Model::load(model_dir, lo);
  if (lo.quantization != Quantization::kNone) {
    std::fprintf(stderr,
                 "%squantization %s (linear layers; embeddings and routers as stored), kernel "
                 "%s, weights %.1f MiB, resident %.1f MiB\n",
                 ctx ? ("rank " + std::to_string(rank) + ": ").c_str() : "",
                 describe(rm.model->quantization()).c_str(), matmul_int_kernel(),
                 rm.model->weight_bytes() / 1048576.0, resident_bytes() / 1048576.0);
  }
  if (const std::string s = describe_stored_int4(rm.model->quantization()); !s.empty()) {
    std::fprintf(stderr, "%sweights: %s\n",
                 ctx ? ("rank " + std::to_string(rank) + ": ").c_str() : "", s.c_str());
  }
  if (ctx) {
    // The whole model's bytes: this rank's plus the experts it left to the others.
    int64_t n_moe = 0;
    for (int64_t il = 0; il < c.n_layer; ++il) n_moe += c.is_moe_layer(il);
    const double whole =
        double(rm.model->weight_bytes()) + double(c.n_expert - rm.placement.n_local()) *
                                               double(rm.model->bytes_per_expert()) * double(n_moe);
    std::fprintf(stderr,
                 "rank %d/%d: %s per MoE layer, weights %.1f MiB of %.1f MiB, resident %.1f MiB "
                 "(%s, %s rows %s, overlap %s%s)\n",
                 rank, world, rm.placement.describe(rank).c_str(),
                 rm.model->weight_bytes() / 1048576.0, whole / 1048576.0,
                 resident_bytes() / 1048576.0, o.backend.c_str(), o.all2all.c_str(),
                 (o.all2all_combine_dtype.empty() || o.all2all_combine_dtype == o.all2all_dtype
                      ? o.all2all_dtype
                      : o.all2all_dtype + " dispatch / " + o.all2all_combine_dtype + " combine")
                     .c_str(),
                 overlap_mode_name(rm.group.overlap), describe_sbo(o).c_str());
  }
  return rm;
}

void finish_trace(RankModel& rm, const DistOptions& o, DistContext* ctx) {
  if (!rm.trace) return;
  if (ctx) ctx->comm().set_trace(nullptr);
  const std::string path =
      trace_path_for_rank(o.trace_file, ctx ? ctx->rank() : 0, ctx ? ctx->world_size() : 1);
  rm.trace->write(path);
  std::fprintf(stderr, "trace: %s (%zu events)\n", path.c_str(), rm.trace->n_events());
}

namespace {

// The rank's share of this process's cores, split for --comm-cores.
CoreSplit rank_core_split(const DistOptions& o, const DistContext* ctx) {
  const bool threads = ctx && o.backend == "inproc";
  return split_cores(allowed_cores(), threads ? ctx->rank() : 0, threads ? ctx->world_size() : 1,
                     o.comm_cores);
}

}  // namespace

int rank_threads(int requested, const DistOptions& o, const DistContext* ctx) {
  if (requested > 0) return requested;
  if (ctx && o.comm_cores > 0) return static_cast<int>(rank_core_split(o, ctx).compute.size());
  const int cores = available_cores();
  if (!ctx || o.backend != "inproc") return cores;
  return std::max(1, cores / ctx->world_size());
}

void split_rank_cores(const DistOptions& o, DistContext* ctx, ThreadPool& pool) {
  if (!ctx || o.comm_cores <= 0) return;
  const CoreSplit split = rank_core_split(o, ctx);
  pool.pin(split.compute);
  ctx->comm().pin_thread(split.comm);
}

}  // namespace duet
