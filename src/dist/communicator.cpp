#include "dist/communicator.h"

#include "core/error.h"

namespace duet {

int64_t elem_size(ElemType t) {
  switch (t) {
    case ElemType::kF32:
      return 4;
    case ElemType::kI64:
      return 8;
  }
  return 0;
}

Communicator::Communicator(std::unique_ptr<CollectiveOps> ops, std::chrono::milliseconds watchdog)
    : ops_(std::move(ops)),
      rank_(ops_->rank()),
      world_size_(ops_->world_size()),
      watchdog_(watchdog),
      thread_("comm rank " + std::to_string(rank_), watchdog) {}

Communicator::~Communicator() = default;

CommHandle Communicator::start(std::string name, std::function<void(CollectiveOps&)> body) {
  CollectiveOps* ops = ops_.get();
  return thread_.submit(std::move(name), [ops, body = std::move(body)] { body(*ops); });
}

CommHandle Communicator::start_all_to_all_v(const void* send, std::vector<int64_t> send_bytes,
                                            void* recv, std::vector<int64_t> recv_bytes) {
  DUET_CHECK(static_cast<int>(send_bytes.size()) == world_size_ &&
                 static_cast<int>(recv_bytes.size()) == world_size_,
             "all_to_all_v counts " << send_bytes.size() << "/" << recv_bytes.size()
                                    << " for world " << world_size_);
  return start("all_to_all_v", [=, sb = std::move(send_bytes), rb = std::move(recv_bytes)](
                                   CollectiveOps& ops) { ops.all_to_all_v(send, sb, recv, rb); });
}

CommHandle Communicator::start_all_gather(const void* send, int64_t bytes, void* recv) {
  return start("all_gather", [=](CollectiveOps& ops) { ops.all_gather(send, bytes, recv); });
}

CommHandle Communicator::start_all_reduce(void* data, int64_t count, ElemType type, ReduceOp op) {
  return start("all_reduce", [=](CollectiveOps& ops) { ops.all_reduce(data, count, type, op); });
}

void Communicator::all_to_all_v(const void* send, const std::vector<int64_t>& send_bytes,
                                void* recv, const std::vector<int64_t>& recv_bytes) {
  start_all_to_all_v(send, send_bytes, recv, recv_bytes).wait();
}

void Communicator::all_gather(const void* send, int64_t bytes, void* recv) {
  start_all_gather(send, bytes, recv).wait();
}

void Communicator::all_reduce(void* data, int64_t count, ElemType type, ReduceOp op) {
  start_all_reduce(data, count, type, op).wait();
}

}  // namespace duet
