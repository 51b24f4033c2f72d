// Safetensors reading (mmap + header validation) and writing (atomic, HF-compatible sharding).
#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>

#include "core/error.h"

namespace duet {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr const char* kSingleName = "model.safetensors";
// The reference implementation refuses larger headers; so do we, before parsing them.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr size_t kMaxQuoted = 200;

// Text for a one-line message: control characters (and, if `ascii`, every byte >= 0x80, which
// may not be valid UTF-8) escaped as \xNN; cut to at most max_len bytes on a UTF-8 boundary.
std::string printable(std::string_view s, bool ascii, size_t max_len = kMaxQuoted) {
  size_t n = std::min(s.size(), max_len);
  while (n < s.size() && n > 0 && (static_cast<unsigned char>(s[n]) & 0xc0) == 0x80) --n;
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f || (ascii && c >= 0x80)) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  if (n < s.size()) out += "...";
  return out;
}

// 'name' (names come from parsed JSON, so they are valid UTF-8).
std::string quote(std::string_view s) {
  return "'" + printable(s, false) + "'";
}

// A JSON value for a message, kept short.
std::string clip(const json& j) {
  return printable(j.dump(), false);
}

// nlohmann's "[json.exception.parse_error.101] parse error at ..." without the bracketed id.
std::string json_error(const json::exception& e) {
  std::string s = e.what();
  if (size_t p = s.find("] "); !s.empty() && s[0] == '[' && p != std::string::npos) {
    s = s.substr(p + 2);
  }
  return printable(s, true, 4 * kMaxQuoted);  // "last read: '...'" quotes raw input bytes
}

std::string join_path(const std::string& dir, const std::string& name) {
  return (fs::path(dir) / name).string();
}

bool parse_dtype(const std::string& s, DType* out) {
  for (DType t :
       {DType::kF32, DType::kF16, DType::kBF16, DType::kF8E4M3, DType::kI32, DType::kI64}) {
    if (s == dtype_name(t)) {
      *out = t;
      return true;
    }
  }
  return false;
}

// One validated header entry; offsets are relative to the start of the data section.
struct Entry {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;
  uint64_t end = 0;
};

const json& field(const std::string& at, const json& entry, const char* key) {
  auto it = entry.find(key);
  if (it == entry.end()) DUET_ERROR(at << ": missing \"" << key << "\"");
  return *it;
}

std::vector<int64_t> parse_shape(const std::string& at, const json& j) {
  if (!j.is_array()) DUET_ERROR(at << ": \"shape\" must be an array of integers, got " << clip(j));
  std::vector<int64_t> shape;
  for (const json& d : j) {
    if (d.is_number_unsigned()) {
      uint64_t u = d.get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        DUET_ERROR(at << ": dimension " << u << " in shape " << clip(j) << " is too large");
      }
      shape.push_back(static_cast<int64_t>(u));
    } else if (d.is_number_integer()) {
      DUET_ERROR(at << ": negative dimension " << d.get<int64_t>() << " in shape " << clip(j));
    } else {
      DUET_ERROR(at << ": \"shape\" must be an array of integers, got " << clip(j));
    }
  }
  return shape;
}

