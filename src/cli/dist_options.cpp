#include "cli/dist_options.h"

#include <cstdio>
#include <fstream>

#include "core/error.h"
#include "core/thread_pool.h"
#include "dist/inproc_backend.h"
#include "dist/launcher.h"
#include "dist/mpi_backend.h"
#include "model/config.h"

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

// Throws if `world` ranks cannot share the model's experts.
void check_overlap(const DistOptions& o) {
  if (o.enable_two_batch_overlap && o.enable_dbo)
    DUET_ERROR("--enable-two-batch-overlap and --enable-dbo are alternatives: choose one");
  if ((o.enable_two_batch_overlap || o.enable_dbo) && !o.enable_expert_parallel) {
    DUET_ERROR((o.enable_dbo ? "--enable-dbo" : "--enable-two-batch-overlap")
               << " overlaps the experts' all-to-all and needs --enable-expert-parallel");
  }
  if (o.dbo_decode_token_threshold < 2 || o.dbo_prefill_token_threshold < 2)
    DUET_ERROR("--dbo-decode-token-threshold and --dbo-prefill-token-threshold must be >= 2 "
               "(two micro-batches of at least one token)");
  if (!(o.tbo_token_distribution_threshold >= 0.0 && o.tbo_token_distribution_threshold <= 0.5))
    DUET_ERROR("--tbo-token-distribution-threshold must be in [0, 0.5], got "
               << o.tbo_token_distribution_threshold);
}

void check_world(const DistOptions& o, const std::string& model_dir, int world) {
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
  cmd->add_option("--trace-file", o.trace_file,
                  "Write a Chrome trace (Perfetto, chrome://tracing) of the steps, each "
                  "micro-batch's operations and the transfers; one file per rank (PATH.rankN)");
  cmd->add_option("--all2all-backend", o.all2all,
                  "Expert dispatch algorithm: high_throughput (default) | low_latency")
      ->check(CLI::IsMember({"high_throughput", "low_latency"}));
  cmd->add_option("--ll-max-tokens", o.ll_max_tokens,
                  "low_latency: tokens per rank per step it can carry (default 256)")
      ->check(CLI::PositiveNumber);
}

void launch_ranks(const DistOptions& o, const std::string& model_dir,
                  const std::function<void(DistContext*)>& fn) {
  if (o.backend == "mpi" && launched_by_mpirun()) {
    DistContext ctx = make_mpi_context();
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
    run_ranks(world, [&](DistContext& ctx) { fn(&ctx); });
  } else {
    if (!mpi_available())
      DUET_ERROR(
          "--distributed-backend mpi: this duet was built without MPI (install "
          "libopenmpi-dev and rebuild), or use --distributed-backend inproc");
    relaunch_under_mpirun(world);  // comes back as the job's ranks, under mpirun
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
  return g;
}

RankModel load_rank_model(const std::string& model_dir, const DistOptions& o, DistContext* ctx) {
  RankModel rm;
  const int world = ctx ? ctx->world_size() : 1;
  const int rank = ctx ? ctx->rank() : 0;
  const ModelConfig c = load_config(model_dir);
  rm.placement = place_experts(c.n_expert, world);
  LoadOptions lo{rm.placement.begin(rank), rm.placement.end(rank), o.repack};
  rm.group = step_group(o);
  if (!o.trace_file.empty()) {
    rm.trace = std::make_unique<Trace>(rank);
    rm.group.trace = rm.trace.get();
    if (ctx) ctx->comm().set_trace(rm.trace.get());
  }
  rm.model = Model::load(model_dir, lo);
  if (ctx) {
    EpDispatcherOptions eo{parse_all2all_backend(o.all2all), o.ll_max_tokens};
    Communicator* comm = &ctx->comm();
    const ExpertPlacement placement = rm.placement;
    rm.group.coord = &ctx->coord();
    rm.group.dispatchers = [comm, placement, eo](int) {
      return std::make_unique<EpDispatcher>(*comm, placement, eo);
    };
    // The whole model's bytes: this rank's plus the experts it left to the others.
    int64_t n_moe = 0;
    for (int64_t il = 0; il < c.n_layer; ++il) n_moe += c.is_moe_layer(il);
    const double whole =
        double(rm.model->weight_bytes()) + double(c.n_expert - rm.placement.n_local()) *
                                               double(rm.model->bytes_per_expert()) * double(n_moe);
    std::fprintf(stderr,
                 "rank %d/%d: %s per MoE layer, weights %.1f MiB of %.1f MiB, resident %.1f MiB "
                 "(%s, %s, overlap %s)\n",
                 rank, world, rm.placement.describe(rank).c_str(),
                 rm.model->weight_bytes() / 1048576.0, whole / 1048576.0,
                 resident_bytes() / 1048576.0, o.backend.c_str(), o.all2all.c_str(),
                 overlap_mode_name(rm.group.overlap));
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

int rank_threads(int requested, const DistOptions& o, const DistContext* ctx) {
  if (requested > 0) return requested;
  const int cores = available_cores();
  if (!ctx || o.backend != "inproc") return cores;
  return std::max(1, cores / ctx->world_size());
}

}  // namespace duet
