#include "app/serve/api_response.h"

namespace tern::app {

using nlohmann::json;

std::string_view finish_reason(StopReason reason) {
    switch (reason) {
    case StopReason::length:
    case StopReason::context: return "length";
    case StopReason::eos:
    case StopReason::stop:
    case StopReason::repetition:
    case StopReason::cancelled: return "stop";
    }
    return "stop";
}

json usage_json(int32_t n_prompt, int32_t n_gen) {
    return {{"prompt_tokens", n_prompt}, {"completion_tokens", n_gen}, {"total_tokens", n_prompt + n_gen}};
}

namespace {

json base(const ResponseHeader& h, const char* object) {
    return {{"id", h.id}, {"object", object}, {"created", h.created}, {"model", h.model}};
}

} // namespace

json chat_completion_json(const ResponseHeader& h, const BatchResult& r, const json& logprobs,
                          const SplitReply* channels) {
    json j = base(h, "chat.completion");
    json message = {{"role", "assistant"}, {"content", channels ? channels->answer : r.text}};
    if (channels && !channels->reasoning.empty()) message["reasoning_content"] = channels->reasoning;
    j["choices"] = json::array({{{"index", 0},
                                 {"message", std::move(message)},
                                 {"logprobs", logprobs},
                                 {"finish_reason", finish_reason(r.stop_reason)}}});
    j["usage"] = usage_json(r.n_prompt, r.n_gen());
    return j;
}

json text_completion_json(const ResponseHeader& h, const BatchResult& r, std::string_view text, const json& logprobs) {
    json j = base(h, "text_completion");
    j["choices"] = json::array(
        {{{"index", 0}, {"text", text}, {"logprobs", logprobs}, {"finish_reason", finish_reason(r.stop_reason)}}});
    j["usage"] = usage_json(r.n_prompt, r.n_gen());
    return j;
}

namespace {

json bytes_of(const std::string& s) {
    json b = json::array();
    for (unsigned char c : s) b.push_back(static_cast<int>(c));
    return b;
}

} // namespace

json chat_logprobs_json(const std::vector<TokenLogprobs>& steps, const TokenText& text) {
    json content = json::array();
    for (const TokenLogprobs& s : steps) {
        json top = json::array();
        for (const TokenLogprob& t : s.top) {
            const std::string piece = text(t.id);
            top.push_back({{"token", piece}, {"logprob", t.logprob}, {"bytes", bytes_of(piece)}});
        }
        const std::string piece = text(s.token);
        content.push_back(
            {{"token", piece}, {"logprob", s.logprob}, {"bytes", bytes_of(piece)}, {"top_logprobs", std::move(top)}});
    }
    return {{"content", std::move(content)}, {"refusal", nullptr}};
}

json completion_logprobs_json(const std::vector<TokenLogprobs>& steps, const TokenText& text, size_t offset0) {
    json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(), offsets = json::array();
    size_t offset = offset0;
    for (const TokenLogprobs& s : steps) {
        const std::string piece = text(s.token);
        tokens.push_back(piece);
        token_logprobs.push_back(s.logprob);
        json top = json::object();
        for (const TokenLogprob& t : s.top) {
            const std::string p = text(t.id);
            if (!top.contains(p)) top[p] = t.logprob;   // two ids with the same text: the likelier one
        }
        top_logprobs.push_back(std::move(top));
        offsets.push_back(offset);
        offset += piece.size();
    }
    return {{"tokens", std::move(tokens)}, {"token_logprobs", std::move(token_logprobs)},
            {"top_logprobs", std::move(top_logprobs)}, {"text_offset", std::move(offsets)}};
}

json chat_role_chunk(const ResponseHeader& h) {
    json j = base(h, "chat.completion.chunk");
    j["choices"] = json::array(
        {{{"index", 0}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr}, {"finish_reason", nullptr}}});
    return j;
}

json chat_content_chunk(const ResponseHeader& h, std::string_view piece) {
    json j = base(h, "chat.completion.chunk");
    j["choices"] =
        json::array({{{"index", 0}, {"delta", {{"content", piece}}}, {"logprobs", nullptr}, {"finish_reason", nullptr}}});
    return j;
}

json chat_reasoning_chunk(const ResponseHeader& h, std::string_view piece) {
    json j = base(h, "chat.completion.chunk");
    j["choices"] = json::array(
        {{{"index", 0}, {"delta", {{"reasoning_content", piece}}}, {"logprobs", nullptr}, {"finish_reason", nullptr}}});
    return j;
}

json chat_finish_chunk(const ResponseHeader& h, StopReason reason) {
    json j = base(h, "chat.completion.chunk");
    j["choices"] = json::array({{{"index", 0},
                                 {"delta", json::object()},
                                 {"logprobs", nullptr},
                                 {"finish_reason", finish_reason(reason)}}});
    return j;
}

json completion_chunk(const ResponseHeader& h, std::string_view piece) {
    json j = base(h, "text_completion");
    j["choices"] = json::array({{{"index", 0}, {"text", piece}, {"logprobs", nullptr}, {"finish_reason", nullptr}}});
    return j;
}

json completion_finish_chunk(const ResponseHeader& h, StopReason reason) {
    json j = base(h, "text_completion");
    j["choices"] =
        json::array({{{"index", 0}, {"text", ""}, {"logprobs", nullptr}, {"finish_reason", finish_reason(reason)}}});
    return j;
}

json usage_chunk(const ResponseHeader& h, bool chat, int32_t n_prompt, int32_t n_gen) {
    json j = base(h, chat ? "chat.completion.chunk" : "text_completion");
    j["choices"] = json::array();
    j["usage"] = usage_json(n_prompt, n_gen);
    return j;
}

std::string dump_json(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string sse_event(const json& j) { return "data: " + dump_json(j) + "\n\n"; }

json model_json(const std::string& name, int64_t created) {
    return {{"id", name}, {"object", "model"}, {"created", created}, {"owned_by", "tern"}};
}

json models_json(const std::string& name, int64_t created) {
    return {{"object", "list"}, {"data", json::array({model_json(name, created)})}};
}

} // namespace tern::app
