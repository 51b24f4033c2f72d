#include "dist/beat_sockets.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <sstream>

#include "core/error.h"

namespace duet {
namespace {

using Clock = std::chrono::steady_clock;

// A connecting rank sends the listener's token and its own rank; the listener answers with its
// rank once the token is its own. 12 and 4 bytes, host order (the ranks of a job share an ISA).
struct Hello {
  uint64_t token;
  int32_t rank;
} __attribute__((packed));

// How long one address may take to answer before the next is tried.
constexpr std::chrono::milliseconds kAttempt{1000};

void set_nonblocking(int fd) {
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

// IPv4 addresses of this host's interfaces that are up, loopback last (a peer on another host
// reaches us by the others; one on this host by any).
std::vector<std::string> local_addresses() {
  std::vector<std::string> outer, loop;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return {"127.0.0.1"};
  for (ifaddrs* a = list; a; a = a->ifa_next) {
    if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET || !(a->ifa_flags & IFF_UP)) continue;
    char text[INET_ADDRSTRLEN];
    const auto* in = reinterpret_cast<const sockaddr_in*>(a->ifa_addr);
    if (!inet_ntop(AF_INET, &in->sin_addr, text, sizeof text)) continue;
    ((a->ifa_flags & IFF_LOOPBACK) ? loop : outer).push_back(text);
  }
  freeifaddrs(list);
  outer.insert(outer.end(), loop.begin(), loop.end());
  if (outer.empty()) outer.push_back("127.0.0.1");
  return outer;
}

// A rank's record: "token port address address ...".
struct Record {
  uint64_t token = 0;
  int port = 0;
  std::vector<std::string> addresses;
};

Record parse_record(const std::string& text) {
  Record r;
  std::istringstream in(text);
  in >> r.token >> r.port;
  for (std::string a; in >> a;) r.addresses.push_back(a);
  return r;
}

// Starts a non-blocking connection to address:port; -1 if it failed at once.
int start_connect(const std::string& address, int port) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, address.c_str(), &sa.sin_addr) != 1) return -1;
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  set_nonblocking(fd);
  if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 && errno != EINPROGRESS) {
    close(fd);
    return -1;
  }
  return fd;
}

// One connection in the making: ours to a higher rank (peer known) or a lower rank's to us
// (peer known once its hello arrives).
struct Attempt {
  int fd = -1;
  int peer = -1;        // the rank at the other end (connector side: the one we dial)
  bool dialing = true;  // connector side: still connecting (else waiting for the answer)
  size_t address = 0;   // connector side: which of the peer's addresses
  Clock::time_point since;
  std::string got;  // bytes of the hello (listener side) or answer (connector side)
};

}  // namespace

