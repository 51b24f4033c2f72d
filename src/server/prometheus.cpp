#include "server/prometheus.h"

#include <cstdio>
#include <sstream>

namespace duet {

namespace {

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

std::string escape_label(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

class Writer {
 public:
  explicit Writer(const std::string& model) : label_("model_name=\"" + escape_label(model) + "\"") {}

  void metric(const std::string& name, const char* type, const char* help, double v) {
    header(name, type, help);
    os_ << name << "{" << label_ << "} " << num(v) << "\n";
  }
  void labelled(const std::string& name, const std::string& extra, double v) {
    os_ << name << "{" << label_ << "," << extra << "} " << num(v) << "\n";
  }
  void header(const std::string& name, const char* type, const char* help) {
    os_ << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n";
  }
  void histogram(const std::string& name, const char* help, const Histogram& h) {
    header(name, "histogram", help);
    for (size_t i = 0; i < h.bounds.size(); ++i)
      labelled(name + "_bucket", "le=\"" + num(h.bounds[i]) + "\"", double(h.counts[i]));
    labelled(name + "_bucket", "le=\"+Inf\"", double(h.count));
    os_ << name << "_sum{" << label_ << "} " << num(h.sum) << "\n";
    os_ << name << "_count{" << label_ << "} " << h.count << "\n";
  }
  std::string str() const { return os_.str(); }

 private:
  std::string label_;
  std::ostringstream os_;
};

}  // namespace

std::string prometheus_text(const EngineMetricsSnapshot& m, const std::string& model_name) {
  Writer w(model_name);
  w.metric("duet:num_requests_running", "gauge", "Requests in the running batch.", double(m.n_running));
  w.metric("duet:num_requests_waiting", "gauge", "Requests waiting to be scheduled.",
           double(m.n_waiting));
  const double usage = m.kv_blocks_total ? double(m.kv_blocks_used) / double(m.kv_blocks_total) : 0;
  w.metric("duet:kv_cache_usage_perc", "gauge", "Fraction of KV cache blocks in use (1 = full).",
           usage);
  w.metric("duet:kv_cache_used_blocks", "gauge", "KV cache blocks in use.", double(m.kv_blocks_used));
  w.metric("duet:kv_cache_total_blocks", "gauge", "KV cache blocks in the pool.",
           double(m.kv_blocks_total));
  w.metric("duet:prompt_tokens_total", "counter", "Prompt tokens prefilled.", double(m.prompt_tokens));
  w.metric("duet:generation_tokens_total", "counter", "Tokens generated.",
           double(m.generation_tokens));
  w.metric("duet:num_preemptions_total", "counter", "Requests preempted (recomputed later).",
           double(m.preemptions));
  w.header("duet:request_success_total", "counter", "Finished requests by finish reason.");
  for (const char* r : {"stop", "length", "abort"}) {
    auto it = m.finished.find(r);
    w.labelled("duet:request_success_total", std::string("finished_reason=\"") + r + "\"",
               it == m.finished.end() ? 0.0 : double(it->second));
  }
  w.histogram("duet:time_to_first_token_seconds", "Time to first token, from arrival.", m.ttft);
  w.histogram("duet:inter_token_latency_seconds", "Time between consecutive tokens.", m.itl);
  w.histogram("duet:e2e_request_latency_seconds", "Request latency, arrival to finish.", m.e2e);
  w.metric("duet:step_gap_seconds_total", "counter",
           "Wall time between the end of one forward pass and the start of the next.",
           m.step_gap_seconds);
  w.metric("duet:step_gaps_total", "counter", "Gaps counted in duet:step_gap_seconds_total.",
           double(m.step_gaps));
  w.metric("duet:forward_seconds_total", "counter", "Wall time in forward passes.",
           m.forward_seconds);
  w.metric("duet:forward_steps_total", "counter", "Forward passes (steps) run.",
           double(m.forward_steps));
  return w.str();
}

}  // namespace duet
