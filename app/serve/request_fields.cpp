#include "app/serve/request_fields.h"

#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <random>
#include <set>

#include "base/terminal_text.h"

namespace tern::app {

namespace {

using nlohmann::json;

constexpr size_t kMaxStopStrings = 16;
constexpr size_t kMaxMessages = 4096;
constexpr int64_t kMaxTopLogprobs = 20;   // OpenAI's limit for top_logprobs

// "a string", "an array", ... for messages about a value of the wrong type.
std::string kind_of(const json& v) {
    switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::object: return "an object";
    case json::value_t::array: return "an array";
    case json::value_t::string: return "a string";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "an integer";
    case json::value_t::number_float: return "a number";
    default: return "a value of another kind";
    }
}

[[noreturn]] void wrong_type(const std::string& param, const json& v, const std::string& expected) {
    throw_invalid(param, param + ": expected " + expected + ", got " + kind_of(v));
}

bool get_bool(const json& v, const std::string& param) {
    if (!v.is_boolean()) wrong_type(param, v, "true or false");
    return v.get<bool>();
}

double get_number(const json& v, const std::string& param, double min, double max) {
    if (!v.is_number()) wrong_type(param, v, "a number");
    const double d = v.get<double>();
    if (!std::isfinite(d) || d < min || d > max) {
        char range[96];
        std::snprintf(range, sizeof range, "%g..%g", min, max);
        throw_invalid(param, param + ": " + v.dump() + " is out of range (expected " + range + ")");
    }
    return d;
}

int64_t get_integer(const json& v, const std::string& param, int64_t min, int64_t max) {
    int64_t i = 0;
    if (v.is_number_unsigned()) {
        const uint64_t u = v.get<uint64_t>();
        if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
            throw_invalid(param, param + ": " + v.dump() + " is out of range (expected " + std::to_string(min) +
                                     ".." + std::to_string(max) + ")");
        i = static_cast<int64_t>(u);
    } else if (v.is_number_integer()) {
        i = v.get<int64_t>();
    } else if (v.is_number_float() && std::isfinite(v.get<double>()) && std::trunc(v.get<double>()) == v.get<double>() &&
               std::fabs(v.get<double>()) < 9.0e18) {
        i = static_cast<int64_t>(v.get<double>());   // 16.0 from a client that has only doubles
    } else {
        wrong_type(param, v, "an integer");
    }
    if (i < min || i > max)
        throw_invalid(param, param + ": " + std::to_string(i) + " is out of range (expected " + std::to_string(min) +
                                 ".." + std::to_string(max) + ")");
    return i;
}

const std::string& get_string(const json& v, const std::string& param) {
    if (!v.is_string()) wrong_type(param, v, "a string");
    return v.get_ref<const std::string&>();
}

// A message's content: a string, or OpenAI's array of parts of which tern reads the text ones.
std::string message_content(const json& v, const std::string& param) {
    if (v.is_string()) return v.get<std::string>();
    if (v.is_null()) return {};   // an assistant turn that only called tools has none
    if (!v.is_array()) wrong_type(param, v, "a string or an array of text parts");
    std::string text;
    for (size_t i = 0; i < v.size(); ++i) {
        const json& part = v[i];
        const std::string p = param + "[" + std::to_string(i) + "]";
        if (!part.is_object()) wrong_type(p, part, "an object {\"type\": \"text\", \"text\": ...}");
        const auto type = part.find("type");
        if (type == part.end() || !type->is_string() || type->get<std::string>() != "text")
            throw_invalid(p + ".type", p + ".type: only \"text\" parts are supported (this model reads text only)",
                          "unsupported_content");
        const auto t = part.find("text");
        if (t == part.end()) throw_invalid(p + ".text", p + ".text: missing");
        if (!text.empty()) text += "\n";
        text += get_string(*t, p + ".text");
    }
    return text;
}

std::vector<ChatMessage> read_messages(const json& v) {
    if (!v.is_array()) wrong_type("messages", v, "an array of {\"role\", \"content\"} objects");
    if (v.empty()) throw_invalid("messages", "messages: the array is empty (give at least one message)");
    if (v.size() > kMaxMessages)
        throw_invalid("messages", "messages: " + std::to_string(v.size()) + " messages is more than the " +
                                      std::to_string(kMaxMessages) + " accepted");
    std::vector<ChatMessage> out;
    for (size_t i = 0; i < v.size(); ++i) {
        const json& m = v[i];
        const std::string p = "messages[" + std::to_string(i) + "]";
        if (!m.is_object()) wrong_type(p, m, "an object {\"role\", \"content\"}");
        const auto role = m.find("role");
        if (role == m.end()) throw_invalid(p + ".role", p + ".role: missing");
        std::string r = get_string(*role, p + ".role");
        if (r == "developer") r = "system";   // OpenAI's newer name for the system turn
        if (r != "system" && r != "user" && r != "assistant")
            throw_invalid(p + ".role",
                          p + ".role: '" + terminal_safe(r.substr(0, 40)) +
                              "' is not supported (expected system, developer, user or assistant; tern does not "
                              "call tools)");
        if (m.contains("tool_calls") && !m["tool_calls"].is_null() && !(m["tool_calls"].is_array() && m["tool_calls"].empty()))
            throw_invalid(p + ".tool_calls", p + ".tool_calls: tool calls are not supported", "unsupported_parameter");
        const auto content = m.find("content");
        if (content == m.end()) throw_invalid(p + ".content", p + ".content: missing");
        out.push_back({r, message_content(*content, p + ".content")});
    }
    return out;
}

std::vector<std::string> read_stop(const json& v) {
    if (v.is_null()) return {};
    if (v.is_string()) return {v.get<std::string>()};
    if (!v.is_array()) wrong_type("stop", v, "a string or an array of strings");
    if (v.size() > kMaxStopStrings)
        throw_invalid("stop", "stop: " + std::to_string(v.size()) + " strings is more than the " +
                                  std::to_string(kMaxStopStrings) + " accepted");
    std::vector<std::string> out;
    for (size_t i = 0; i < v.size(); ++i) out.push_back(get_string(v[i], "stop[" + std::to_string(i) + "]"));
    return out;
}

// Fields of OpenAI's API that tern cannot honour: refused unless they hold their neutral value, so a
// client never gets a silent approximation of what it asked for.
void refuse_unsupported(const json& body) {
    const auto unsupported = [](const std::string& param, const std::string& what) {
        throw_invalid(param, param + ": " + what + " is not supported", "unsupported_parameter");
    };
    if (const auto n = body.find("n"); n != body.end() && !n->is_null() && get_integer(*n, "n", 1, 1) != 1)
        unsupported("n", "more than one choice");
    if (const auto b = body.find("best_of"); b != body.end() && !b->is_null() && get_integer(*b, "best_of", 1, 1) != 1)
        unsupported("best_of", "more than one candidate");
    for (const char* key : {"tools", "functions"})
        if (const auto t = body.find(key); t != body.end() && !t->is_null() && !(t->is_array() && t->empty()))
            unsupported(key, "calling tools");
    if (const auto s = body.find("suffix"); s != body.end() && !s->is_null() && !(s->is_string() && s->get<std::string>().empty()))
        unsupported("suffix", "a suffix (fill-in-the-middle)");
    if (const auto lb = body.find("logit_bias"); lb != body.end() && !lb->is_null() && !(lb->is_object() && lb->empty()))
        unsupported("logit_bias", "logit bias");
    if (const auto rf = body.find("response_format"); rf != body.end() && !rf->is_null()) {
        if (!rf->is_object()) wrong_type("response_format", *rf, "an object");
        const auto type = rf->find("type");
        if (type != rf->end() && !(type->is_string() && type->get<std::string>() == "text"))
            unsupported("response_format", "a response format other than text");
    }
}

// OpenAI's log-probability fields, as the most likely tokens to list per generated token (-1: none asked).
// Chat: "logprobs": true, with "top_logprobs": 0..20. Completions (the legacy API): "logprobs": 0..20.
int32_t read_logprobs(const json& body, RequestKind kind) {
    const auto l = body.find("logprobs");
    const auto t = body.find("top_logprobs");
    const bool has_l = l != body.end() && !l->is_null(), has_t = t != body.end() && !t->is_null();
    if (kind == RequestKind::completions) {
        if (has_t) throw_invalid("top_logprobs", "top_logprobs: a field of chat completions; here logprobs is the count");
        return has_l ? static_cast<int32_t>(get_integer(*l, "logprobs", 0, kMaxTopLogprobs)) : -1;
    }
    const bool on = has_l && get_bool(*l, "logprobs");
    if (!has_t) return on ? 0 : -1;
    const auto n = static_cast<int32_t>(get_integer(*t, "top_logprobs", 0, kMaxTopLogprobs));
    if (!on && n > 0) throw_invalid("top_logprobs", "top_logprobs: only with \"logprobs\": true");
    return on ? n : -1;
}

// The batch format's fields: those of the API (the OpenAI names) and the CLI's spellings.
const std::set<std::string>& batch_fields() {
    static const std::set<std::string> fields = {
        "id", "prompt", "messages", "max_tokens", "max_completion_tokens", "n_predict", "temperature", "temp",
        "top_p", "top_k", "min_p", "repeat_penalty", "repeat_last_n", "frequency_penalty", "presence_penalty",
        "seed", "stop", "reasoning_effort"};
    return fields;
}

// The value of the first of `names` present (not null), and which one it was.
const json* field(const json& body, std::initializer_list<const char*> names, std::string& name) {
    const json* found = nullptr;
    for (const char* n : names) {
        const auto it = body.find(n);
        if (it == body.end() || it->is_null()) continue;
        if (found)
            throw_invalid(n, std::string(n) + ": give either " + name + " or " + n + ", not both");
        found = &*it;
        name = n;
    }
    return found;
}

// Builds a request body from nlohmann's SAX events while knowing where in the document it is, so a
// value the parser cannot take (a number beyond a double, ill-formed UTF-8, nesting past
// kMaxRequestJsonDepth) is refused naming its field ("messages[0].content") rather than escaping as
// an exception the server would answer with 500. Nothing here throws: the first failure is kept and
// parsing stops.
class BodyBuilder {
public:
    struct Failure {
        enum Kind { syntax, number_overflow, too_deep } kind = syntax;
        std::string path;    // the field where it happened, "" at the top
        std::string token;   // number_overflow: the number as written (shortened)
        std::string message; // syntax: nlohmann's description (where and what was expected)
    };

