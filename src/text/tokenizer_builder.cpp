// build_bpe_tokenizer_json: the tokenizer of a generated (random-weight) model. Byte-level BPE
// with Qwen2's pre-tokenizer, trained on a small built-in corpus; once the corpus has no pair
// left that occurs twice, synthetic merges of frequent tokens fill the vocab to the size asked.
//
// Ids: 0..255 are the single bytes (id == byte value), then one id per new token string in merge
// order, then the specials. Everything is deterministic: the same arguments give the same text.
#include <algorithm>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "core/error.h"
#include "text/tokenizer.h"
#include "text/tokenizer_byte_level.h"
#include "text/tokenizer_regex.h"

namespace duet {
namespace {

// Training text: English prose of several registers, a dialogue, numbers and some code, so the
// learned merges look like a real tokenizer's (" the", "ing", "    ", "()" ...).
constexpr const char* kCorpus = R"corpus(
The morning fog lifted slowly from the harbor, and the fishing boats began to move out past the
old stone lighthouse. Nobody in the village could remember a summer as quiet as this one. The
children played by the water, the shopkeepers opened their doors late, and even the gulls seemed
to have lost interest in the market. Margaret walked along the pier every day at seven o'clock,
counting the boats as they left. She had done it for thirty-two years, ever since her husband
first sailed with the northern fleet, and she wasn't going to stop now.

"You're up early again," said Thomas, who ran the bakery at the corner of Water Street.
"I'm always up early. It's the only time the town is honest," she answered. "Before nine, people
say what they mean. After nine, they say what they think you'd like to hear."
He laughed and handed her a warm roll. "Then I'll tell you something honest: the bread's burnt."
"It's perfect," she said, and it was.

In the history of science, few ideas have been as productive as the notion that nature can be
described by simple rules. Galileo measured the time it took for a ball to roll down an inclined
plane; Newton generalized those measurements into laws of motion that explained the orbits of
the planets. Two centuries later, Maxwell showed that electricity, magnetism and light were
different faces of a single phenomenon. Each of these steps required both careful experiments
and the courage to imagine that the world is more orderly than it appears.

Modern computers follow the same pattern at a smaller scale. A processor executes billions of
instructions per second, but every instruction is simple: load a value from memory, add two
numbers, compare a result with zero, jump to another instruction. The complexity of a program
comes from the way these simple operations are combined. Good software engineering is largely
the art of keeping that combination understandable: small functions with clear names, data
structures that match the problem, and tests that describe what the code is supposed to do.

Large language models are trained to predict the next token of a text. A tokenizer splits the
text into tokens, which are usually words, pieces of words, or single bytes. Byte pair encoding
starts with individual bytes and repeatedly merges the most frequent adjacent pair, so common
words such as "the", "and" and "information" become single tokens, while rare words are spelled
out from smaller pieces. A mixture-of-experts model routes each token to a few of its many expert
networks, which lets the model hold more parameters without spending more computation per token.
When the experts live on different machines, the tokens must travel over the network, and the
time spent communicating can be hidden behind the time spent computing.

Recipe for a simple tomato soup (serves 4):
1. Heat 2 tablespoons of olive oil in a large pot over medium heat.
2. Add 1 chopped onion and 3 cloves of garlic; cook for 5 minutes until soft.
3. Add 800 g of tomatoes, 500 ml of vegetable stock, salt and pepper.
4. Simmer for 20 minutes, then blend until smooth. Serve with fresh bread.

The committee met on Tuesday, March 14, 2023, at 10:30 a.m. to review the budget. Revenue for
the first quarter was $4.2 million, an increase of 12% compared with the same period last year,
while expenses rose by only 3.5%. The chair noted that the new office in Denver had opened on
schedule and that hiring would continue through the summer. Questions from the members focused
on the cost of the software licenses, which had doubled since 2021.

She didn't know whether they'd arrive in time. The train was late, the roads were closed, and
the phone lines had been down since Monday. Still, they'd promised, and they'd never broken a
promise before. "We'll be there," they had written. "Whatever happens, we'll be there."

Weather report: cloudy in the morning with a chance of light rain; clearing in the afternoon.
High of 18 degrees, low of 9. Winds from the west at 15 to 25 kilometers per hour. Tomorrow will
be sunny and warmer, with temperatures reaching 22 degrees by the evening.

# Getting started

Install the package, then run the server:

