// The socket of the HTTP connection a handler is serving, so that a handler that waits (a
// non-streamed completion) can notice a client that hung up without writing anything, and so
// keep its status line unsent until it knows the outcome (200, or 503 when a rank died).
// Debian's cpp-httplib (0.11) does not hand the socket to handlers; the connection's two
// addresses, which it does hand over, name exactly one socket of the process.
#pragma once

#include <string>
#include <vector>

namespace duet {

// The descriptor of this process's TCP socket whose local end is local_addr:local_port and
// whose peer is remote_addr:remote_port (IPv4 or IPv6 text as httplib gives them), or -1 if
// there is none. Scans /proc/self/fd: call it once per request, not per poll.
int find_connection_socket(const std::string& local_addr, int local_port,
                           const std::string& remote_addr, int remote_port);

// This process's connected TCP sockets whose local port is local_port (a server's accepted
// connections), with their peers. Scans /proc/self/fd.
struct ServedConnection {
  int fd = -1;
  std::string remote_addr;
  int remote_port = 0;
};
std::vector<ServedConnection> served_connections(int local_port);

// A descriptor of this process's own for connection c of the server on local_port (a dup of
// c.fd, checked to be that same connection: a listed descriptor may have been closed and its
// number reused since), or -1 if c is gone. The caller closes it.
int claim_connection(const ServedConnection& c, int local_port);

// Whether the peer of socket fd has closed the connection (or it failed). Never blocks, never
// reads: bytes the client sent ahead (a pipelined request) stay for the HTTP library.
bool peer_hung_up(int fd);

}  // namespace duet
