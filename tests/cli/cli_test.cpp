// The duet binary end to end: make-model writes a loadable directory, generate prints a
// completion and dumps logits, and bad input ends with one "error: ..." line and exit code 1
// (never a crash or a signal).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>

#include "cli/run_duet.h"
#include "core/thread_pool.h"
#include "kernels/bandwidth.h"
#include "kernels/matmul.h"
#include "test_util.h"
#include "text/tokenizer.h"

namespace duet {
namespace {

using test::run_duet;
using test::RunResult;

class CliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = test::make_temp_dir("duet-cli-") + "/model";
    RunResult r = run_duet("make-model " + dir_ + " --arch qwen3_moe --preset tiny --seed 3");
    ASSERT_EQ(r.exit_code, 0) << r.out;
  }
  static std::string dir_;
};
std::string CliTest::dir_;

TEST_F(CliTest, GenerateDumpsLogitsAndPrintsSpeeds) {
  const std::string dump = dir_ + "/../logits.json";
  RunResult r =
      run_duet("generate " + dir_ + " --prompt-ids 1,2,3 --max-tokens 4 --dump-logits " + dump);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("tok/s"), std::string::npos) << r.out;
  auto j = nlohmann::json::parse(test::read_file(dump));
  EXPECT_EQ(j["tokens"], nlohmann::json({1, 2, 3}));
  ASSERT_EQ(j["logits"].size(), 3u);
  EXPECT_EQ(j["logits"][0].size(), 512u);
  EXPECT_EQ(j["generated"].size(), 4u);
}

// A tiny model makes its tokens faster than generate's reader wakes, so they often reach it in
// one delta (deepseek_v3 `tiny`: 3 to 6 runs in 10 before, which then printed 0.0 tok/s); the
// generation rate is the engine's (its gaps between tokens), not the reader's.
TEST_F(CliTest, GenerateTimesDecodeWhenTheTokensArriveTogether) {
  const std::string dir = dir_ + "/../deepseek";
  ASSERT_EQ(run_duet("make-model " + dir + " --arch deepseek_v3 --preset tiny --seed 3").exit_code,
            0);
  const std::regex summary(
      R"(prompt: 3 tokens, ([0-9.]+) tok/s \| generation: 48 tokens, ([0-9.]+) tok/s)");
  for (int i = 0; i < 8; ++i) {  // the reader's timing failed 2 of 3 runs of this loop
    RunResult r = run_duet("generate " + dir + " --prompt-ids 1,2,3 --max-tokens 48 --ignore-eos");
    ASSERT_EQ(r.exit_code, 0) << r.out;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(r.out, m, summary)) << r.out;
    EXPECT_GT(std::stod(m[1].str()), 0.0) << r.out;
    EXPECT_GT(std::stod(m[2].str()), 0.0) << r.out;
  }
}

TEST_F(CliTest, GenerateFromTextPrompt) {
  RunResult r = run_duet("generate " + dir_ +
                         " --prompt 'Hello there' --max-tokens 5 --temperature 0.8 "
                         "--top-p 0.9 --top-k 50 --seed 1");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  // The completion comes first (stdout is flushed before the speeds go to stderr).
  const std::string completion = r.out.substr(0, r.out.find("prompt: "));
  RunResult again = run_duet("generate " + dir_ +
                             " --prompt 'Hello there' --max-tokens 5 "
                             "--temperature 0.8 --top-p 0.9 --top-k 50 --seed 1");
  EXPECT_EQ(again.out.substr(0, again.out.find("prompt: ")), completion) << "seeded run repeats";
}

// Kimi K2's layout: config.json's model_type kimi_k2 runs as deepseek_v3, and text goes through
// its tiktoken.model (there is no tokenizer.json) with Kimi's regex, Han runs apart.
TEST_F(CliTest, KimiK2DirectoryRunsOnItsTiktokenTokenizer) {
  const std::string dir = dir_ + "/../kimi";
  ASSERT_EQ(run_duet("make-model " + dir + " --arch kimi_k2 --preset tiny --seed 3").exit_code, 0);
  EXPECT_FALSE(std::filesystem::exists(dir + "/tokenizer.json"));
  const std::string text = "Hello 中文English混合 there";
  std::vector<int32_t> ids = Tokenizer::load(dir)->encode(text);
  const std::string dump = dir + "/../kimi-text.json", dump_ids = dir + "/../kimi-ids.json";
  RunResult r = run_duet("generate " + dir + " --prompt '" + text +
                         "' --max-tokens 4 --ignore-eos --dump-logits " + dump);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto from_text = nlohmann::json::parse(test::read_file(dump));
  EXPECT_EQ(from_text["tokens"], nlohmann::json(ids));
  std::string list;
  for (int32_t id : ids) list += (list.empty() ? "" : ",") + std::to_string(id);
  r = run_duet("generate " + dir + " --prompt-ids " + list +
               " --max-tokens 4 --ignore-eos --dump-logits " + dump_ids);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(test::read_file(dump_ids))["generated"], from_text["generated"]);
  r = run_duet("generate " + dir + " --prompt-ids " + list + " --max-tokens 4 --ignore-eos");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto tok = Tokenizer::load(dir);
  std::vector<int32_t> generated = from_text["generated"].get<std::vector<int32_t>>();
  EXPECT_EQ(r.out.substr(0, r.out.find('\n')), utf8_lossy(tok->decode(generated, true)))
      << "ids in, the completion printed as text";
  // The chat template writes Kimi's markers, and each encodes as its special token.
  test::write_file(dir + "/../chat.json", R"([{"role": "user", "content": "hi"}])");
  r = run_duet("tokenize " + dir + " --chat --add-generation-prompt < " + dir + "/../chat.json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out.substr(0, 41), "<|im_user|>user<|im_middle|>hi<|im_end|><") << r.out;
  ids = tok->encode(r.out.substr(0, 40));
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.front(), tok->token_to_id("<|im_user|>"));
  EXPECT_EQ(std::count(ids.begin(), ids.end(), tok->token_to_id("<|im_middle|>")), 1);
  EXPECT_EQ(ids.back(), tok->token_to_id("<|im_end|>"));
}

