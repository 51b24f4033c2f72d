#include "server/header_deadline.h"

#include <sys/socket.h>

#include <cstdio>
#include <iterator>
#include <vector>

#include "server/client_socket.h"

namespace duet {

namespace {

constexpr auto kScanEvery = std::chrono::milliseconds(500);
constexpr auto kForgetAfter = std::chrono::minutes(10);

// The 408 a connection gets before it is shut down: the OpenAI error object, and the connection
// closed so that no client waits for more.
std::string timeout_reply(std::chrono::milliseconds deadline) {
  char body[256];
  std::snprintf(
      body, sizeof body,
      "{\"error\":{\"message\":\"the request (headers and body) did not arrive within %.1f s\","
      "\"type\":\"invalid_request_error\",\"param\":null,\"code\":408}}",
      deadline.count() / 1000.0);
  const std::string b = body;
  return "HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\nConnection: "
         "close\r\nContent-Length: " +
         std::to_string(b.size()) + "\r\n\r\n" + b;
}

}  // namespace

void HeaderDeadline::start(int local_port) {
  thread_ = std::thread([this, local_port] { loop(local_port); });
}

void HeaderDeadline::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void HeaderDeadline::request_started(const std::string& remote_addr, int remote_port) {
  std::lock_guard<std::mutex> lock(mu_);
  Connection& c = connections_[{remote_addr, remote_port}];
  c.in_request = true;
  c.last_seen = Clock::now();  // the watcher may not have listed it yet
}

void HeaderDeadline::request_finished(const std::string& remote_addr, int remote_port) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = connections_.find({remote_addr, remote_port});
  if (it == connections_.end()) return;
  it->second.in_request = false;
  it->second.waiting_since = Clock::now();
}

void HeaderDeadline::loop(int local_port) {
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, kScanEvery, [this] { return stop_; })) {
    lock.unlock();
    scan(local_port);
    lock.lock();
  }
}

void HeaderDeadline::scan(int local_port) {
  const std::vector<ServedConnection> now_open = served_connections(local_port);
  const Clock::time_point now = Clock::now();
  std::vector<ServedConnection> expire;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const ServedConnection& s : now_open) {
      auto [it, added] = connections_.try_emplace({s.remote_addr, s.remote_port});
      Connection& c = it->second;
      if (added) c.waiting_since = now;
      c.last_seen = now;
      if (!c.in_request && now - c.waiting_since > deadline_) {
        expire.push_back(s);
        c.in_request = true;  // once: it is being closed
      }
    }
    // Forget connections gone since the last scan. One in a request may have been opened after
    // the listing above (request_started made its entry): it is kept until the handler is done
    // and a later scan misses it, or, if its response never went out, for a long while.
    for (auto it = connections_.begin(); it != connections_.end();) {
      const Connection& c = it->second;
      const bool gone = c.last_seen != now && (!c.in_request || now - c.last_seen > kForgetAfter);
      it = gone ? connections_.erase(it) : std::next(it);
    }
  }
  const std::string reply = timeout_reply(deadline_);
  for (const ServedConnection& c : expire) {
    // Through a descriptor of our own, checked to be that connection: httplib may have closed
    // the listed one since, and its number may now be another connection's.
    const int fd = claim_connection(c, local_port);
    if (fd < 0) continue;
    // httplib's thread is still reading this connection's request: it writes nothing meanwhile.
    (void)::send(fd, reply.data(), reply.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    ::shutdown(fd, SHUT_RDWR);  // httplib's read returns at once
    ::close(fd);
    ++expired_;
  }
}

}  // namespace duet
