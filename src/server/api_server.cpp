#include "server/api_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdio>

#include "server/api_error.h"
#include "server/client_socket.h"
#include "server/prometheus.h"

namespace duet {

namespace {

using nlohmann::json;

constexpr auto kHeartbeat = std::chrono::milliseconds(1000);
// How often a non-streamed request that waits in its handler checks whether its client left.
constexpr auto kHangupPoll = std::chrono::milliseconds(50);
constexpr size_t kMaxBody = 32u << 20;

void reply_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(body.dump(), "application/json");
}

void reply_error(httplib::Response& res, const std::exception& e) {
  ErrorReply r = error_reply(e);
  reply_json(res, r.status, r.body);
}

int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string sse(const json& j) { return "data: " + j.dump() + "\n\n"; }

// Whether `got` equals `want`, in a time that does not depend on where they differ.
bool same_secret(const std::string& got, const std::string& want) {
  unsigned diff = got.size() == want.size() ? 0u : 1u;
  for (size_t i = 0; i < got.size(); ++i)
    diff |= static_cast<unsigned char>(got[i]) ^
            static_cast<unsigned char>(want.empty() ? 0 : want[i % want.size()]);
  return diff == 0;
}

// One request's response in progress, shared by the content provider and its releaser.
struct Exchange {
  std::shared_ptr<RequestStream> stream;
  ResponseMeta meta;
  bool stream_mode = false;
  bool include_usage = false;
  bool first = true;
  bool done = false;
  std::string text;  // non-streamed: the whole completion
};

// The SSE bytes for one delta (maybe none).
std::string sse_events(Exchange& x, const StreamDelta& d) {
  std::string out;
  if (!d.tokens.empty() || !d.text.empty() || (x.first && x.meta.chat)) {
    out += chunk_event(x.meta, d.text, "", x.first && x.meta.chat, x.include_usage);
    x.first = false;
  }
  if (!d.finished) return out;
  if (!d.error.empty()) out += sse(error_reply(ApiError(503, d.error, "service_unavailable")).body);
  out += chunk_event(x.meta, "", d.finish_reason, false, x.include_usage);
  if (x.include_usage) out += sse(usage_chunk_json(x.meta, {d.prompt_tokens, d.completion_tokens}));
  out += "data: [DONE]\n\n";
  return out;
}

// The status and body of a non-streamed request that has finished: 200 with the completion, or
// 503 with the OpenAI error when the engine failed (a rank died).
ErrorReply whole_response(const Exchange& x, const StreamDelta& d) {
  if (!d.error.empty()) return error_reply(ApiError(503, d.error, "service_unavailable"));
  return {200, response_json(x.meta, x.text, d.finish_reason,
                             {d.prompt_tokens, d.completion_tokens})};
}

// Feeds one request's output to httplib: blocks on the stream and writes what arrived (a chunk
// per delta when streaming; the whole body at the end otherwise). After a silent second it
// writes a heartbeat (an SSE comment, or whitespace, which JSON ignores) so that a client that
// left is found by the failing write even while its request waits or prefills.
bool provide(Exchange& x, httplib::DataSink& sink) {
  if (x.done) {
    sink.done();
    return true;
  }
  const StreamDelta d = x.stream->wait(kHeartbeat);
  std::string out;
  if (x.stream_mode) {
    out = sse_events(x, d);
  } else {
    x.text += d.text;
    if (d.finished) out = whole_response(x, d).body.dump();
  }
  const bool silent = d.tokens.empty() && d.text.empty() && !d.finished;
  if (silent) out = x.stream_mode ? ": keep-alive\n\n" : " ";
  if (out.empty()) return true;
  if (!sink.write(out.data(), out.size())) {
    x.stream->abort();
    return false;
  }
  if (d.finished) {
    x.done = true;
    sink.done();
  }
  return true;
}

// A non-streamed request whose connection socket is known: waits in the handler, before
// anything is written, so that the status line says how the request ended (200, or 503 with the
// OpenAI error when the engine failed, e.g. a rank died). A client that hangs up meanwhile is
// noticed within kHangupPoll and its request aborted.
void reply_whole(Exchange& x, int fd, httplib::Response& res) {
  auto next_check = std::chrono::steady_clock::now() + kHangupPoll;
  for (;;) {
    const StreamDelta d = x.stream->wait(kHangupPoll);
    x.text += d.text;
    if (d.finished) {
      const ErrorReply r = whole_response(x, d);
      reply_json(res, r.status, r.body);
      return;
    }
    // Once per kHangupPoll, not per token.
    const auto now = std::chrono::steady_clock::now();
    if (now < next_check) continue;
    next_check = now + kHangupPoll;
    if (peer_hung_up(fd)) {
      x.stream->abort();
      reply_error(res, ApiError(400, "the client closed the connection"));  // read by no one
      return;
    }
  }
}

}  // namespace

