#include "engine/stream_waker.h"

#include "core/affinity.h"

namespace duet {

StreamWaker::StreamWaker()
    : thread_([this] {
        name_this_thread("duet-waker");
        loop();
      }) {}

StreamWaker::~StreamWaker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void StreamWaker::wake(std::vector<std::shared_ptr<RequestStream>>& streams) {
  // A stream whose wake-up is still queued needs no second one: when the waker falls behind (its
  // core is busy), each wake-up hands over several steps' tokens at once.
  std::erase_if(streams, [](const std::shared_ptr<RequestStream>& s) { return !s->queue_wake(); });
  if (streams.empty()) return;
  bool was_empty = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    was_empty = queued_.empty();
    if (was_empty) {
      queued_.swap(streams);  // the caller gets the (empty) buffer of the last batch back
    } else {
      queued_.insert(queued_.end(), streams.begin(), streams.end());
    }
  }
  streams.clear();
  // A non-empty queue means the waker has not taken the last batch yet: it is awake already.
  if (was_empty) cv_.notify_one();
}

void StreamWaker::loop() {
  std::vector<std::shared_ptr<RequestStream>> batch;
  for (;;) {
    batch.clear();  // released here, not under the lock the engine thread takes
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queued_.empty(); });
      if (queued_.empty()) return;  // stop_
      batch.swap(queued_);
    }
    for (const std::shared_ptr<RequestStream>& s : batch) {
      s->wake_taken();  // output handed over from here on gets a wake-up of its own
      s->wake();
    }
  }
}

}  // namespace duet
