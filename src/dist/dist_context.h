// What a rank gets from its launcher: the control plane and the data plane, both backends'
// concrete types hidden behind the interfaces.
#pragma once

#include <memory>

#include "dist/communicator.h"
#include "dist/coordinator.h"

namespace duet {

struct DistContext {
  std::unique_ptr<Coordinator> coordinator;
  std::unique_ptr<Communicator> communicator;
  // Whatever else the backend must keep alive as long as the two above (MPI's runtime).
  std::shared_ptr<void> keepalive;

  Coordinator& coord() const { return *coordinator; }
  Communicator& comm() const { return *communicator; }
  int rank() const { return coordinator->rank(); }
  int world_size() const { return coordinator->world_size(); }
};

}  // namespace duet
