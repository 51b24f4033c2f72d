#include "model/safetensors.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "test_util.h"

namespace duet {
namespace {

namespace fs = std::filesystem;
using test::make_temp_dir;
using test::read_file;
using test::write_file;

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(n >> (8 * i));
  return s;
}

// A hand-built file: little-endian header length, the header text as given, then the data.
std::string raw_file(const std::string& header, const std::string& data = "") {
  return le64(header.size()) + header + data;
}

// Bytes that differ per tensor (seed) and per position, so misplaced data shows.
TensorData make_tensor(const std::string& name, DType dtype, std::vector<int64_t> shape, int seed) {
  TensorData t;
  t.name = name;
  t.dtype = dtype;
  t.shape = std::move(shape);
  int64_t n = 1;
  for (int64_t d : t.shape) n *= d;
  t.bytes.resize(static_cast<size_t>(n) * dtype_size(dtype));
  for (size_t i = 0; i < t.bytes.size(); ++i) t.bytes[i] = static_cast<uint8_t>(i * 31 + seed);
  return t;
}

void expect_same(const TensorView& v, const TensorData& t) {
  SCOPED_TRACE(t.name);
  EXPECT_EQ(v.dtype, t.dtype);
  EXPECT_EQ(v.shape, t.shape);
  ASSERT_EQ(v.nbytes(), t.bytes.size());
  ASSERT_NE(v.data, nullptr);
  if (!t.bytes.empty()) {  // memcmp must not see the null data() of an empty vector
    EXPECT_EQ(std::memcmp(v.data, t.bytes.data(), t.bytes.size()), 0);
  }
}

std::set<std::string> list_dir(const std::string& dir) {
  std::set<std::string> names;
  for (const auto& de : fs::directory_iterator(dir)) names.insert(de.path().filename().string());
  return names;
}

// The message of the duet::Error that `fn` throws; fails the test if it throws nothing.
template <typename Fn>
std::string error_of(Fn fn) {
  try {
    fn();
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "message is not one line: " << msg;
    return msg;
  }
  ADD_FAILURE() << "expected a duet::Error";
  return "";
}

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << "in: " << (haystack)

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = make_temp_dir("duet_st_"); }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }

  std::string dir_;
};

// f32, bf16, f16, a zero-size tensor and a scalar: 24, 8, 8, 0 and 4 bytes. With a 16-byte
// shard limit: shard 1 embed_tokens (over the limit alone), shard 2 gate lm_head empty, shard 3
// scale.
std::vector<TensorData> mixed_tensors() {
  std::vector<TensorData> ts;
  ts.push_back(make_tensor("model.embed_tokens.weight", DType::kF32, {2, 3}, 1));
  ts.push_back(make_tensor("model.layers.0.mlp.gate.weight", DType::kBF16, {4}, 2));
  ts.push_back(make_tensor("lm_head.weight", DType::kF16, {2, 2}, 3));
  ts.push_back(make_tensor("empty", DType::kF32, {0, 5}, 4));
  ts.push_back(make_tensor("scale", DType::kF32, {}, 5));
  return ts;
}

TEST_F(SafetensorsTest, RoundTripSingleFile) {
  std::vector<TensorData> ts = mixed_tensors();
  write_safetensors_dir(dir_, ts, 1 << 20);
  EXPECT_EQ(list_dir(dir_), std::set<std::string>{"model.safetensors"});  // no temp files left

  auto file = SafetensorsFile::open(path("model.safetensors"));
  EXPECT_EQ(file->tensors().size(), ts.size());
  for (const TensorData& t : ts) expect_same(file->get(t.name), t);

  SafetensorsSet set = SafetensorsSet::open_dir(dir_);
  std::vector<std::string> want;
  for (const TensorData& t : ts) want.push_back(t.name);
  std::sort(want.begin(), want.end());
  EXPECT_EQ(set.names(), want);
  for (const TensorData& t : ts) {
    expect_same(set.get(t.name), t);
    EXPECT_EQ(set.file_of(t.name), path("model.safetensors"));
  }
  EXPECT_EQ(set.get("scale").numel(), 1);
  EXPECT_EQ(set.get("empty").numel(), 0);
}