    make build
    ./server --port 8080 --threads 4 --model ./models/small

The server listens on http://localhost:8080 and accepts JSON requests. Use `--help` to list all
options. If the model directory does not contain a config.json file, the server exits with an
error message that names the missing file.

```cpp
#include <cstdint>
#include <string>
#include <vector>

namespace example {

// Returns the sum of the values, or 0 for an empty vector.
int64_t sum(const std::vector<int32_t>& values) {
  int64_t total = 0;
  for (int32_t value : values) {
    total += value;
  }
  return total;
}

class Counter {
 public:
  explicit Counter(std::string name) : name_(std::move(name)) {}
  void add(int n) { count_ += n; }
  int count() const { return count_; }
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  int count_ = 0;
};

}  // namespace example
```

```python
import json
import os


def load_config(path):
    """Reads a JSON config file and returns it as a dictionary."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"config not found: {path}")
    with open(path, "r", encoding="utf-8") as f:
        return json.load(f)


class Model:
    def __init__(self, config):
        self.config = config
        self.layers = [self.make_layer(i) for i in range(config["num_layers"])]

    def make_layer(self, index):
        return {"index": index, "hidden_size": self.config["hidden_size"]}

    def forward(self, tokens):
        for layer in self.layers:
            tokens = [t * 2 + layer["index"] for t in tokens]
        return tokens


if __name__ == "__main__":
    model = Model(load_config("config.json"))
    print(model.forward([1, 2, 3]))
```

{"model": "small", "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 128,
 "temperature": 0.7, "stream": true}

The old library closed at five, but Daniel stayed until the librarian turned off the lights. He
was reading about the explorers who mapped the coast three hundred years ago: how they measured
distances by counting the days, how they drew the rivers from the descriptions of the people who
lived there, and how often they were wrong. What surprised him most was not their mistakes but
their patience. They returned, year after year, to correct the maps, adding a bay here and
removing an island there, until the lines on the paper finally matched the shape of the land.
Une petite phrase en français, ein kurzer Satz auf Deutsch, y una frase corta en español.
)corpus";

// A word of the corpus: its symbols (token ids) and how often it occurs.
struct Word {
  std::vector<int32_t> symbols;
  int64_t freq;
};

uint64_t pair_key(int32_t left, int32_t right) {
  return (uint64_t(uint32_t(left)) << 32) | uint32_t(right);
}

// Vocab being built: raw bytes of each id, and the merges in order.
struct VocabBuilder {
  std::vector<std::string> tokens;               // [n_ids] raw bytes
  std::unordered_map<std::string, int32_t> ids;  // raw bytes -> id
  std::vector<std::pair<int32_t, int32_t>> merges;

