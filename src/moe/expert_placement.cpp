#include "moe/expert_placement.h"

#include "core/error.h"

namespace duet {

std::string ExpertPlacement::describe(int rank) const {
  return "experts [" + std::to_string(begin(rank)) + ", " + std::to_string(end(rank)) + ") of " +
         std::to_string(n_expert);
}

ExpertPlacement place_experts(int64_t n_expert, int world_size) {
  if (world_size < 1) DUET_ERROR("expert parallelism: world size " << world_size << " < 1");
  if (n_expert < 1)
    DUET_ERROR("expert parallelism needs a MoE model (n_expert " << n_expert << ")");
  if (world_size > n_expert) {
    DUET_ERROR("expert parallelism: " << world_size << " ranks but only " << n_expert
                                      << " experts; use at most " << n_expert << " ranks");
  }
  if (n_expert % world_size != 0) {
    DUET_ERROR("expert parallelism: " << n_expert << " experts cannot be split evenly over "
                                      << world_size << " ranks; use a world size that divides "
                                      << n_expert);
  }
  return ExpertPlacement{n_expert, world_size};
}

}  // namespace duet