TEST_F(SafetensorsTest, HeaderIsPaddedToEightBytesAndKeepsOrder) {
  std::vector<TensorData> ts = mixed_tensors();
  std::vector<const TensorData*> ptrs;
  size_t total = 0;
  for (const TensorData& t : ts) {
    ptrs.push_back(&t);
    total += t.bytes.size();
  }
  write_safetensors(path("a.safetensors"), ptrs);

  std::string raw = read_file(path("a.safetensors"));
  ASSERT_GE(raw.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(raw[i]);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(raw.size(), 8 + n + total);
  std::string header = raw.substr(8, n);
  EXPECT_EQ(header.front(), '{');
  EXPECT_CONTAINS(header, R"("__metadata__":{"format":"pt"})");
  size_t last = header.find_last_not_of(' ');  // the JSON ends; only space padding follows
  EXPECT_EQ(header[last], '}');
  EXPECT_LT(n - 1 - last, 8u);
  for (size_t i = 1; i < ts.size(); ++i) {
    EXPECT_LT(header.find('"' + ts[i - 1].name + '"'), header.find('"' + ts[i].name + '"'));
  }
  auto parsed = nlohmann::json::parse(header);
  EXPECT_EQ(parsed["model.embed_tokens.weight"]["dtype"], "F32");
  EXPECT_EQ(parsed["model.layers.0.mlp.gate.weight"]["dtype"], "BF16");
  EXPECT_EQ(parsed["lm_head.weight"]["dtype"], "F16");
  EXPECT_EQ(parsed["scale"]["shape"], nlohmann::json::array());
}

TEST_F(SafetensorsTest, RoundTripSharded) {
  // Bytes: 40, 40, 40, 200, 8, 4, 0 with a 100-byte limit. Greedy fill in order:
  //   shard 1: a b (80)   shard 2: c (40)   shard 3: big (200, over the limit alone)
  //   shard 4: d scale empty (12)
  std::vector<TensorData> ts;
  ts.push_back(make_tensor("a", DType::kF32, {10}, 1));
  ts.push_back(make_tensor("b", DType::kBF16, {4, 5}, 2));
  ts.push_back(make_tensor("c", DType::kF16, {20}, 3));
  ts.push_back(make_tensor("big", DType::kF32, {5, 10}, 4));
  ts.push_back(make_tensor("d", DType::kF32, {2}, 5));
  ts.push_back(make_tensor("scale", DType::kF32, {}, 6));
  ts.push_back(make_tensor("empty", DType::kBF16, {3, 0}, 7));
  write_safetensors_dir(dir_, ts, 100);

  const std::string s1 = "model-00001-of-00004.safetensors";
  const std::string s2 = "model-00002-of-00004.safetensors";
  const std::string s3 = "model-00003-of-00004.safetensors";
  const std::string s4 = "model-00004-of-00004.safetensors";
  EXPECT_EQ(list_dir(dir_),
            (std::set<std::string>{s1, s2, s3, s4, "model.safetensors.index.json"}));

  auto index = nlohmann::json::parse(read_file(path("model.safetensors.index.json")));
  EXPECT_EQ(index["metadata"]["total_size"], 332);
  EXPECT_EQ(
      index["weight_map"],
      (nlohmann::json{
          {"a", s1}, {"b", s1}, {"c", s2}, {"big", s3}, {"d", s4}, {"scale", s4}, {"empty", s4}}));

  SafetensorsSet set = SafetensorsSet::open_dir(dir_);
  EXPECT_EQ(set.names().size(), ts.size());
  for (const TensorData& t : ts) expect_same(set.get(t.name), t);
  EXPECT_EQ(set.file_of("a"), path(s1));
  EXPECT_EQ(set.file_of("big"), path(s3));
  EXPECT_EQ(set.file_of("empty"), path(s4));
}

TEST_F(SafetensorsTest, ViewsStayValidWhileACopyOfTheSetLives) {
  std::vector<TensorData> ts = mixed_tensors();
  write_safetensors_dir(dir_, ts, 16);  // 3 shards
  SafetensorsSet copy;
  {
    SafetensorsSet set = SafetensorsSet::open_dir(dir_);
    copy = set;
  }
  for (const TensorData& t : ts) expect_same(copy.get(t.name), t);
}

TEST_F(SafetensorsTest, RewritingAsOneFileRemovesTheStaleIndexAndShards) {
  write_safetensors_dir(dir_, mixed_tensors(), 16);
  ASSERT_TRUE(fs::exists(path("model.safetensors.index.json")));
  fs::create_directories(path("sub"));
  write_file(path("config.json"), "{}");

  std::vector<TensorData> ts = {make_tensor("only", DType::kBF16, {3}, 9)};
  write_safetensors_dir(dir_, ts, 1 << 20);
  EXPECT_EQ(list_dir(dir_), (std::set<std::string>{"model.safetensors", "config.json", "sub"}));
  SafetensorsSet set = SafetensorsSet::open_dir(dir_);
  EXPECT_EQ(set.names(), std::vector<std::string>{"only"});
  expect_same(set.get("only"), ts[0]);
}

TEST_F(SafetensorsTest, UnalignedDataIsReadInPlace) {
  // An unpadded header of odd length and a tensor at data offset 0, as a careless writer might
  // produce: the data pointer is not 4-aligned.
  std::string header = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  if (header.size() % 2 == 0) header += ' ';
  const float values[2] = {1.5f, -2.25f};
  std::string data(reinterpret_cast<const char*>(values), sizeof values);
  write_file(path("u.safetensors"), raw_file(header, data));

  auto file = SafetensorsFile::open(path("u.safetensors"));
  const TensorView& v = file->get("x");
  EXPECT_NE(reinterpret_cast<uintptr_t>(v.data) % 4, 0u);
  float got[2];
  std::memcpy(got, v.data, sizeof got);
  EXPECT_EQ(got[0], 1.5f);
  EXPECT_EQ(got[1], -2.25f);
  EXPECT_EQ(file->get("x").data, v.data);  // a view, not a copy
}

TEST_F(SafetensorsTest, MetadataIsIgnoredAndAFileMayHoldNoTensors) {
  write_file(path("m.safetensors"), raw_file(R"({"__metadata__":{"format":"pt","x":"y"}})"));
  EXPECT_TRUE(SafetensorsFile::open(path("m.safetensors"))->tensors().empty());

  write_file(path("n.safetensors"), raw_file("{}   "));
  EXPECT_TRUE(SafetensorsFile::open(path("n.safetensors"))->tensors().empty());
}

TEST_F(SafetensorsTest, WriterChecksByteCountAndNames) {
  TensorData t = make_tensor("w", DType::kF32, {4, 8}, 1);
  t.bytes.resize(96);
  std::string msg = error_of([&] { write_safetensors(path("w.safetensors"), {&t}); });
  EXPECT_CONTAINS(msg, "'w'");
  EXPECT_CONTAINS(msg, "needs 128");
  EXPECT_FALSE(fs::exists(path("w.safetensors")));

  TensorData u = make_tensor("w", DType::kF32, {1}, 1);
  error_of([&] { write_safetensors(path("w.safetensors"), {&u, &u}); });
  EXPECT_TRUE(list_dir(dir_).empty());
}

TEST_F(SafetensorsTest, WriteIntoMissingDirectoryNamesThePath) {
  TensorData t = make_tensor("w", DType::kF32, {1}, 1);
  const std::string p = path("no/such/dir/x.safetensors");
  std::string msg = error_of([&] { write_safetensors(p, {&t}); });
  EXPECT_EQ(msg.rfind(p, 0), 0u) << msg;
  EXPECT_CONTAINS(msg, "No such file or directory");
}

TEST_F(SafetensorsTest, MissingFile) {
  const std::string p = path("nope.safetensors");
  EXPECT_EQ(error_of([&] { SafetensorsFile::open(p); }),
            p + ": cannot open: No such file or directory");
}

TEST_F(SafetensorsTest, DirectoryIsNotAFile) {
  std::string msg = error_of([&] { SafetensorsFile::open(dir_); });
  EXPECT_EQ(msg, dir_ + ": not a regular file");
}

TEST_F(SafetensorsTest, MissingTensorInFile) {
  write_file(path("m.safetensors"), raw_file("{}"));
  auto file = SafetensorsFile::open(path("m.safetensors"));
  EXPECT_FALSE(file->has("x"));
  EXPECT_EQ(error_of([&] { file->get("x"); }), path("m.safetensors") + ": missing tensor 'x'");
}

// ---- Hostile files, built byte by byte ----

struct BadFile {
  const char* label;
  std::string bytes;
  std::vector<std::string> expect;  // pieces the message must contain (besides the path)
};

std::string entry(const std::string& name, const std::string& body) {
  return R"({")" + name + R"(":)" + body + "}";
}

// 1000 bytes of 'é': messages cut it, on a character boundary.
std::string long_name() {
  std::string s;
  for (int i = 0; i < 500; ++i) s += "\xc3\xa9";
  return s;
}

const std::string kW = "model.layers.0.mlp.experts.0.w1.weight";

std::vector<BadFile> bad_files() {
  const std::string w = "tensor '" + kW + "'";
  auto one = [&](const std::string& body, const std::string& data = std::string(16, 'x')) {
    return raw_file(entry(kW, body), data);
  };
  return {
      {"too_short", "\x01\x02\x03", {"3 bytes", "too short", "truncated"}},
      {"empty_file", "", {"0 bytes", "too short"}},
      {"header_past_end",
       le64(1000) + "{}",
       {"header length 1000", "runs past the end", "truncated"}},
      {"header_length_huge", le64(~uint64_t{0}) + "{}", {"runs past the end"}},
      {"not_json", raw_file(R"({"x": )"), {"header is not valid JSON"}},
      {"not_utf8", raw_file("{\"\xff\":1}"), {"header is not valid JSON"}},
      {"not_object", raw_file("[1, 2]"), {"header must be a JSON object", "array"}},
      {"entry_not_object", one("5"), {w, "entry must be a JSON object"}},
      {"missing_dtype", one(R"({"shape":[4],"data_offsets":[0,16]})"), {w, R"(missing "dtype")"}},
      {"missing_shape", one(R"({"dtype":"F32","data_offsets":[0,16]})"), {w, R"(missing "shape")"}},
      {"missing_offsets", one(R"({"dtype":"F32","shape":[4]})"), {w, R"(missing "data_offsets")"}},
      {"dtype_not_string",
       one(R"({"dtype":7,"shape":[4],"data_offsets":[0,16]})"),
       {w, R"("dtype" must be a string)"}},
      {"dtype_f8_e5m2",
       one(R"({"dtype":"F8_E5M2","shape":[16],"data_offsets":[0,16]})"),
       {w, "unsupported dtype 'F8_E5M2' (expected F32, F16, BF16, F8_E4M3, I32 or I64)"}},
      {"dtype_f64",
       one(R"({"dtype":"F64","shape":[2],"data_offsets":[0,16]})"),
       {w, "unsupported dtype 'F64'"}},
      {"dtype_i16",
       one(R"({"dtype":"I16","shape":[2],"data_offsets":[0,4]})"),
       {w, "unsupported dtype 'I16'"}},
      {"dtype_lowercase",
       one(R"({"dtype":"f32","shape":[4],"data_offsets":[0,16]})"),
       {w, "unsupported dtype 'f32'"}},
      {"shape_not_array",
       one(R"({"dtype":"F32","shape":4,"data_offsets":[0,16]})"),
       {w, R"("shape" must be an array of integers)"}},
      {"shape_float",
       one(R"({"dtype":"F32","shape":[2.5],"data_offsets":[0,16]})"),
       {w, R"("shape" must be an array of integers)"}},
      {"shape_string",
       one(R"({"dtype":"F32","shape":["4"],"data_offsets":[0,16]})"),
       {w, R"("shape" must be an array of integers)"}},
      {"negative_dim",
       one(R"({"dtype":"F32","shape":[4,-2],"data_offsets":[0,16]})"),
       {w, "negative dimension -2"}},
      {"offsets_reversed",
       one(R"({"dtype":"F32","shape":[1],"data_offsets":[8,4]})"),
       {w, "data_offsets", "begin <= end"}},
      {"offsets_three",
       one(R"({"dtype":"F32","shape":[1],"data_offsets":[0,4,8]})"),
       {w, "data_offsets", "[begin, end]"}},
      {"offsets_negative",
       one(R"({"dtype":"F32","shape":[1],"data_offsets":[-4,0]})"),
       {w, "data_offsets"}},
      {"offsets_not_array",
       one(R"({"dtype":"F32","shape":[1],"data_offsets":"0"})"),
       {w, "data_offsets"}},
      {"size_mismatch",
       one(R"({"dtype":"F32","shape":[4,8],"data_offsets":[0,96]})", std::string(96, 'x')),
       {w, "header says 96 bytes but dtype F32 × shape [4, 8] needs 128"}},
      {"size_overflow",
       one(R"({"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,16]})"),
       {w, "needs more than 2^64 bytes"}},
      {"truncated",
       one(R"({"dtype":"F32","shape":[4],"data_offsets":[0,16]})", "0123456789"),
       {w, "data [0, 16) runs past the end of the file", "truncated?"}},
      {"offset_beyond_u64",
       one(R"({"dtype":"F32","shape":[1],"data_offsets":[18446744073709551612,18446744073709551615]})"),
       {w, "header says 3 bytes"}},
      {"overlap",
       raw_file(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                R"("b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
                std::string(24, 'x')),
       {"tensor 'b'", "overlaps tensor 'a' [0, 16)"}},
      {"overlap_nested",
       raw_file(R"({"a":{"dtype":"BF16","shape":[16],"data_offsets":[0,32]},)"
                R"("b":{"dtype":"F32","shape":[1],"data_offsets":[20,24]},)"
                R"("c":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                std::string(32, 'x')),
       {"tensor 'c'", "overlaps tensor 'a'"}},
      {"name_with_newline",
       raw_file(R"({"bad\nname":{"dtype":"F64","shape":[],"data_offsets":[0,8]}})",
                std::string(8, 'x')),
       {"tensor 'bad\\x0aname'", "unsupported dtype 'F64'"}},
      {"long_name",
       raw_file(entry(long_name(), R"({"dtype":"F64","shape":[],"data_offsets":[0,8]})"),
                std::string(8, 'x')),
       {"tensor '\xc3\xa9\xc3\xa9", "\xc3\xa9...': unsupported dtype 'F64'"}},
  };
}