void expect_error(const RunResult& r, const std::string& needle) {
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_EQ(r.out.rfind("error: ", 0), 0u) << r.out;
  EXPECT_NE(r.out.find(needle), std::string::npos) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
}

TEST_F(CliTest, BadInputIsOneLineErrors) {
  expect_error(run_duet("generate /nonexistent --prompt-ids 1"), "/nonexistent/config.json");
  expect_error(run_duet("generate " + dir_ + " --prompt-ids 1,x"), "'x'");
  expect_error(run_duet("generate " + dir_ + " --prompt-ids 1,100000"), "100000");
  expect_error(run_duet("generate " + dir_ + " --prompt-ids 1 --max-tokens 99999"), "context");
  expect_error(run_duet("generate " + dir_ + " --prompt-ids 1 --top-p 2"), "top_p");
  expect_error(run_duet("generate " + dir_), "--prompt");
  expect_error(run_duet("serve " + dir_ + " --port 0 --header-timeout 2"),
               "is neither 0 nor at least 5 seconds");
  expect_error(run_duet("generate " + dir_ + " --prompt-ids 1 --dist-timeout 0.5"),
               "--dist-timeout");
  expect_error(run_duet("make-model /tmp/x --arch qwen3_moe --hf-overrides '[1]'"),
               "--hf-overrides");
}

TEST_F(CliTest, BrokenModelFileIsNamed) {
  const std::string broken = test::make_temp_dir("duet-cli-broken-");
  for (const auto& e : std::filesystem::directory_iterator(dir_))
    std::filesystem::copy(e.path(), broken + "/" + e.path().filename().string());
  std::filesystem::resize_file(broken + "/model.safetensors", 1000);
  expect_error(run_duet("generate " + broken + " --prompt-ids 1"), broken + "/model.safetensors");
}

// The completion line of a `generate` run: the first line of the single-rank output.
std::string first_line(const std::string& out) {
  return out.substr(0, out.find('\n'));
}

bool has_line(const std::string& out, const std::string& line) {
  return ("\n" + out + "\n").find("\n" + line + "\n") != std::string::npos;
}

// Two ranks (threads, and processes under mpirun when OpenMPI is installed) give the
// single-rank greedy completion, and each rank reports the experts it holds.
TEST_F(CliTest, ExpertParallelGenerateMatchesSingleRank) {
  const std::string args = "generate " + dir_ + " --prompt-ids 5,6,7,8 --max-tokens 6 ";
  RunResult one = run_duet(args);
  ASSERT_EQ(one.exit_code, 0) << one.out;
  const std::string want = first_line(one.out);
  std::vector<std::string> backends = {"inproc"};
  if (std::system("command -v mpirun >/dev/null 2>&1") == 0) backends.push_back("mpi");
  for (const std::string& b : backends) {
    RunResult r = run_duet(args +
                           "--data-parallel-size 2 --enable-expert-parallel "
                           "--distributed-backend " +
                           b);
    ASSERT_EQ(r.exit_code, 0) << r.out;
    EXPECT_TRUE(has_line(r.out, want)) << b << ": want '" << want << "' in\n" << r.out;
    EXPECT_NE(r.out.find("rank 0/2: experts [0, 4) of 8"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("rank 1/2: experts [4, 8) of 8"), std::string::npos) << r.out;
  }
}

// A compressed-tensors int4 checkpoint (Kimi K2's layout, experts packed) split over two ranks
// gives the single rank's tokens and prompt logits exactly: each rank reads its experts' packed
// weights alone.
TEST_F(CliTest, Int4CheckpointExpertParallelGivesTheSingleRankLogits) {
  const std::string dir = dir_ + "/../kimi-int4";
  ASSERT_EQ(run_duet("make-model " + dir + " --arch kimi_k2 --preset tiny --dtype int4").exit_code,
            0);
  const std::string args = "generate " + dir + " --prompt-ids 5,6,7,8,300 --max-tokens 6 ";
  RunResult r = run_duet(args + "--dump-logits " + dir + "/../one.json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  r = run_duet(args +
               "--data-parallel-size 2 --enable-expert-parallel --distributed-backend inproc "
               "--dump-logits " + dir + "/../two.json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto one = nlohmann::json::parse(test::read_file(dir + "/../one.json"));
  const auto two = nlohmann::json::parse(test::read_file(dir + "/../two.json"));
  EXPECT_EQ(two["generated"], one["generated"]);
  EXPECT_EQ(two["logits"], one["logits"]);
}

// generate runs the serving engine under every scheduler mode (the overlapped scheduler by
// default, --disable-overlap-schedule, --num-scheduler-steps N, on one rank and on two) and
// gives the completion of the reference path (--dump-logits: one step at a time), greedy and
// seeded; each run names its scheduler.
TEST_F(CliTest, GenerateRunsEverySchedulerModeToTheSameTokens) {
  for (const std::string sampling : {"", " --temperature 0.9 --top-k 40 --seed 7"}) {
    const std::string args =
        "generate " + dir_ + " --prompt-ids 5,6,7,8 --max-tokens 9 --ignore-eos" + sampling;
    RunResult ref = run_duet(args + " --dump-logits " + dir_ + "/sched_ref.json");
    ASSERT_EQ(ref.exit_code, 0) << ref.out;
    EXPECT_NE(ref.out.find("| one step at a time (all prompt logits)\n"), std::string::npos)
        << ref.out;
    const std::string want = first_line(ref.out);
    const std::vector<std::pair<std::string, std::string>> modes = {
        {"", "| overlapped scheduler\n"},
        {" --disable-overlap-schedule", "| plain scheduler\n"},
        {" --num-scheduler-steps 3", "| overlapped scheduler, 3 steps per decode batch\n"},
        {" --disable-overlap-schedule --num-scheduler-steps 4",
         "| plain scheduler, 4 steps per decode batch\n"},
        {" --num-scheduler-steps 3 --data-parallel-size 2 --enable-expert-parallel "
         "--distributed-backend inproc",
         "| overlapped scheduler, 3 steps per decode batch\n"}};
    for (const auto& [flags, names] : modes) {
      RunResult r = run_duet(args + flags);
      ASSERT_EQ(r.exit_code, 0) << flags << ": " << r.out;
      EXPECT_TRUE(has_line(r.out, want)) << flags << ": want '" << want << "' in\n" << r.out;
      EXPECT_NE(r.out.find(names), std::string::npos) << flags << ": " << r.out;
      EXPECT_NE(r.out.find("generation: 9 tokens"), std::string::npos) << flags << ": " << r.out;
    }
  }
  RunResult bad = run_duet("generate " + dir_ + " --prompt-ids 1 --num-scheduler-steps 0");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.out.find("--num-scheduler-steps: Value 0 not in range 1 to 64"), std::string::npos)
      << bad.out;
}

// Under the mpirun that duet starts for generate (and the benchmarks), a rank that fails makes
// the command fail: OpenMPI's mpirun with --enable-recovery (which serve keeps) exits 0 whatever
// its ranks did.
TEST_F(CliTest, AFailedRankUnderMpirunFailsTheCommand) {
  if (std::system("command -v mpirun >/dev/null 2>&1") != 0) GTEST_SKIP() << "no mpirun";
  RunResult r = run_duet("generate " + dir_ +
                         " --prompt-ids 1,100000 --data-parallel-size 2 --enable-expert-parallel");
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("error: rank 0: prompt token id 100000 is outside the vocabulary"),
            std::string::npos)
      << r.out;
}

