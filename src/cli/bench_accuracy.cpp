// `duet bench accuracy MODEL_DIR --quantizations int8 --compare FP8_DIR`: how far each format's
// next-token distributions are from the model as stored, on the same text. The text (--text, or
// the varied prose, code and lists built in from bench/data/accuracy_text.txt) is tokenized once
// with the reference's tokenizer and cut into chunks of --ctx tokens; each chunk is prefilled,
// teacher-forced, through the reference and through every format, and the positions from ctx/2
// to ctx - 2 of each chunk are scored, as llama-perplexity --kl-divergence scores them (so its
// figures on the same tokens compare). Prints per format the mean KL(ref || format) of the
// next-token distributions, its 99% quantile and maximum, and top-1 agreement.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>

#include "cli/commands.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/generator.h"
#include "engine/logit_divergence.h"
#include "kernels/matmul.h"
#include "model/model.h"
#include "model/quantization.h"
#include "text/tokenizer.h"

namespace duet {

extern const char* const kAccuracyText;  // bench/data/accuracy_text.txt (accuracy_text.cpp.in)

namespace {

struct AccuracyOptions {
  std::string model_dir;
  std::string quantizations;         // comma-separated, e.g. "int8,int4"
  std::vector<std::string> compare;  // other model directories of the same weights
  std::string text_file;             // empty: the built-in text
  int64_t ctx = 512;
  int64_t max_chunks = 0;  // 0: every whole chunk of the text
  int threads = 0;
};

// One format: a model whose distributions are scored against the reference's.
struct Format {
  std::string name;
  std::unique_ptr<Model> model;
  std::unique_ptr<Generator> gen;
  DivergenceStats stats;
};

std::string read_text(const std::string& path) {
  if (path.empty()) return kAccuracyText;
  std::ifstream in(path, std::ios::binary);
  if (!in) DUET_ERROR("--text: cannot open " << path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A --compare directory's row is named by the directory (e.g. qwen3-moe-small-fp8).
std::string compare_name(const std::string& dir) {
  const std::filesystem::path p = std::filesystem::path(dir).lexically_normal();
  const std::string base = p.filename().string();
  return base.empty() ? p.parent_path().filename().string() : base;
}

// The logits of every position of `chunk` [ctx] through `gen`: [ctx, n_vocab] f32.
std::vector<float> chunk_logits(Generator& gen, const std::vector<int32_t>& chunk) {
  GenerateRequest r;
  r.prompt = chunk;
  r.max_tokens = 0;
  r.prompt_logits = true;
  std::vector<GenerateResult> out = gen.generate({r});
  if (out[0].finish_reason == "error") DUET_ERROR(out[0].error);
  return std::move(out[0].prompt_logits);
}

void print_row(const std::string& name, uint64_t weight_bytes, const DivergenceStats& s) {
  std::printf("  %-20s %9.1f %12.6f %10.6f %10.6f %10.6f %8.2f %6.2f %9lld\n", name.c_str(),
              double(weight_bytes) / 1048576.0, s.mean_kl(), s.mean_kl_stderr(),
              s.kl_quantile(0.99), s.kl_quantile(1.0), 100.0 * s.top1_agreement(),
              100.0 * s.top1_stderr(), (long long)s.n_tokens());
}

void run_accuracy(const AccuracyOptions& o) {
  if (o.quantizations.empty() && o.compare.empty())
    DUET_ERROR("nothing to compare: give --quantizations, --compare or both");
  const std::string text = read_text(o.text_file);  // a bad path fails before the loads
  ThreadPool pool(o.threads > 0 ? o.threads : available_cores());
  std::unique_ptr<Model> ref = Model::load(o.model_dir);
  Generator ref_gen(*ref, pool);
  const ModelConfig& c = ref->config();
  if (o.ctx < 4 || o.ctx > c.max_position_embeddings)
    DUET_ERROR("--ctx " << o.ctx << ": expected 4 to the model's context, "
                        << c.max_position_embeddings);

  std::vector<Format> formats;
  std::stringstream list(o.quantizations);
  for (std::string name; std::getline(list, name, ',');) {
    LoadOptions lo;
    lo.quantization = parse_quantization(name);
    Format f;
    f.name = quantization_name(lo.quantization);
    f.model = Model::load(o.model_dir, lo);
    formats.push_back(std::move(f));
  }
  for (const std::string& dir : o.compare) {
    Format f;
    f.model = Model::load(dir);
    f.name = compare_name(dir);
    if (f.model->config().n_vocab != c.n_vocab)
      DUET_ERROR("--compare " << dir << ": vocabulary of " << f.model->config().n_vocab
                              << " ids, the reference's has " << c.n_vocab);
    formats.push_back(std::move(f));
  }
  for (Format& f : formats) f.gen = std::make_unique<Generator>(*f.model, pool);

  // The text's tokens, cut into whole chunks. As llama-perplexity does, a tokenizer that adds BOS
  // to prompts gets BOS as each chunk's first token.
  const std::unique_ptr<Tokenizer> tok = Tokenizer::load(o.model_dir);
  const std::vector<int32_t> tokens = tok->encode(text);
  int64_t n_chunks = static_cast<int64_t>(tokens.size()) / o.ctx;
  if (o.max_chunks > 0) n_chunks = std::min(n_chunks, o.max_chunks);
  if (n_chunks == 0)
    DUET_ERROR("the text has " << tokens.size() << " tokens, fewer than one chunk of --ctx "
                               << o.ctx);
  const int64_t first = o.ctx / 2;  // positions [first, ctx - 1) are scored
  std::printf("model %s (%s), reference: %s as stored, %d threads, matmul %s\n",
              o.model_dir.c_str(), arch_name(c.arch), dtype_name(ref->weight_dtype()),
              pool.n_threads(), matmul_isa());
  std::printf(
      "text %s: %zu tokens; %lld chunks of %lld, positions %lld to %lld of each scored "
      "(as llama-perplexity --kl-divergence): %lld positions\n",
      o.text_file.empty() ? "built in (bench/data/accuracy_text.txt)" : o.text_file.c_str(),
      tokens.size(), (long long)n_chunks, (long long)o.ctx, (long long)first,
      (long long)(o.ctx - 2), (long long)(n_chunks * (o.ctx - 1 - first)));
  for (const Format& f : formats) {
    if (f.model->quantization().quantization != Quantization::kNone)
      std::printf("  %s: %s\n", f.name.c_str(), describe(f.model->quantization()).c_str());
  }
  std::fflush(stdout);

  for (int64_t k = 0; k < n_chunks; ++k) {
    std::vector<int32_t> chunk(tokens.begin() + k * o.ctx, tokens.begin() + (k + 1) * o.ctx);
    if (tok->add_bos_token() && tok->bos_id() >= 0) chunk[0] = tok->bos_id();
    const std::vector<float> want = chunk_logits(ref_gen, chunk);  // [ctx, n_vocab]
    for (Format& f : formats) {
      const std::vector<float> got = chunk_logits(*f.gen, chunk);  // [ctx, n_vocab]
      for (int64_t p = first; p < o.ctx - 1; ++p) {
        f.stats.add(
            token_divergence(want.data() + p * c.n_vocab, got.data() + p * c.n_vocab, c.n_vocab));
      }
    }
  }

  // Every format's stats saw the same reference rows.
  const DivergenceStats& any = formats[0].stats;
  std::printf(
      "reference distributions: mean entropy %.3f nats (uniform: ln %lld = %.3f), mean top-1 "
      "probability %.4f\n",
      any.mean_ref_entropy(), (long long)c.n_vocab, std::log(double(c.n_vocab)),
      any.mean_ref_top_prob());
  std::printf("  %-20s %9s %12s %10s %10s %10s %8s %6s %9s\n", "format", "MiB", "mean KL", "± s.e.",
              "99% KL", "max KL", "top-1 %", "± s.e.", "positions");
  for (const Format& f : formats) print_row(f.name, f.model->weight_bytes(), f.stats);
}

}  // namespace

void add_bench_accuracy(CLI::App& bench) {
  auto o = std::make_shared<AccuracyOptions>();
  CLI::App* cmd = bench.add_subcommand(
      "accuracy",
      "KL divergence and top-1 agreement of quantized formats against the model as stored");
  cmd->add_option("model_dir", o->model_dir, "Hugging Face model directory (the reference)")
      ->required();
  cmd->add_option("--quantizations", o->quantizations,
                  "The reference loaded again under each --quantization (comma-separated, e.g. "
                  "int8; none: the reference against itself)");
  cmd->add_option("--compare", o->compare,
                  "Another model directory of the same weights (e.g. an fp8 checkpoint from "
                  "make-model --dtype fp8 with the same seed); may be repeated");
  cmd->add_option("--text", o->text_file,
                  "Text file to evaluate (default: built-in varied prose, code and lists)");
  cmd->add_option("--ctx", o->ctx, "Tokens per chunk (llama-perplexity's -c; default 512)");
  cmd->add_option("--chunks", o->max_chunks, "At most this many chunks (default: all)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--threads", o->threads, "Compute threads (default: available cores)");
  cmd->callback([o] { run_accuracy(*o); });
}

}  // namespace duet