    bool null() { return add(json(nullptr)); }
    bool boolean(bool v) { return add(json(v)); }
    bool number_integer(json::number_integer_t v) { return add(json(v)); }
    bool number_unsigned(json::number_unsigned_t v) { return add(json(v)); }
    bool number_float(json::number_float_t v, const json::string_t&) { return add(json(v)); }
    bool string(json::string_t& v) { return add(json(std::move(v))); }
    bool binary(json::binary_t& v) { return add(json(json::binary_t(std::move(v)))); }
    bool start_object(std::size_t) { return open(json::object()); }
    bool start_array(std::size_t) { return open(json::array()); }
    bool key(json::string_t& k) {
        levels_.back().key = std::move(k);
        levels_.back().has_key = true;
        return true;
    }
    bool end_object() { return close(); }
    bool end_array() { return close(); }
    bool parse_error(std::size_t, const std::string& last_token, const nlohmann::detail::exception& e) {
        Failure f;
        f.path = path();
        if (e.id == 406) { // out_of_range.406: a number that overflows a double
            f.kind = Failure::number_overflow;
            f.token = terminal_safe(last_token.size() > 40 ? last_token.substr(0, 40) + "..." : last_token);
        } else {
            std::string why = e.what();
            if (const size_t at = why.find("parse error"); at != std::string::npos) why = why.substr(at);
            f.message = terminal_safe(why.substr(0, 200));
        }
        failure_ = std::move(f);
        return false;
    }

