#include "engine/request.h"

namespace duet {

void RequestStream::push(const std::string& text, int32_t token) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.text += text;
    pending_.tokens.push_back(token);
    ++pending_.completion_tokens;
  }
  cv_.notify_all();
}

void RequestStream::finish(const std::string& reason, const std::string& text,
                           const std::string& error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (pending_.finished) return;
    pending_.text += text;
    pending_.finished = true;
    pending_.finish_reason = reason;
    pending_.error = error;
  }
  cv_.notify_all();
}

bool RequestStream::stage(const std::string& text, int32_t token) {
  const bool was_empty = staged_.empty();
  staged_.text += text;
  staged_.tokens.push_back(token);
  return was_empty;
}

bool RequestStream::stage_finish(const std::string& reason, const std::string& text,
                                 const std::string& error) {
  const bool was_empty = staged_.empty();
  if (staged_.finished) return was_empty;
  staged_.finished = true;
  staged_.reason = reason;
  staged_.final_text = text;
  staged_.error = error;
  return was_empty;
}

bool RequestStream::flush(bool wake) {
  if (staged_.empty()) return false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!pending_.finished) {
      pending_.text += staged_.text;
      pending_.tokens.insert(pending_.tokens.end(), staged_.tokens.begin(), staged_.tokens.end());
      pending_.completion_tokens += static_cast<int64_t>(staged_.tokens.size());
      if (staged_.finished) {
        pending_.text += staged_.final_text;
        pending_.finished = true;
        pending_.finish_reason = staged_.reason;
        pending_.error = staged_.error;
      }
    }
  }
  if (wake) cv_.notify_all();
  n_flushed_tokens_ += static_cast<int64_t>(staged_.tokens.size());
  // Keep the buffers' capacity for the next step's output.
  staged_.text.clear();
  staged_.tokens.clear();
  staged_.finished = false;
  return true;
}

StreamDelta RequestStream::wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  auto ready = [&] {
    return !pending_.tokens.empty() || !pending_.text.empty() ||
           (pending_.finished && !taken_final_);
  };
  cv_.wait_for(lock, timeout, ready);
  StreamDelta out = pending_;
  // Keep the running totals and the final state; hand out text and tokens once.
  pending_.text.clear();
  pending_.tokens.clear();
  if (out.finished) taken_final_ = true;
  return out;
}

}  // namespace duet
