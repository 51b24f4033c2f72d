// NFC normalization, for tokenizers whose normalizer is NFC (Qwen2/3). Text that has no
// character outside NFC_Quick_Check=Yes (all ASCII, and nearly all real text) is left as it is
// after one scan; the rest goes through decompose -> canonical order -> compose (UAX #15).
// Private to the tokenizer (and its tests).
//
// tokenizer_nfc_data.h is the output of this Python 3 script, run through clang-format:
// clang-format off
//   import unicodedata as u
//
//
//   def ranges(cps):
//       out = []
//       for c in sorted(cps):
//           if out and out[-1][1] == c - 1:
//               out[-1][1] = c
//           else:
//               out.append([c, c])
//       return out
//
//
//   def nfc(s):
//       return u.normalize('NFC', s)
//
//
//   cps = [c for c in range(0x110000) if not 0xD800 <= c < 0xE000]
//   ccc = {c: u.combining(chr(c)) for c in cps if u.combining(chr(c))}
//   dec = {}
//   for c in cps:
//       d = u.decomposition(chr(c))
//       if d and not d.startswith('<'):
//           p = [int(x, 16) for x in d.split()]
//           dec[c] = (p[0], p[1] if len(p) > 1 else 0)
//   comp = sorted((a, b, c) for c, (a, b) in dec.items() if b and nfc(chr(a) + chr(b)) == chr(c))
//   maybe = {b for a, b, c in comp} | set(range(0x1161, 0x1176)) | set(range(0x11A8, 0x11C3))
//   no = {c for c in cps if nfc(chr(c)) != chr(c)}
//   cr = []
//   for c in sorted(ccc):
//       if cr and cr[-1][1] == c - 1 and cr[-1][2] == ccc[c]:
//           cr[-1][1] = c
//       else:
//           cr.append([c, c, ccc[c]])
//
//
//   def emit(comment, typ, name, rows, n_hex, per_line):
//       items = []
//       for r in rows:
//           cols = [f'0x{v:X}' if i < n_hex else str(v) for i, v in enumerate(r)]
//           items.append('{' + ', '.join(cols) + '}')
//       print(comment)
//       print(f'inline constexpr {typ} {name}[] = {{')
//       for i in range(0, len(items), per_line):
//           print('    ' + ', '.join(items[i:i + per_line]) + ',')
//       print('};\n')
//
//
//   v = u.unidata_version
//   print(f'// Generated from Python unicodedata (Unicode {v}) by the script in tokenizer_nfc.h.')
//   print('// Do not edit by hand.')
//   print('''#pragma once
//
//   #include <cstdint>
//
//   namespace duet::nfc {
//
//   struct CodePointRange {
//     char32_t first, last;
//   };
//   struct CombiningClassRange {
//     char32_t first, last;
//     uint8_t ccc;
//   };
//   struct Decomposition {
//     char32_t cp, first, second;  // second == 0: a singleton
//   };
//   struct Composition {
//     char32_t first, second, composite;
//   };
//   ''')
//   emit('// Code points whose NFC_Quick_Check is No or Maybe, or whose combining class is\n'
//        '// not 0. (Hangul syllables, composed algorithmically, are Yes; trailing jamo Maybe.)',
//        'CodePointRange', 'kNotQuickNfc', ranges(set(ccc) | maybe | no), 2, 4)
//   emit('// Canonical_Combining_Class, for code points where it is not 0.',
//        'CombiningClassRange', 'kCombiningClass', cr, 2, 3)
//   emit('// Canonical decompositions (one level; apply again to the parts), by code point.',
//        'Decomposition', 'kDecompositions', sorted((c, a, b) for c, (a, b) in dec.items()), 3, 3)
//   emit('// Primary composites: the pairs that NFC composes, by (first, second).',
//        'Composition', 'kCompositions', comp, 3, 3)
//   print('}  // namespace duet::nfc')
// clang-format on
#pragma once
//
//   #include <cstdint>
//
//   namespace duet::nfc {{
//
//   struct CodePointRange {{
//     char32_t first, last;
//   }};
//   struct CombiningClassRange {{
//     char32_t first, last;
//     uint8_t ccc;
//   }};
//   struct Decomposition {{
//     char32_t cp, first, second;  // second == 0: a singleton
//   }};
//   struct Composition {{
//     char32_t first, second, composite;
//   }};
//
//   // Code points whose NFC_Quick_Check is No or Maybe, or whose combining class is not 0 (Hangul
//   // syllables, composed algorithmically, are Yes; their trailing jamo are Maybe).
//   ''' + emit('kNotQuickNfc', 'CodePointRange', qc, 5) + '''
//   // Canonical_Combining_Class, for code points where it is not 0.
//   ''' + emit('kCombiningClass', 'CombiningClassRange', cr, 4) + '''
//   // Canonical decompositions (one level; apply again to the parts), by code point.
//   ''' + emit('kDecompositions', 'Decomposition', sorted((c, a, b) for c, (a, b) in dec.items()),
//   4) + '''
//   // Primary composites: pairs that NFC composes, by (first, second).
//   ''' + emit('kCompositions', 'Composition', comp, 4) + '''
//   }  // namespace duet::nfc''')
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "text/tokenizer_nfc_data.h"
#include "text/tokenizer_utf8.h"