Entry parse_entry(const std::string& path, const std::string& name, const json& j) {
  const std::string at = path + ": tensor " + quote(name);
  if (!j.is_object()) DUET_ERROR(at << ": entry must be a JSON object, got " << clip(j));
  Entry e;
  e.name = name;

  const json& dtype = field(at, j, "dtype");
  if (!dtype.is_string()) DUET_ERROR(at << ": \"dtype\" must be a string, got " << clip(dtype));
  if (!parse_dtype(dtype.get<std::string>(), &e.dtype)) {
    DUET_ERROR(at << ": unsupported dtype " << quote(dtype.get<std::string>())
                  << " (expected F32, F16, BF16, F8_E4M3, I32 or I64)");
  }

  e.shape = parse_shape(at, field(at, j, "shape"));

  const json& offsets = field(at, j, "data_offsets");
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned() || offsets[0].get<uint64_t>() > offsets[1].get<uint64_t>()) {
    DUET_ERROR(at << ": \"data_offsets\" must be [begin, end] with 0 <= begin <= end, got "
                  << clip(offsets));
  }
  e.begin = offsets[0].get<uint64_t>();
  e.end = offsets[1].get<uint64_t>();

  uint64_t need = dtype_size(e.dtype);
  for (int64_t d : e.shape) {
    if (__builtin_mul_overflow(need, static_cast<uint64_t>(d), &need)) {
      DUET_ERROR(at << ": dtype " << dtype_name(e.dtype) << " × shape " << shape_str(e.shape)
                    << " needs more than 2^64 bytes");
    }
  }
  if (e.end - e.begin != need) {
    DUET_ERROR(at << ": header says " << e.end - e.begin << " bytes but dtype "
                  << dtype_name(e.dtype) << " × shape " << shape_str(e.shape) << " needs " << need);
  }
  return e;
}

// Every range lies inside the data section and no two non-empty ranges share a byte.
void check_ranges(const std::string& path, std::vector<Entry>& entries, uint64_t data_size,
                  uint64_t file_size) {
  for (const Entry& e : entries) {
    if (e.end > data_size) {
      DUET_ERROR(path << ": tensor " << quote(e.name) << ": data [" << e.begin << ", " << e.end
                      << ") runs past the end of the file (" << file_size
                      << " bytes; the data section holds " << data_size << "): truncated?");
    }
  }
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.begin < b.begin; });
  const Entry* reach = nullptr;  // the non-empty entry reaching furthest so far
  for (const Entry& e : entries) {
    if (e.begin == e.end) continue;
    if (reach && e.begin < reach->end) {
      DUET_ERROR(path << ": tensor " << quote(e.name) << ": data [" << e.begin << ", " << e.end
                      << ") overlaps tensor " << quote(reach->name) << " [" << reach->begin << ", "
                      << reach->end << ")");
    }
    if (!reach || e.end > reach->end) reach = &e;
  }
}

// Parses the header of a mapped file; returns the entries and sets *data_start (file offset).
std::vector<Entry> parse_header(const std::string& path, const uint8_t* base, uint64_t size,
                                uint64_t* data_start) {
  if (size < 8) {
    DUET_ERROR(path << ": file is " << size
                    << " bytes, too short for the 8-byte header length: truncated or not a "
                       "safetensors file?");
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | base[i];
  if (n > size - 8) {
    DUET_ERROR(path << ": header length " << n << " runs past the end of the file (" << size
                    << " bytes): truncated or not a safetensors file?");
  }
  if (n > kMaxHeaderBytes) {
    DUET_ERROR(path << ": header length " << n << " exceeds the limit of " << kMaxHeaderBytes
                    << " bytes: not a safetensors file?");
  }
  json header;
  try {
    const char* text = reinterpret_cast<const char*>(base + 8);
    header = json::parse(text, text + n);
  } catch (const json::exception& e) {
    DUET_ERROR(path << ": header is not valid JSON: " << json_error(e));
  }
  if (!header.is_object()) {
    DUET_ERROR(path << ": header must be a JSON object, got " << header.type_name());
  }
  std::vector<Entry> entries;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") continue;
    entries.push_back(parse_entry(path, name, value));
  }
  *data_start = 8 + n;
  check_ranges(path, entries, size - *data_start, size);
  return entries;
}

std::string errno_str(int e) {
  return std::strerror(e);
}

std::string read_text_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) DUET_ERROR(path << ": cannot open: " << errno_str(errno));
  std::string out;
  char buf[1 << 16];
  for (;;) {
    ssize_t r = ::read(fd, buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      int e = errno;
      ::close(fd);
      DUET_ERROR(path << ": cannot read: " << errno_str(e));
    }
    if (r == 0) break;
    out.append(buf, static_cast<size_t>(r));
  }
  ::close(fd);
  return out;
}