TEST_F(CliTest, InconsistentDistributedFlagsAreRefused) {
  const std::string args = "generate " + dir_ + " --prompt-ids 1 --distributed-backend inproc ";
  expect_error(run_duet(args + "--data-parallel-size 2"), "--enable-expert-parallel");
  expect_error(run_duet(args + "--data-parallel-size 3 --enable-expert-parallel"),
               "cannot be split evenly over 3 ranks");
  expect_error(run_duet(args + "--data-parallel-size 16 --enable-expert-parallel"), "16 ranks");
  // MPI missing: no mpirun to start the ranks with.
  expect_error(run_duet("generate " + dir_ +
                            " --prompt-ids 1 --data-parallel-size 2 "
                            "--enable-expert-parallel",
                        "PATH=/nonexistent"),
               "install openmpi-bin");
}

// --kv-cache-dtype on every command that makes a KV cache: a bad value is refused (before the
// model loads) with one error line; the chosen dtype is reported, `auto` being bf16 for this
// bf16 model; bf16 and f32 K/V give this model the same greedy completion.
TEST_F(CliTest, KvCacheDtypeIsCheckedAndReported) {
  const std::string want = "--kv-cache-dtype must be auto, bf16 or f32, got 'bogus'";
  expect_error(run_duet("generate " + dir_ + " --prompt-ids 1 --kv-cache-dtype bogus"), want);
  expect_error(run_duet("serve " + dir_ + " --port 0 --kv-cache-dtype bogus"), want);
  expect_error(run_duet("bench latency " + dir_ + " --kv-cache-dtype bogus"), want);
  const std::string args = "generate " + dir_ + " --prompt-ids 5,6,7,8 --max-tokens 6";
  RunResult automatic = run_duet(args);
  RunResult bf16 = run_duet(args + " --kv-cache-dtype bf16");
  RunResult f32 = run_duet(args + " --kv-cache-dtype f32");
  for (const RunResult* r : {&automatic, &bf16, &f32}) ASSERT_EQ(r->exit_code, 0) << r->out;
  EXPECT_NE(automatic.out.find("| KV cache bf16"), std::string::npos) << automatic.out;
  EXPECT_NE(bf16.out.find("| KV cache bf16"), std::string::npos) << bf16.out;
  EXPECT_NE(f32.out.find("| KV cache f32"), std::string::npos) << f32.out;
  EXPECT_EQ(first_line(bf16.out), first_line(f32.out));
  RunResult bench = run_duet("bench latency " + dir_ +
                             " --batch 2 --prompt-len 4 --gen-len 2 --threads 1 "
                             "--kv-cache-dtype f32");
  ASSERT_EQ(bench.exit_code, 0) << bench.out;
  EXPECT_NE(bench.out.find(", KV cache f32\n"), std::string::npos) << bench.out;
}

