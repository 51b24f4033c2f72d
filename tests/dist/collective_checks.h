// Checks of every collective that any backend must pass, run by each rank of a test (the
// in-process tests and the MPI test program share them).
#pragma once

#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "dist/dist_context.h"

namespace duet::test {

// Rank s sends (s + r) % 3 int32 values to rank r: some parts are empty.
inline int64_t n_vals(int s, int r) {
  return (s + r) % 3;
}
inline int32_t val(int s, int r, int64_t i) {
  return s * 100 + r * 10 + static_cast<int32_t>(i);
}

inline void check_all_to_all_v(DistContext& ctx, bool async) {
  const int n = ctx.world_size(), me = ctx.rank();
  std::vector<int32_t> send;
  std::vector<int64_t> send_bytes, recv_bytes;
  for (int r = 0; r < n; ++r) {
    for (int64_t i = 0; i < n_vals(me, r); ++i) send.push_back(val(me, r, i));
    send_bytes.push_back(n_vals(me, r) * 4);
    recv_bytes.push_back(n_vals(r, me) * 4);
  }
  int64_t total = 0;
  for (int64_t b : recv_bytes) total += b;
  std::vector<int32_t> recv(static_cast<size_t>(total / 4) + 1, -1);  // +1: never written
  if (async) {
    CommHandle h = ctx.comm().start_all_to_all_v(send.data(), send_bytes, recv.data(), recv_bytes);
    h.wait();
    EXPECT_TRUE(h.done());
  } else {
    ctx.comm().all_to_all_v(send.data(), send_bytes, recv.data(), recv_bytes);
  }
  size_t k = 0;
  for (int s = 0; s < n; ++s)
    for (int64_t i = 0; i < n_vals(s, me); ++i) EXPECT_EQ(recv[k++], val(s, me, i));
  EXPECT_EQ(recv[k], -1);
}

inline void check_all_to_all_v_zero(DistContext& ctx) {
  std::vector<int64_t> zero(static_cast<size_t>(ctx.world_size()), 0);
  ctx.comm().all_to_all_v(nullptr, zero, nullptr, zero);
}

// The same parts as check_all_to_all_v, each sent from the start of a room of 3 values (the rest
// junk) and received into room for 3 values from each rank with no count told: each part lands
// at its room's start, its length is reported, and the rest of the room is untouched.
inline void check_all_to_all_bounded(DistContext& ctx) {
  const int n = ctx.world_size(), me = ctx.rank();
  std::vector<int32_t> send(static_cast<size_t>(3 * n), 99);
  std::vector<int64_t> send_bytes, room(static_cast<size_t>(n), 12);
  for (int r = 0; r < n; ++r) {
    for (int64_t i = 0; i < n_vals(me, r); ++i) send[r * 3 + i] = val(me, r, i);
    send_bytes.push_back(n_vals(me, r) * 4);
  }
  std::vector<int32_t> recv(static_cast<size_t>(3 * n), -1);
  std::vector<int64_t> got;
  ctx.comm()
      .start("bounded", [&](CollectiveOps& ops) {
        ops.all_to_all_bounded(send.data(), send_bytes, room, recv.data(), room, &got);
      })
      .wait();
  ASSERT_EQ(got.size(), static_cast<size_t>(n));
  for (int s = 0; s < n; ++s) {
    EXPECT_EQ(got[s], n_vals(s, me) * 4) << "from rank " << s;
    for (int64_t i = 0; i < 3; ++i) {
      EXPECT_EQ(recv[s * 3 + i], i < n_vals(s, me) ? val(s, me, i) : -1) << "from rank " << s;
    }
  }
}

// Parts of 0, 1 MiB (exactly one of MPI's chunks), 2 MiB + 12 and 1 MiB - 4 bytes, through
// all_to_all_v and all_to_all_bounded (some receivers' rooms exactly the part, so the chunk
// that ends a transfer is empty and fills nothing): every byte arrives where it belongs.
inline void check_large_transfers(DistContext& ctx) {
  const int n = ctx.world_size(), me = ctx.rank();
  constexpr int64_t kMiB = int64_t(1) << 20;
  const auto part = [](int s, int r) {  // bytes from s to r
    const int64_t sizes[4] = {0, kMiB, 2 * kMiB + 12, kMiB - 4};
    return sizes[(s + 2 * r) % 4];
  };
  const auto value = [](int s, int r, int64_t i) { return int32_t(s * 1000003 + r * 7919 + i); };
  std::vector<int64_t> send_bytes, recv_bytes, room, capacity;
  for (int r = 0; r < n; ++r) {
    send_bytes.push_back(part(me, r));
    recv_bytes.push_back(part(r, me));
    room.push_back(2 * kMiB + 64);
    capacity.push_back(part(r, me) + ((r + me) % 2 ? 0 : 64));
  }
  std::vector<int32_t> send;
  for (int r = 0; r < n; ++r) {
    for (int64_t i = 0; i < part(me, r) / 4; ++i) send.push_back(value(me, r, i));
  }
  // all_to_all_v: parts packed
  std::vector<int32_t> recv(
      size_t(std::accumulate(recv_bytes.begin(), recv_bytes.end(), int64_t(0)) / 4), -1);
  ctx.comm().all_to_all_v(send.data(), send_bytes, recv.data(), recv_bytes);
  size_t k = 0;
  for (int s = 0; s < n; ++s) {
    int64_t wrong = 0;
    for (int64_t i = 0; i < part(s, me) / 4; ++i) wrong += recv[k++] != value(s, me, i);
    EXPECT_EQ(wrong, 0) << "all_to_all_v from rank " << s;
  }
  // all_to_all_bounded: parts in rooms of 2 MiB + 64 bytes on the sending side
  std::vector<int32_t> roomy(size_t(n) * size_t(room[0] / 4), 0);
  for (int r = 0, at = 0; r < n; ++r) {
    std::copy(send.begin() + at, send.begin() + at + part(me, r) / 4,
              roomy.begin() + r * (room[0] / 4));
    at += int(part(me, r) / 4);
  }
  std::vector<int32_t> bounded(
      size_t(std::accumulate(capacity.begin(), capacity.end(), int64_t(0)) / 4), -1);
  std::vector<int64_t> got;
  ctx.comm()
      .start("bounded large",
             [&](CollectiveOps& ops) {
               ops.all_to_all_bounded(roomy.data(), send_bytes, room, bounded.data(), capacity,
                                      &got);
             })
      .wait();
  ASSERT_EQ(got.size(), size_t(n));
  k = 0;
  for (int s = 0; s < n; ++s) {
    EXPECT_EQ(got[s], part(s, me)) << "all_to_all_bounded from rank " << s;
    int64_t wrong = 0;
    for (int64_t i = 0; i < part(s, me) / 4; ++i)
      wrong += bounded[k + size_t(i)] != value(s, me, i);
    EXPECT_EQ(wrong, 0) << "all_to_all_bounded from rank " << s;
    k += size_t(capacity[s] / 4);
  }
}

inline void check_all_gather(DistContext& ctx) {
  const int n = ctx.world_size();
  std::vector<float> mine = {float(ctx.rank()), float(ctx.rank()) + 0.5f};
  std::vector<float> all(static_cast<size_t>(2 * n));
  ctx.comm().all_gather(mine.data(), 8, all.data());
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(all[2 * r], float(r));
    EXPECT_EQ(all[2 * r + 1], float(r) + 0.5f);
  }
  ctx.comm().all_gather(nullptr, 0, nullptr);  // zero bytes
}