BeatSockets::BeatSockets(int rank, int size, const Exchange& exchange,
                         std::chrono::milliseconds deadline)
    : rank_(rank), size_(size), fd_(size, -1), out_(size), in_(size) {
  const int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  DUET_CHECK(listener >= 0, "heartbeat: socket: " << std::strerror(errno));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof sa;
  if (bind(listener, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 ||
      listen(listener, size) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
    const std::string why = std::strerror(errno);
    close(listener);
    DUET_ERROR("heartbeat: cannot listen on a TCP port: " << why);
  }
  set_nonblocking(listener);
  std::random_device random;
  const uint64_t token = (uint64_t(random()) << 32) ^ random();
  std::ostringstream mine;
  mine << token << ' ' << ntohs(sa.sin_port);
  for (const std::string& a : local_addresses()) mine << ' ' << a;
  struct Closer {  // the listener goes however this ends (the exchange may throw)
    int fd;
    ~Closer() { close(fd); }
  } closer{listener};
  std::vector<Record> records;
  for (const std::string& r : exchange(mine.str())) records.push_back(parse_record(r));
  DUET_CHECK(static_cast<int>(records.size()) == size_,
             "heartbeat: " << records.size() << " records for " << size_ << " ranks");

  std::vector<Attempt> attempts;
  // The next address of a.peer, from a.address on; a.fd -1 once none is left (never the fd just
  // closed: its number may be another socket's by now).
  const auto dial = [&](Attempt& a) {
    const Record& r = records[a.peer];
    a.fd = -1;
    for (; a.address < r.addresses.size(); ++a.address) {
      a.fd = start_connect(r.addresses[a.address], r.port);
      if (a.fd >= 0) break;
    }
    a.dialing = true;
    a.got.clear();
    a.since = Clock::now();
  };
  for (int p = rank_ + 1; p < size_; ++p) {
    Attempt a;
    a.peer = p;
    dial(a);
    if (a.fd >= 0) attempts.push_back(a);
  }
  int awaited_lower = rank_;  // lower ranks that dial us
  const Clock::time_point end = Clock::now() + deadline;
  while ((!attempts.empty() || awaited_lower > 0) && Clock::now() < end) {
    std::vector<pollfd> polls{{listener, POLLIN, 0}};
    for (const Attempt& a : attempts)
      polls.push_back({a.fd, short(a.dialing && a.peer > rank_ ? POLLOUT : POLLIN), 0});
    poll(polls.data(), polls.size(), 50);
    if (polls[0].revents & POLLIN) {
      for (int fd; (fd = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK)) >= 0;) {
        Attempt a;
        a.fd = fd;
        a.dialing = false;
        a.since = Clock::now();
        attempts.push_back(a);
      }
    }
    std::vector<Attempt> next;
    for (size_t i = 0; i < attempts.size(); ++i) {
      Attempt a = attempts[i];
      const short ev = i + 1 < polls.size() ? polls[i + 1].revents : 0;
      bool failed = false, done = false;
      if (a.peer > rank_ && a.dialing) {  // ours: connected yet?
        if (ev) {
          int err = 0;
          socklen_t n = sizeof err;
          getsockopt(a.fd, SOL_SOCKET, SO_ERROR, &err, &n);
          const Hello hello{records[a.peer].token, rank_};
          failed = err != 0 || ::send(a.fd, &hello, sizeof hello, MSG_NOSIGNAL) != sizeof hello;
          a.dialing = false;
        }
      } else if (ev) {  // a hello (theirs) or an answer (ours) arriving
        char buf[sizeof(Hello)];
        const size_t want = (a.peer > rank_ ? sizeof(int32_t) : sizeof(Hello)) - a.got.size();
        const ssize_t n = recv(a.fd, buf, want, 0);
        if (n > 0) a.got.append(buf, size_t(n));
        failed = n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
        if (!failed && a.peer > rank_ && a.got.size() == sizeof(int32_t)) {
          int32_t theirs;
          std::memcpy(&theirs, a.got.data(), sizeof theirs);
          failed = theirs != a.peer;
          done = !failed;
        } else if (!failed && a.peer < 0 && a.got.size() == sizeof(Hello)) {
          Hello hello;
          std::memcpy(&hello, a.got.data(), sizeof hello);
          failed = hello.token != token || hello.rank < 0 || hello.rank >= rank_ ||
                   fd_[hello.rank] >= 0 ||
                   ::send(a.fd, &rank_, sizeof(int32_t), MSG_NOSIGNAL) != sizeof(int32_t);
          a.peer = hello.rank;
          done = !failed;
          awaited_lower -= done;
        }
      }
      if (!failed && !done && Clock::now() - a.since > kAttempt) failed = true;
      if (done) {
        set_nodelay(a.fd);
        fd_[a.peer] = a.fd;
      } else if (failed) {
        close(a.fd);
        if (a.peer > rank_) {  // ours: the peer's next address
          ++a.address;
          dial(a);
          if (a.fd >= 0) next.push_back(a);
        }
      } else {
        next.push_back(a);
      }
    }
    attempts.swap(next);
  }
  for (const Attempt& a : attempts) close(a.fd);
}

BeatSockets::~BeatSockets() {
  for (int p = 0; p < size_; ++p) close_peer(p);
}

int BeatSockets::n_connected() const {
  int n = 0;
  for (int fd : fd_) n += fd >= 0;
  return n;
}

void BeatSockets::close_peer(int peer) {
  if (fd_[peer] < 0) return;
  close(fd_[peer]);
  fd_[peer] = -1;
  out_[peer].clear();
  in_[peer].clear();
}

void BeatSockets::flush(int peer) {
  std::string& out = out_[peer];
  while (!out.empty()) {
    const ssize_t n = ::send(fd_[peer], out.data(), out.size(), MSG_NOSIGNAL);
    if (n > 0) {
      out.erase(0, size_t(n));
    } else {
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
      close_peer(peer);
      return;
    }
  }
}

void BeatSockets::send(const Beat& beat) {
  for (int p = 0; p < size_; ++p) {
    if (fd_[p] < 0) continue;
    if (out_[p].empty()) out_[p].assign(reinterpret_cast<const char*>(&beat), sizeof beat);
    flush(p);
  }
}

std::vector<std::pair<int, Beat>> BeatSockets::receive() {
  std::vector<std::pair<int, Beat>> got;
  for (int p = 0; p < size_; ++p) {
    while (fd_[p] >= 0) {
      char buf[16 * sizeof(Beat)];
      const ssize_t n = recv(fd_[p], buf, sizeof buf, 0);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) break;
      if (n <= 0) {
        close_peer(p);
        break;
      }
      std::string& in = in_[p];
      in.append(buf, size_t(n));
      size_t used = 0;
      for (; in.size() - used >= sizeof(Beat); used += sizeof(Beat)) {
        Beat b;
        std::memcpy(&b, in.data() + used, sizeof b);
        got.emplace_back(p, b);
      }
      in.erase(0, used);
    }
  }
  return got;
}

}  // namespace duet
