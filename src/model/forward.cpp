#include "model/forward.h"

#include <algorithm>
#include <sstream>

#include "core/error.h"
#include "kernels/ops.h"

namespace duet {

const char* forward_mode_name(ForwardMode mode) {
  switch (mode) {
    case ForwardMode::kIdle:
      return "idle";
    case ForwardMode::kDecode:
      return "decode";
    case ForwardMode::kPrefill:
      return "prefill";
  }
  return "?";
}

const char* op_kind_name(OpKind kind) {
  switch (kind) {
    case OpKind::kEmbed:
      return "embed";
    case OpKind::kAttn:
      return "attn";
    case OpKind::kMlp:
      return "mlp";
    case OpKind::kMoeRoute:
      return "moe_route";
    case OpKind::kDispatchSend:
      return "dispatch_send";
    case OpKind::kSharedExperts:
      return "shared_experts";
    case OpKind::kDispatchRecv:
      return "dispatch_recv";
    case OpKind::kExperts:
      return "experts";
    case OpKind::kCombineSend:
      return "combine_send";
    case OpKind::kCombineRecv:
      return "combine_recv";
    case OpKind::kOutput:
      return "output";
    case OpKind::kYield:
      return "yield";
  }
  return "?";
}

std::string Operation::name() const {
  std::ostringstream s;
  if (il >= 0) s << "L" << il << ".";
  s << op_kind_name(kind);
  if (is_yield()) s << stage;
  return s.str();
}

namespace {

// The ForwardState buffers that carry data across operations (ForwardState's "across" ones).
enum class Buf { kX, kH, kTopk, kSharedOut, kExpertBatch, kLogits };
constexpr int kNumBufs = 6;

const char* buf_name(Buf b) {
  static const char* const kNames[kNumBufs] = {"x", "h", "topk", "shared_out", "expert_batch",
                                               "logits"};
  return kNames[static_cast<int>(b)];
}

// A read of buf, of what an operation of kind `from` of the same layer wrote; kYield: of whatever
// wrote it last.
struct Read {
  Buf buf;
  OpKind from;
};

// What an operation kind reads, writes, and holds: buffers no other operation may write from this
// operation until the same layer's operation of kind `until` (which may write them itself).
struct Contract {
  std::vector<Read> reads;
  std::vector<Buf> writes;
  std::vector<Buf> holds;
  OpKind until = OpKind::kYield;
};

Contract contract_of(OpKind kind, bool layer_has_shared) {
  switch (kind) {
    case OpKind::kEmbed:
      return {{}, {Buf::kX}, {}};
    case OpKind::kAttn:
    case OpKind::kMlp:
      return {{{Buf::kX, OpKind::kYield}}, {Buf::kX, Buf::kH}, {}};
    case OpKind::kMoeRoute:
      return {{{Buf::kX, OpKind::kYield}}, {Buf::kH, Buf::kTopk}, {}};
    case OpKind::kDispatchSend:
      // The dispatcher reads h and the routes until the combine, and adds into x at combine_recv.
      return {{{Buf::kH, OpKind::kMoeRoute}, {Buf::kTopk, OpKind::kMoeRoute}},
              {},
              {Buf::kX, Buf::kH, Buf::kTopk},
              OpKind::kCombineRecv};
    case OpKind::kSharedExperts:
      return {{{Buf::kH, OpKind::kMoeRoute}}, {Buf::kSharedOut}, {}};
    case OpKind::kDispatchRecv:
      return {{}, {Buf::kExpertBatch}, {}};
    case OpKind::kExperts:
      return {{{Buf::kExpertBatch, OpKind::kDispatchRecv}}, {}, {}};
    case OpKind::kCombineSend:
      return {{{Buf::kExpertBatch, OpKind::kDispatchRecv}}, {Buf::kExpertBatch}, {}};
    case OpKind::kCombineRecv: {
      Contract c{{}, {Buf::kX}, {}};
      if (layer_has_shared) c.reads.push_back({Buf::kSharedOut, OpKind::kSharedExperts});
      return c;
    }
    case OpKind::kOutput:
      return {{{Buf::kX, OpKind::kYield}}, {Buf::kH, Buf::kLogits}, {}};
    case OpKind::kYield:
      break;
  }
  return {};
}

std::string op_name(OpKind kind, int32_t il) {
  Operation op;
  op.kind = kind;
  op.il = il;
  return op.name();
}

}  // namespace

void check_operations(std::vector<Operation>& ops) {
  struct Hold {
    Buf buf;
    size_t holder;
  };
  std::vector<Hold> holds;
  std::vector<int64_t> last_writer(kNumBufs, -1);  // index into ops
  std::vector<bool> has_shared;                     // by layer
  for (const Operation& op : ops) {
    if (op.kind != OpKind::kSharedExperts) continue;
    if (static_cast<size_t>(op.il) >= has_shared.size()) has_shared.resize(op.il + 1, false);
    has_shared[static_cast<size_t>(op.il)] = true;
  }
  const auto shared_in = [&](int32_t il) {
    return il >= 0 && static_cast<size_t>(il) < has_shared.size() && has_shared[il];
  };
  int32_t stage = 0;
  for (size_t i = 0; i < ops.size(); ++i) {
    Operation& op = ops[i];
    if (op.is_yield()) {
      op.stage = stage++;
      continue;
    }
    DUET_CHECK(op.run, "operation " << op.name() << " has nothing to run");
    const Contract c = contract_of(op.kind, shared_in(op.il));
    for (const Read& r : c.reads) {
      const int64_t w = last_writer[static_cast<int>(r.buf)];
      DUET_CHECK(w >= 0, "operation list: " << op.name() << " reads " << buf_name(r.buf)
                                            << ", which nothing wrote before it");
      const Operation& writer = ops[static_cast<size_t>(w)];
      DUET_CHECK(r.from == OpKind::kYield || (writer.kind == r.from && writer.il == op.il),
                 "operation list: " << op.name() << " reads " << buf_name(r.buf) << " written by "
                                    << writer.name() << ", not by " << op_name(r.from, op.il));
    }
    for (Buf b : c.writes) {
      for (const Hold& h : holds) {
        const Operation& holder = ops[h.holder];
        const OpKind until = contract_of(holder.kind, false).until;
        DUET_CHECK(h.buf != b || (op.kind == until && op.il == holder.il),
                   "operation list: " << op.name() << " writes " << buf_name(b) << ", which "
                                      << holder.name() << " holds until "
                                      << op_name(until, holder.il));
      }
    }
    // Holds end at their `until` operation.
    holds.erase(std::remove_if(holds.begin(), holds.end(),
                               [&](const Hold& h) {
                                 const Operation& holder = ops[h.holder];
                                 return op.kind == contract_of(holder.kind, false).until &&
                                        op.il == holder.il;
                               }),
                holds.end());
    for (Buf b : c.writes) last_writer[static_cast<int>(b)] = static_cast<int64_t>(i);
    for (Buf b : c.holds) holds.push_back({b, i});
  }
  for (const Hold& h : holds) {
    const Operation& holder = ops[h.holder];
    DUET_ERROR("operation list: " << holder.name() << " holds " << buf_name(h.buf) << " until "
                                  << op_name(contract_of(holder.kind, false).until, holder.il)
                                  << ", which never runs");
  }
}

void ForwardInput::add(int32_t seq_id, int64_t n_past, const int32_t* toks, int64_t n,
                       bool all_logits) {
  DUET_CHECK(n > 0, "empty span for seq " << seq_id);
  SeqSpan span{seq_id, n_past, n_tokens(), n};
  const int32_t span_index = static_cast<int32_t>(spans.size());
  spans.push_back(span);
  for (int64_t i = 0; i < n; ++i) {
    tokens.push_back(toks[i]);
    pos.push_back(n_past + i);
    span_of.push_back(span_index);
    if (all_logits || i == n - 1) out_rows.push_back(span.first + i);
  }
}

namespace {

// dst[0, n) = src[0, n) in `dtype` (kF32 or kBF16).
void convert_row(DType dtype, const float* src, int64_t n, void* dst) {
  if (dtype == DType::kBF16) {
    f32_to_bf16_row(src, n, static_cast<uint16_t*>(dst));
  } else {
    DUET_CHECK(dtype == DType::kF32, "KV rows of dtype " << dtype_name(dtype));
    std::copy_n(src, n, static_cast<float*>(dst));
  }
}

}  // namespace

void KvStore::store_k(int32_t seq_id, int64_t il, int64_t pos, const float* src, int64_t n,
                      int64_t offset) {
  convert_row(dtype(), src, n, static_cast<char*>(k(seq_id, il, pos)) + offset * elem_bytes());
}

void KvStore::store_v(int32_t seq_id, int64_t il, int64_t pos, const float* src, int64_t n,
                      int64_t offset) {
  convert_row(dtype(), src, n, static_cast<char*>(v(seq_id, il, pos)) + offset * elem_bytes());
}

}  // namespace duet