  // Records left + right; returns the id of the joined string (a new id unless it exists).
  int32_t merge(int32_t left, int32_t right) {
    merges.emplace_back(left, right);
    std::string joined = tokens[left] + tokens[right];
    auto [it, inserted] = ids.emplace(joined, int32_t(tokens.size()));
    if (inserted) tokens.push_back(std::move(joined));
    return it->second;
  }
};

std::vector<Word> corpus_words() {
  TokenRegex regex(kQwen2Pattern, false, "built-in tokenizer corpus");
  const std::string_view text(kCorpus);
  std::vector<TextSpan> spans;
  regex.find_all(text, &spans);  // the Qwen2 regex covers every character of the text
  std::unordered_map<std::string_view, int64_t> counts;
  for (const TextSpan& s : spans) ++counts[text.substr(s.begin, s.end - s.begin)];
  std::vector<std::pair<std::string_view, int64_t>> sorted(counts.begin(), counts.end());
  std::sort(sorted.begin(), sorted.end());  // a fixed word order, whatever the hash
  std::vector<Word> words;
  for (const auto& [w, freq] : sorted) {
    words.push_back({std::vector<int32_t>(w.begin(), w.end()), freq});
    for (int32_t& s : words.back().symbols) s &= 0xFF;  // id of byte b is b
  }
  return words;
}

// Standard BPE training: merge the most frequent adjacent pair (ties: lowest left id, then
// lowest right id) until `n_ids` ids exist or no pair occurs twice. Returns the corpus words
// as segmented at the end.
std::vector<Word> learn_merges(int32_t n_ids, VocabBuilder* vocab) {
  std::vector<Word> words = corpus_words();
  std::unordered_map<uint64_t, int64_t> counts;              // pair -> weighted count
  std::unordered_map<uint64_t, std::vector<int32_t>> where;  // pair -> words (may repeat)
  struct Entry {
    int64_t count;
    int32_t left, right;
    bool operator<(const Entry& o) const {  // max-heap: higher count, then lower ids first
      if (count != o.count) return count < o.count;
      if (left != o.left) return left > o.left;
      return right > o.right;
    }
  };
  std::priority_queue<Entry> heap;
  std::vector<uint64_t> touched;  // pairs whose count changed in this step
  auto add_pairs = [&](int32_t w, int64_t sign) {
    const std::vector<int32_t>& s = words[w].symbols;
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      uint64_t key = pair_key(s[i], s[i + 1]);
      counts[key] += sign * words[w].freq;
      if (sign > 0) where[key].push_back(w);
      touched.push_back(key);
    }
  };
  for (int32_t w = 0; w < int32_t(words.size()); ++w) add_pairs(w, +1);
  for (uint64_t key : touched) heap.push({counts[key], int32_t(key >> 32), int32_t(key)});
  touched.clear();

  std::vector<int32_t> last_seen(words.size(), -1);  // dedups `where` within one step
  for (int32_t step = 0; int32_t(vocab->tokens.size()) < n_ids && !heap.empty(); ++step) {
    Entry top = heap.top();
    heap.pop();
    const uint64_t key = pair_key(top.left, top.right);
    if (counts[key] != top.count) continue;  // stale: a newer entry holds the current count
    if (top.count < 2) break;
    const int32_t merged = vocab->merge(top.left, top.right);
    std::vector<int32_t> affected = std::move(where[key]);
    where.erase(key);
    for (int32_t w : affected) {
      if (last_seen[w] == step) continue;
      last_seen[w] = step;
      std::vector<int32_t>& s = words[w].symbols;
      add_pairs(w, -1);
      size_t out = 0;
      for (size_t i = 0; i < s.size(); ++i) {
        if (i + 1 < s.size() && s[i] == top.left && s[i + 1] == top.right) {
          s[out++] = merged;
          ++i;
        } else {
          s[out++] = s[i];
        }
      }
      s.resize(out);
      add_pairs(w, +1);
    }
    std::sort(touched.begin(), touched.end());
    touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
    for (uint64_t k : touched) {
      if (counts[k] > 0) heap.push({counts[k], int32_t(k >> 32), int32_t(k)});
    }
    touched.clear();
  }
  return words;
}

