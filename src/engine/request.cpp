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