// ---- Writing ----

struct Chunk {
  const void* data;
  size_t size;
};

void write_all(int fd, const Chunk& c, const std::string& path) {
  const char* p = static_cast<const char*>(c.data);
  size_t left = c.size;
  while (left > 0) {
    ssize_t w = ::write(fd, p, left);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) DUET_ERROR(path << ": cannot write: " << errno_str(errno));
    p += w;
    left -= static_cast<size_t>(w);
  }
}

// Writes the chunks to "<path>.tmp-<pid>", syncs, and renames it over `path`, so a crash leaves
// either the old file or the complete new one under the real name, never a partial file.
void write_atomically(const std::string& path, const std::vector<Chunk>& chunks) {
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) DUET_ERROR(path << ": cannot create " << tmp << ": " << errno_str(errno));
  try {
    for (const Chunk& c : chunks) write_all(fd, c, path);
    if (::fsync(fd) != 0) DUET_ERROR(path << ": cannot sync: " << errno_str(errno));
    int rc = ::close(fd);
    fd = -1;
    if (rc != 0) DUET_ERROR(path << ": cannot write: " << errno_str(errno));
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
      DUET_ERROR(path << ": cannot rename " << tmp << " to it: " << errno_str(errno));
    }
  } catch (...) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  // Make the rename itself durable; failing to sync the directory is not worth an error.
  std::string parent = fs::path(path).parent_path().string();
  int dfd = ::open(parent.empty() ? "." : parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

std::string shard_name(size_t i, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i, n);
  return buf;
}

// "model-NNNNN-of-NNNNN.safetensors", the names write_safetensors_dir gives shards.
bool is_shard_name(const std::string& s) {
  const std::string_view pattern = "model-#####-of-#####.safetensors";
  if (s.size() != pattern.size()) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    if (pattern[i] == '#' ? !std::isdigit(static_cast<unsigned char>(s[i])) : s[i] != pattern[i]) {
      return false;
    }
  }
  return true;
}

// Removes outputs of an earlier write_safetensors_dir that this one did not rewrite, so that
// e.g. a stale index cannot shadow a fresh model.safetensors.
void remove_stale(const std::string& dir, const std::set<std::string>& written) {
  std::error_code ec;
  for (const auto& de : fs::directory_iterator(dir, ec)) {
    const std::string name = de.path().filename().string();
    if (written.count(name)) continue;
    if (name == kSingleName || name == kIndexName || is_shard_name(name)) fs::remove(de.path(), ec);
  }
}

}  // namespace

// ---- SafetensorsFile ----

std::unique_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) DUET_ERROR(path << ": cannot open: " << errno_str(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    DUET_ERROR(path << ": cannot stat: " << errno_str(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    DUET_ERROR(path << ": not a regular file");
  }
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size > 0) {
    void* m = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      DUET_ERROR(path << ": cannot mmap " << size << " bytes: " << errno_str(e));
    }
    f->map_ = m;
    f->map_size_ = size;
  }
  ::close(fd);  // the mapping keeps the file alive

  const auto* base = static_cast<const uint8_t*>(f->map_);
  uint64_t data_start = 0;
  for (Entry& e : parse_header(path, base, size, &data_start)) {
    TensorView v;
    v.dtype = e.dtype;
    v.shape = std::move(e.shape);
    // Straight into the mapping, no copy. Safetensors data may begin at any byte offset, so
    // consumers must not assume `data` is aligned for its dtype (use memcpy or unaligned loads).
    v.data = base + data_start + e.begin;
    f->tensors_.emplace(std::move(e.name), std::move(v));
  }
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, map_size_);
}

const TensorView& SafetensorsFile::get(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) DUET_ERROR(path_ << ": missing tensor " << quote(name));
  return it->second;
}

// ---- SafetensorsSet ----