// bench latency --rounds N: N rounds of the batch, each decode also set against the bandwidth
// measured just before and after it (one ratio per round and their median); without it, one
// round and no such line.
TEST_F(CliTest, BenchLatencyRoundsSetEachDecodeAgainstTheBandwidthAroundIt) {
  const std::string bench =
      "bench latency " + dir_ + " --batch 2 --prompt-len 4 --gen-len 3 --threads 1";
  RunResult one = run_duet(bench), three = run_duet(bench + " --rounds 3");
  ASSERT_EQ(one.exit_code, 0) << one.out;
  ASSERT_EQ(three.exit_code, 0) << three.out;
  const std::string line = "decode achieved/limit per round, against the bandwidth measured";
  EXPECT_EQ(one.out.find(line), std::string::npos) << one.out;
  const size_t at = three.out.find(line);
  ASSERT_NE(at, std::string::npos) << three.out;
  const std::string rest = three.out.substr(three.out.find(':', at) + 1);
  double r[3], median;
  ASSERT_EQ(std::sscanf(rest.c_str(), " %lf %lf %lf (median %lf", &r[0], &r[1], &r[2], &median), 4)
      << three.out;
  std::sort(r, r + 3);
  EXPECT_GT(r[0], 0.0);
  EXPECT_DOUBLE_EQ(median, r[1]) << three.out;
  // The steps of each round: 2 decode steps after the prefill, the same in the median round.
  EXPECT_NE(three.out.find("2 steps x 2 seqs"), std::string::npos) << three.out;
}

// bench latency --bandwidth-each-step: after every decode step a read of about a step's bytes,
// and each round's decode against those reads' bandwidth; one rank alone.
TEST_F(CliTest, BenchLatencyBandwidthEachStepSetsEachRoundAgainstItsReads) {
  const std::string bench =
      "bench latency " + dir_ + " --batch 2 --prompt-len 4 --gen-len 3 --threads 1";
  RunResult r = run_duet(bench + " --rounds 2 --bandwidth-each-step");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const std::string line = "decode achieved/limit per round, each step followed by a read of ";
  const size_t at = r.out.find(line);
  ASSERT_NE(at, std::string::npos) << r.out;
  double mb = 0, a = 0, b = 0, median = 0;
  ASSERT_EQ(std::sscanf(r.out.c_str() + at + line.size(), "%lf MB", &mb), 1) << r.out;
  ASSERT_EQ(std::sscanf(r.out.c_str() + r.out.find("):", at) + 2, " %lf %lf (median %lf", &a, &b,
                        &median),
            3)
      << r.out;
  EXPECT_GT(mb, 0.0);
  // At least twice the last-level cache, so that no step finds its weights there (this tiny
  // model's steps read far less).
  EXPECT_GE(mb * 1e6, 2.0 * static_cast<double>(last_level_cache_bytes()) * 0.999) << r.out;
  EXPECT_GT(std::min(a, b), 0.0);
  EXPECT_DOUBLE_EQ(median, std::max(a, b)) << r.out;  // the upper of two
  EXPECT_EQ(r.out.find("step gap"), std::string::npos) << r.out;
  const RunResult plain = run_duet(bench);
  EXPECT_EQ(plain.out.find(line), std::string::npos);
  // The tiny model's steps fit in any last-level cache: bench latency says so.
  if (last_level_cache_bytes() > 0) {
    EXPECT_NE(plain.out.find("decode: the last-level cache ("), std::string::npos) << plain.out;
  }
  expect_error(run_duet(bench + " --bandwidth-each-step --quantizations none,int8"),
               "--bandwidth-each-step times one rank's generator alone");
}

// --no-repack and --mmap: bench latency says whether the dense matrices were packed as panels
// and whether the weights were copied out of the files, and generate gives the same tokens
// every way.
TEST_F(CliTest, NoRepackAndMmapReadWeightsAsStored) {
  const std::string bench =
      "bench latency " + dir_ + " --batch 2 --prompt-len 4 --gen-len 2 --threads 1";
  RunResult packed = run_duet(bench), plain = run_duet(bench + " --no-repack"),
            mapped = run_duet(bench + " --mmap");
  ASSERT_EQ(packed.exit_code, 0) << packed.out;
  ASSERT_EQ(plain.exit_code, 0) << plain.out;
  ASSERT_EQ(mapped.exit_code, 0) << mapped.out;
  EXPECT_NE(plain.out.find("weights: as stored\n"), std::string::npos) << plain.out;
  if (matmul_reads_panels(DType::kBF16)) {
    EXPECT_NE(packed.out.find("also as panels ("), std::string::npos) << packed.out;
  }
  EXPECT_NE(packed.out.find("weights: copied into huge pages at load"), std::string::npos)
      << packed.out;
  EXPECT_NE(mapped.out.find("weights: read in the files' mapping (--mmap)"), std::string::npos)
      << mapped.out;
  const std::string gen =
      "generate " + dir_ +
      " --prompt-ids 5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21 --max-tokens 6";
  RunResult a = run_duet(gen), b = run_duet(gen + " --no-repack"), c = run_duet(gen + " --mmap");
  ASSERT_EQ(a.exit_code, 0) << a.out;
  ASSERT_EQ(b.exit_code, 0) << b.out;
  ASSERT_EQ(c.exit_code, 0) << c.out;
  EXPECT_EQ(first_line(a.out), first_line(b.out));
  EXPECT_EQ(first_line(a.out), first_line(c.out));
}