ApiServer::ApiServer(LlmEngine& engine, const Tokenizer* tokenizer,
                     const ChatTemplate* chat_template, const ApiServerOptions& options)
    : engine_(engine), tokenizer_(tokenizer), chat_template_(chat_template), opt_(options),
      http_(std::make_unique<httplib::Server>()) {
  const int n = std::max(8, opt_.http_threads);
  http_->new_task_queue = [n] { return new httplib::ThreadPool(static_cast<size_t>(n)); };
  http_->set_payload_max_length(kMaxBody);
  // httplib's default sets SO_REUSEPORT, which lets a second server bind the same port and
  // silently take half its connections; two duet instances must collide loudly instead.
  http_->set_socket_options([this](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    listen_sock_ = static_cast<int>(sock);
  });
  routes();
}

ApiServer::~ApiServer() = default;

int ApiServer::bind(const std::string& host, int port) {
  const int got = port == 0 ? http_->bind_to_any_port(host) : (http_->bind_to_port(host, port) ? port : -1);
  if (got <= 0)
    DUET_ERROR("cannot listen on " << host << ":" << port
                                   << " (is another server using the port? --port 0 picks a free one)");
  // Debian's httplib listens with a backlog of 5 (compiled in): a burst of new connections (a
  // client per request, as load generators open them) overflows it and clients see their
  // connection fail. Listening again on the bound socket raises the backlog.
  if (listen_sock_ >= 0) ::listen(listen_sock_, SOMAXCONN);
  if (header_deadline_) header_deadline_->start(got);
  return got;
}

void ApiServer::listen() { http_->listen_after_bind(); }

void ApiServer::stop() { http_->stop(); }

std::string ApiServer::next_id(bool chat) {
  return std::string(chat ? "chatcmpl-" : "cmpl-") + std::to_string(unix_seconds()) + "-" +
         std::to_string(n_requests_.fetch_add(1));
}

EngineRequest ApiServer::to_engine_request(const ApiRequest& a) const {
  EngineRequest r;
  if (a.chat) {
    if (!chat_template_) throw ApiError(400, "this model has no chat template; use /v1/completions");
    if (!tokenizer_)
      throw ApiError(400, "this model has no tokenizer (tokenizer.json or tiktoken.model)");
    r.prompt = tokenizer_->encode(chat_template_->render(a.messages, /*add_generation_prompt=*/true));
  } else if (a.prompt_is_ids) {
    r.prompt = a.prompt_ids;
  } else {
    if (!tokenizer_)
      throw ApiError(
          400, "this model has no tokenizer (tokenizer.json or tiktoken.model); send token ids");
    if (opt_.add_bos && opt_.bos_id >= 0) r.prompt.push_back(opt_.bos_id);
    std::vector<int32_t> ids = tokenizer_->encode(a.prompt_text);
    r.prompt.insert(r.prompt.end(), ids.begin(), ids.end());
  }
  const int64_t n_prompt = static_cast<int64_t>(r.prompt.size());
  if (n_prompt == 0) throw_bad_field(a.chat ? "messages" : "prompt", "the prompt is empty");
  if (n_prompt >= engine_.max_model_len()) {
    throw_bad_field(a.chat ? "messages" : "prompt",
                    "This model's maximum context length is " + std::to_string(engine_.max_model_len()) +
                        " tokens. However, the prompt has " + std::to_string(n_prompt) +
                        " tokens. Please reduce the length of the prompt.");
  }
  // Chat's default, as vLLM's: whatever room the request has left (at least 1, so that a full
  // context is reported by the engine's check).
  r.max_tokens = a.max_tokens ? *a.max_tokens
                 : a.chat     ? std::max<int64_t>(1, engine_.max_request_len() - n_prompt)
                              : 16;
  r.sampling = a.sampling;
  r.stop = a.stop;
  r.stop_ids = a.stop_token_ids;
  r.ignore_eos = a.ignore_eos;
  return r;
}

