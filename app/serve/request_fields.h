#pragma once
// What a client asks for, read from JSON and checked field by field: the bodies of OpenAI's
// POST /v1/chat/completions and /v1/completions, and the lines of `tern run --batch`. Every problem is
// an ApiException (400) naming the field, what it holds and what is expected; nothing here loads a
// model or counts tokens (prompt_maker.h does that).
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "app/serve/api_error.h"
#include "engine/chat/chat_template.h"
#include "engine/generation/sampler.h"

namespace tern::app {

enum class RequestKind {
    chat_completions,   // "messages" (POST /v1/chat/completions)
    completions,        // "prompt" (POST /v1/completions)
    batch_line,         // either, plus "id"; CLI spellings (n_predict, temp) too; unknown fields refused
};

// What a request gets for the fields it leaves out: the server's or the batch run's flags.
struct RequestDefaults {
    SamplingParams sampling;          // its seed is not used: `seed` below
    int64_t seed = -1;                // -1: every request draws its own
    int32_t n_predict = -1;           // -1: until an end-of-generation token or the end of the context
    std::vector<std::string> stop;
};

struct GenerationRequest {
    bool chat = false;                      // messages (through the chat template) rather than a prompt
    std::vector<ChatMessage> messages;      // chat
    std::string prompt;                     // not chat
    std::string model;                      // empty: not given
    nlohmann::json id;                      // batch lines: "id" as given (null when absent)
    bool stream = false;
    bool include_usage = false;             // stream_options.include_usage
    bool echo = false;                      // completions: the prompt before the completion
    int32_t max_tokens = -1;                // -1: until an end-of-generation token or the end of the context
    bool max_tokens_given = false;
    SamplingParams sampling;                // seed drawn when neither the request nor the defaults gave one
    std::vector<std::string> stop;
    // >= 0: the log-probability of every generated token and those of its step's N most likely tokens (chat:
    // "logprobs": true and "top_logprobs": N; completions: "logprobs": N). -1: not asked.
    int32_t logprobs = -1;
    std::string reasoning_effort;           // low, medium, high (gpt-oss's harmony); empty: the server's default
};

// The most nesting a request body may have (a chat message's content parts are 4 levels deep); a
// deeper document is refused while parsing, before it is built.
inline constexpr int kMaxRequestJsonDepth = 32;

// `text` as JSON: 400 (code "invalid_json") when it is not JSON (ill-formed UTF-8 included), nests deeper
// than kMaxRequestJsonDepth, or is not an object; 400 naming the field ("temperature",
// "messages[0].content", or any other key) when a number is beyond the range of a double. Every
// failure is an ApiException whose param is the JSON path where it happened (empty at the top); no
// other exception leaves it. `what` names the text in messages ("the request body", "the line").
nlohmann::json parse_request_json(std::string_view text, const std::string& what = "the request body");

// The request's fields checked and resolved against `defaults`.
GenerationRequest read_generation_request(const nlohmann::json& body, RequestKind kind,
                                          const RequestDefaults& defaults);

} // namespace tern::app
