// `duet bench tokenizer MODEL_DIR`: encode throughput of English text on one core, against the
// 5 MB/s target. The text is built-in prose (sentences shuffled with a fixed seed up to --mb
// megabytes) or a file; it is encoded in 64 KiB documents, as prompts arrive, three times, and
// the median is printed.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <sstream>

#include "cli/commands.h"
#include "core/error.h"
#include "text/tokenizer.h"

namespace duet {

namespace {

constexpr double kTargetMbPerSecond = 5.0;

constexpr const char* kProse[] = {
    "The morning fog lifted slowly from the harbor, and the fishing boats began to move out "
    "past the old stone lighthouse.",
    "Nobody in the village could remember a summer as quiet as this one.",
    "Margaret walked along the pier every day at seven o'clock, counting the boats as they left.",
    "\"You're up early again,\" said Thomas, who ran the bakery at the corner of Water Street.",
    "In the history of science, few ideas have been as productive as the notion that nature can "
    "be described by simple rules.",
    "Galileo measured the time it took for a ball to roll down an inclined plane; Newton "
    "generalized those measurements into laws of motion.",
    "Modern computers follow the same pattern at a smaller scale: every instruction is simple, "
    "and the complexity comes from the way they are combined.",
    "Good software engineering is largely the art of keeping that combination understandable.",
    "Large language models are trained to predict the next token of a text, one piece at a time.",
    "A mixture-of-experts model routes each token to a few of its many expert networks, which "
    "lets it hold more parameters without spending more computation per token.",
    "The committee met on Tuesday, March 14, 2023, at 10:30 a.m. to review the budget.",
    "Revenue for the first quarter was $4.2 million, an increase of 12% compared with the same "
    "period last year.",
    "She didn't know whether they'd arrive in time; the train was late and the roads were closed.",
    "Weather report: cloudy in the morning with a chance of light rain, clearing in the afternoon.",
    "The old library closed at five, but Daniel stayed until the librarian turned off the lights.",
    "He was reading about the explorers who mapped the coast three hundred years ago.",
    "What surprised him most was not their mistakes but their patience.",
    "They returned, year after year, to correct the maps, adding a bay here and removing an "
    "island there.",
    "Heat two tablespoons of olive oil in a large pot over medium heat, then add the onions.",
    "Questions from the members focused on the cost of the software licenses, which had doubled.",
};

struct BenchTokenizerOptions {
  std::string model_dir;
  double mb = 8;
  std::string file;
};

std::string make_text(const BenchTokenizerOptions& o) {
  if (!o.file.empty()) {
    std::ifstream in(o.file, std::ios::binary);
    if (!in) DUET_ERROR("cannot open " << o.file);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  const size_t target = size_t(o.mb * 1e6);
  std::mt19937 rng(1234);
  std::vector<int> order(std::size(kProse));
  for (size_t k = 0; k < order.size(); ++k) order[k] = int(k);
  std::string text;
  text.reserve(target + 1024);
  while (text.size() < target) {
    std::shuffle(order.begin(), order.end(), rng);
    for (int k = 0; k < 5 && text.size() < target; ++k) {
      text += kProse[order[k]];
      text += ' ';
    }
    text += rng() % 3 == 0 ? "\n\n" : "\n";
  }
  return text;
}

void run_bench_tokenizer(const BenchTokenizerOptions& o) {
  std::unique_ptr<Tokenizer> tok = Tokenizer::load(o.model_dir);
  const std::string text = make_text(o);
  if (text.empty()) DUET_ERROR("no text to encode");
  constexpr size_t kDocBytes = 64 * 1024;
  std::vector<std::string> docs;
  for (size_t pos = 0; pos < text.size(); pos += kDocBytes)
    docs.push_back(text.substr(pos, kDocBytes));
  tok->encode(docs[0]);  // warm the word cache as a serving process would be
  std::vector<double> seconds;
  size_t n_tokens = 0;
  for (int run = 0; run < 3; ++run) {
    n_tokens = 0;
    const auto start = std::chrono::steady_clock::now();
    for (const std::string& d : docs) n_tokens += tok->encode(d).size();
    seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(seconds.begin(), seconds.end());
  const double s = seconds[1];
  const double mb = double(text.size()) / 1e6;
  std::printf("tokenizer %s: %.1f MB of English text, %zu tokens (%.2f bytes/token)\n",
              o.model_dir.c_str(), mb, n_tokens, double(text.size()) / double(n_tokens));
  std::printf("encode, 1 thread: %.3f s median of 3 = %.2f MB/s, %.0f tokens/s\n", s, mb / s,
              double(n_tokens) / s);
  std::printf("target %.1f MB/s: ratio %.2f\n", kTargetMbPerSecond, mb / s / kTargetMbPerSecond);
}

}  // namespace

void add_bench_tokenizer(CLI::App& bench) {
  auto o = std::make_shared<BenchTokenizerOptions>();
  CLI::App* cmd = bench.add_subcommand("tokenizer", "Encode throughput (MB/s) on one core");
  cmd->add_option("model_dir", o->model_dir,
                  "Directory with tokenizer.json (or Kimi's tiktoken.model)")
      ->required();
  cmd->add_option("--mb", o->mb, "Megabytes of built-in English prose (default 8)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--file", o->file, "Encode this file instead");
  cmd->callback([o] { run_bench_tokenizer(*o); });
}

}  // namespace duet