    const std::optional<Failure>& failure() const { return failure_; }
    json take() { return std::move(root_); }

private:
    struct Level {
        json* value;     // the open object or array
        std::string key; // an object's key whose value comes next
        bool has_key = false;
        size_t index = 0; // an array's next element
    };

    // Where the next value goes, made in its parent (or the root).
    json& slot() {
        if (levels_.empty()) return root_;
        Level& l = levels_.back();
        if (l.value->is_array()) return l.value->emplace_back();
        return (*l.value)[l.key]; // a repeated key: the last one wins, as nlohmann's own parser does
    }
    // The parent has its value: an array moves on to the next index, an object waits for a key.
    void advance() {
        if (levels_.empty()) return;
        ++levels_.back().index;
        levels_.back().has_key = false;
    }
    bool add(json v) {
        slot() = std::move(v);
        advance();
        return true;
    }
    bool open(json container) {
        if (levels_.size() >= static_cast<size_t>(kMaxRequestJsonDepth)) {
            failure_ = Failure{Failure::too_deep, path(), "", ""};
            return false;
        }
        json& s = slot();
        s = std::move(container);
        levels_.push_back({&s});
        return true;
    }
    bool close() {
        levels_.pop_back();
        advance();
        return true;
    }
    // The JSON path of the value being read: messages[0].content.
    std::string path() const {
        std::string p;
        for (const Level& l : levels_) {
            if (l.value->is_array()) {
                p += "[" + std::to_string(l.index) + "]";
            } else if (l.has_key) {
                if (!p.empty()) p += '.';
                p += terminal_safe(l.key.size() > 40 ? l.key.substr(0, 40) + "..." : l.key);
            } else {
                break; // between an object's members: the object itself
            }
        }
        return p;
    }

