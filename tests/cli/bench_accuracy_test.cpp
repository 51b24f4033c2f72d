// `duet bench accuracy` end to end on a tiny model: a format that is the reference itself scores
// KL 0 and full top-1 agreement, a quantized one and an fp8 checkpoint of the same weights are
// scored on the positions llama-perplexity scores, and bad options end with one error line.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "cli/run_duet.h"
#include "test_util.h"

namespace duet {
namespace {

using test::run_duet;
using test::RunResult;

// The table row of `format`: MiB, mean KL, its s.e., 99% KL, max KL, top-1 %, its s.e.,
// positions. Empty if there is no such row.
std::vector<double> row(const std::string& out, const std::string& format) {
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    const std::string head = "  " + format + " ";
    if (line.rfind(head, 0) != 0) continue;
    std::istringstream fields(line.substr(head.size()));
    std::vector<double> v;
    for (double x; fields >> x;) v.push_back(x);
    return v;
  }
  return {};
}

class BenchAccuracyTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string root = test::make_temp_dir("duet-accuracy-");
    dir_ = root + "/model";
    fp8_dir_ = root + "/fp8";
    for (const auto& [dir, dtype] : {std::pair{dir_, "bf16"}, std::pair{fp8_dir_, "fp8"}}) {
      RunResult r = run_duet("make-model " + dir + " --arch qwen3_moe --preset tiny --seed 3 " +
                             "--dtype " + dtype);
      ASSERT_EQ(r.exit_code, 0) << r.out;
    }
  }
  static std::string dir_, fp8_dir_;
};
std::string BenchAccuracyTest::dir_, BenchAccuracyTest::fp8_dir_;

TEST_F(BenchAccuracyTest, ReferenceAgainstItselfIsExactAndFormatsAreScored) {
  RunResult r = run_duet("bench accuracy " + dir_ + " --quantizations none,int8 --compare " + dir_ +
                         " --compare " + fp8_dir_ + " --ctx 32 --chunks 3 --threads 1");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  // 3 chunks of 32, positions 16 to 30 of each: 45 positions.
  EXPECT_NE(r.out.find("3 chunks of 32, positions 16 to 30"), std::string::npos) << r.out;
  for (const std::string self : {"none", "model"}) {
    const std::vector<double> v = row(r.out, self);
    ASSERT_EQ(v.size(), 8u) << self << "\n" << r.out;
    EXPECT_EQ(v[1], 0.0) << self;    // mean KL
    EXPECT_EQ(v[4], 0.0) << self;    // max KL
    EXPECT_EQ(v[5], 100.0) << self;  // top-1 %
    EXPECT_EQ(v[7], 45.0) << self;
  }
  for (const std::string other : {"int8", "fp8"}) {
    const std::vector<double> v = row(r.out, other);
    ASSERT_EQ(v.size(), 8u) << other << "\n" << r.out;
    EXPECT_GT(v[1], 0.0) << other;  // rounded weights move the distributions a little
    EXPECT_LT(v[1], 0.1) << other;  // but not far
    EXPECT_LE(v[1], v[4]) << other;
    EXPECT_LE(v[3], v[4]) << other;
    EXPECT_GE(v[5], 50.0) << other;
    EXPECT_EQ(v[7], 45.0) << other;
  }
  // The fp8 checkpoint holds fewer bytes than the bf16 one (int8 does not on the tiny model,
  // whose 32- and 64-wide rows are padded to 128 columns).
  EXPECT_LT(row(r.out, "fp8")[0], row(r.out, "none")[0]);
}

TEST_F(BenchAccuracyTest, TextFileIsRead) {
  const std::string text = dir_ + "/../text.txt";
  std::string s;
  for (int i = 0; i < 40; ++i) s += "one two three four five six seven eight nine ten. ";
  test::write_file(text, s);
  RunResult r = run_duet("bench accuracy " + dir_ + " --quantizations none --text " + text +
                         " --ctx 16 --threads 1");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("text " + text + ": "), std::string::npos) << r.out;
  const std::vector<double> v = row(r.out, "none");
  ASSERT_EQ(v.size(), 8u) << r.out;
  EXPECT_EQ(v[1], 0.0);
}

void expect_error(const RunResult& r, const std::string& needle) {
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_EQ(r.out.rfind("error: ", 0), 0u) << r.out;
  EXPECT_NE(r.out.find(needle), std::string::npos) << r.out;
}

TEST_F(BenchAccuracyTest, BadOptionsAreRefused) {
  expect_error(run_duet("bench accuracy " + dir_), "nothing to compare");
  expect_error(run_duet("bench accuracy " + dir_ + " --quantizations int9"), "int9");
  expect_error(run_duet("bench accuracy " + dir_ + " --quantizations int8 --ctx 100000"),
               "--ctx 100000");
  expect_error(run_duet("bench accuracy " + dir_ + " --quantizations int8 --text /nonexistent"),
               "/nonexistent");
}

}  // namespace
}  // namespace duet
