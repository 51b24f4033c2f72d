// `duet bench latency --quantizations none,int8,int4`: one model loaded once per --quantization
// (or per quantization+mmap, its unquantized matrices read in the files' mapping),
// the same batch through each in turn, alternating over rounds in one run (this machine's speed
// drifts within a minute: only side-by-side figures compare). Prints per quantization the
// medians of prefill and decode tok/s, their ratios to the first, decode bytes per step and
// decode against the bandwidth limit for those bytes.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <random>
#include <sstream>

#include "cli/commands.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/generator.h"
#include "kernels/bandwidth.h"
#include "kernels/matmul.h"
#include "model/model.h"
#include "model/quantization.h"

namespace duet {

namespace {

struct Run {
  double prefill_tps = 0;
  double decode_tps = 0;
  double bytes_per_step = 0;
};

// One entry of --quantizations: a quantization, "+mmap" after it for the matrices it leaves
// unquantized read in the files' mapping (LoadOptions::mmap).
struct Setting {
  std::string name;
  LoadOptions load;
};

std::vector<Setting> parse_list(const std::string& list) {
  std::vector<Setting> settings;
  std::stringstream in(list);
  for (std::string name; std::getline(in, name, ',');) {
    Setting s;
    s.name = name;
    std::string q = name;
    if (q.ends_with("+mmap")) {
      q.resize(q.size() - 5);
      s.load.mmap = true;
    }
    s.load.quantization = parse_quantization(q);
    settings.push_back(s);
  }
  if (settings.empty()) DUET_ERROR("--quantizations: expected a list such as none,int8,int4");
  return settings;
}

Run run_once(Generator& gen, const Model& model, const std::vector<GenerateRequest>& reqs) {
  GenerateStats st;
  gen.generate(reqs, &st);
  Run r;
  r.prefill_tps = st.prompt_tokens / st.prefill_seconds;
  const double tokens = double(st.generated_tokens) - double(reqs.size());  // after the prefill
  r.decode_tps = st.decode_seconds > 0 ? tokens / st.decode_seconds : 0.0;
  r.bytes_per_step = st.decode_steps > 0
                         ? model.dense_bytes_per_step() +
                               double(st.decode_expert_bytes + st.decode_kv_bytes) / st.decode_steps
                         : 0.0;
  return r;
}

}  // namespace

void run_quantization_bench(const AlternatingBenchOptions& o) {
  const std::vector<Setting> qs = parse_list(o.settings);
  ThreadPool pool(o.threads > 0 ? o.threads : available_cores());
  std::vector<std::unique_ptr<Model>> models;
  std::vector<std::unique_ptr<Generator>> gens;
  for (const Setting& q : qs) {
    models.push_back(Model::load(o.model_dir, q.load));
    gens.push_back(std::make_unique<Generator>(*models.back(), pool, o.kv_dtype));
  }
  const ModelConfig& c = models[0]->config();
  std::mt19937_64 rng(o.seed);
  std::vector<GenerateRequest> reqs(static_cast<size_t>(o.batch));
  for (size_t k = 0; k < reqs.size(); ++k) {
    GenerateRequest& r = reqs[k];
    for (int64_t i = 0; i < o.prompt_len; ++i)
      r.prompt.push_back(static_cast<int32_t>(rng() % static_cast<uint64_t>(c.n_vocab)));
    r.max_tokens = o.gen_len;
    r.sampling = bench_sampling(o.sampling, o.seed, k);
  }
  std::printf(
      "model %s (%s), batch %lld, prompt %lld, gen %lld, %d threads, matmul %s (int8/int4 "
      "kernel %s), %d rounds\n",
      o.model_dir.c_str(), arch_name(c.arch), (long long)o.batch, (long long)o.prompt_len,
      (long long)o.gen_len, pool.n_threads(), matmul_isa(), matmul_int_kernel(), o.rounds);
  for (size_t i = 0; i < qs.size(); ++i) {
    std::printf("  %-9s weights %.1f MiB (%s)\n", qs[i].name.c_str(),
                models[i]->weight_bytes() / 1048576.0, describe(models[i]->quantization()).c_str());
  }
  double bw = measure_read_bandwidth(pool);
  for (auto& g : gens) g->generate(reqs);  // warm-up
  std::vector<std::vector<Run>> runs(qs.size());
  for (int round = 0; round < o.rounds; ++round) {
    for (size_t i = 0; i < qs.size(); ++i) runs[i].push_back(run_once(*gens[i], *models[i], reqs));
  }
  bw = std::max(bw, measure_read_bandwidth(pool));
  std::printf("measured read bandwidth %.1f GB/s; medians of %d rounds, alternating:\n", bw / 1e9,
              o.rounds);
  std::printf("  %-9s %12s %8s %12s %8s %14s %12s\n", "quant", "prefill t/s", "ratio", "decode t/s",
              "ratio", "bytes/step MB", "decode/limit");
  double prefill0 = 0, decode0 = 0;
  for (size_t i = 0; i < qs.size(); ++i) {
    std::vector<double> pre, dec, bytes;
    for (const Run& r : runs[i]) {
      pre.push_back(r.prefill_tps);
      dec.push_back(r.decode_tps);
      bytes.push_back(r.bytes_per_step);
    }
    const double p = median(pre), d = median(dec), b = median(bytes);
    if (i == 0) prefill0 = p, decode0 = d;
    const double limit = b > 0 ? bw / b * double(o.batch) : 0.0;
    std::printf("  %-9s %12.1f %8.2f %12.1f %8.2f %14.1f %12.2f\n", qs[i].name.c_str(), p,
                prefill0 > 0 ? p / prefill0 : 0.0, d, decode0 > 0 ? d / decode0 : 0.0, b / 1e6,
                limit > 0 ? d / limit : 0.0);
  }
}

}  // namespace duet
