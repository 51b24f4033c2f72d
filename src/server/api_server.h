// The OpenAI-compatible HTTP server: /v1/completions, /v1/chat/completions (plain and
// server-sent events), /v1/models, /health and /metrics, over an LlmEngine running on its own
// thread. HTTP requests are served by a pool of httplib threads that block on their request's
// stream; a client that goes away aborts its request.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "engine/llm_engine.h"
#include "server/header_deadline.h"
#include "server/protocol.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace duet {

struct ApiServerOptions {
  std::string model_name;       // what /v1/models lists and requests must name
  int http_threads = 128;       // concurrent connections served
  bool add_bos = false;         // prepend bos_id to completion prompts (tokenizer_config.json)
  int32_t bos_id = -1;
  // Non-empty: every /v1 route needs `Authorization: Bearer <api_key>` (else 401, as vLLM's
  // --api-key); /health and /metrics stay open.
  std::string api_key;
  // A connection must send a request's headers within this time (HeaderDeadline), else 408 and
  // closed; 0: no deadline (only httplib's per-read timeout).
  double header_timeout_seconds = 30;
};

class ApiServer {
 public:
  // engine, tokenizer and chat_template (both may be null) must outlive the server.
  ApiServer(LlmEngine& engine, const Tokenizer* tokenizer, const ChatTemplate* chat_template,
            const ApiServerOptions& options);
  ~ApiServer();

  // Binds host:port (port 0: any free port) and returns the port. Throws duet::Error.
  int bind(const std::string& host, int port);
  // Serves until stop(); call after bind().
  void listen();
  // Thread-safe; makes listen() return.
  void stop();

 private:
  void routes();
  void handle_generate(const httplib::Request& req, bool chat, httplib::Response& res);
  EngineRequest to_engine_request(const ApiRequest& a) const;
  std::string next_id(bool chat);

  LlmEngine& engine_;
  const Tokenizer* tokenizer_;
  const ChatTemplate* chat_template_;
  ApiServerOptions opt_;
  std::unique_ptr<httplib::Server> http_;
  int listen_sock_ = -1;  // the listening socket httplib made (set in its socket-options hook)
  std::unique_ptr<HeaderDeadline> header_deadline_;  // null: none
  std::atomic<uint64_t> n_requests_{0};
};

}  // namespace duet
