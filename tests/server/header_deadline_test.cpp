// HeaderDeadline on real sockets: a connection that trickles its headers past the deadline gets a
// 408 and is shut down (the server's blocked read returns), one whose headers arrived is left
// alone however long its request takes, and after a response the deadline starts again.
#include "server/header_deadline.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <string>
#include <thread>

namespace duet {
namespace {

using Clock = std::chrono::steady_clock;

struct Listener {
  int fd = -1;
  int port = 0;
  Listener() {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_EQ(::listen(fd, 8), 0);
    socklen_t len = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
  }
  ~Listener() { ::close(fd); }
  // Accepts one connection: its descriptor and the client's port (the client is 127.0.0.1).
  std::pair<int, int> accept() const {
    sockaddr_in a{};
    socklen_t len = sizeof a;
    const int c = ::accept(fd, reinterpret_cast<sockaddr*>(&a), &len);
    return {c, ntohs(a.sin_port)};
  }
};

int connect_to(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  timeval tv{5, 0};  // no test waits for ever
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

// Sends a header byte every 100 ms until the peer ends the connection or `limit` passes; returns
// what came back and the seconds it took.
std::pair<std::string, double> trickle(int fd, std::chrono::milliseconds limit) {
  const Clock::time_point t0 = Clock::now();
  const std::string line = "POST /v1/completions HTTP/1.1\r\nX-Slow: ";
  for (size_t i = 0; Clock::now() - t0 < limit; ++i) {
    if (::send(fd, &line[i % line.size()], 1, MSG_NOSIGNAL) != 1) break;
    char buf[512];
    const ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) {
      std::string got(buf, static_cast<size_t>(n));
      while (true) {  // the rest, until the server closes
        const ssize_t m = ::recv(fd, buf, sizeof buf, 0);
        if (m <= 0) break;
        got.append(buf, static_cast<size_t>(m));
      }
      return {got, std::chrono::duration<double>(Clock::now() - t0).count()};
    }
    if (n == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return {"", std::chrono::duration<double>(Clock::now() - t0).count()};
}

// The server's side of a connection, reading until the connection ends, as httplib's thread
// reads headers: whether its read ended (rather than timing out after `limit`).
bool read_until_end(int fd, std::chrono::seconds limit) {
  timeval tv{static_cast<time_t>(limit.count()), 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  char buf[256];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n == 0) return true;
    if (n < 0) return errno != EAGAIN && errno != EWOULDBLOCK;
  }
}

TEST(HeaderDeadlineTest, ATricklingClientGets408AndItsReadEnds) {
  Listener l;
  HeaderDeadline deadline(std::chrono::milliseconds(1000));
  const int client = connect_to(l.port);
  const auto [served, client_port] = l.accept();
  // Started after the accept, as a server's connections predate a scan: ThreadSanitizer models
  // descriptors and wants the watcher to see the accept happen before its own use of the socket.
  deadline.start(l.port);
  bool read_ended = false;
  std::thread server(
      [&, fd = served] { read_ended = read_until_end(fd, std::chrono::seconds(14)); });
  const auto [reply, seconds] = trickle(client, std::chrono::milliseconds(12000));
  server.join();
  EXPECT_EQ(reply.rfind("HTTP/1.1 408 Request Timeout\r\n", 0), 0u) << reply;
  EXPECT_NE(reply.find("\"code\":408"), std::string::npos) << reply;
  EXPECT_GE(seconds, 1.0);
  EXPECT_LT(seconds, 10.0);  // the deadline and a scan interval, with slack for a loaded host
  EXPECT_TRUE(read_ended) << "the server's read did not end";
  EXPECT_EQ(deadline.expired(), 1);
  ::close(client);
  ::close(served);
  (void)client_port;
}

TEST(HeaderDeadlineTest, ARequestInProgressIsLeftAloneAndTheDeadlineRestartsAfterIt) {
  Listener l;
  HeaderDeadline deadline(std::chrono::milliseconds(800));
  const int client = connect_to(l.port);
  const auto [served, client_port] = l.accept();
  deadline.start(l.port);                              // after the accept, as above
  deadline.request_started("127.0.0.1", client_port);  // its headers are in
  // Twice the deadline in its request (a long stream, say): not touched.
  const auto [nothing, waited] = trickle(client, std::chrono::milliseconds(1800));
  EXPECT_EQ(nothing, "");
  EXPECT_GE(waited, 1.8);
  EXPECT_EQ(deadline.expired(), 0);
  // Its response went out: the next request's headers are due within the deadline.
  deadline.request_finished("127.0.0.1", client_port);
  const auto [reply, seconds] = trickle(client, std::chrono::milliseconds(12000));
  EXPECT_EQ(reply.rfind("HTTP/1.1 408", 0), 0u) << reply;
  EXPECT_LT(seconds, 10.0);
  EXPECT_EQ(deadline.expired(), 1);
  ::close(client);
  ::close(served);
}

}  // namespace
}  // namespace duet