    json root_;
    std::vector<Level> levels_;
    std::optional<Failure> failure_;
};

} // namespace

nlohmann::json parse_request_json(std::string_view text, const std::string& what) {
    BodyBuilder builder;
    json::sax_parse(text.begin(), text.end(), &builder);
    if (const auto& f = builder.failure()) {
        const std::string at = f->path.empty() ? "" : " (at " + f->path + ")";
        switch (f->kind) {
        case BodyBuilder::Failure::too_deep:
            throw_invalid(f->path, what + " nests deeper than " + std::to_string(kMaxRequestJsonDepth) + " levels" + at,
                          "invalid_json");
        case BodyBuilder::Failure::number_overflow:
            throw_invalid(f->path, (f->path.empty() ? what : f->path) + ": " + f->token +
                                       " is beyond the range of a double (at most about 1.8e308 in magnitude)");
        case BodyBuilder::Failure::syntax:
            throw_invalid(f->path, what + " is not valid JSON: " + f->message + at, "invalid_json");
        }
    }
    json body = builder.take();
    if (!body.is_object()) throw_invalid("", what + " must be a JSON object, not " + kind_of(body), "invalid_json");
    return body;
}

GenerationRequest read_generation_request(const nlohmann::json& body, RequestKind kind, const RequestDefaults& defaults) {
    if (!body.is_object()) throw_invalid("", "the request must be a JSON object, not " + kind_of(body), "invalid_json");
    const bool batch = kind == RequestKind::batch_line;
    if (batch) {
        for (const auto& [key, value] : body.items())
            if (!batch_fields().count(key))
                throw_invalid(key, "'" + terminal_safe(key.substr(0, 40)) +
                                       "' is not a field of a batch line (fields: prompt or messages, id, max_tokens, "
                                       "temperature, top_p, top_k, min_p, seed, stop, repeat_penalty, repeat_last_n, "
                                       "frequency_penalty, presence_penalty, reasoning_effort)",
                               "unknown_field");
    } else {
        refuse_unsupported(body);
    }

    GenerationRequest r;
    r.sampling = defaults.sampling;
    r.stop = defaults.stop;
    r.max_tokens = defaults.n_predict;

    const auto messages = body.find("messages");
    const auto prompt = body.find("prompt");
    const bool has_messages = messages != body.end() && !messages->is_null();
    const bool has_prompt = prompt != body.end() && !prompt->is_null();
    if (kind == RequestKind::chat_completions || (batch && has_messages)) {
        if (batch && has_prompt) throw_invalid("prompt", "give either prompt or messages, not both");
        if (!has_messages) throw_invalid("messages", "messages: missing (the conversation to answer)");
        r.chat = true;
        r.messages = read_messages(*messages);
    } else {
        if (!has_prompt)
            throw_invalid("prompt", batch ? "give prompt (text to continue) or messages (a conversation)"
                                          : "prompt: missing (the text to continue)");
        if (prompt->is_array() && prompt->size() == 1 && (*prompt)[0].is_string()) {
            r.prompt = (*prompt)[0].get<std::string>();   // older clients send a list of one prompt
        } else if (prompt->is_array()) {
            throw_invalid("prompt", "prompt: only one prompt per request is supported (a string)", "unsupported_parameter");
        } else {
            r.prompt = get_string(*prompt, "prompt");
        }
    }

    if (!batch) {
        if (const auto m = body.find("model"); m != body.end() && !m->is_null()) r.model = get_string(*m, "model");
        if (const auto s = body.find("stream"); s != body.end() && !s->is_null()) r.stream = get_bool(*s, "stream");
        if (const auto so = body.find("stream_options"); so != body.end() && !so->is_null()) {
            if (!so->is_object()) wrong_type("stream_options", *so, "an object");
            if (const auto u = so->find("include_usage"); u != so->end() && !u->is_null())
                r.include_usage = get_bool(*u, "stream_options.include_usage");
        }
        if (kind == RequestKind::completions)
            if (const auto e = body.find("echo"); e != body.end() && !e->is_null()) r.echo = get_bool(*e, "echo");
        r.logprobs = read_logprobs(body, kind);
        if (r.logprobs >= 0 && r.stream)
            throw_invalid("logprobs", "logprobs: log probabilities of a streamed answer are not supported (ask "
                                      "without stream)", "unsupported_parameter");
    } else if (const auto id = body.find("id"); id != body.end()) {
        r.id = *id;
    }

    std::string name;
    if (const json* v = field(body, {"max_tokens", "max_completion_tokens", "n_predict"}, name)) {
        r.max_tokens = static_cast<int32_t>(get_integer(*v, name, -1, std::numeric_limits<int32_t>::max()));
        if (r.max_tokens == 0) throw_invalid(name, name + ": must be at least 1 (or -1: until the end)");
        r.max_tokens_given = true;
    }
    if (const json* v = field(body, {"temperature", "temp"}, name))
        r.sampling.temp = static_cast<float>(get_number(*v, name, 0.0, 2.0));
    if (const json* v = field(body, {"top_p"}, name)) r.sampling.top_p = static_cast<float>(get_number(*v, name, 0.0, 1.0));
    if (const json* v = field(body, {"min_p"}, name)) r.sampling.min_p = static_cast<float>(get_number(*v, name, 0.0, 1.0));
    if (const json* v = field(body, {"top_k"}, name))
        r.sampling.top_k = static_cast<int32_t>(get_integer(*v, name, 0, std::numeric_limits<int32_t>::max()));
    if (const json* v = field(body, {"repeat_penalty"}, name)) {
        r.sampling.repeat_penalty = static_cast<float>(get_number(*v, name, 0.0, 100.0));
        if (r.sampling.repeat_penalty <= 0.0f) throw_invalid(name, name + ": must be > 0 (1 turns it off)");
    }
    if (const json* v = field(body, {"repeat_last_n"}, name))
        r.sampling.repeat_last_n = static_cast<int32_t>(get_integer(*v, name, -1, std::numeric_limits<int32_t>::max()));
    if (const json* v = field(body, {"frequency_penalty"}, name))
        r.sampling.frequency_penalty = static_cast<float>(get_number(*v, name, -2.0, 2.0));
    if (const json* v = field(body, {"presence_penalty"}, name))
        r.sampling.presence_penalty = static_cast<float>(get_number(*v, name, -2.0, 2.0));
    if (const json* v = field(body, {"stop"}, name)) r.stop = read_stop(*v);
    // OpenAI's reasoning_effort: what gpt-oss's system message asks for (other formats have no such setting).
    if (const json* v = field(body, {"reasoning_effort"}, name)) {
        r.reasoning_effort = get_string(*v, name);
        if (!ChatTemplate::is_reasoning_effort(r.reasoning_effort))
            throw_invalid(name, name + ": '" + terminal_safe(r.reasoning_effort.substr(0, 40)) +
                                    "' is not one of low, medium, high");
    }

    int64_t seed = defaults.seed;
    if (const json* v = field(body, {"seed"}, name)) seed = get_integer(*v, name, -1, std::numeric_limits<int64_t>::max());
    if (seed < 0) {
        std::random_device rd;
        seed = rd();   // 32 bits, like the CLI's drawn seeds
    }
    r.sampling.seed = static_cast<uint64_t>(seed);
    return r;
}

} // namespace tern::app
