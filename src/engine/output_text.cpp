#include "engine/output_text.h"

#include <algorithm>

#include "core/error.h"
#include "text/tokenizer.h"

namespace duet {

namespace {
// Length of the UTF-8 sequence a lead byte starts (0 for a byte that cannot lead one).
int lead_length(unsigned char c) {
  if (c < 0x80) return 1;
  if (c >= 0xc2 && c <= 0xdf) return 2;
  if (c >= 0xe0 && c <= 0xef) return 3;
  if (c >= 0xf0 && c <= 0xf4) return 4;
  return 0;
}
}  // namespace

size_t utf8_complete_end(const std::string& s, size_t end) {
  // Look back at most 3 bytes for the lead byte of a sequence still waiting for bytes.
  for (size_t back = 1; back <= 3 && back <= end; ++back) {
    const auto c = static_cast<unsigned char>(s[end - back]);
    if ((c & 0xc0) == 0x80) continue;  // continuation byte: keep looking for the lead
    const int need = lead_length(c);
    return need > static_cast<int>(back) ? end - back : end;
  }
  return end;
}

OutputText::OutputText(std::vector<std::string> stop) : stop_(std::move(stop)) {
  for (const std::string& s : stop_) {
    DUET_CHECK(!s.empty(), "empty stop string");
    max_stop_ = std::max(max_stop_, s.size());
  }
}

bool OutputText::append(const std::string& bytes) {
  DUET_CHECK(!stopped_, "append after a stop string");
  const size_t old = text_.size();
  text_ += bytes;
  if (max_stop_ == 0) return false;
  // Only a match that ends in the new bytes is new: start far enough back to catch it.
  const size_t from = old >= max_stop_ - 1 ? old - (max_stop_ - 1) : 0;
  size_t best = std::string::npos;
  for (const std::string& s : stop_) best = std::min(best, text_.find(s, from));
  if (best == std::string::npos) return false;
  text_.resize(std::max(best, sent_));
  stopped_ = true;
  return true;
}

std::string OutputText::take_ready() {
  if (stopped_) return take_rest();
  // Hold back the bytes that could be the start of a stop string.
  size_t end = text_.size();
  if (max_stop_ > 1) end = end >= max_stop_ - 1 ? end - (max_stop_ - 1) : 0;
  end = utf8_complete_end(text_, std::max(end, sent_));
  if (end <= sent_) return {};
  std::string out = utf8_lossy(text_.substr(sent_, end - sent_));
  sent_ = end;
  return out;
}

std::string OutputText::take_rest() {
  std::string out = sent_ < text_.size() ? utf8_lossy(text_.substr(sent_)) : std::string();
  sent_ = text_.size();
  return out;
}

}  // namespace duet
