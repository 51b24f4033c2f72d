// find_connection_socket and peer_hung_up on real loopback TCP connections.
#include "server/client_socket.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace duet {
namespace {

int port_of(int fd, bool peer) {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  if (peer) {
    ::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len);
  } else {
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  }
  return ntohs(a.sin_port);
}

// A listening socket on 127.0.0.1 and n clients connected to it, with the server's ends.
struct Loopback {
  int listener = -1;
  std::vector<int> clients, served;

  explicit Loopback(int n) {
    listener = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_EQ(::listen(listener, 16), 0);
    socklen_t len = sizeof a;
    ::getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len);
    for (int i = 0; i < n; ++i) {
      const int c = ::socket(AF_INET, SOCK_STREAM, 0);
      EXPECT_EQ(::connect(c, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
      clients.push_back(c);
      served.push_back(::accept(listener, nullptr, nullptr));
    }
  }
  ~Loopback() {
    for (int fd : clients)
      if (fd >= 0) ::close(fd);
    for (int fd : served) ::close(fd);
    ::close(listener);
  }
};

TEST(ClientSocket, FindsTheServedEndOfEachConnection) {
  Loopback lo(3);
  for (size_t i = 0; i < lo.served.size(); ++i) {
    const int s = lo.served[i];
    EXPECT_EQ(find_connection_socket("127.0.0.1", port_of(s, false), "127.0.0.1", port_of(s, true)),
              s)
        << "connection " << i;
    // The client's end of the same connection has the two addresses the other way round.
    const int c = lo.clients[i];
    EXPECT_EQ(find_connection_socket("127.0.0.1", port_of(s, true), "127.0.0.1", port_of(s, false)),
              c);
  }
  EXPECT_EQ(find_connection_socket("127.0.0.1", port_of(lo.served[0], false), "127.0.0.1", 1), -1);
  EXPECT_EQ(find_connection_socket("10.9.9.9", port_of(lo.served[0], false), "127.0.0.1",
                                   port_of(lo.served[0], true)),
            -1);
  EXPECT_EQ(find_connection_socket("127.0.0.1", -1, "127.0.0.1", -1), -1);
}

TEST(ClientSocket, HangUpIsSeenAndPipelinedBytesAreNot) {
  Loopback lo(2);
  EXPECT_FALSE(peer_hung_up(lo.served[0]));
  // A client that sends more (a pipelined request) has not hung up, and the bytes stay unread.
  ASSERT_EQ(::write(lo.clients[0], "GET", 3), 3);
  usleep(20000);
  EXPECT_FALSE(peer_hung_up(lo.served[0]));
  char buf[8] = {};
  EXPECT_EQ(::recv(lo.served[0], buf, sizeof buf, MSG_DONTWAIT), 3);
  ::close(lo.clients[1]);
  lo.clients[1] = -1;
  usleep(20000);
  EXPECT_TRUE(peer_hung_up(lo.served[1]));
  EXPECT_FALSE(peer_hung_up(lo.served[0]));
}

// served_connections lists the server's ends with their peers; claim_connection gives a
// descriptor of its own for a listed connection, and none once that connection is closed even
// when its descriptor number now belongs to another connection.
TEST(ClientSocket, ClaimingAListedConnectionThatWasReplacedGivesNothing) {
  Loopback lo(2);
  const int local_port = port_of(lo.served[0], false);
  const std::vector<ServedConnection> listed = served_connections(local_port);
  ASSERT_EQ(listed.size(), 2u);
  ServedConnection first;
  for (const ServedConnection& c : listed) {
    if (c.fd == lo.served[0]) first = c;
  }
  ASSERT_EQ(first.fd, lo.served[0]);
  EXPECT_EQ(first.remote_port, port_of(lo.served[0], true));
  const int mine = claim_connection(first, local_port);
  ASSERT_GE(mine, 0);
  EXPECT_NE(mine, first.fd);
  EXPECT_EQ(port_of(mine, true), first.remote_port);
  ::close(mine);
  // The connection ends; a new one takes its descriptor number.
  ::close(lo.served[0]);
  ::close(lo.clients[0]);
  lo.clients[0] = -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(local_port));
  const int c = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_EQ(::connect(c, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  lo.clients[0] = c;
  lo.served[0] = ::accept(lo.listener, nullptr, nullptr);
  ASSERT_EQ(lo.served[0], first.fd) << "the new connection did not reuse the number";
  EXPECT_EQ(claim_connection(first, local_port), -1);
  const ServedConnection now{lo.served[0], "127.0.0.1", port_of(lo.served[0], true)};
  const int theirs = claim_connection(now, local_port);
  EXPECT_GE(theirs, 0);
  if (theirs >= 0) ::close(theirs);
  EXPECT_EQ(claim_connection(now, local_port + 1), -1);
}

}  // namespace
}  // namespace duet
