// Request parsing (types, ranges, unknown fields → ApiError naming the field), the error JSON,
// response and chunk bodies, and the output text: stop strings cut as OpenAI does and streamed
// text never breaks a UTF-8 character.
#include "server/protocol.h"

#include <gtest/gtest.h>

#include <random>

#include "engine/output_text.h"
#include "server/api_error.h"

namespace duet {
namespace {

ApiError parse_error(const std::string& body, bool chat = false) {
  try {
    parse_api_request(body, chat);
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "accepted: " << body;
  return ApiError(0, "");
}

TEST(ProtocolTest, ParsesACompletionRequest) {
  ApiRequest r = parse_api_request(
      R"({"model":"m","prompt":"hi","max_tokens":7,"temperature":0.5,"top_p":0.9,"top_k":3,)"
      R"("seed":4,"stop":["a","bc"],"stop_token_ids":[9],"ignore_eos":true,"stream":true,)"
      R"("stream_options":{"include_usage":true},"n":1,"user":"u","presence_penalty":0})",
      false);
  EXPECT_EQ(r.model, "m");
  EXPECT_EQ(r.prompt_text, "hi");
  EXPECT_EQ(*r.max_tokens, 7);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 0.9f);
  EXPECT_EQ(r.sampling.top_k, 3);
  EXPECT_EQ(*r.sampling.seed, 4u);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"a", "bc"}));
  EXPECT_EQ(r.stop_token_ids, (std::vector<int32_t>{9}));
  EXPECT_TRUE(r.ignore_eos && r.stream && r.include_usage);
}

TEST(ProtocolTest, DefaultsAndTokenPrompts) {
  ApiRequest r = parse_api_request(R"({"prompt":[1,2,3],"stop":"x","temperature":null})", false);
  EXPECT_TRUE(r.prompt_is_ids);
  EXPECT_EQ(r.prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_FALSE(r.max_tokens.has_value());
  EXPECT_FLOAT_EQ(r.sampling.temperature, 1.0f);  // OpenAI's default
  EXPECT_EQ(r.stop, std::vector<std::string>{"x"});
  ApiRequest c = parse_api_request(
      R"({"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]})",
      true);
  EXPECT_EQ(c.messages[0]["content"], "ab");
}

TEST(ProtocolTest, RejectsBadInputNamingTheField) {
  struct Case {
    const char* body;
    const char* param;
  };
  const Case cases[] = {
      {R"({"prompt":"x","max_tokens":"3"})", "max_tokens"},
      {R"({"prompt":"x","max_tokens":0})", "max_tokens"},
      {R"({"prompt":"x","max_tokens":1.5})", "max_tokens"},
      {R"({"prompt":"x","max_tokens":1e30})", "max_tokens"},
      {R"({"prompt":"x","max_tokens":18446744073709551615})", "max_tokens"},
      {R"({"prompt":"x","temperature":2.5})", "temperature"},
      {R"({"prompt":"x","top_p":0})", "top_p"},
      {R"({"prompt":"x","top_k":-2})", "top_k"},
      {R"({"prompt":"x","n":3})", "n"},
      {R"({"prompt":"x","stop":[""]})", "stop"},
      {R"({"prompt":"x","stream":1})", "stream"},
      {R"({"prompt":"x","stream_options":{"include_usage":true}})", "stream_options"},
      {R"({"prompt":"x","logprobs":2})", "logprobs"},
      {R"({"prompt":"x","bogus":1})", "bogus"},
      {R"({"prompt":""})", "prompt"},
      {R"({"prompt":[]})", "prompt"},
      {R"({"prompt":[1,-4]})", "prompt"},
      {R"({"prompt":["a","b"]})", "prompt"},
      {R"({"max_tokens":3})", "prompt"},
  };
  for (const Case& c : cases) {
    ApiError e = parse_error(c.body);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body;
  }
  EXPECT_EQ(parse_error(R"({"messages":[]})", true).param, "messages");
  EXPECT_EQ(parse_error(R"({"messages":[{"role":"x","content":"a"}]})", true).param, "messages");
  EXPECT_EQ(parse_error("{not json").status, 400);
  EXPECT_EQ(parse_error("[1]").status, 400);
}

