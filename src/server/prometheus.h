// The engine's metrics in Prometheus' text exposition format (GET /metrics).
#pragma once

#include <string>

#include "engine/engine_metrics.h"

namespace duet {

// `model_name` becomes the model_name label of every series, as vLLM labels them.
std::string prometheus_text(const EngineMetricsSnapshot& m, const std::string& model_name);

}  // namespace duet