void ApiServer::handle_generate(const httplib::Request& req, bool chat, httplib::Response& res) {
  // Headers and body are in: however long the generation runs, the deadline waits for its end.
  if (header_deadline_) header_deadline_->request_started(req.remote_addr, req.remote_port);
  try {
    const ApiRequest a = parse_api_request(req.body, chat);
    if (!a.model.empty() && a.model != opt_.model_name) {
      throw ApiError(404, "The model `" + excerpt(a.model) + "` does not exist.",
                     "invalid_request_error", "model", "model_not_found");
    }
    if (!engine_.alive()) throw ApiError(503, "the engine is not running", "service_unavailable");
    auto x = std::make_shared<Exchange>();
    x->stream = engine_.submit(to_engine_request(a));
    if (!x->stream) throw ApiError(503, "the engine is not running", "service_unavailable");
    x->meta = {chat, next_id(chat), unix_seconds(), opt_.model_name};
    x->stream_mode = a.stream;
    x->include_usage = a.include_usage;
    if (!a.stream) {
      const int fd = find_connection_socket(req.local_addr, req.local_port, req.remote_addr,
                                            req.remote_port);
      if (fd >= 0) {
        reply_whole(*x, fd, res);
        return;
      }
      // Not found (not expected): the whitespace heartbeat below finds a client that left, at
      // the price of a 200 status sent before the outcome is known.
    }
    if (a.stream) res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        a.stream ? "text/event-stream" : "application/json",
        [x](size_t, httplib::DataSink& sink) { return provide(*x, sink); },
        [x](bool) { x->stream->abort(); });  // a no-op once the request finished
  } catch (const std::exception& e) {
    reply_error(res, e);
  }
}

void ApiServer::routes() {
  using httplib::Request;
  using httplib::Response;
  if (opt_.header_timeout_seconds > 0) {
    header_deadline_ = std::make_unique<HeaderDeadline>(
        std::chrono::milliseconds(static_cast<int64_t>(opt_.header_timeout_seconds * 1000)));
    // After the response went out (httplib calls its logger then): the next request's headers
    // are due within the deadline again.
    http_->set_logger([this](const Request& req, const Response&) {
      header_deadline_->request_finished(req.remote_addr, req.remote_port);
    });
  }
  // Runs once a request's headers are in, before its body is read and before routing. A POST's
  // body is still to come: its deadline ends when its handler starts (handle_generate).
  http_->set_pre_routing_handler([this](const Request& req, Response& res) {
    if (header_deadline_ && req.method != "POST")
      header_deadline_->request_started(req.remote_addr, req.remote_port);
    if (opt_.api_key.empty() || req.path.rfind("/v1", 0) != 0)
      return httplib::Server::HandlerResponse::Unhandled;
    const std::string auth = req.get_header_value("Authorization");
    const std::string bearer = "Bearer ";
    if (auth.rfind(bearer, 0) == 0 && same_secret(auth.substr(bearer.size()), opt_.api_key))
      return httplib::Server::HandlerResponse::Unhandled;
    reply_json(res, 401,
               error_reply(ApiError(401,
                                    "Incorrect or missing API key: send the header "
                                    "'Authorization: Bearer <key>' with the server's --api-key",
                                    "invalid_request_error", "", "invalid_api_key"))
                   .body);
    return httplib::Server::HandlerResponse::Handled;
  });
  http_->Post("/v1/completions", [this](const Request& req, Response& res) {
    handle_generate(req, /*chat=*/false, res);
  });
  http_->Post("/v1/chat/completions", [this](const Request& req, Response& res) {
    handle_generate(req, /*chat=*/true, res);
  });
  http_->Get("/v1/models", [this](const Request&, Response& res) {
    json model = {{"id", opt_.model_name},      {"object", "model"},
                  {"created", unix_seconds()},  {"owned_by", "duet"},
                  {"root", opt_.model_name},    {"max_model_len", engine_.max_model_len()}};
    reply_json(res, 200, {{"object", "list"}, {"data", json::array({model})}});
  });
  http_->Get("/health", [this](const Request&, Response& res) {
    if (engine_.alive()) {
      res.status = 200;
    } else {
      reply_error(res, ApiError(503, "the engine is not running", "service_unavailable"));
    }
  });
  http_->Get("/metrics", [this](const Request&, Response& res) {
    res.set_content(prometheus_text(engine_.metrics().snapshot(), opt_.model_name),
                    "text/plain; version=0.0.4; charset=utf-8");
  });
  http_->set_error_handler(httplib::Server::HandlerWithResponse([](const Request& req,
                                                                  Response& res) {
    if (!res.body.empty() || res.status < 400) return httplib::Server::HandlerResponse::Unhandled;
    const std::string what = res.status == 404 ? "no such endpoint: " + req.method + " " + req.path
                                               : "request rejected by the HTTP layer";
    reply_json(res, res.status,
               error_reply(ApiError(res.status, what)).body);
    return httplib::Server::HandlerResponse::Handled;
  }));
  http_->set_exception_handler([](const Request&, Response& res, std::exception_ptr ep) {
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      reply_error(res, e);
    } catch (...) {
      reply_json(res, 500, error_reply(ApiError(500, "internal server error")).body);
    }
  });
}

}  // namespace duet
