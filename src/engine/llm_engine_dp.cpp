// The serving engine's control plane (see llm_engine.h), beside the step path: before each step
// rank 0 makes and shares the control message (stop, the new requests with the rank each goes
// to, the requests whose clients left); after it the other ranks send the output of their
// requests (tokens, text, finish) to rank 0, which feeds the HTTP streams and the metrics, and
// every rank shares its load. On a single rank the same functions run without a message.
// Messages are JSON on the coordinator (small: one token and its text per request per step).
#include <algorithm>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/llm_engine.h"

namespace duet {

namespace {

using json = nlohmann::json;

// How long rank 0 waits for a request while no rank has work before it runs an (empty) step
// anyway: the other ranks sit in the control broadcast meanwhile. Both backends know an idle
// rank 0 is alive (MPI by its heartbeat, in-process by its thread); the empty step only bounds
// how long a stop or an abort waits to reach the other ranks.
constexpr std::chrono::milliseconds kIdleWait{20};

// The counts each rank shares after its step, in this order.
enum Output {
  kOutboxBytes,
  kPromptTokens,
  kGenerated,
  kPreempted,
  kRunning,
  kWaiting,
  kBlocksUsed,
  kNumOutputs
};

json request_to_json(const EngineRequest& r) {
  json j = {{"prompt", r.prompt},         {"max_tokens", r.max_tokens},
            {"stop_ids", r.stop_ids},     {"stop", r.stop},
            {"ignore_eos", r.ignore_eos}, {"temperature", r.sampling.temperature},
            {"top_k", r.sampling.top_k},  {"top_p", r.sampling.top_p}};
  if (r.sampling.seed) j["seed"] = *r.sampling.seed;
  return j;
}

EngineRequest request_from_json(const json& j) {
  EngineRequest r;
  r.prompt = j.at("prompt").get<std::vector<int32_t>>();
  r.max_tokens = j.at("max_tokens").get<int64_t>();
  r.stop_ids = j.at("stop_ids").get<std::vector<int32_t>>();
  r.stop = j.at("stop").get<std::vector<std::string>>();
  r.ignore_eos = j.at("ignore_eos").get<bool>();
  r.sampling.temperature = j.at("temperature").get<float>();
  r.sampling.top_k = j.at("top_k").get<int32_t>();
  r.sampling.top_p = j.at("top_p").get<float>();
  if (j.contains("seed")) r.sampling.seed = j.at("seed").get<uint64_t>();
  return r;
}

std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace

bool LlmEngine::exchange_control(const std::vector<int64_t>& load) {
  Coordinator& coord = steps_.coord();
  std::string ctrl;
  if (coord.is_master()) {
    bool stop = false, fresh = false;
    {
      std::unique_lock<std::mutex> lock(inbox_mu_);
      // Waiting for work: the time until the next step is idle time, not a step gap.
      if (live_.empty() && remote_.empty() && inbox_.empty()) steps_.idle();
      if (steps_.solo()) {
        inbox_cv_.wait(lock, [&] { return stop_ || !inbox_.empty() || !live_.empty(); });
      } else if (live_.empty() && remote_.empty()) {
        inbox_cv_.wait_for(lock, kIdleWait, [&] { return stop_ || !inbox_.empty(); });
      }
      stop = stop_;
      fresh = !inbox_.empty();
    }
    if (steps_.solo()) {
      // A group of one: the new requests are all its own and nobody reads a message.
      if (stop) return false;
      if (fresh) make_control(load, false);
      return true;
    }
    ctrl = make_control(load, stop);
  }
  coord.broadcast(ctrl, 0);
  return apply_control(ctrl);
}

std::string LlmEngine::make_control(const std::vector<int64_t>& load_in, bool stop) {
  json ctrl = {{"stop", stop}, {"new", json::array()}, {"abort", json::array()}};
  if (stop) return dump(ctrl);
  std::vector<std::unique_ptr<Live>> fresh;
  {
    std::lock_guard<std::mutex> lock(inbox_mu_);
    fresh.swap(inbox_);
  }
  std::vector<int64_t> load = load_in;
  for (std::unique_ptr<Live>& l : fresh) {
    int to = 0;  // the least loaded rank; the lowest on a tie
    for (int r = 1; r < static_cast<int>(load.size()); ++r)
      if (load[r] < load[to]) to = r;
    ++load[to];
    const uint64_t id = l->seq->id;
    if (to == 0) {
      scheduler_.add(l->seq.get());
      live_.emplace(id, std::move(l));
      continue;
    }
    ctrl["new"].push_back({{"rank", to}, {"id", id}, {"req", request_to_json(l->req)}});
    remote_[id] = Remote{l->stream, l->arrival, l->arrival, 0, to};
  }
  for (const auto& [id, r] : remote_)
    if (r.stream->aborted()) ctrl["abort"].push_back(id);
  return dump(ctrl);
}

bool LlmEngine::apply_control(const std::string& msg) {
  const json ctrl = json::parse(msg);
  if (ctrl.at("stop").get<bool>()) return false;
  if (steps_.coord().is_master()) return true;  // it made the message and acted on it then
  const int me = steps_.coord().rank();
  for (const json& n : ctrl.at("new")) {
    if (n.at("rank").get<int>() != me) continue;
    const uint64_t id = n.at("id").get<uint64_t>();
    std::unique_ptr<Live> l = make_live(request_from_json(n.at("req")), id);
    forwarded_[id] = l->stream;
    scheduler_.add(l->seq.get());
    live_.emplace(id, std::move(l));
  }
  for (const json& a : ctrl.at("abort")) {
    const uint64_t id = a.get<uint64_t>();
    if (live_.count(id)) finish(id, "abort");
  }
  return true;
}

void LlmEngine::exchange_outputs(std::vector<int64_t>& load, uint64_t prompt_tokens,
                                 uint64_t generated, uint64_t preempted) {
  Coordinator& coord = steps_.coord();
  const int world = coord.world_size();
  if (steps_.solo()) {
    metrics_.add_tokens(prompt_tokens, generated, preempted);
    publish_state();
    load[0] = scheduler_.n_running() + scheduler_.n_waiting();
    return;
  }
  // Each rank's counts, then the output of its requests (rank 0's: none), in one round: rank 0
  // feeds the streams with the others' output, every rank learns every rank's load.
  const std::string out = coord.is_master() ? std::string() : take_outbox();
  const int64_t counts[kNumOutputs] = {static_cast<int64_t>(out.size()),
                                       static_cast<int64_t>(prompt_tokens),
                                       static_cast<int64_t>(generated),
                                       static_cast<int64_t>(preempted),
                                       scheduler_.n_running(),
                                       scheduler_.n_waiting(),
                                       blocks_.n_used()};
  std::string mine(reinterpret_cast<const char*>(counts), sizeof counts);
  mine += out;
  const std::vector<std::string> got = coord.all_gather_bytes(mine);
  int64_t sum[kNumOutputs] = {};
  for (int r = 0; r < world; ++r) {
    const std::string& g = got[static_cast<size_t>(r)];
    int64_t o[kNumOutputs] = {};
    if (g.size() >= sizeof o) std::memcpy(o, g.data(), sizeof o);
    if (g.size() < sizeof o || g.size() - sizeof o != static_cast<size_t>(o[kOutboxBytes]))
      DUET_ERROR("the step's output exchange: rank " << r << " sent " << g.size() << " bytes");
    if (coord.is_master() && o[kOutboxBytes] > 0) apply_outbox(g.substr(sizeof o));
    for (int i = 0; i < kNumOutputs; ++i) sum[i] += o[i];
    load[static_cast<size_t>(r)] = o[kRunning] + o[kWaiting];
  }
  if (coord.is_master()) {
    metrics_.add_tokens(sum[kPromptTokens], sum[kGenerated], sum[kPreempted]);
    metrics_.set_state(sum[kRunning], sum[kWaiting], sum[kBlocksUsed],
                       blocks_.n_blocks() * world);
  }
}

std::string LlmEngine::take_outbox() {
  json events = json::array();
  for (auto it = forwarded_.begin(); it != forwarded_.end();) {
    const StreamDelta d = it->second->wait(std::chrono::milliseconds(0));
    if (d.tokens.empty() && d.text.empty() && !d.finished) {
      ++it;
      continue;
    }
    json e = {{"id", it->first}, {"text", d.text}, {"tokens", d.tokens}};
    if (d.finished) {
      e["finish"] = d.finish_reason;
      e["error"] = d.error;
      it = forwarded_.erase(it);
    } else {
      ++it;
    }
    events.push_back(std::move(e));
  }
  return events.empty() ? std::string() : dump(events);
}

void LlmEngine::apply_outbox(const std::string& msg) {
  const Clock::time_point now = Clock::now();
  for (const json& e : json::parse(msg)) {
    auto it = remote_.find(e.at("id").get<uint64_t>());
    if (it == remote_.end()) continue;
    Remote& r = it->second;
    const std::string text = e.at("text").get<std::string>();
    const std::vector<int32_t> tokens = e.at("tokens").get<std::vector<int32_t>>();
    for (size_t i = 0; i < tokens.size(); ++i) {
      r.stream->push(i == 0 ? text : std::string(), tokens[i]);
      if (r.n_generated++ == 0)
        metrics_.observe_ttft(std::chrono::duration<double>(now - r.arrival).count());
      else
        metrics_.observe_itl(std::chrono::duration<double>(now - r.last_token).count());
      r.last_token = now;
    }
    if (e.contains("finish")) {
      const std::string reason = e.at("finish").get<std::string>();
      metrics_.finished(reason, std::chrono::duration<double>(now - r.arrival).count());
      r.stream->finish(reason, tokens.empty() ? text : std::string(),
                       e.at("error").get<std::string>());
      remote_.erase(it);
    }
  }
}

}  // namespace duet