// --quantization on every command that loads a model: a bad value is refused (before the model
// loads) with one error line; int8 and int4 say what they quantized and the resident bytes at
// start-up.
TEST_F(CliTest, QuantizationIsCheckedAndReported) {
  const std::string want = "--quantization int3: expected none, int8, int4 or int4_pure";
  expect_error(run_duet("generate " + dir_ + " --prompt-ids 1 --quantization int3"), want);
  expect_error(run_duet("serve " + dir_ + " --port 0 --quantization int3"), want);
  expect_error(run_duet("bench latency " + dir_ + " --quantization int3"), want);
  RunResult gen =
      run_duet("generate " + dir_ + " --prompt-ids 5,6,7,8 --max-tokens 4 --quantization int8");
  ASSERT_EQ(gen.exit_code, 0) << gen.out;
  EXPECT_NE(gen.out.find("quantization int8: "), std::string::npos) << gen.out;
  EXPECT_NE(gen.out.find(" MiB, resident "), std::string::npos) << gen.out;
  RunResult gen4 =
      run_duet("generate " + dir_ + " --prompt-ids 5,6,7,8 --max-tokens 4 --quantization int4");
  ASSERT_EQ(gen4.exit_code, 0) << gen4.out;
  EXPECT_NE(gen4.out.find("quantization int4 (output head int8): "), std::string::npos) << gen4.out;
  RunResult bench = run_duet("bench latency " + dir_ +
                             " --batch 2 --prompt-len 4 --gen-len 2 --threads 1 "
                             "--quantization int8");
  ASSERT_EQ(bench.exit_code, 0) << bench.out;
  EXPECT_NE(bench.out.find("weights: quantization int8: "), std::string::npos) << bench.out;
  EXPECT_EQ(bench.out.find("weights: as stored"), std::string::npos) << bench.out;
  // --quantizations: the loads side by side, a row each, ratios to the first.
  RunResult both = run_duet("bench latency " + dir_ +
                            " --batch 1 --prompt-len 4 --gen-len 3 --threads 1 --rounds 2 "
                            "--quantizations none,int8,int4,int4_pure,none+mmap");
  ASSERT_EQ(both.exit_code, 0) << both.out;
  const size_t table = both.out.find("decode/limit\n");
  ASSERT_NE(table, std::string::npos) << both.out;
  EXPECT_NE(both.out.find("\n  none  ", table), std::string::npos) << both.out;
  EXPECT_NE(both.out.find("\n  int8  ", table), std::string::npos) << both.out;
  EXPECT_NE(both.out.find("\n  int4  ", table), std::string::npos) << both.out;
  EXPECT_NE(both.out.find("\n  int4_pure ", table), std::string::npos) << both.out;
  EXPECT_NE(both.out.find("\n  none+mmap ", table), std::string::npos) << both.out;
  expect_error(run_duet("bench latency " + dir_ + " --quantizations none,int9"),
               "--quantization int9: expected none, int8, int4 or int4_pure");
}

// --profile-ops adds decode time per kind of operation, each layer's summed under one name;
// with several ranks it is refused.
TEST_F(CliTest, ProfileOpsPrintsDecodeTimePerOperation) {
  const std::string bench =
      "bench latency " + dir_ + " --batch 2 --prompt-len 4 --gen-len 3 --threads 1 --profile-ops";
  RunResult r = run_duet(bench);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const size_t table = r.out.find("decode time by operation");
  ASSERT_NE(table, std::string::npos) << r.out;
  for (const char* op : {"\n  attn ", "\n  experts ", "\n  moe_route ", "\n  output ",
                         "\n    attn.qkv ", "\n    attn.attend ", "\n    attn.o "}) {
    EXPECT_NE(r.out.find(op, table), std::string::npos) << op << " in " << r.out;
  }
  EXPECT_EQ(r.out.find("L0."), std::string::npos) << r.out;
  // With expert parallelism: rank 0's table, the dispatch and combine halves included.
  RunResult ep = run_duet(bench + " --enable-expert-parallel --data-parallel-size 2 "
                                  "--distributed-backend inproc");
  ASSERT_EQ(ep.exit_code, 0) << ep.out;
  const size_t ep_table = ep.out.find("rank 0, decode time by operation");
  ASSERT_NE(ep_table, std::string::npos) << ep.out;
  for (const char* op : {"\n  attn ", "\n  experts ", "\n  dispatch_recv ", "\n  combine_recv "}) {
    EXPECT_NE(ep.out.find(op, ep_table), std::string::npos) << op << " in " << ep.out;
  }
}

// Two-micro-batch overlap on 2 ranks, TBO and DBO, in-process and over MPI: the single rank's
// greedy tokens and its prompt logits to 1e-5 (the halves' products may sum in another order).
TEST_F(CliTest, OverlapModesMatchSingleRank) {
  const std::string args = "generate " + dir_ +
                           " --prompt-ids 5,6,7,8,9,10,11,12,13 --max-tokens 4 "
                           "--dbo-prefill-token-threshold 4 --dump-logits ";
  const std::string one = dir_ + "/overlap1.json";
  ASSERT_EQ(run_duet(args + one).exit_code, 0);
  const nlohmann::json want = nlohmann::json::parse(test::read_file(one));
  std::vector<std::string> backends = {"inproc"};
  if (std::system("command -v mpirun >/dev/null 2>&1") == 0) backends.push_back("mpi");
  for (const std::string& b : backends) {
    for (const std::string mode : {"--enable-two-batch-overlap", "--enable-dbo"}) {
      const std::string dump = dir_ + "/overlap_" + b + ".json";
      RunResult r = run_duet(args + dump + " " + mode +
                             " --data-parallel-size 2 --enable-expert-parallel "
                             "--distributed-backend " + b);
      ASSERT_EQ(r.exit_code, 0) << b << " " << mode << ": " << r.out;
      EXPECT_NE(r.out.find(mode == "--enable-dbo" ? "overlap dbo" : "overlap tbo"),
                std::string::npos) << r.out;
      const nlohmann::json got = nlohmann::json::parse(test::read_file(dump));
      EXPECT_EQ(got["generated"], want["generated"]) << b << " " << mode;
      ASSERT_EQ(got["logits"].size(), want["logits"].size());
      for (size_t t = 0; t < want["logits"].size(); ++t) {
        for (size_t j = 0; j < want["logits"][t].size(); ++j) {
          const double w = want["logits"][t][j].get<double>();
          ASSERT_NEAR(got["logits"][t][j].get<double>(), w, 1e-5 * (1 + std::fabs(w)))
              << b << " " << mode << " position " << t;
        }
      }
    }
  }
}