// Fills the vocab to `n_ids` with merges of two existing tokens into a string not yet in the
// vocab (nor equal to a special): tokens ordered by how often they occur in the segmented
// corpus, pairs (order[i], order[j]) taken by increasing i + j, then increasing i.
void add_synthetic_merges(int32_t n_ids, const std::vector<Word>& words,
                          const std::unordered_set<std::string>& specials, VocabBuilder* vocab) {
  std::vector<int64_t> uses(vocab->tokens.size(), 0);
  for (const Word& w : words) {
    for (int32_t s : w.symbols) uses[s] += w.freq;
  }
  std::vector<int32_t> order(vocab->tokens.size());
  for (int32_t i = 0; i < int32_t(order.size()); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return uses[a] > uses[b]; });
  const int64_t n = int64_t(order.size());
  for (int64_t diag = 0; diag <= 2 * (n - 1); ++diag) {
    for (int64_t i = std::max<int64_t>(0, diag - (n - 1)); i <= std::min(diag, n - 1); ++i) {
      if (int32_t(vocab->tokens.size()) >= n_ids) return;
      const int32_t left = order[i], right = order[diag - i];
      std::string joined = vocab->tokens[left] + vocab->tokens[right];
      if (vocab->ids.count(joined) != 0 || specials.count(joined) != 0) continue;
      vocab->merge(left, right);
    }
  }
  DUET_CHECK(int32_t(vocab->tokens.size()) >= n_ids,
             "ran out of synthetic merges at " << vocab->tokens.size() << " of " << n_ids);
}

std::string quoted(const std::string& s) {
  return nlohmann::json(s).dump();
}

constexpr const char* kByteLevelFalse =
    R"({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, )"
    R"("use_regex": false})";

// The tokenizer.json of `vocab` (ids in order) with `specials` after it, pre-tokenized by
// `pattern` and ByteLevel. With `tiktoken`, a word that is a token is taken whole
// (ignore_merges), as tiktoken takes a pre-token that has a rank.
std::string to_tokenizer_json(const VocabBuilder& vocab, const std::vector<std::string>& specials,
                              const char* pattern, bool tiktoken) {
  std::ostringstream os;
  os << "{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n"
     << "  \"added_tokens\": [";
  for (size_t i = 0; i < specials.size(); ++i) {
    os << (i == 0 ? "\n" : ",\n") << "    {\"id\": " << vocab.tokens.size() + i
       << ", \"content\": " << quoted(specials[i])
       << ", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, \"normalized\": false,"
       << " \"special\": true}";
  }
  os << (specials.empty() ? "],\n" : "\n  ],\n") << "  \"normalizer\": null,\n"
     << "  \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [\n"
     << "    {\"type\": \"Split\", \"pattern\": {\"Regex\": " << quoted(pattern)
     << "}, \"behavior\": \"Isolated\", \"invert\": false},\n    " << kByteLevelFalse << "]},\n"
     << "  \"post_processor\": " << kByteLevelFalse << ",\n"
     << "  \"decoder\": " << kByteLevelFalse << ",\n"
     << "  \"model\": {\n    \"type\": \"BPE\",\n    \"dropout\": null,\n    \"unk_token\": null,\n"
     << "    \"continuing_subword_prefix\": \"\",\n    \"end_of_word_suffix\": \"\",\n"
     << "    \"fuse_unk\": false,\n    \"byte_fallback\": false,\n    \"ignore_merges\": "
     << (tiktoken ? "true" : "false") << ",\n    \"vocab\": {";
  std::vector<std::string> mapped(vocab.tokens.size());
  for (size_t id = 0; id < vocab.tokens.size(); ++id) {
    mapped[id] = byte_level::encode_bytes(vocab.tokens[id]);
    os << (id == 0 ? "\n      " : ",\n      ") << quoted(mapped[id]) << ": " << id;
  }
  os << "\n    },\n    \"merges\": [";
  for (size_t i = 0; i < vocab.merges.size(); ++i) {
    // The "left right" form: byte-level tokens never hold a space, and every loader reads it.
    os << (i == 0 ? "\n      " : ",\n      ")
       << quoted(mapped[vocab.merges[i].first] + " " + mapped[vocab.merges[i].second]);
  }
  os << "\n    ]\n  }\n}\n";
  return os.str();
}