// Limits: stop strings are at most 16 of at most 1024 bytes each; an error quotes at most a
// short excerpt of what the client sent (an unknown field named by a 100 KB key).
TEST(ProtocolTest, LimitsAndShortExcerpts) {
  const std::string long_stop(1025, 'a');
  ApiError e = parse_error(R"({"prompt":"x","stop":[")" + long_stop + R"("]})");
  EXPECT_EQ(e.param, "stop");
  EXPECT_NE(std::string(e.what()).find("1025 bytes"), std::string::npos) << e.what();
  EXPECT_EQ(parse_api_request(R"({"prompt":"x","stop":[")" + long_stop.substr(1) + R"("]})", false)
                .stop.size(),
            1u);
  const std::string key(100000, 'k');
  e = parse_error(R"({"prompt":"x",")" + key + R"(":1})");
  EXPECT_LT(std::string(e.what()).size(), 200u);
  EXPECT_LT(e.param.size(), 100u);
  EXPECT_NE(std::string(e.what()).find("(100000 bytes)"), std::string::npos) << e.what();
  EXPECT_EQ(excerpt("short"), "short");
  EXPECT_EQ(excerpt("\xc3\xa9\xc3\xa9", 3), "\xc3\xa9... (4 bytes)");  // never cuts a character
}

TEST(ProtocolTest, ErrorReplyIsAnOpenAiErrorObject) {
  ErrorReply r = error_reply(ApiError(404, "no model", "invalid_request_error", "model", "model_not_found"));
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(r.body["error"]["message"], "no model");
  EXPECT_EQ(r.body["error"]["param"], "model");
  EXPECT_EQ(r.body["error"]["code"], "model_not_found");
  ErrorReply plain = error_reply(Error("bad prompt"));
  EXPECT_EQ(plain.status, 400);
  EXPECT_EQ(plain.body["error"]["type"], "invalid_request_error");
  EXPECT_TRUE(plain.body["error"]["param"].is_null());
  EXPECT_EQ(error_reply(std::runtime_error("bug")).status, 500);
}

TEST(ProtocolTest, ResponseAndChunkBodies) {
  ResponseMeta chat{true, "chatcmpl-1", 5, "m"};
  auto r = response_json(chat, "hi", "stop", {3, 2});
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_EQ(r["choices"][0]["message"]["content"], "hi");
  EXPECT_EQ(r["usage"]["total_tokens"], 5);
  auto first = chunk_json(chat, "", "", true, true);
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE(first["usage"].is_null());
  auto usage = usage_chunk_json(ResponseMeta{false, "cmpl-1", 5, "m"}, {3, 2});
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 2);
}