class SafetensorsBadFileTest : public SafetensorsTest,
                               public ::testing::WithParamInterface<BadFile> {};

TEST_P(SafetensorsBadFileTest, OpenFailsNamingFileAndTensor) {
  const BadFile& bad = GetParam();
  const std::string p = path("model.safetensors");
  write_file(p, bad.bytes);
  std::string msg = error_of([&] { SafetensorsFile::open(p); });
  EXPECT_EQ(msg.rfind(p + ": ", 0), 0u) << "message must start with the path: " << msg;
  for (const std::string& piece : bad.expect) EXPECT_CONTAINS(msg, piece);

  // The same failure surfaces, unchanged, through the directory reader.
  EXPECT_EQ(error_of([&] { SafetensorsSet::open_dir(dir_); }), msg);
}

INSTANTIATE_TEST_SUITE_P(Hostile, SafetensorsBadFileTest, ::testing::ValuesIn(bad_files()),
                         [](const ::testing::TestParamInfo<BadFile>& info) {
                           return std::string(info.param.label);
                         });

TEST_F(SafetensorsTest, TruncatedMessageGivesTheFileSize) {
  std::string bytes =
      raw_file(entry("w", R"({"dtype":"F32","shape":[4],"data_offsets":[0,16]})"), "0123456789");
  write_file(path("t.safetensors"), bytes);
  std::string msg = error_of([&] { SafetensorsFile::open(path("t.safetensors")); });
  EXPECT_CONTAINS(msg, "(" + std::to_string(bytes.size()) + " bytes");
}