// 256 single-byte tokens (id == byte), then merges learned from the corpus and synthetic ones up
// to n_ids tokens in all, none of them equal to a special.
VocabBuilder learned_vocab(int64_t n_ids, const std::vector<std::string>& specials) {
  if (n_ids < 256) {
    DUET_ERROR("tokenizer vocab_size " << n_ids + int64_t(specials.size())
                                       << " is too small: it needs 256 byte tokens + "
                                       << specials.size() << " special tokens");
  }
  std::unordered_set<std::string> special_set;
  for (const std::string& s : specials) {
    if (s.empty()) DUET_ERROR("tokenizer special token is empty");
    if (!special_set.insert(s).second) {
      DUET_ERROR("tokenizer special token '" << s << "' is repeated");
    }
  }
  VocabBuilder vocab;
  for (int32_t b = 0; b < 256; ++b) {
    vocab.tokens.emplace_back(1, char(b));
    vocab.ids.emplace(vocab.tokens.back(), b);
  }
  const std::vector<Word> words = learn_merges(int32_t(n_ids), &vocab);
  add_synthetic_merges(int32_t(n_ids), words, special_set, &vocab);
  return vocab;
}

constexpr char kBase64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string base64_encode(std::string_view raw) {
  std::string out;
  for (size_t i = 0; i < raw.size(); i += 3) {
    uint32_t v = uint32_t(static_cast<unsigned char>(raw[i])) << 16;
    if (i + 1 < raw.size()) v |= uint32_t(static_cast<unsigned char>(raw[i + 1])) << 8;
    if (i + 2 < raw.size()) v |= static_cast<unsigned char>(raw[i + 2]);
    for (size_t k = 0; k < 4; ++k)
      out += i + k <= raw.size() ? kBase64[(v >> (18 - 6 * k)) & 63] : '=';
  }
  return out;
}

// Standard base64 with its '=' padding; false on any other character or a bad length.
bool base64_decode(std::string_view text, std::string* out) {
  out->clear();
  if (text.size() % 4 != 0) return false;
  for (size_t i = 0; i < text.size(); i += 4) {
    uint32_t v = 0;
    int pad = 0;
    for (size_t k = 0; k < 4; ++k) {
      const char c = text[i + k];
      const char* at = c == '=' ? nullptr : std::strchr(kBase64, c);
      if (c == '=' && i + 4 == text.size() && k >= 2) {
        ++pad;
      } else if (at == nullptr || c == '\0' || pad > 0) {
        return false;
      }
      v = v << 6 | (at ? uint32_t(at - kBase64) : 0);
    }
    for (int k = 0; k < 3 - pad; ++k) out->push_back(char(v >> (16 - 8 * k)));
  }
  return true;
}

}  // namespace

std::string build_bpe_tokenizer_json(int32_t vocab_size, const std::vector<std::string>& specials) {
  const VocabBuilder vocab =
      learned_vocab(int64_t(vocab_size) - int64_t(specials.size()), specials);
  return to_tokenizer_json(vocab, specials, kQwen2Pattern, false);
}

std::string build_tiktoken_ranks(int32_t n_tokens) {
  const VocabBuilder vocab = learned_vocab(n_tokens, {});
  std::string out;
  for (size_t rank = 0; rank < vocab.tokens.size(); ++rank) {
    out += base64_encode(vocab.tokens[rank]) + " " + std::to_string(rank) + "\n";
  }
  return out;
}