inline void check_all_reduce(DistContext& ctx) {
  const int n = ctx.world_size(), me = ctx.rank();
  std::vector<float> f = {1.0f, float(me), 0.25f * float(me)};
  ctx.comm().all_reduce(f.data(), 3, ElemType::kF32, ReduceOp::kSum);
  EXPECT_FLOAT_EQ(f[0], float(n));
  EXPECT_FLOAT_EQ(f[1], float(n * (n - 1) / 2));
  EXPECT_FLOAT_EQ(f[2], 0.25f * float(n * (n - 1) / 2));
  std::vector<int64_t> i = {me, -me, 7};
  ctx.comm().start_all_reduce(i.data(), 3, ElemType::kI64, ReduceOp::kMax).wait();
  EXPECT_EQ(i, (std::vector<int64_t>{n - 1, 0, 7}));
  ctx.comm().all_reduce(nullptr, 0, ElemType::kF32, ReduceOp::kSum);  // empty
}

inline void check_in_flight(DistContext& ctx) {
  const int n = ctx.world_size();
  std::vector<int64_t> a = {1}, b = {ctx.rank()};
  std::vector<int64_t> g(static_cast<size_t>(n));
  CommHandle h1 = ctx.comm().start_all_reduce(a.data(), 1, ElemType::kI64, ReduceOp::kSum);
  CommHandle h2 = ctx.comm().start_all_gather(b.data(), 8, g.data());
  CommHandle h3 = ctx.comm().start("custom", [&](CollectiveOps& ops) {
    ops.all_reduce(b.data(), 1, ElemType::kI64, ReduceOp::kMax);  // after h2 read b
  });
  h3.wait();
  h1.wait();
  h2.wait();
  EXPECT_EQ(a[0], n);
  EXPECT_EQ(b[0], n - 1);
  for (int r = 0; r < n; ++r) EXPECT_EQ(g[r], r);
}

