// Wakes the HTTP threads whose request streams got output, on a thread of its own. Waking a
// sleeping thread is a system call, and the woken thread often takes the waker's core at once:
// done by the engine thread for every stream every step, it delays the launch of the next step
// and, with the overlapped scheduler, it takes the core the forward pass runs on. The engine
// thread hands the step's streams over in one go (one wake-up of this thread at most) and goes
// on; this thread wakes them. (SGLang and vLLM take the same work off their schedulers with a
// detokenizer process and an output-processing task.)
//
// Threads: wake() on the engine thread; the rest on the waker's own thread.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/request.h"

namespace duet {

class StreamWaker {
 public:
  // Starts the thread.
  StreamWaker();
  // Wakes the streams handed over before, then stops the thread.
  ~StreamWaker();
  StreamWaker(const StreamWaker&) = delete;
  StreamWaker& operator=(const StreamWaker&) = delete;

  // Takes the streams (whose output is already in place: RequestStream::flush(false)) and
  // returns at once; `streams` is left empty. Each will be woken (notified) soon after, once
  // for all the output it was handed over with until then.
  void wake(std::vector<std::shared_ptr<RequestStream>>& streams);

 private:
  void loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<RequestStream>> queued_;  // GUARDED_BY(mu_)
  bool stop_ = false;                                   // GUARDED_BY(mu_)
  std::thread thread_;  // last: starts after everything above exists
};

}  // namespace duet
