#include "server/client_socket.h"

#include <dirent.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <utility>

namespace duet {

namespace {

// addr:port as text, the way httplib formats a connection's ends (getnameinfo, numeric).
bool endpoint(const sockaddr_storage& ss, socklen_t len, std::string* addr, int* port) {
  if (ss.ss_family == AF_INET) {
    *port = ntohs(reinterpret_cast<const sockaddr_in&>(ss).sin_port);
  } else if (ss.ss_family == AF_INET6) {
    *port = ntohs(reinterpret_cast<const sockaddr_in6&>(ss).sin6_port);
  } else {
    return false;
  }
  char host[NI_MAXHOST] = {};
  if (::getnameinfo(reinterpret_cast<const sockaddr*>(&ss), len, host, sizeof host, nullptr, 0,
                    NI_NUMERICHOST) != 0) {
    return false;
  }
  *addr = host;
  return true;
}

bool end_is(int fd, bool peer, const std::string& want_addr, int want_port) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  const int rc = peer ? ::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len)
                      : ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  if (rc != 0) return false;
  std::string addr;
  int port = -1;
  return endpoint(ss, len, &addr, &port) && port == want_port && addr == want_addr;
}

}  // namespace

int find_connection_socket(const std::string& local_addr, int local_port,
                           const std::string& remote_addr, int remote_port) {
  if (local_port <= 0 || remote_port <= 0) return -1;
  DIR* dir = ::opendir("/proc/self/fd");
  if (!dir) return -1;
  int found = -1;
  while (const dirent* e = ::readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == ::dirfd(dir)) continue;
    // The peer first: it rules out listening sockets and every other connection at once.
    if (end_is(static_cast<int>(fd), /*peer=*/true, remote_addr, remote_port) &&
        end_is(static_cast<int>(fd), /*peer=*/false, local_addr, local_port)) {
      found = static_cast<int>(fd);
      break;
    }
  }
  ::closedir(dir);
  return found;
}

std::vector<ServedConnection> served_connections(int local_port) {
  std::vector<ServedConnection> out;
  DIR* dir = ::opendir("/proc/self/fd");
  if (!dir) return out;
  while (const dirent* e = ::readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == ::dirfd(dir)) continue;
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    std::string addr;
    int port = -1;
    if (::getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&ss), &len) != 0 ||
        !endpoint(ss, len, &addr, &port) || port != local_port) {
      continue;
    }
    ServedConnection c;
    c.fd = static_cast<int>(fd);
    len = sizeof ss;
    if (::getpeername(c.fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0 ||
        !endpoint(ss, len, &c.remote_addr, &c.remote_port)) {
      continue;  // the listening socket, or not connected
    }
    out.push_back(std::move(c));
  }
  ::closedir(dir);
  return out;
}

int claim_connection(const ServedConnection& c, int local_port) {
  const int fd = ::dup(c.fd);
  if (fd < 0) return -1;
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  std::string addr;
  int port = -1;
  bool same = ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0 &&
              endpoint(ss, len, &addr, &port) && port == local_port;
  len = sizeof ss;
  same = same && ::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0 &&
         endpoint(ss, len, &addr, &port) && addr == c.remote_addr && port == c.remote_port;
  if (!same) {
    ::close(fd);
    return -1;
  }
  return fd;
}

bool peer_hung_up(int fd) {
  pollfd p{fd, POLLRDHUP, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

}  // namespace duet
