// A deadline for a request to arrive (headers and body), the defence against slow clients that a
// per-read timeout is not: Debian's cpp-httplib (0.11) gives up on a connection only when a single
// read waits longer than its read timeout, so a client that sends a byte every few seconds holds
// an HTTP thread for ever, and as many such clients as threads stop the server (slowloris).
//
// A watcher thread looks at the server's connections twice a second (this process's sockets
// whose local port is the server's, found through /proc/self/fd as client_socket.h does). A
// connection is waiting for its request from when the watcher first sees it, or from when its
// last response went out (keep-alive), until the server says the request arrived
// (request_started: the handler of a POST, the pre-routing handler of others). One that waits
// longer than the deadline gets an HTTP 408 with an OpenAI-style error body and is shut down,
// which ends httplib's read at once and frees its thread. An idle keep-alive connection is
// closed quietly by httplib after 5 s, before a deadline of at least that (serve's minimum).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

namespace duet {

class HeaderDeadline {
 public:
  explicit HeaderDeadline(std::chrono::milliseconds deadline) : deadline_(deadline) {}
  ~HeaderDeadline() { stop(); }
  HeaderDeadline(const HeaderDeadline&) = delete;
  HeaderDeadline& operator=(const HeaderDeadline&) = delete;

  // Starts watching the connections to local_port. Once.
  void start(int local_port);
  // Stops the watcher (also on destruction).
  void stop();

  // The connection from remote_addr:remote_port has sent its request: no deadline until its
  // response went out. Thread-safe.
  void request_started(const std::string& remote_addr, int remote_port);
  // Its response went out: the deadline starts again for the next request (keep-alive).
  void request_finished(const std::string& remote_addr, int remote_port);

  // Connections ended by the deadline so far.
  int64_t expired() const { return expired_.load(); }
  std::chrono::milliseconds deadline() const { return deadline_; }

 private:
  using Clock = std::chrono::steady_clock;
  using Peer = std::pair<std::string, int>;
  struct Connection {
    Clock::time_point waiting_since;  // for its request
    Clock::time_point last_seen;      // open, by a scan (or request_started)
    bool in_request = false;
  };

  void loop(int local_port);
  void scan(int local_port);

  const std::chrono::milliseconds deadline_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<Peer, Connection> connections_;  // GUARDED_BY(mu_)
  bool stop_ = false;                       // GUARDED_BY(mu_)
  std::atomic<int64_t> expired_{0};
  std::thread thread_;
};

}  // namespace duet
