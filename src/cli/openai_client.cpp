#include "cli/openai_client.h"

#include <httplib.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"

namespace duet {

std::string first_served_model(const std::string& base_url, const std::string& api_key) {
  httplib::Client cli(base_url);
  httplib::Headers headers;
  if (!api_key.empty()) headers.emplace("Authorization", "Bearer " + api_key);
  auto res = cli.Get("/v1/models", headers);
  if (!res || res->status != 200) DUET_ERROR("GET " << base_url << "/v1/models failed");
  const nlohmann::json j = nlohmann::json::parse(res->body, nullptr, false);
  if (j.is_discarded() || !j.contains("data") || j["data"].empty())
    DUET_ERROR(base_url << "/v1/models lists no model");
  return j["data"][0].value("id", "");
}

std::vector<MetricSample> scrape_metrics(const std::string& base_url) {
  std::vector<MetricSample> out;
  httplib::Client cli(base_url);
  auto res = cli.Get("/metrics");
  if (!res || res->status != 200) return out;
  std::istringstream lines(res->body);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    if (space == std::string::npos) continue;
    MetricSample m;
    const size_t brace = line.find('{');
    if (brace < space) {
      m.name = line.substr(0, brace);
      const size_t close = line.find('}', brace);
      m.labels = line.substr(brace + 1, close == std::string::npos ? 0 : close - brace - 1);
    } else {
      m.name = line.substr(0, space);
    }
    m.value = std::strtod(line.c_str() + space + 1, nullptr);
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace duet