// --trace-file on 2 in-process ranks with TBO: one Chrome trace per rank, with the step track
// (agreement, the plan of a split step), both micro-batches' operations and the transfers.
TEST_F(CliTest, TraceFileShowsStepsMicroBatchesAndTransfers) {
  const std::string trace = dir_ + "/trace.json";
  RunResult r = run_duet("generate " + dir_ +
                         " --prompt-ids 5,6,7,8,9,10,11,12,13 --max-tokens 3 "
                         "--enable-two-batch-overlap --dbo-prefill-token-threshold 4 "
                         "--data-parallel-size 2 --enable-expert-parallel "
                         "--distributed-backend inproc --trace-file " + trace);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  for (int rank : {0, 1}) {
    const std::string path = dir_ + "/trace.rank" + std::to_string(rank) + ".json";
    const nlohmann::json t = nlohmann::json::parse(test::read_file(path));
    std::map<int, std::vector<std::string>> names;  // track → span names
    for (const nlohmann::json& e : t["traceEvents"]) {
      if (e["ph"] == "X") names[e["tid"].get<int>()].push_back(e["name"].get<std::string>());
    }
    const auto has = [&](int tid, const std::string& part) {
      for (const std::string& n : names[tid])
        if (n.find(part) != std::string::npos) return true;
      return false;
    };
    EXPECT_TRUE(has(1, "agree")) << path;
    EXPECT_TRUE(has(1, "step: prefill padded 9 micro-batch 5|4")) << path;
    EXPECT_TRUE(has(2, "L0.attn")) << path;
    EXPECT_TRUE(has(3, "L0.dispatch_send")) << path;
    EXPECT_TRUE(has(4, "ep_dispatch(high_throughput")) << path;
    EXPECT_TRUE(has(4, "bytes sent")) << path;
  }
}

// Each chunk of single-batch overlap's transfers is named with the bytes it sends: summed over
// both ranks, the dispatch's chunks carry the rows that the combine's chunks bring back, plus the
// first chunk's row counts (one word per local expert). A name taken after the bytes had moved
// into the transfer read 0 for every later dispatch chunk.
TEST_F(CliTest, TraceFileNamesTheBytesOfEverySboChunk) {
  const std::string trace = dir_ + "/sbo_trace.json";
  RunResult r = run_duet("generate " + dir_ +
                         " --prompt-ids 5,6,7,8,9,10,11,12,13 --max-tokens 3 "
                         "--enable-single-batch-overlap --sbo-combine-chunks 2 "
                         "--all2all-backend low_latency --data-parallel-size 2 "
                         "--enable-expert-parallel --distributed-backend inproc --trace-file " +
                         trace);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const int64_t n_local = 4;  // the tiny preset's 8 experts over 2 ranks
  int64_t dispatch_bytes = 0, combine_bytes = 0, dispatch_spans = 0, combine_spans = 0;
  const std::regex sent(R"(^ep_(dispatch|combine)\(low_latency, chunk\), (\d+) bytes sent$)");
  for (int rank : {0, 1}) {
    const std::string path = dir_ + "/sbo_trace.rank" + std::to_string(rank) + ".json";
    const nlohmann::json t = nlohmann::json::parse(test::read_file(path));
    for (const nlohmann::json& e : t["traceEvents"]) {
      std::smatch m;
      const std::string name = e.value("name", "");
      if (e["ph"] != "X" || !std::regex_match(name, m, sent)) continue;
      const bool dispatch = m[1] == "dispatch";
      (dispatch ? dispatch_bytes : combine_bytes) += std::stoll(m[2]);
      ++(dispatch ? dispatch_spans : combine_spans);
    }
  }
  ASSERT_GT(dispatch_spans, 0);
  EXPECT_EQ(dispatch_spans, combine_spans);
  EXPECT_GT(combine_bytes, 0);
  // Half of the dispatch's spans are first chunks, each with the counts for the other rank.
  EXPECT_EQ(dispatch_bytes - dispatch_spans / 2 * n_local * 4, combine_bytes);
}

// bench overlap runs off, TBO and DBO in each round on one group and prints a row for each, with
// how many steps ran as two micro-batches (none with overlap off; all of them with the thresholds
// alone deciding).
TEST_F(CliTest, BenchOverlapComparesTheModesInOneRun) {
  RunResult r =
      run_duet("bench overlap " + dir_ +
               " --batch 4 --gen-len 3 --rounds 1 --threads 1 --data-parallel-size 2 "
               "--enable-expert-parallel --distributed-backend inproc --dbo-split "
               "thresholds --dbo-decode-token-threshold 2 --dbo-prefill-token-threshold 2");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  for (const char* row : {"\n1     off ", "\n1     tbo ", "\n1     dbo ", "\n1     sbo "}) {
    EXPECT_NE(r.out.find(row), std::string::npos) << row << " in " << r.out;
  }
  EXPECT_NE(r.out.find(" 0/3 "), std::string::npos) << r.out;  // off: no split step
  EXPECT_NE(r.out.find(" 3/3 "), std::string::npos) << r.out;  // tbo, dbo: every step split
  expect_error(run_duet("bench overlap " + dir_ + " --enable-dbo --enable-expert-parallel "
                        "--data-parallel-size 2 --distributed-backend inproc"),
               "runs every mode itself");
  expect_error(run_duet("bench overlap " + dir_ + " --modes off,tbo+dbo --enable-expert-parallel "
                        "--data-parallel-size 2 --distributed-backend inproc"),
               "'tbo+dbo' is not off, tbo or dbo");
  expect_error(run_duet("bench overlap " + dir_ +
                        " --dbo-split sometimes --enable-expert-parallel "
                        "--data-parallel-size 2 --distributed-backend inproc"),
               "--dbo-split");
}