// chunk_event writes what chunk_json's dump gives, byte for byte: both kinds, first chat chunk or
// not, finish reasons, usage, and texts of random code points (quotes, backslashes, every control
// character, 2- to 4-byte UTF-8); text that is not UTF-8 fails the same way on both paths.
TEST(ProtocolTest, ChunkEventIsChunkJsonsDump) {
  std::mt19937 rng(11);
  auto random_text = [&](int n) {
    std::string t;
    std::uniform_int_distribution<int> kind(0, 5), ctrl(0, 0x1f), ascii(0x20, 0x7f);
    std::uniform_int_distribution<uint32_t> wide(0x80, 0x10ffff);
    for (int i = 0; i < n; ++i) {
      uint32_t cp = 0;
      switch (kind(rng)) {
        case 0:
          cp = static_cast<uint32_t>(ctrl(rng));
          break;
        case 1:
          cp = "\"\\/"[i % 3];
          break;
        case 2:
          do cp = wide(rng);
          while (cp >= 0xd800 && cp <= 0xdfff);
          break;
        default:
          cp = static_cast<uint32_t>(ascii(rng));
      }
      if (cp < 0x80) {
        t += static_cast<char>(cp);
      } else if (cp < 0x800) {
        t += static_cast<char>(0xc0 | (cp >> 6));
        t += static_cast<char>(0x80 | (cp & 0x3f));
      } else if (cp < 0x10000) {
        t += static_cast<char>(0xe0 | (cp >> 12));
        t += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
        t += static_cast<char>(0x80 | (cp & 0x3f));
      } else {
        t += static_cast<char>(0xf0 | (cp >> 18));
        t += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
        t += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
        t += static_cast<char>(0x80 | (cp & 0x3f));
      }
    }
    return t;
  };
  int checked = 0;
  for (bool chat : {false, true}) {
    for (int i = 0; i < 300; ++i) {
      const ResponseMeta m{chat, (chat ? "chatcmpl-" : "cmpl-") + std::to_string(i), 1700000000 + i,
                           i % 7 == 0 ? random_text(5) : "tiny"};
      const std::string text = i % 5 == 0 ? "" : random_text(i % 40);
      const std::string finish = i % 3 == 0 ? "" : (i % 3 == 1 ? "stop" : "length");
      const bool first = i % 4 == 0, usage = i % 2 == 0;
      EXPECT_EQ(chunk_event(m, text, finish, first, usage),
                "data: " + chunk_json(m, text, finish, first, usage).dump() + "\n\n")
          << "case " << i << (chat ? " chat" : "");
      ++checked;
    }
  }
  EXPECT_EQ(checked, 600);
  const ResponseMeta m{false, "cmpl-1", 5, "m"};
  for (const std::string bad : {"\xff", "a\xc3", "\xed\xa0\x80", "\xc0\xaf", "\xf4\x90\x80\x80"}) {
    EXPECT_THROW(chunk_json(m, bad, "", false, false).dump(), std::exception);
    EXPECT_THROW(chunk_event(m, bad, "", false, false), std::exception);
  }
}

TEST(OutputTextTest, StopStringIsCutAndNeverStreamed) {
  OutputText t({"END", "xyz"});
  EXPECT_FALSE(t.append("hello E"));
  EXPECT_EQ(t.take_ready(), "hello");  // " E" might start "END"
  EXPECT_FALSE(t.append("N"));
  EXPECT_EQ(t.take_ready(), " ");  // "EN" is held back
  EXPECT_TRUE(t.append("D and more"));
  EXPECT_EQ(t.take_ready(), "");
  EXPECT_EQ(t.take_rest(), "");
  EXPECT_EQ(t.bytes(), "hello ");
}

TEST(OutputTextTest, StopStringAcrossManyTokens) {
  OutputText t({"abc"});
  std::string sent;
  for (const char* piece : {"x", "a", "b", "y", "a", "b", "c", "z"}) {
    if (t.append(piece)) break;
    sent += t.take_ready();
  }
  sent += t.take_rest();
  EXPECT_EQ(sent, "xaby");
}

TEST(OutputTextTest, NeverSplitsAUtf8Character) {
  OutputText t({});
  const std::string euro = "\xe2\x82\xac";  // €
  EXPECT_FALSE(t.append("a\xe2"));
  EXPECT_EQ(t.take_ready(), "a");
  EXPECT_FALSE(t.append("\x82"));
  EXPECT_EQ(t.take_ready(), "");
  EXPECT_FALSE(t.append("\xac" "b"));
  EXPECT_EQ(t.take_ready(), euro + "b");
  EXPECT_FALSE(t.append("\xf0\x9f"));  // half an emoji at the end of the request
  EXPECT_EQ(t.take_rest(), "\xef\xbf\xbd");  // U+FFFD, as Hugging Face's decode gives
  EXPECT_EQ(utf8_complete_end("ab\xff", 3), 3u);  // never-valid bytes are not held back
}

}  // namespace
}  // namespace duet
