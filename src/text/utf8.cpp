#include <string>

#include "text/tokenizer.h"
#include "text/tokenizer_utf8.h"

namespace duet {

namespace {

// How many bytes of s starting at i form a well-formed UTF-8 sequence (> 0), or minus the length
// of the maximal ill-formed prefix (< 0), as Unicode's "maximal subpart" rule defines it.
// *truncated is set when the sequence was cut short by the end of s (still valid so far).
int scan_sequence(std::string_view s, size_t i, bool* truncated) {
  *truncated = false;
  const auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) return 1;
  int n;
  unsigned char lo = 0x80, hi = 0xbf;  // allowed range of the second byte
  if (c >= 0xc2 && c <= 0xdf) {
    n = 2;
  } else if (c >= 0xe0 && c <= 0xef) {
    n = 3;
    if (c == 0xe0) lo = 0xa0;
    if (c == 0xed) hi = 0x9f;
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 4;
    if (c == 0xf0) lo = 0x90;
    if (c == 0xf4) hi = 0x8f;
  } else {
    return -1;
  }
  for (int k = 1; k < n; ++k) {
    if (i + k >= s.size()) {
      *truncated = true;
      return -k;
    }
    const auto b = static_cast<unsigned char>(s[i + k]);
    const bool ok = k == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xbf);
    if (!ok) return -k;
  }
  return n;
}

}  // namespace

std::string utf8_lossy(const std::string& bytes) {
  std::string out;
  out.reserve(bytes.size());
  bool truncated;
  for (size_t i = 0; i < bytes.size();) {
    const int n = scan_sequence(bytes, i, &truncated);
    if (n > 0) {
      out.append(bytes, i, static_cast<size_t>(n));
      i += static_cast<size_t>(n);
    } else {
      out += utf8::kReplacementChar;
      i += static_cast<size_t>(-n);
    }
  }
  return out;
}

namespace utf8 {

char32_t next(std::string_view s, size_t* i) {
  // Ill-formed or cut-off sequences (a chat_template.jinja file is read as raw bytes) decode as
  // U+FFFD and are stepped over, never read past the end (found by fuzz_chat_template).
  bool truncated;
  const int len = scan_sequence(s, *i, &truncated);
  if (len <= 0) {
    *i += static_cast<size_t>(len < 0 ? -len : 1);
    return 0xFFFD;
  }
  const auto c = static_cast<unsigned char>(s[*i]);
  char32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
  for (int k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[*i + k]) & 0x3F);
  *i += len;
  return cp;
}

void append(std::string* out, char32_t cp) {
  if (cp < 0x80) {
    out->push_back(char(cp));
  } else if (cp < 0x800) {
    out->push_back(char(0xC0 | (cp >> 6)));
    out->push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(char(0xE0 | (cp >> 12)));
    out->push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(char(0xF0 | (cp >> 18)));
    out->push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(char(0x80 | (cp & 0x3F)));
  }
}

size_t length(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

bool is_whitespace(char32_t cp) {
  if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
  if (cp < 0x85) return false;
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
         cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

bool is_python_space(char32_t cp) {
  return is_whitespace(cp) || (cp >= 0x1C && cp <= 0x1F);
}

size_t stable_end(std::string_view bytes) {
  bool truncated;
  for (size_t i = 0; i < bytes.size();) {
    const int n = scan_sequence(bytes, i, &truncated);
    if (truncated) return i;
    i += static_cast<size_t>(n > 0 ? n : -n);
  }
  return bytes.size();
}

bool is_valid(std::string_view bytes) {
  bool truncated;
  for (size_t i = 0; i < bytes.size();) {
    const int n = scan_sequence(bytes, i, &truncated);
    if (n < 0) return false;
    i += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace utf8
}  // namespace duet
