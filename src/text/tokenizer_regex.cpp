// Pre-tokenizer regexes (PCRE2) and the UTF-8 validity scan they rely on.
#include "text/tokenizer_regex.h"

#include <memory>
#include <string>
#include <vector>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/error.h"

namespace duet {

size_t valid_utf8_prefix(std::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    unsigned char c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint32_t cp;
    if ((c & 0xE0) == 0xC0) {
      len = 2, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, cp = c & 0x07;
    } else {
      return i;
    }
    if (i + len > n) return i;
    for (size_t k = 1; k < len; ++k) {
      unsigned char cc = s[i + k];
      if ((cc & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (cc & 0x3F);
    }
    static constexpr uint32_t kMinForLen[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMinForLen[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += len;
  }
  return n;
}

namespace {

// One bracket class of an Oniguruma pattern, read from just past its '['.
struct ClassReader {
  const std::string& p;
  const std::string& source_name;
  size_t i;  // the next character to read

  [[noreturn]] void fail(const std::string& why) const {
    DUET_ERROR(source_name << ": bad regex '" << p << "': " << why << " at offset " << i);
  }

  // Reads up to and past the class's closing ']'; returns its PCRE2 form.
  std::string read() {
    const size_t open = i - 1;
    const bool negated = i < p.size() && p[i] == '^';
    if (negated) ++i;
    std::vector<std::string> operands(1);  // the items between "&&"s, as PCRE2 classes' insides
    std::vector<bool> nested(1, false);    // operand k is one nested class (kept whole)
    bool first = true;                     // a ']' first in the class is a literal
    for (;;) {
      if (i >= p.size()) {
        i = open;
        fail("unterminated character class");
      }
      const char c = p[i];
      if (c == ']' && !first) {
        ++i;
        break;
      }
      first = false;
      const bool and_and = c == '&' && i + 1 < p.size() && p[i + 1] == '&';
      if (nested.back() && !and_and) fail("a nested class beside other items (a union)");
      if (c == '\\') {
        if (i + 1 >= p.size()) fail("'\\' at the end of a class");
        operands.back() += p.substr(i, 2);
        i += 2;
      } else if (c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // [:alpha:] stays as it is
        const size_t end = p.find(":]", i + 2);
        if (end == std::string::npos) fail("unterminated POSIX class");
        operands.back() += p.substr(i, end + 2 - i);
        i = end + 2;
      } else if (c == '[') {  // a nested class: only as a whole operand of an intersection
        if (!operands.back().empty()) fail("a nested class beside other items (a union)");
        ++i;
        operands.back() = ClassReader{p, source_name, i}.read_nested(&i);
        nested.back() = true;
      } else if (and_and) {
        operands.emplace_back();
        nested.push_back(false);
        i += 2;
      } else {
        operands.back() += c;
        ++i;
      }
    }
    auto as_class = [&](size_t k) { return nested[k] ? operands[k] : "[" + operands[k] + "]"; };
    if (operands.size() == 1) {
      if (nested[0]) fail("a nested class as a whole class");
      return p.substr(open, i - open);  // no intersection: as written
    }
    for (size_t k = 0; k < operands.size(); ++k) {
      if (operands[k].empty()) fail("an empty operand of '&&'");
    }
    std::string one = "(?:";  // one character in every operand: the others as look-aheads
    for (size_t k = 1; k < operands.size(); ++k) one += "(?=" + as_class(k) + ")";
    one += as_class(0) + ")";
    return negated ? "(?:(?!" + one + ")(?s:.))" : one;
  }

  // A class nested in another, from just past its '[': no intersection or nesting inside.
  std::string read_nested(size_t* end) {
    const size_t open = i - 1;
    bool first = true;
    if (i < p.size() && p[i] == '^') ++i;
    for (; i < p.size(); ++i) {
      const char c = p[i];
      if (c == '\\') {
        ++i;
      } else if (c == '[' && i + 1 < p.size() && p[i + 1] == ':') {
        const size_t e = p.find(":]", i + 2);
        if (e == std::string::npos) fail("unterminated POSIX class");
        i = e + 1;
      } else if (c == '[' || (c == '&' && i + 1 < p.size() && p[i + 1] == '&')) {
        fail("a class nested two deep or an intersection inside a nested class");
      } else if (c == ']' && !first) {
        *end = i + 1;
        return p.substr(open, i + 1 - open);
      }
      first = false;
    }
    i = open;
    fail("unterminated character class");
  }
};

}  // namespace

std::string oniguruma_classes(const std::string& pattern, const std::string& source_name) {
  if (pattern.find('[') == std::string::npos) return pattern;
  std::string out;
  out.reserve(pattern.size());
  for (size_t i = 0; i < pattern.size();) {
    const char c = pattern[i];
    if (c == '\\') {
      out += pattern.substr(i, 2);
      i += 2;
    } else if (c == '[') {
      ClassReader r{pattern, source_name, i + 1};
      out += r.read();
      i = r.i;
    } else {
      out += c;
      ++i;
    }
  }
  return out;
}

TokenRegex::TokenRegex(const std::string& pattern_in, bool literal,
                       const std::string& source_name) {
  const std::string pattern = literal ? pattern_in : oniguruma_classes(pattern_in, source_name);
  // PCRE2_UCP may not be combined with PCRE2_LITERAL (and a literal needs no classes anyway).
  uint32_t options = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options, &err,
                        &err_offset, nullptr);
  if (code_ == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(err, message, sizeof(message));
    DUET_ERROR(source_name << ": bad regex '" << pattern << "': "
                           << reinterpret_cast<char*>(message) << " at offset " << err_offset);
  }
  pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // without JIT, pcre2_match interprets
}

TokenRegex::~TokenRegex() {
  pcre2_code_free(code_);
}

void TokenRegex::find_all(std::string_view text, std::vector<TextSpan>* out) const {
  struct MatchDataDeleter {
    void operator()(pcre2_match_data* md) const { pcre2_match_data_free(md); }
  };
  // One ovector pair is enough: only the whole match is used.
  thread_local std::unique_ptr<pcre2_match_data, MatchDataDeleter> match_data(
      pcre2_match_data_create(1, nullptr));
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const size_t n = text.size();
  size_t offset = 0;
  while (offset < n) {
    // The caller validated the UTF-8 once; without NO_UTF_CHECK PCRE2 would re-check per call.
    int rc = pcre2_match(code_, subject, n, offset, PCRE2_NO_UTF_CHECK, match_data.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) return;
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      DUET_ERROR("tokenizer regex match failed: " << reinterpret_cast<char*>(message));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match_data.get());
    size_t begin = ovector[0], end = ovector[1];
    if (end > begin) {
      out->push_back({begin, end});
      offset = end;
    } else {  // an empty match yields no piece; step over one character
      offset = end + 1;
      while (offset < n && (static_cast<unsigned char>(text[offset]) & 0xC0) == 0x80) ++offset;
    }
  }
}

}  // namespace duet
