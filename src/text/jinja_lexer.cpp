#include "text/jinja_lexer.h"

#include <algorithm>

#include "core/error.h"
#include "text/tokenizer_utf8.h"

namespace duet::jinja {

namespace {

// Python's str.lstrip() / str.rstrip() (Unicode whitespace).
std::string_view lstrip(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t next = i;
    if (!utf8::is_python_space(utf8::next(s, &next))) break;
    i = next;
  }
  return s.substr(i);
}

std::string_view rstrip(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    size_t i = start;
    if (!utf8::is_python_space(utf8::next(s, &i))) break;
    end = start;
  }
  return s.substr(0, end);
}

bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

class Lexer {
 public:
  explicit Lexer(std::string_view source) : src_(source) {}
  std::vector<Token> run();

 private:
  [[noreturn]] void fail(const std::string& what) const {
    DUET_ERROR("line " << line_ << ": " << what);
  }
  void advance_to(size_t pos) {
    line_ += int(std::count(src_.begin() + pos_, src_.begin() + pos, '\n'));
    pos_ = pos;
  }
  void push(Tok type, std::string text) { tokens_.push_back({type, std::move(text), line_}); }
  void lex_data(size_t tag);
  void lex_comment();
  // Lexes a tag's expression tokens up to its end ("}}" or "%}").
  void lex_tag(bool block);
  std::string lex_string();
  void after_tag_end(char marker, bool block);

  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> tokens_;
  bool strip_next_ = false;  // a "-" end marker: drop the leading whitespace of the next data
  bool trim_next_ = false;   // trim_blocks: drop one newline right after a block or comment
};

std::vector<Token> Lexer::run() {
  // Jinja2 normalizes newlines and drops one trailing newline (keep_trailing_newline=False).
  std::string normalized;
  for (size_t i = 0; i < src_.size(); ++i) {
    if (src_[i] == '\r') {
      normalized.push_back('\n');
      if (i + 1 < src_.size() && src_[i + 1] == '\n') ++i;
    } else {
      normalized.push_back(src_[i]);
    }
  }
  if (!normalized.empty() && normalized.back() == '\n') normalized.pop_back();
  src_ = std::move(normalized);
  while (pos_ < src_.size()) {
    size_t tag = pos_;
    for (;;) {
      tag = src_.find('{', tag);
      if (tag == std::string::npos || tag + 1 >= src_.size()) {
        tag = std::string::npos;
        break;
      }
      const char c = src_[tag + 1];
      if (c == '{' || c == '%' || c == '#') break;
      ++tag;
    }
    lex_data(tag);
    if (tag == std::string::npos) break;
    const char kind = src_[pos_ + 1];
    if (kind == '#') {
      lex_comment();
    } else {
      lex_tag(kind == '%');
    }
  }
  push(Tok::kEof, "");
  return std::move(tokens_);
}

void Lexer::lex_data(size_t tag) {
  const size_t end = tag == std::string::npos ? src_.size() : tag;
  std::string_view data(src_.data() + pos_, end - pos_);
  bool line_starting = pos_ == 0 || src_[pos_ - 1] == '\n';
  if (strip_next_) {
    data = lstrip(data);
  } else if (trim_next_ && !data.empty() && data[0] == '\n') {
    data.remove_prefix(1);
    line_starting = true;
  }
  strip_next_ = trim_next_ = false;
  if (tag != std::string::npos) {
    const char kind = src_[tag + 1];
    const char marker = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
    if (marker == '-') {
      data = rstrip(data);
    } else if (marker != '+' && kind != '{') {
      // lstrip_blocks: a block or comment that starts its line takes the indentation with it.
      const size_t line_pos = data.rfind('\n') + 1;  // npos + 1 == 0
      if ((line_pos > 0 || line_starting) &&
          data.find_first_not_of(" \t", line_pos) == std::string_view::npos) {
        data = data.substr(0, line_pos);
      }
    }
  }
  if (!data.empty()) push(Tok::kData, std::string(data));
  advance_to(end);
}

void Lexer::lex_comment() {
  const size_t end = src_.find("#}", pos_ + 2);
  if (end == std::string::npos) fail("unterminated comment");
  const bool strip = end > pos_ + 2 && src_[end - 1] == '-';
  const bool keep = end > pos_ + 2 && src_[end - 1] == '+';
  advance_to(end + 2);
  if (strip) {
    strip_next_ = true;
  } else if (!keep) {
    trim_next_ = true;
  }
}

void Lexer::after_tag_end(char marker, bool block) {
  if (marker == '-') {
    strip_next_ = true;
  } else if (block && marker != '+') {
    trim_next_ = true;
  }
}