namespace {

struct Loaded {
  std::vector<std::shared_ptr<SafetensorsFile>> files;
  std::map<std::string, size_t> where;
};

Loaded load_index(const std::string& dir, const std::string& index_path) {
  json index;
  try {
    index = json::parse(read_text_file(index_path));
  } catch (const json::exception& e) {
    DUET_ERROR(index_path << ": not valid JSON: " << json_error(e));
  }
  if (!index.is_object() || !index.contains("weight_map") || !index.at("weight_map").is_object()) {
    DUET_ERROR(index_path << ": expected a JSON object with a \"weight_map\" object");
  }
  const json& weight_map = index.at("weight_map");
  if (weight_map.empty()) DUET_ERROR(index_path << ": \"weight_map\" is empty");

  Loaded out;
  std::map<std::string, size_t> opened;  // file name in the index -> index into out.files
  for (const auto& [name, file] : weight_map.items()) {
    if (!file.is_string() || file.get<std::string>().empty()) {
      DUET_ERROR(index_path << ": tensor " << quote(name) << " must map to a file name, got "
                            << clip(file));
    }
    const std::string fname = file.get<std::string>();
    auto it = opened.find(fname);
    if (it == opened.end()) {
      try {
        out.files.push_back(SafetensorsFile::open(join_path(dir, fname)));
      } catch (const Error& e) {
        DUET_ERROR(index_path << ": tensor " << quote(name) << " is mapped to " << quote(fname)
                              << ", which cannot be opened: " << e.what());
      }
      it = opened.emplace(fname, out.files.size() - 1).first;
    }
    if (!out.files[it->second]->has(name)) {
      DUET_ERROR(index_path << ": tensor " << quote(name) << " is mapped to " << quote(fname)
                            << ", but " << out.files[it->second]->path() << " has no such tensor");
    }
    out.where.emplace(name, it->second);
  }
  return out;
}

// Every tensor of every file; a name in two files is an error.
Loaded load_files(const std::string& dir, const std::vector<std::string>& paths) {
  Loaded out;
  for (const std::string& p : paths) {
    out.files.push_back(SafetensorsFile::open(p));
    for (const auto& [name, view] : out.files.back()->tensors()) {
      auto [it, fresh] = out.where.emplace(name, out.files.size() - 1);
      if (!fresh) {
        DUET_ERROR(dir << ": tensor " << quote(name) << " is in both "
                       << out.files[it->second]->path() << " and " << p);
      }
    }
  }
  return out;
}

std::vector<std::string> find_safetensors(const std::string& dir) {
  std::vector<std::string> paths;
  std::error_code ec;
  for (const auto& de : fs::directory_iterator(dir, ec)) {
    if (de.path().extension() == ".safetensors" && de.is_regular_file(ec)) {
      paths.push_back(de.path().string());
    }
  }
  if (ec) DUET_ERROR(dir << ": cannot list: " << ec.message());
  std::sort(paths.begin(), paths.end());
  return paths;
}

}  // namespace

SafetensorsSet SafetensorsSet::open_dir(const std::string& dir) {
  std::error_code ec;
  fs::file_status st = fs::status(dir, ec);
  if (ec) DUET_ERROR(dir << ": cannot open: " << ec.message());
  if (!fs::is_directory(st)) DUET_ERROR(dir << ": not a directory");

  Loaded loaded;
  const std::string index_path = join_path(dir, kIndexName);
  const std::string single_path = join_path(dir, kSingleName);
  if (fs::exists(index_path, ec)) {
    loaded = load_index(dir, index_path);
  } else if (fs::exists(single_path, ec)) {
    loaded = load_files(dir, {single_path});
  } else {
    std::vector<std::string> paths = find_safetensors(dir);
    if (paths.empty()) {
      DUET_ERROR(dir << ": no .safetensors files (expected " << kSingleName << " or " << kIndexName
                     << ")");
    }
    loaded = load_files(dir, paths);
  }
  SafetensorsSet set;
  set.dir_ = dir;
  set.files_ = std::move(loaded.files);
  set.where_ = std::move(loaded.where);
  return set;
}