// The SBO modes and bf16 rows, low_latency (the chunked combine), side by side with off.
TEST_F(CliTest, BenchOverlapRunsSboAndBf16Modes) {
  RunResult r = run_duet("bench overlap " + dir_ +
                         " --batch 4 --gen-len 3 --rounds 1 --threads 1 --data-parallel-size 2 "
                         "--enable-expert-parallel --distributed-backend inproc --all2all-backend "
                         "low_latency --modes off,sbo,bf16,tbo+sbo+bf16,sbo3,sbo+fp8/bf16,serial "
                         "--sbo-combine-chunks 2");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  for (const char* row : {"\n1     off ", "\n1     sbo ", "\n1     bf16 ", "\n1     tbo+sbo+bf16 ",
                          "\n1     sbo3 ", "\n1     sbo+fp8/bf16 ", "\n1     serial "})
    EXPECT_NE(r.out.find(row), std::string::npos) << row << " in " << r.out;
}

TEST_F(CliTest, OverlapFlagsAreChecked) {
  const std::string args = "generate " + dir_ + " --prompt-ids 1 ";
  expect_error(run_duet(args + "--enable-dbo"), "needs --enable-expert-parallel");
  expect_error(run_duet(args + "--enable-two-batch-overlap --enable-dbo --enable-expert-parallel"),
               "are alternatives");
  expect_error(run_duet(args + "--enable-dbo --enable-expert-parallel --dbo-decode-token-threshold 1"),
               "must be >= 2");
  expect_error(run_duet(args + "--enable-two-batch-overlap --enable-expert-parallel "
                               "--tbo-token-distribution-threshold 0.7"),
               "must be in [0, 0.5]");
  expect_error(run_duet(args + "--enable-single-batch-overlap"), "need --enable-expert-parallel");
  expect_error(run_duet(args + "--all2all-dtype bf16"), "need --enable-expert-parallel");
  expect_error(run_duet(args + "--all2all-dtype fp4 --enable-expert-parallel"), "fp4");
  expect_error(run_duet(args + "--all2all-combine-dtype bf16"), "need --enable-expert-parallel");
  expect_error(run_duet(args + "--all2all-combine-dtype fp4 --enable-expert-parallel"), "fp4");
  expect_error(run_duet(args + "--sbo-shared-experts never --enable-expert-parallel"), "never");
  expect_error(run_duet(args + "--sbo-own-experts-last both"), "need --enable-expert-parallel");
  expect_error(run_duet(args + "--sbo-own-experts-last maybe --enable-expert-parallel"),
               "'maybe' is not auto, combine, both or off");
  // More cores for communication than a rank has (2 ranks as threads share this machine's).
  const int cores = available_cores();
  expect_error(run_duet(args + "--comm-cores " + std::to_string(cores) +
                        " --enable-expert-parallel --data-parallel-size 2 "
                        "--distributed-backend inproc"),
               "needs at least one left for compute");
}

// generate with each SBO setting and bf16 rows on 2 ranks gives the single-rank tokens, and the
// start-up line says what SBO does.
TEST_F(CliTest, SingleBatchOverlapGenerateEqualsOneRank) {
  const std::string args = "generate " + dir_ + " --prompt-ids 5,6,7,8,9 --max-tokens 4 ";
  auto generated = [&](const std::string& flags) {
    const std::string dump = dir_ + "/sbo_dump.json";
    RunResult r = run_duet(args + flags + " --dump-logits " + dump);
    EXPECT_EQ(r.exit_code, 0) << flags << ": " << r.out;
    return nlohmann::json::parse(test::read_file(dump))["generated"];
  };
  const nlohmann::json want = generated("");
  for (const std::string flags :
       {"--enable-single-batch-overlap --all2all-backend low_latency",
        "--enable-single-batch-overlap --sbo-shared-experts dispatch",
        "--sbo-shared-experts serial",
        "--sbo-own-experts-last combine --all2all-backend low_latency",
        "--sbo-own-experts-last both --all2all-backend low_latency",
        "--enable-single-batch-overlap --sbo-own-experts-last off --all2all-backend low_latency",
        "--sbo-combine-chunks 3 --all2all-backend low_latency --enable-two-batch-overlap",
        "--all2all-dtype bf16"}) {
    EXPECT_EQ(generated(flags + " --data-parallel-size 2 --enable-expert-parallel "
                                "--distributed-backend inproc"),
              want)
        << flags;
  }
  RunResult r = run_duet(args + "--enable-single-batch-overlap --all2all-backend low_latency "
                                "--data-parallel-size 2 --enable-expert-parallel "
                                "--distributed-backend inproc");
  EXPECT_NE(r.out.find("sbo: dispatch and combine in up to 8 chunks of 128+ KiB in whole steps, "
                       "own experts last in whole transfers, shared experts beside the dispatch"),
            std::string::npos)
      << r.out;
}