namespace duet::nfc {

namespace detail {

constexpr char32_t kHangulS = 0xAC00, kHangulL = 0x1100, kHangulV = 0x1161, kHangulT = 0x11A7;
constexpr int kHangulVCount = 21, kHangulTCount = 28, kHangulSCount = 11172;


inline uint8_t combining_class(char32_t cp) {
  if (cp < 0x300) return 0;
  auto it = std::upper_bound(std::begin(kCombiningClass), std::end(kCombiningClass), cp,
                             [](char32_t c, const CombiningClassRange& r) { return c < r.first; });
  if (it == std::begin(kCombiningClass)) return 0;
  --it;
  return cp <= it->last ? it->ccc : 0;
}

inline void decompose(char32_t cp, std::vector<char32_t>* out) {
  if (cp >= kHangulS && cp < kHangulS + kHangulSCount) {
    const char32_t s = cp - kHangulS;
    out->push_back(kHangulL + s / (kHangulVCount * kHangulTCount));
    out->push_back(kHangulV + (s % (kHangulVCount * kHangulTCount)) / kHangulTCount);
    if (s % kHangulTCount != 0) out->push_back(kHangulT + s % kHangulTCount);
    return;
  }
  auto it = std::lower_bound(std::begin(kDecompositions), std::end(kDecompositions), cp,
                             [](const Decomposition& d, char32_t c) { return d.cp < c; });
  if (it == std::end(kDecompositions) || it->cp != cp) {
    out->push_back(cp);
    return;
  }
  decompose(it->first, out);
  if (it->second != 0) decompose(it->second, out);
}

// The primary composite of first + second, or 0 if they do not compose.
inline char32_t compose(char32_t first, char32_t second) {
  if (first >= kHangulL && first < kHangulL + 19 && second >= kHangulV &&
      second < kHangulV + kHangulVCount) {
    return kHangulS + ((first - kHangulL) * kHangulVCount + (second - kHangulV)) * kHangulTCount;
  }
  if (first >= kHangulS && first < kHangulS + kHangulSCount &&
      (first - kHangulS) % kHangulTCount == 0 && second > kHangulT &&
      second < kHangulT + kHangulTCount) {
    return first + (second - kHangulT);
  }
  auto it = std::lower_bound(std::begin(kCompositions), std::end(kCompositions),
                             std::pair{first, second}, [](const Composition& c, auto key) {
                               return std::pair{c.first, c.second} < key;
                             });
  if (it == std::end(kCompositions) || it->first != first || it->second != second) return 0;
  return it->composite;
}

}  // namespace detail

// True if `text` (valid UTF-8) is in NFC by the quick check: no character in it has
// NFC_Quick_Check No or Maybe, nor a non-zero combining class.
inline bool is_quick_nfc(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    if (static_cast<unsigned char>(text[i]) < 0xCC) {  // below U+0300: always Yes
      i += static_cast<unsigned char>(text[i]) < 0x80 ? 1 : 2;
      continue;
    }
    const char32_t cp = utf8::next(text, &i);
    auto it = std::upper_bound(std::begin(kNotQuickNfc), std::end(kNotQuickNfc), cp,
                               [](char32_t c, const CodePointRange& r) { return c < r.first; });
    if (it != std::begin(kNotQuickNfc) && cp <= (it - 1)->last) return false;
  }
  return true;
}

// NFC of `text` (valid UTF-8).
inline std::string normalize(std::string_view text) {
  std::vector<char32_t> chars;  // canonical decomposition
  for (size_t i = 0; i < text.size();) detail::decompose(utf8::next(text, &i), &chars);
  // Canonical order: each run of non-starters sorted by combining class, stably.
  for (size_t i = 0; i < chars.size();) {
    if (detail::combining_class(chars[i]) == 0) {
      ++i;
      continue;
    }
    size_t end = i;
    while (end < chars.size() && detail::combining_class(chars[end]) != 0) ++end;
    std::stable_sort(chars.begin() + i, chars.begin() + end, [](char32_t a, char32_t b) {
      return detail::combining_class(a) < detail::combining_class(b);
    });
    i = end;
  }
  // Compose each character with the last starter unless a character between blocks it.
  std::vector<char32_t> out;
  out.reserve(chars.size());
  size_t starter = SIZE_MAX;
  for (char32_t c : chars) {
    const uint8_t ccc = detail::combining_class(c);
    if (starter != SIZE_MAX) {
      const bool adjacent = starter + 1 == out.size();
      const uint8_t last_ccc = detail::combining_class(out.back());
      if (adjacent || (last_ccc != 0 && last_ccc < ccc)) {
        if (char32_t composite = detail::compose(out[starter], c)) {
          out[starter] = composite;
          continue;
        }
      }
    }
    if (ccc == 0) starter = out.size();
    out.push_back(c);
  }
  std::string result;
  result.reserve(text.size());
  for (char32_t c : out) utf8::append(&result, c);
  return result;
}

}  // namespace duet::nfc