const TensorView& SafetensorsSet::get(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) DUET_ERROR(dir_ << ": missing tensor " << quote(name));
  return files_[it->second]->get(name);
}

const std::string& SafetensorsSet::file_of(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) DUET_ERROR(dir_ << ": missing tensor " << quote(name));
  return files_[it->second]->path();
}

std::vector<std::string> SafetensorsSet::names() const {
  std::vector<std::string> out;
  out.reserve(where_.size());
  for (const auto& [name, i] : where_) out.push_back(name);
  return out;
}

// ---- Writing ----

void write_safetensors(const std::string& path, const std::vector<const TensorData*>& tensors) {
  nlohmann::ordered_json header;
  header["__metadata__"] = {{"format", "pt"}};
  std::vector<Chunk> chunks(1);  // chunks[0], the header length, is filled in below
  std::set<std::string> names = {"__metadata__"};
  uint64_t offset = 0;
  for (const TensorData* t : tensors) {
    DUET_CHECK(t != nullptr, path);
    DUET_CHECK(names.insert(t->name).second,
               path << ": tensor name " << quote(t->name) << " reserved or repeated");
    uint64_t need = dtype_size(t->dtype);
    for (int64_t d : t->shape) {
      DUET_CHECK(d >= 0, path << ": " << quote(t->name) << " shape " << shape_str(t->shape));
      need *= static_cast<uint64_t>(d);
    }
    DUET_CHECK(t->bytes.size() == need, path << ": " << quote(t->name) << ": " << t->bytes.size()
                                             << " bytes but " << dtype_name(t->dtype) << " × "
                                             << shape_str(t->shape) << " needs " << need);
    header[t->name] = {{"dtype", dtype_name(t->dtype)},
                       {"shape", t->shape},
                       {"data_offsets", {offset, offset + need}}};
    offset += need;
    chunks.push_back({t->bytes.data(), t->bytes.size()});
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // data starts 8-aligned, as the reference does
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(uint64_t{text.size()} >> (8 * i));
  chunks[0] = {len, 8};
  chunks.insert(chunks.begin() + 1, Chunk{text.data(), text.size()});
  write_atomically(path, chunks);
}

void write_safetensors_dir(const std::string& dir, const std::vector<TensorData>& tensors,
                           uint64_t max_shard_bytes) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) DUET_ERROR(dir << ": cannot create directory: " << ec.message());

  // Greedy fill in the given order; a tensor larger than the limit gets a shard of its own.
  std::vector<std::vector<const TensorData*>> shards;
  uint64_t total = 0;
  uint64_t shard_bytes = 0;
  std::set<std::string> names;
  for (const TensorData& t : tensors) {
    DUET_CHECK(names.insert(t.name).second, dir << ": tensor " << quote(t.name) << " repeated");
    if (shards.empty() || (shard_bytes > 0 && shard_bytes + t.bytes.size() > max_shard_bytes)) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(&t);
    shard_bytes += t.bytes.size();
    total += t.bytes.size();
  }

  if (total <= max_shard_bytes || shards.size() <= 1) {
    std::vector<const TensorData*> all;
    for (const TensorData& t : tensors) all.push_back(&t);
    write_safetensors(join_path(dir, kSingleName), all);
    remove_stale(dir, {kSingleName});
    return;
  }

  // The old index goes first: left behind by a crash half-way through replacing the shards it
  // names, it would silently pair new shards with old ones.
  fs::remove(join_path(dir, kIndexName), ec);
  json weight_map = json::object();
  std::set<std::string> written = {kIndexName};
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string name = shard_name(i + 1, shards.size());
    write_safetensors(join_path(dir, name), shards[i]);
    for (const TensorData* t : shards[i]) weight_map[t->name] = name;
    written.insert(name);
  }
  json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  const std::string text = index.dump(2) + "\n";
  write_atomically(join_path(dir, kIndexName), {{text.data(), text.size()}});
  remove_stale(dir, written);
}

}  // namespace duet