std::string tiktoken_tokenizer_json(const std::string& ranks_text, const std::string& source,
                                    const std::map<int64_t, std::string>& named_specials,
                                    int32_t n_reserved, const char* pattern) {
  // The ranks: one "<base64 bytes> <rank>" a line, every rank 0..n-1 once (n lines).
  const int64_t n_lines = std::count(ranks_text.begin(), ranks_text.end(), '\n') +
                          (!ranks_text.empty() && ranks_text.back() != '\n');
  VocabBuilder vocab;            // tokens only: ids and merges below work on views of them
  std::vector<int64_t> line_of;  // [rank] the line that gave it, 0 if none yet
  int64_t line_no = 0, n_ranks = 0;
  for (size_t begin = 0; begin < ranks_text.size();) {
    size_t end = ranks_text.find('\n', begin);
    if (end == std::string::npos) end = ranks_text.size();
    std::string_view line(ranks_text.data() + begin, end - begin);
    begin = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    const size_t space = line.find(' ');
    std::string bytes;
    int64_t rank = -1;
    if (space != std::string_view::npos && space + 1 < line.size() && line.size() - space < 12 &&
        std::all_of(line.begin() + space + 1, line.end(),
                    [](char c) { return c >= '0' && c <= '9'; })) {
      rank = std::stoll(std::string(line.substr(space + 1)));
    }
    if (rank < 0 || !base64_decode(line.substr(0, space), &bytes) || bytes.empty()) {
      DUET_ERROR(source << ":" << line_no << ": expected '<base64 token bytes> <rank>', found '"
                        << std::string(line.substr(0, 80)) << "'");
    }
    if (rank >= n_lines) {
      DUET_ERROR(source << ":" << line_no << ": rank " << rank << " in a file of " << n_lines
                        << " lines (the ranks must be 0, 1, ... one a token)");
    }
    if (rank >= int64_t(vocab.tokens.size())) {
      vocab.tokens.resize(rank + 1);
      line_of.resize(rank + 1, 0);
    }
    if (line_of[rank] != 0) {
      DUET_ERROR(source << ":" << line_no << ": rank " << rank << " is given twice (line "
                        << line_of[rank] << " first)");
    }
    line_of[rank] = line_no;
    vocab.tokens[rank] = std::move(bytes);
    ++n_ranks;
  }
  if (n_ranks != int64_t(vocab.tokens.size())) {
    const int64_t missing = std::find(line_of.begin(), line_of.end(), 0) - line_of.begin();
    DUET_ERROR(source << ": the ranks are not 0.." << vocab.tokens.size() - 1 << ": rank "
                      << missing << " is missing");
  }
  std::unordered_map<std::string_view, int32_t> ids;  // token bytes -> rank
  ids.reserve(vocab.tokens.size());
  for (size_t rank = 0; rank < vocab.tokens.size(); ++rank) {
    auto [it, inserted] = ids.emplace(vocab.tokens[rank], int32_t(rank));
    if (!inserted) {
      DUET_ERROR(source << ": ranks " << it->second << " and " << rank << " are the same token ('"
                        << base64_encode(vocab.tokens[rank]) << "')");
    }
  }
  for (int b = 0; b < 256; ++b) {
    const char byte = char(b);
    if (ids.count(std::string_view(&byte, 1)) == 0) {
      DUET_ERROR(source << ": byte " << b << " has no rank (tiktoken needs all 256 bytes)");
    }
  }
  // Every split of a token into two tokens is a merge, ranked by the token's rank, then by the
  // two parts' ranks: tiktoken joins any two adjacent parts whose bytes together have a rank,
  // the lowest first (the order Hugging Face's TikTokenConverter writes; checked against
  // tiktoken itself in tests/npm/tokenizer).
  for (const std::string& token : vocab.tokens) {
    const std::string_view t(token);
    const size_t first = vocab.merges.size();
    for (size_t k = 1; k < t.size(); ++k) {
      auto l = ids.find(t.substr(0, k));
      if (l == ids.end()) continue;
      auto r = ids.find(t.substr(k));
      if (r != ids.end()) vocab.merges.emplace_back(l->second, r->second);
    }
    std::sort(vocab.merges.begin() + first, vocab.merges.end());
  }
  const int64_t n_base = int64_t(vocab.tokens.size());
  std::vector<std::string> specials;
  for (int64_t id = n_base; id < n_base + n_reserved; ++id) {
    auto it = named_specials.find(id);
    specials.push_back(
        it != named_specials.end() ? it->second : "<|reserved_token_" + std::to_string(id) + "|>");
  }
  for (const auto& [id, name] : named_specials) {
    if (id < n_base || id >= n_base + n_reserved) {
      DUET_ERROR(source << ": special token " << id << " ('" << name << "') is outside [" << n_base
                        << ", " << n_base + n_reserved << "), where the special tokens follow the "
                        << n_base << " ranks");
    }
  }
  return to_tokenizer_json(vocab, specials, pattern, true);
}

}  // namespace duet