// ---- Directories ----

TEST_F(SafetensorsTest, MissingTensorInSet) {
  write_safetensors_dir(dir_, mixed_tensors(), 1 << 20);
  SafetensorsSet set = SafetensorsSet::open_dir(dir_);
  EXPECT_FALSE(set.has("model.norm.weight"));
  EXPECT_EQ(error_of([&] { set.get("model.norm.weight"); }),
            dir_ + ": missing tensor 'model.norm.weight'");
  EXPECT_EQ(error_of([&] { set.file_of("model.norm.weight"); }),
            dir_ + ": missing tensor 'model.norm.weight'");
}

TEST_F(SafetensorsTest, IndexPointingToMissingShard) {
  write_safetensors_dir(dir_, mixed_tensors(), 16);
  const std::string shard = "model-00002-of-00003.safetensors";
  ASSERT_TRUE(fs::remove(path(shard)));
  std::string msg = error_of([&] { SafetensorsSet::open_dir(dir_); });
  EXPECT_EQ(msg.rfind(path("model.safetensors.index.json") + ": tensor '", 0), 0u) << msg;
  EXPECT_CONTAINS(msg, "is mapped to '" + shard + "', which cannot be opened: " + path(shard) +
                           ": cannot open: No such file or directory");
}

TEST_F(SafetensorsTest, IndexNamingATensorItsShardLacks) {
  write_safetensors_dir(dir_, mixed_tensors(), 16);
  const std::string index_path = path("model.safetensors.index.json");
  auto index = nlohmann::json::parse(read_file(index_path));
  index["weight_map"]["ghost.weight"] = "model-00001-of-00003.safetensors";
  write_file(index_path, index.dump());
  std::string msg = error_of([&] { SafetensorsSet::open_dir(dir_); });
  EXPECT_CONTAINS(msg, index_path +
                           ": tensor 'ghost.weight' is mapped to "
                           "'model-00001-of-00003.safetensors'");
  EXPECT_CONTAINS(msg, path("model-00001-of-00003.safetensors") + " has no such tensor");
}

