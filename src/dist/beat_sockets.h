// Beat sockets: a TCP connection between every pair of ranks for the heartbeat's few bytes,
// apart from the data plane.
//
// The heartbeat's messages must not queue behind the all-to-all's. Over MPI they share the
// data's TCP connection between two ranks, so on a slow link a beat waits behind every byte
// already queued to that peer: 4 ranks behind 150 Mbit/s links, prefilling 2048 tokens each
// (6 MB per peer per layer), went silent for over 4 s and the watchdog took a healthy rank for
// dead. On a connection of its own a beat waits only behind the link's queue (milliseconds).
//
// Set up once, collectively, through `exchange` (each rank's listening port and addresses, and
// a token that a connecting peer must present); a pair that cannot connect within the deadline
// stays unconnected, and the heartbeat keeps its MPI messages for every peer anyway. The sockets
// are non-blocking: a send that cannot leave at once is kept (at most one beat per peer) and
// retried by the next call, so a stopped peer costs nothing.
//
// Not thread-safe: one thread (the heartbeat's) makes every call.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace duet {

// What a beat says: its number (increasing per sender) and the sender's state.
struct Beat {
  int64_t seq = 0;
  int64_t state = 0;
};

class BeatSockets {
 public:
  // Collective: every rank passes its own record, gets every rank's, in rank order.
  using Exchange = std::function<std::vector<std::string>(const std::string& mine)>;

  // Connects this rank (of `size`) to every other, giving up on a pair after `deadline`.
  // Throws duet::Error only if this rank cannot listen at all (no socket).
  BeatSockets(int rank, int size, const Exchange& exchange, std::chrono::milliseconds deadline);
  ~BeatSockets();
  BeatSockets(const BeatSockets&) = delete;
  BeatSockets& operator=(const BeatSockets&) = delete;

  bool connected(int peer) const { return fd_[peer] >= 0; }
  int n_connected() const;

  // Sends `beat` to every connected peer whose previous beat has left; never blocks.
  void send(const Beat& beat);
  // The beats that arrived since the last call, (peer, beat) in arrival order; never blocks. A
  // peer whose connection ends (it exited) is no longer connected.
  std::vector<std::pair<int, Beat>> receive();

 private:
  void close_peer(int peer);
  void flush(int peer);

  int rank_ = 0;
  int size_ = 1;
  std::vector<int> fd_;                // [size] the connection to each peer, -1 if none
  std::vector<std::string> out_, in_;  // [size] bytes not yet sent / a beat not yet whole
};

}  // namespace duet