std::string Lexer::lex_string() {
  const char quote = src_[pos_];
  std::string out;
  size_t i = pos_ + 1;
  for (;;) {
    if (i >= src_.size()) fail("unterminated string");
    const char c = src_[i];
    if (c == quote) break;
    if (c != '\\') {
      out.push_back(c);
      ++i;
      continue;
    }
    if (i + 1 >= src_.size()) fail("unterminated string");
    const char e = src_[i + 1];
    i += 2;
    switch (e) {
      case 'n':
        out.push_back('\n');
        break;
      case 't':
        out.push_back('\t');
        break;
      case 'r':
        out.push_back('\r');
        break;
      case 'b':
        out.push_back('\b');
        break;
      case 'f':
        out.push_back('\f');
        break;
      case 'v':
        out.push_back('\v');
        break;
      case 'a':
        out.push_back('\a');
        break;
      case '\\':
        out.push_back('\\');
        break;
      case '\'':
        out.push_back('\'');
        break;
      case '"':
        out.push_back('"');
        break;
      case '\n':
        break;  // line continuation
      case 'x':
      case 'u':
      case 'U': {
        const int n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        char32_t cp = 0;
        for (int k = 0; k < n; ++k) {
          const int h = i + k < src_.size() ? hex_value(src_[i + k]) : -1;
          if (h < 0) fail(std::string("bad \\") + e + " escape in a string");
          cp = cp * 16 + char32_t(h);
        }
        i += n;
        if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) fail("bad code point escape");
        utf8::append(&out, cp);
        break;
      }
      default:
        if (e >= '0' && e <= '7') {  // octal, up to three digits
          char32_t cp = char32_t(e - '0');
          for (int k = 0; k < 2 && i < src_.size() && src_[i] >= '0' && src_[i] <= '7'; ++k) {
            cp = cp * 8 + char32_t(src_[i++] - '0');
          }
          utf8::append(&out, cp);
        } else {  // Python keeps unknown escapes as written
          out.push_back('\\');
          out.push_back(e);
        }
    }
  }
  advance_to(i + 1);
  return out;
}

void Lexer::lex_tag(bool block) {
  push(block ? Tok::kBlockBegin : Tok::kVarBegin, "");
  size_t start = pos_ + 2;
  if (start < src_.size() && (src_[start] == '-' || src_[start] == '+')) ++start;
  advance_to(start);
  int balance = 0;
  const std::string_view end = block ? "%}" : "}}";
  static constexpr std::string_view kOps[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/",
                                              "*",  "%",  "~",  "[",  "]",  "(",  ")", "{", "}",
                                              "<",  ">",  "=",  ".",  ":",  "|",  ",", ";"};
  for (;;) {
    while (pos_ < src_.size() && (src_[pos_] == ' ' || src_[pos_] == '\t' || src_[pos_] == '\n')) {
      advance_to(pos_ + 1);
    }
    if (pos_ >= src_.size()) fail(std::string("unterminated ") + (block ? "{% tag" : "{{ tag"));
    const std::string_view rest(src_.data() + pos_, src_.size() - pos_);
    if (balance == 0) {
      const char marker = rest[0];
      if ((marker == '-' || (block && marker == '+')) && rest.substr(1, 2) == end) {
        push(block ? Tok::kBlockEnd : Tok::kVarEnd, "");
        advance_to(pos_ + 3);
        after_tag_end(marker, block);
        return;
      }
      if (rest.substr(0, 2) == end) {
        push(block ? Tok::kBlockEnd : Tok::kVarEnd, "");
        advance_to(pos_ + 2);
        after_tag_end('\0', block);
        return;
      }
    }
    const char c = rest[0];
    if (is_name_start(c)) {
      size_t n = 1;
      while (n < rest.size() && (is_name_start(rest[n]) || is_digit(rest[n]))) ++n;
      push(Tok::kName, std::string(rest.substr(0, n)));
      advance_to(pos_ + n);
    } else if (is_digit(c)) {
      size_t n = 1;
      while (n < rest.size() && (is_digit(rest[n]) || rest[n] == '_')) ++n;
      bool is_float = false;
      if (n + 1 < rest.size() && rest[n] == '.' && is_digit(rest[n + 1])) {
        is_float = true;
        n += 1;
        while (n < rest.size() && (is_digit(rest[n]) || rest[n] == '_')) ++n;
      }
      if (n < rest.size() && (rest[n] == 'e' || rest[n] == 'E')) {
        size_t k = n + 1;
        if (k < rest.size() && (rest[k] == '+' || rest[k] == '-')) ++k;
        if (k < rest.size() && is_digit(rest[k])) {
          is_float = true;
          n = k;
          while (n < rest.size() && is_digit(rest[n])) ++n;
        }
      }
      std::string text(rest.substr(0, n));
      text.erase(std::remove(text.begin(), text.end(), '_'), text.end());
      push(is_float ? Tok::kFloat : Tok::kInt, text);
      advance_to(pos_ + n);
    } else if (c == '\'' || c == '"') {
      const int line = line_;
      std::string value = lex_string();
      tokens_.push_back({Tok::kString, std::move(value), line});
    } else {
      bool matched = false;
      for (std::string_view op : kOps) {
        if (rest.substr(0, op.size()) != op) continue;
        if (op == "(" || op == "[" || op == "{") ++balance;
        if (op == ")" || op == "]" || op == "}") --balance;
        push(Tok::kOp, std::string(op));
        advance_to(pos_ + op.size());
        matched = true;
        break;
      }
      if (!matched) fail(std::string("unexpected character '") + c + "'");
    }
  }
}

}  // namespace

std::vector<Token> lex(std::string_view source) {
  return Lexer(source).run();
}

}  // namespace duet::jinja