TEST_F(SafetensorsTest, CorruptShardIsNamedThroughTheIndex) {
  write_safetensors_dir(dir_, mixed_tensors(), 16);
  const std::string shard = path("model-00001-of-00003.safetensors");
  std::string bytes = read_file(shard);
  write_file(shard, bytes.substr(0, bytes.size() - 1));
  std::string msg = error_of([&] { SafetensorsSet::open_dir(dir_); });
  EXPECT_CONTAINS(msg, "model.safetensors.index.json");
  EXPECT_CONTAINS(msg, shard + ": tensor '");
  EXPECT_CONTAINS(msg, "truncated?");
}

TEST_F(SafetensorsTest, BadIndexFiles) {
  const std::string index_path = path("model.safetensors.index.json");
  struct Case {
    std::string text;
    std::string expect;
  };
  for (const Case& c : std::vector<Case>{
           {"{oops", "not valid JSON"},
           {"[]", R"("weight_map")"},
           {R"({"metadata":{"total_size":4}})", R"("weight_map")"},
           {R"({"weight_map":[]})", R"("weight_map")"},
           {R"({"weight_map":{}})", R"("weight_map" is empty)"},
           {R"({"weight_map":{"w":3}})", "tensor 'w' must map to a file name"},
       }) {
    SCOPED_TRACE(c.text);
    write_file(index_path, c.text);
    std::string msg = error_of([&] { SafetensorsSet::open_dir(dir_); });
    EXPECT_EQ(msg.rfind(index_path + ": ", 0), 0u) << msg;
    EXPECT_CONTAINS(msg, c.expect);
  }
}

