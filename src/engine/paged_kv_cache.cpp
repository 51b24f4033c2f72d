#include "engine/paged_kv_cache.h"

#include <algorithm>

#include "core/error.h"

namespace duet {

PagedKvCache::PagedKvCache(BlockPool& pool)
    : pool_(pool), block_size_(pool.shape().block_size) {}

PagedKvCache::~PagedKvCache() {
  for (size_t i = 0; i < seqs_.size(); ++i)
    if (seqs_[i].live) remove_sequence(static_cast<int32_t>(i));
}

PagedKvCache::Seq& PagedKvCache::seq(int32_t seq_id) {
  DUET_CHECK(seq_id >= 0 && static_cast<size_t>(seq_id) < seqs_.size() && seqs_[seq_id].live,
             "no KV sequence " << seq_id);
  return seqs_[seq_id];
}

const PagedKvCache::Seq& PagedKvCache::seq(int32_t seq_id) const {
  return const_cast<PagedKvCache*>(this)->seq(seq_id);
}

int32_t PagedKvCache::add_sequence() {
  for (size_t i = 0; i < seqs_.size(); ++i) {
    if (!seqs_[i].live) {
      seqs_[i].live = true;
      return static_cast<int32_t>(i);
    }
  }
  seqs_.push_back(Seq{true, {}});
  return static_cast<int32_t>(seqs_.size() - 1);
}

void PagedKvCache::remove_sequence(int32_t seq_id) {
  Seq& s = seq(seq_id);
  for (int32_t b : s.blocks) pool_.free(b);
  s.blocks.clear();
  s.live = false;
}

int64_t PagedKvCache::blocks_for(int64_t n_pos) const {
  return (n_pos + block_size_ - 1) / block_size_;
}

bool PagedKvCache::reserve(int32_t seq_id, int64_t n_pos) {
  Seq& s = seq(seq_id);
  const int64_t need = blocks_for(n_pos) - static_cast<int64_t>(s.blocks.size());
  if (need <= 0) return true;
  if (need > pool_.n_free()) return false;
  for (int64_t i = 0; i < need; ++i) s.blocks.push_back(pool_.alloc());
  return true;
}

int64_t PagedKvCache::capacity(int32_t seq_id) const {
  return static_cast<int64_t>(seq(seq_id).blocks.size()) * block_size_;
}

int64_t PagedKvCache::max_reservable(int32_t seq_id) const {
  return capacity(seq_id) + pool_.n_free() * block_size_;
}

const std::vector<int32_t>& PagedKvCache::block_table(int32_t seq_id) const {
  return seq(seq_id).blocks;
}

int64_t PagedKvCache::n_sequences() const {
  int64_t n = 0;
  for (const Seq& s : seqs_) n += s.live;
  return n;
}

namespace {

// Hot path (attention calls it per position per layer): one table lookup; a position past the
// table is an engine bug (rows are reserved before every forward pass), so it is checked.
int32_t block_at(const std::vector<int32_t>& blocks, int32_t seq_id, int64_t pos,
                 int64_t block_size) {
  const size_t i = static_cast<size_t>(pos / block_size);
  DUET_CHECK(pos >= 0 && i < blocks.size(),
             "KV position " << pos << " of seq " << seq_id << " is not reserved");
  return blocks[i];
}

KvRows rows_in(BlockPool& pool, const std::vector<int32_t>& blocks, int32_t seq_id, int64_t il,
               int64_t pos, int64_t n_max) {
  DUET_CHECK(n_max >= 1, "KV rows of seq " << seq_id << ": n_max " << n_max);
  const BlockPoolShape& shape = pool.shape();
  const int32_t b = block_at(blocks, seq_id, pos, shape.block_size);
  const int64_t off = pos % shape.block_size;
  KvRows r;
  r.k = pool.k(b, il, off);
  r.v = shape.v_width > 0 ? pool.v(b, il, off) : nullptr;
  r.k_stride = shape.k_width;
  r.v_stride = shape.v_width;
  r.n = std::min(n_max, shape.block_size - off);
  return r;
}

}  // namespace

void* PagedKvCache::k(int32_t seq_id, int64_t il, int64_t pos) {
  return pool_.k(block_at(seqs_[seq_id].blocks, seq_id, pos, block_size_), il, pos % block_size_);
}

void* PagedKvCache::v(int32_t seq_id, int64_t il, int64_t pos) {
  return pool_.v(block_at(seqs_[seq_id].blocks, seq_id, pos, block_size_), il, pos % block_size_);
}

KvRows PagedKvCache::rows(int32_t seq_id, int64_t il, int64_t pos, int64_t n_max) {
  return rows_in(pool_, seqs_[seq_id].blocks, seq_id, il, pos, n_max);
}

PagedKvView PagedKvCache::snapshot(const ForwardInput& in) const {
  std::vector<std::vector<int32_t>> tables;
  for (const SeqSpan& span : in.spans) {
    const size_t id = static_cast<size_t>(span.seq_id);
    if (tables.size() <= id) tables.resize(id + 1);
    if (tables[id].empty()) tables[id] = seq(span.seq_id).blocks;
  }
  return PagedKvView(pool_, std::move(tables));
}

namespace {

const std::vector<int32_t>& table_of(const std::vector<std::vector<int32_t>>& tables,
                                     int32_t seq_id) {
  DUET_CHECK(seq_id >= 0 && static_cast<size_t>(seq_id) < tables.size(),
             "KV sequence " << seq_id << " is not in this step's snapshot");
  return tables[static_cast<size_t>(seq_id)];
}

}  // namespace

void* PagedKvView::k(int32_t seq_id, int64_t il, int64_t pos) {
  return pool_->k(block_at(table_of(tables_, seq_id), seq_id, pos, block_size_), il,
                  pos % block_size_);
}

void* PagedKvView::v(int32_t seq_id, int64_t il, int64_t pos) {
  return pool_->v(block_at(table_of(tables_, seq_id), seq_id, pos, block_size_), il,
                  pos % block_size_);
}

KvRows PagedKvView::rows(int32_t seq_id, int64_t il, int64_t pos, int64_t n_max) {
  return rows_in(*pool_, table_of(tables_, seq_id), seq_id, il, pos, n_max);
}

}  // namespace duet
