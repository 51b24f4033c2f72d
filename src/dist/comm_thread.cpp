#include "dist/comm_thread.h"

#include "core/error.h"

namespace duet {

void CommHandle::wait() {
  if (!task_) return;
  std::unique_lock<std::mutex> lock(task_->mu);
  // The backend's watchdog fires first for a missing peer; this one also catches a
  // communication thread that is stuck behind something else, plus a grace for the poll step.
  const auto limit = watchdog_ + std::chrono::seconds(1);
  if (!task_->cv.wait_for(lock, limit, [this] { return task_->done; })) {
    DUET_ERROR(task_->name << ": not finished after " << limit.count()
                           << " ms (the communication thread is stuck)");
  }
  if (task_->error) std::rethrow_exception(task_->error);
}

bool CommHandle::done() const {
  if (!task_) return true;
  std::lock_guard<std::mutex> lock(task_->mu);
  return task_->done;
}

CommThread::CommThread(std::string name, std::chrono::milliseconds watchdog)
    : name_(std::move(name)), watchdog_(watchdog), thread_([this] { loop(); }) {}

CommThread::~CommThread() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

CommHandle CommThread::submit(std::string name, std::function<void()> run) {
  auto task = std::make_shared<detail::CommTask>();
  task->name = std::move(name);
  task->run = std::move(run);
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(task);
  }
  cv_.notify_one();
  return CommHandle(task, watchdog_);
}

void CommThread::loop() {
  for (;;) {
    std::shared_ptr<detail::CommTask> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and drained
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    std::exception_ptr error = failed_;
    if (!error) {
      try {
        task->run();
      } catch (...) {
        error = std::current_exception();
        failed_ = error;
      }
    }
    task->run = nullptr;  // drop captured buffers' owners before signalling
    {
      std::lock_guard<std::mutex> lock(task->mu);
      task->done = true;
      task->error = error;
    }
    task->cv.notify_all();
  }
}

}  // namespace duet