TEST_F(SafetensorsTest, NoSafetensorsInDir) {
  write_file(path("config.json"), "{}");
  EXPECT_EQ(error_of([&] { SafetensorsSet::open_dir(dir_); }),
            dir_ +
                ": no .safetensors files (expected model.safetensors or "
                "model.safetensors.index.json)");
}

TEST_F(SafetensorsTest, DirThatDoesNotExist) {
  EXPECT_EQ(error_of([&] { SafetensorsSet::open_dir(path("gone")); }),
            path("gone") + ": cannot open: No such file or directory");
  write_file(path("plain"), "x");
  EXPECT_EQ(error_of([&] { SafetensorsSet::open_dir(path("plain")); }),
            path("plain") + ": not a directory");
}

TEST_F(SafetensorsTest, WithoutIndexEverySafetensorsFileIsRead) {
  TensorData a = make_tensor("a", DType::kF32, {3}, 1);
  TensorData b = make_tensor("b", DType::kBF16, {5}, 2);
  write_safetensors(path("b-part.safetensors"), {&b});
  write_safetensors(path("a-part.safetensors"), {&a});
  write_file(path("notes.txt"), "not weights");
  SafetensorsSet set = SafetensorsSet::open_dir(dir_ + "/");
  EXPECT_EQ(set.names(), (std::vector<std::string>{"a", "b"}));
  expect_same(set.get("a"), a);
  expect_same(set.get("b"), b);
  EXPECT_EQ(set.file_of("a"), path("a-part.safetensors"));
  EXPECT_EQ(set.file_of("b"), path("b-part.safetensors"));
}

TEST_F(SafetensorsTest, SameTensorInTwoFiles) {
  TensorData x = make_tensor("x", DType::kF32, {3}, 1);
  write_safetensors(path("a.safetensors"), {&x});
  write_safetensors(path("b.safetensors"), {&x});
  std::string msg = error_of([&] { SafetensorsSet::open_dir(dir_); });
  EXPECT_EQ(msg.rfind(dir_ + ": tensor 'x' is in both ", 0), 0u) << msg;
  EXPECT_CONTAINS(msg, path("a.safetensors"));
  EXPECT_CONTAINS(msg, path("b.safetensors"));
}

}  // namespace
}  // namespace duet
