// What the bench clients (bench serve, bench soak) share to talk to an OpenAI-compatible server:
// its model, its streamed events, its /metrics.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace duet {

// The id of the first model /v1/models lists at base_url (sending "Authorization: Bearer
// api_key" unless it is empty). Throws duet::Error naming the URL if the request fails or the
// list is empty.
std::string first_served_model(const std::string& base_url, const std::string& api_key = "");

// Cuts a server-sent-events stream into its events as the bytes arrive: feed() calls
// on_data(payload) for each complete "data: ..." event (the payload after "data: ", "[DONE]"
// included) and skips comments (": keep-alive").
class SseSplitter {
 public:
  template <typename F>
  void feed(const char* data, size_t n, F&& on_data) {
    buf_.append(data, n);
    for (size_t end; (end = buf_.find("\n\n")) != std::string::npos;) {
      if (buf_.compare(0, 6, "data: ") == 0) on_data(buf_.substr(6, end - 6));
      buf_.erase(0, end + 2);
    }
  }
  // What has arrived after the last complete event (an error body that is not SSE, say).
  const std::string& rest() const { return buf_; }

 private:
  std::string buf_;
};

// One sample of a Prometheus text exposition: `name{labels} value`.
struct MetricSample {
  std::string name;
  std::string labels;  // between the braces, empty if none
  double value = 0;
};

// GET base_url/metrics, every sample; empty if the server does not answer it.
std::vector<MetricSample> scrape_metrics(const std::string& base_url);

}  // namespace duet
