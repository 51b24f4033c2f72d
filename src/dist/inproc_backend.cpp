#include "dist/inproc_backend.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <thread>

#include "core/error.h"

namespace duet {

namespace {

class InprocCoordinator final : public Coordinator {
 public:
  InprocCoordinator(std::shared_ptr<InprocHub> hub, int rank)
      : Coordinator(RankInfo{rank, hub->world_size(), rank, hub->world_size()}),
        hub_(std::move(hub)) {}

  void broadcast(std::string& bytes, int src) override {
    DUET_CHECK(src >= 0 && src < world_size(), "broadcast src " << src);
    hub_->collective(InprocHub::kControl, rank(), "broadcast", &bytes,
                     [&](const std::vector<const void*>& posts) {
                       if (rank() != src) bytes = *static_cast<const std::string*>(posts[src]);
                     });
  }

  void barrier() override {
    hub_->collective(InprocHub::kControl, rank(), "barrier", nullptr,
                     [](const std::vector<const void*>&) {});
  }

  std::vector<int64_t> all_gather(const std::vector<int64_t>& values) override {
    std::vector<int64_t> out;
    hub_->collective(InprocHub::kControl, rank(), "all_gather(coordinator)", &values,
                     [&](const std::vector<const void*>& posts) {
                       for (const void* p : posts) {
                         const auto& v = *static_cast<const std::vector<int64_t>*>(p);
                         if (v.size() != values.size())
                           DUET_ERROR("coordinator all_gather: " << v.size() << " values from a "
                                                                 << "peer, " << values.size()
                                                                 << " here");
                         out.insert(out.end(), v.begin(), v.end());
                       }
                     });
    return out;
  }

  std::vector<std::string> all_gather_bytes(const std::string& bytes) override {
    std::vector<std::string> out;
    hub_->collective(InprocHub::kControl, rank(), "all_gather_bytes", &bytes,
                     [&](const std::vector<const void*>& posts) {
                       for (const void* p : posts)
                         out.push_back(*static_cast<const std::string*>(p));
                     });
    return out;
  }

 private:
  std::shared_ptr<InprocHub> hub_;
};

class InprocOps final : public CollectiveOps {
 public:
  InprocOps(std::shared_ptr<InprocHub> hub, int rank) : hub_(std::move(hub)), rank_(rank) {}

  int rank() const override { return rank_; }
  int world_size() const override { return hub_->world_size(); }

  void all_to_all_v(const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                    const std::vector<int64_t>& recv_bytes) override {
    exchange_parts("all_to_all_v", send, send_bytes, send_bytes, recv, recv_bytes,
                   /*exact=*/true, nullptr);
  }

  void all_to_all_bounded(const void* send, const std::vector<int64_t>& send_bytes,
                          const std::vector<int64_t>& send_room, void* recv,
                          const std::vector<int64_t>& recv_capacity,
                          std::vector<int64_t>* recv_bytes) override {
    recv_bytes->assign(static_cast<size_t>(world_size()), 0);
    exchange_parts("all_to_all_bounded", send, send_bytes, send_room, recv, recv_capacity,
                   /*exact=*/false, recv_bytes);
  }

  void all_gather(const void* send, int64_t bytes, void* recv) override {
    struct Post {
      const void* send;
      int64_t bytes;
    } mine{send, bytes};
    hub_->collective(
        InprocHub::kData, rank_, "all_gather", &mine, [&](const std::vector<const void*>& posts) {
          auto* dst = static_cast<uint8_t*>(recv);
          for (int s = 0; s < world_size(); ++s) {
            const Post& p = *static_cast<const Post*>(posts[s]);
            if (p.bytes != bytes)
              DUET_ERROR("all_gather: rank " << s << " sends " << p.bytes << " bytes, rank "
                                             << rank_ << " " << bytes);
            if (bytes > 0) std::memcpy(dst + s * bytes, p.send, bytes);
          }
        });
  }

  void all_reduce(void* data, int64_t count, ElemType type, ReduceOp op) override {
    struct Post {
      const void* data;
      int64_t count;
      ElemType type;
      ReduceOp op;
    } mine{data, count, type, op};
    // Peers read `data` until the collective ends, so the result is built aside first.
    std::vector<uint8_t> result(static_cast<size_t>(count * elem_size(type)));
    hub_->collective(InprocHub::kData, rank_, "all_reduce", &mine,
                     [&](const std::vector<const void*>& posts) {
                       for (int s = 0; s < world_size(); ++s) {
                         const Post& p = *static_cast<const Post*>(posts[s]);
                         if (p.count != count || p.type != type || p.op != op)
                           DUET_ERROR("all_reduce: rank " << s << " reduces " << p.count
                                                          << " elements, rank " << rank_ << " "
                                                          << count << " (or another type or op)");
                         if (type == ElemType::kF32) {
                           reduce(static_cast<const float*>(p.data),
                                  reinterpret_cast<float*>(result.data()), count, op, s == 0);
                         } else {
                           reduce(static_cast<const int64_t*>(p.data),
                                  reinterpret_cast<int64_t*>(result.data()), count, op, s == 0);
                         }
                       }
                     });
    if (!result.empty()) std::memcpy(data, result.data(), result.size());
  }

