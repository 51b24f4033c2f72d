// GPT-2 byte-level alphabet (bytes_to_unicode): every byte is written as one printable code
// point, so byte-level BPE token strings never contain spaces or control characters. Printable
// bytes ('!'..'~', 0xA1..0xAC, 0xAE..0xFF) stand for themselves; the other 68 bytes, in byte
// order, become U+0100, U+0101, ... (space -> U+0120 'Ġ', '\n' -> U+010A 'Ċ').
// Private to the tokenizer and its builder.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace duet::byte_level {

constexpr bool is_printable_byte(int b) {
  return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

// [256] code point that byte b is written as.
constexpr std::array<char32_t, 256> make_byte_to_code_point() {
  std::array<char32_t, 256> table{};
  int n = 0;
  for (int b = 0; b < 256; ++b) table[b] = is_printable_byte(b) ? char32_t(b) : char32_t(256 + n++);
  return table;
}
inline constexpr std::array<char32_t, 256> kByteToCodePoint = make_byte_to_code_point();

// Appends code point cp (< 0x800, which covers the whole alphabet) as UTF-8.
inline void append_utf8_small(std::string* out, char32_t cp) {
  if (cp < 0x80) {
    out->push_back(char(cp));
  } else {
    out->push_back(char(0xC0 | (cp >> 6)));
    out->push_back(char(0x80 | (cp & 0x3F)));
  }
}

// Raw bytes -> byte-level token string ("a b" -> "aĠb").
inline std::string encode_bytes(std::string_view raw) {
  std::string out;
  out.reserve(raw.size() * 2);
  for (unsigned char c : raw) append_utf8_small(&out, kByteToCodePoint[c]);
  return out;
}

// [256 + 68] byte that code point cp stands for, or -1 if cp is outside the alphabet.
constexpr std::array<int16_t, 256 + 68> make_code_point_to_byte() {
  std::array<int16_t, 256 + 68> table{};
  for (auto& t : table) t = -1;
  for (int b = 0; b < 256; ++b) table[kByteToCodePoint[b]] = int16_t(b);
  return table;
}
inline constexpr std::array<int16_t, 256 + 68> kCodePointToByte = make_code_point_to_byte();

// Byte-level token string -> raw bytes. Returns false (and leaves *raw unspecified) when the
// string holds a character outside the alphabet, e.g. an added token such as "<｜User｜>".
inline bool decode_token(std::string_view mapped, std::string* raw) {
  raw->clear();
  for (size_t i = 0; i < mapped.size();) {
    unsigned char c = mapped[i];
    char32_t cp;
    if (c < 0x80) {
      cp = c;
      i += 1;
    } else if ((c & 0xE0) == 0xC0 && i + 1 < mapped.size() && (mapped[i + 1] & 0xC0) == 0x80) {
      cp = (char32_t(c & 0x1F) << 6) | (mapped[i + 1] & 0x3F);
      i += 2;
    } else {
      return false;  // three- and four-byte sequences are never in the alphabet
    }
    if (cp >= kCodePointToByte.size() || kCodePointToByte[cp] < 0) return false;
    raw->push_back(char(kCodePointToByte[cp]));
  }
  return true;
}

}  // namespace duet::byte_level