// --dump-logits on 2 and 4 ranks (the request is rank 0's; the others run dummy batches beside
// it) writes the single-rank dump byte for byte where the products with the model's (bf16) weights
// multiply bf16 pairs, whose sums do not depend on how many rows an expert gets (the other ranks'
// dummy tokens add some). The f32 kernels' token blocks do change a row's summation order with
// the count (Ice Lake, and bf16 weights on Intel's CPUs by default: simd::bf16_isa): there the
// tokens are the same and every logit within 1e-5 of its row's largest.
TEST_F(CliTest, DumpLogitsOnSeveralRanksEqualsOneRank) {
  const bool exact = std::string(matmul_bf16_isa()) == "avx512bf16" ||
                     std::string(matmul_bf16_isa()) == "avx512bf16-emulated";
  const std::string args = "generate " + dir_ + " --prompt-ids 5,6,7,8,9,10,11,12,13 --max-tokens 3 ";
  const std::string one = dir_ + "/dump1.json";
  ASSERT_EQ(run_duet(args + "--dump-logits " + one).exit_code, 0);
  std::vector<std::string> backends = {"inproc"};
  if (std::system("command -v mpirun >/dev/null 2>&1") == 0) backends.push_back("mpi");
  for (const std::string& b : backends) {
    for (int n : {2, 4}) {
      const std::string dump = dir_ + "/dump_" + b + std::to_string(n) + ".json";
      RunResult r = run_duet(args + "--dump-logits " + dump + " --data-parallel-size " +
                             std::to_string(n) + " --enable-expert-parallel --distributed-backend " + b);
      ASSERT_EQ(r.exit_code, 0) << b << " " << n << ": " << r.out;
      if (exact) {
        EXPECT_EQ(test::read_file(dump), test::read_file(one)) << b << " on " << n << " ranks";
        continue;
      }
      const nlohmann::json got = nlohmann::json::parse(test::read_file(dump));
      const nlohmann::json want = nlohmann::json::parse(test::read_file(one));
      EXPECT_EQ(got["tokens"], want["tokens"]) << b << " on " << n << " ranks";
      EXPECT_EQ(got["generated"], want["generated"]) << b << " on " << n << " ranks";
      ASSERT_EQ(got["logits"].size(), want["logits"].size());
      for (size_t i = 0; i < want["logits"].size(); ++i) {
        const std::vector<float> g = got["logits"][i].get<std::vector<float>>();
        const std::vector<float> w = want["logits"][i].get<std::vector<float>>();
        ASSERT_EQ(g.size(), w.size());
        float largest = 0;
        for (float v : w) largest = std::max(largest, std::fabs(v));
        for (size_t k = 0; k < w.size(); ++k) {
          ASSERT_NEAR(g[k], w[k], 1e-5f * largest) << b << " on " << n << " ranks, row " << i;
        }
      }
    }
  }
}

// The scheduler modes from the command line: bench latency runs the batch through the serving
// engine in each mode and prints one row per mode; bad modes and step counts are refused.
TEST_F(CliTest, SchedulerModes) {
  RunResult r = run_duet("bench latency " + dir_ +
                         " --batch 2 --prompt-len 4 --gen-len 6 --rounds 1 --threads 1"
                         " --scheduler-modes plain,overlap,multistep3,overlap+multistep2");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  for (const char* row : {"\nplain ", "\noverlap ", "\nmultistep3 ", "\noverlap+multistep2 "})
    EXPECT_NE(r.out.find(row), std::string::npos) << row << " missing in:\n" << r.out;
  // On two ranks: rank 0 submits both ranks' batches and prints the group's table.
  RunResult two = run_duet("bench latency " + dir_ +
                           " --batch 2 --prompt-len 4 --gen-len 6 --rounds 1 --threads 1"
                           " --scheduler-modes plain,overlap+multistep2 --data-parallel-size 2"
                           " --enable-expert-parallel --distributed-backend inproc");
  ASSERT_EQ(two.exit_code, 0) << two.out;
  EXPECT_NE(two.out.find(", 2 ranks (batch per rank, tok/s of all)"), std::string::npos) << two.out;
  for (const char* row : {"\nplain ", "\noverlap+multistep2 "})
    EXPECT_NE(two.out.find(row), std::string::npos) << row << " missing in:\n" << two.out;
  expect_error(run_duet("bench latency " + dir_ + " --scheduler-modes overlap+turbo"),
               "overlap+turbo");
  expect_error(run_duet("bench latency " + dir_ + " --scheduler-modes multistep0"), "multistep0");
  RunResult bad = run_duet("serve " + dir_ + " --num-scheduler-steps 0");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.out.find("--num-scheduler-steps"), std::string::npos) << bad.out;
  bad = run_duet("serve " + dir_ + " --stream-interval 0");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.out.find("--stream-interval"), std::string::npos) << bad.out;
}

// bench latency samples when asked (every path: the generator, the serving engine's modes) and
// refuses sampling parameters out of range by name.
TEST_F(CliTest, BenchLatencySamples) {
  for (const char* extra : {"", " --scheduler-modes plain,overlap+multistep2"}) {
    RunResult r = run_duet("bench latency " + dir_ +
                           " --batch 3 --prompt-len 4 --gen-len 5 --rounds 1 --threads 1"
                           " --temperature 0.8 --top-p 0.9 --top-k 20" +
                           extra);
    ASSERT_EQ(r.exit_code, 0) << extra << "\n" << r.out;
    EXPECT_NE(r.out.find("decode"), std::string::npos) << r.out;
  }
  expect_error(run_duet("bench latency " + dir_ + " --temperature 0.8 --top-p 0"), "top_p");
  expect_error(run_duet("bench latency " + dir_ + " --temperature 0.8 --top-k -3"), "top_k");
}

TEST_F(CliTest, UnknownOptionsAreRejected) {
  RunResult r = run_duet("generate " + dir_ + " --no-such-flag");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.exit_code, -1);
}

}  // namespace
}  // namespace duet