 private:
  // Both all-to-alls: the part each rank s sends here (at the start of its send room for this
  // rank) is copied to recv past the rooms of the ranks before s; it must fill its room here
  // exactly (exact) or fit in it, and its length goes to (*got)[s] when got is given.
  void exchange_parts(const char* op, const void* send, const std::vector<int64_t>& send_bytes,
                      const std::vector<int64_t>& send_room, void* recv,
                      const std::vector<int64_t>& room, bool exact, std::vector<int64_t>* got) {
    struct Post {
      const uint8_t* send;
      const std::vector<int64_t>* send_bytes;
      const std::vector<int64_t>* send_room;
    } mine{static_cast<const uint8_t*>(send), &send_bytes, &send_room};
    hub_->collective(InprocHub::kData, rank_, op, &mine, [&](const std::vector<const void*>& posts) {
      auto* dst = static_cast<uint8_t*>(recv);
      for (int s = 0; s < world_size(); ++s) {
        const Post& p = *static_cast<const Post*>(posts[s]);
        const std::vector<int64_t>& sb = *p.send_bytes;
        int64_t off = 0;
        for (int r = 0; r < rank_; ++r) off += (*p.send_room)[r];
        const int64_t n = sb[rank_];
        if (exact ? n != room[s] : n > room[s])
          DUET_ERROR(op << ": rank " << s << " sends " << n << " bytes to rank " << rank_ << ", "
                        << (exact ? "which expects " : "which has room for ") << room[s]);
        if (n > 0) std::memcpy(dst, p.send + off, n);
        if (got) (*got)[s] = n;
        dst += room[s];
      }
    });
  }

  // Reduces in rank order, so every rank computes bit-identical sums.
  template <typename T>
  static void reduce(const T* in, T* acc, int64_t n, ReduceOp op, bool first) {
    for (int64_t i = 0; i < n; ++i) {
      if (first)
        acc[i] = in[i];
      else if (op == ReduceOp::kSum)
        acc[i] += in[i];
      else
        acc[i] = std::max(acc[i], in[i]);
    }
  }

  std::shared_ptr<InprocHub> hub_;
  int rank_;
};

}  // namespace

void stop_answering(DistContext& ctx) {
  DUET_CHECK(dynamic_cast<InprocCoordinator*>(ctx.coordinator.get()) != nullptr,
             "stop_answering: not an in-process rank");
  std::static_pointer_cast<InprocHub>(ctx.keepalive)->stop_answering(ctx.rank());
}

DistContext make_inproc_context(std::shared_ptr<InprocHub> hub, int rank) {
  DistContext ctx;
  ctx.coordinator = std::make_unique<InprocCoordinator>(hub, rank);
  ctx.communicator =
      std::make_unique<Communicator>(std::make_unique<InprocOps>(hub, rank), hub->watchdog());
  ctx.keepalive = hub;
  return ctx;
}

namespace {

// Runs the ranks; *first gets the rank whose failure came first in time (-1 if none).
std::vector<std::string> run_ranks_impl(int world_size, const std::function<void(DistContext&)>& fn,
                                        std::chrono::milliseconds watchdog, int* first) {
  auto hub = std::make_shared<InprocHub>(world_size, watchdog);
  std::vector<std::string> errors(static_cast<size_t>(world_size));
  std::mutex mu;
  *first = -1;  // GUARDED_BY(mu), as is `errors`
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      try {
        DistContext ctx = make_inproc_context(hub, r);
        fn(ctx);
        hub->stop_answering(r, "ended");  // as a process that exits: its peers may not wait
      } catch (const std::exception& e) {
        {
          std::lock_guard<std::mutex> lock(mu);
          errors[r] = e.what();
          if (*first < 0) *first = r;
        }
        hub->abort("rank " + std::to_string(r) + " failed: " + e.what());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return errors;
}

}  // namespace

std::vector<std::string> run_ranks_collect(int world_size,
                                           const std::function<void(DistContext&)>& fn,
                                           std::chrono::milliseconds watchdog) {
  int first = -1;
  return run_ranks_impl(world_size, fn, watchdog, &first);
}

void run_ranks(int world_size, const std::function<void(DistContext&)>& fn,
               std::chrono::milliseconds watchdog) {
  int first = -1;
  std::vector<std::string> errors = run_ranks_impl(world_size, fn, watchdog, &first);
  if (first >= 0) DUET_ERROR("rank " << first << ": " << errors[first]);
}

}  // namespace duet