inline void check_coordinator(DistContext& ctx) {
  const int n = ctx.world_size(), me = ctx.rank();
  Coordinator& c = ctx.coord();
  EXPECT_EQ(c.rank(), me);
  EXPECT_EQ(c.world_size(), n);
  EXPECT_EQ(c.local_rank(), me);
  EXPECT_EQ(c.local_world_size(), n);
  EXPECT_EQ(c.is_master(), me == 0);
  EXPECT_EQ(c.is_local_master(), me == 0);
  for (int src = 0; src < n; ++src) {
    std::string msg = me == src ? "hello from " + std::to_string(src) : "junk";
    c.broadcast(msg, src);
    EXPECT_EQ(msg, "hello from " + std::to_string(src));
  }
  std::string empty = me == 0 ? "" : "x";
  c.broadcast(empty, 0);
  EXPECT_EQ(empty, "");
  // Around the MPI backend's one-round limit (4088 bytes with the size) and well past it.
  for (size_t len : {size_t(4087), size_t(4088), size_t(4089), size_t(100000)}) {
    std::string want(len, '\0');
    for (size_t i = 0; i < len; ++i) want[i] = static_cast<char>('a' + (i * 7 + len) % 26);
    std::string msg = me == n - 1 ? want : std::string(3, 'z');
    c.broadcast(msg, n - 1);
    EXPECT_EQ(msg, want) << len;
  }
  // Every rank's own bytes to every rank: all empty, short, around the one-round limit on one
  // rank (others empty), and long on every rank.
  auto text = [](int r, size_t len) {
    std::string t(len, '\0');
    for (size_t i = 0; i < len; ++i) t[i] = static_cast<char>('a' + (i * 5 + r * 3 + len) % 26);
    return t;
  };
  auto lengths = [&](int pattern, int r) -> size_t {
    switch (pattern) {
      case 0:
        return 0;
      case 1:
        return 3 + static_cast<size_t>(r);
      case 2:
        return r == n - 1 ? 4087 : 0;
      case 3:
        return r == n - 1 ? 4088 : 0;
      case 4:
        return r == 0 ? 4089 : 10;
      default:
        return 100000 + 17 * static_cast<size_t>(r);
    }
  };
  for (int pattern = 0; pattern <= 5; ++pattern) {
    const std::vector<std::string> got = c.all_gather_bytes(text(me, lengths(pattern, me)));
    ASSERT_EQ(got.size(), static_cast<size_t>(n)) << pattern;
    for (int r = 0; r < n; ++r)
      EXPECT_EQ(got[r], text(r, lengths(pattern, r))) << pattern << " " << r;
  }
  c.barrier();
  std::vector<int64_t> all = c.all_gather({me, 10 * me});
  ASSERT_EQ(all.size(), static_cast<size_t>(2 * n));
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(all[2 * r], r);
    EXPECT_EQ(all[2 * r + 1], 10 * r);
  }
}

// All of the above in one go.
inline void check_every_collective(DistContext& ctx) {
  check_all_to_all_v(ctx, false);
  check_all_to_all_v(ctx, true);
  check_all_to_all_v_zero(ctx);
  check_all_to_all_bounded(ctx);
  check_large_transfers(ctx);
  check_all_gather(ctx);
  check_all_reduce(ctx);
  check_in_flight(ctx);
  check_coordinator(ctx);
}

}  // namespace duet::test
