#include "engine/chat/conversation_file.h"

#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <algorithm>
#include <functional>
#include <string_view>

#include "engine/model.h"
#include "engine/generation/session.h"
#include "engine/kv_snapshot.h"
#include "formats/atomic_file.h"
#include "base/error.h"
#include "formats/input_file.h"
#include "formats/text.h"

namespace tern {

namespace {

constexpr char kMagic[8] = {'T', 'E', 'R', 'N', 'C', 'H', 'A', 'T'};
constexpr size_t kHeaderBytes = 8 + 4 + 4 + 8;

void put_u32(std::string& out, uint32_t v) {
    for (int i = 0; i < 4; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
}
void put_u64(std::string& out, uint64_t v) {
    for (int i = 0; i < 8; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
}
uint64_t get_u64(const std::string& in, size_t at) {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(in[at + i])) << (8 * i);
    return v;
}
uint32_t get_u32(const std::string& in, size_t at) {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(in[at + i])) << (8 * i);
    return v;
}

// What K/V a conversation's cache depends on, as far as a file can tell cheaply: the model's shape
// and name, the file's size and the KV format. Enough to refuse another model's conversation.
nlohmann::json model_fingerprint(const Session& session, KvType kv_type) {
    nlohmann::json j;
    j["vocab"] = session.tokenizer().vocab_size();
    j["kv_type"] = std::string(kv_type_name(kv_type));
    if (const Model* m = session.model()) {
        j["name"] = m->config.name;
        j["n_layers"] = m->config.n_layers;
        j["dim"] = m->config.dim;
        j["file_size"] = m->file.file_size();
    }
    return j;
}

// A conversation holds what the user typed: 0600, like the chat history. A unique temporary file
// beside PATH, renamed over it (formats/atomic_file.h): two /save to one file each leave a whole file.
void write_atomically(const std::string& path, const std::string& bytes) {
    AtomicFile::Options options;
    options.mode = 0600;
    options.what = "cannot save the conversation";
    AtomicFile out(path, options);
    out.write(bytes.data(), bytes.size());
    out.commit();
}

// The JSON part is untrusted: /save writes 3 levels, so anything deeper than kMaxJsonDepth is
// refused while parsing (the parser itself is iterative; the depth bound keeps the recursive copy
// and destruction of the document small) and its size is capped before parsing.
constexpr int kMaxJsonDepth = 16;
constexpr uint64_t kMaxConversationJsonBytes = uint64_t{256} << 20;

nlohmann::json parse_bounded_json(std::string_view text) {
    struct TooDeep {};
    try {
        return nlohmann::json::parse(text.begin(), text.end(),
                                     [](int depth, nlohmann::json::parse_event_t event, nlohmann::json&) {
                                         if ((event == nlohmann::json::parse_event_t::object_start ||
                                              event == nlohmann::json::parse_event_t::array_start) &&
                                             depth >= kMaxJsonDepth)
                                             throw TooDeep{};
                                         return true;
                                     });
    } catch (const TooDeep&) {
        throw UsageError("the file is damaged: its JSON nests deeper than " + std::to_string(kMaxJsonDepth) +
                         " levels");
    }
}

// The largest file this session's conversation can need: the JSON part's cap plus the K/V of a
// full context at 4 bytes an element, so a bigger file is refused before it is read into memory.
uint64_t max_conversation_file_bytes(const Session& session) {
    uint64_t per_token = 0;
    if (const Model* m = session.model())
        for (const LayerConfig& l : m->config.layers)
            per_token += static_cast<uint64_t>(std::max(l.n_kv_heads, 0)) *
                         static_cast<uint64_t>(std::max(m->config.head_dim, 0) + std::max(m->config.head_dim_v, 0)) * 4;
    else
        per_token = uint64_t{1} << 20; // no model to measure (a test backend): 1 MiB a position
    return kMaxConversationJsonBytes + per_token * static_cast<uint64_t>(std::max(session.n_ctx(), 1)) +
           (uint64_t{1} << 20);
}

// Typed access to one JSON object's fields: each getter checks presence, type and range and
// throws `damaged("<prefix>name: ...")` otherwise.
class Fields {
public:
    using Damaged = std::function<InputError(const std::string&)>;
    Fields(const nlohmann::json& j, std::string prefix, Damaged damaged)
        : j_(j), prefix_(std::move(prefix)), damaged_(std::move(damaged)) {
        if (!j_.is_object())
            throw damaged_((prefix_.empty() ? std::string("the conversation") : prefix_) +
                           ": expected an object, found " + j_.type_name());
    }
    const nlohmann::json& field(const char* name, bool (nlohmann::json::*is)() const noexcept, const char* want) const {
        const auto it = j_.find(name);
        if (it == j_.end()) throw damaged_(prefix_ + name + ": missing");
        if (!((*it).*is)()) throw damaged_(prefix_ + name + ": expected " + want + ", found " + it->type_name());
        return *it;
    }
    const nlohmann::json& object(const char* name) const {
        return field(name, &nlohmann::json::is_object, "an object");
    }
    const nlohmann::json& array(const char* name) const { return field(name, &nlohmann::json::is_array, "an array"); }
    std::string string(const char* name) const {
        return field(name, &nlohmann::json::is_string, "a string").get<std::string>();
    }
    bool boolean(const char* name) const {
        return field(name, &nlohmann::json::is_boolean, "true or false").get<bool>();
    }
    int64_t integer(const char* name, int64_t lo, int64_t hi) const {
        const nlohmann::json& v = field(name, &nlohmann::json::is_number_integer, "an integer");
        const bool huge = v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX);
        const int64_t n = huge ? INT64_MAX : v.get<int64_t>();
        if (n < lo || n > hi)
            throw damaged_(prefix_ + name + ": " + (huge ? v.dump() : std::to_string(n)) + " is outside " +
                           std::to_string(lo) + ".." + std::to_string(hi));
        return n;
    }

private:
    const nlohmann::json& j_;
    std::string prefix_;
    Damaged damaged_;
};

} // namespace

void save_conversation(const std::string& path, const Conversation& conversation, Session& session,
                       const nlohmann::json& settings) {
    const ConversationState s = conversation.state();
    // The cache holds a prefix of the conversation's tokens (all but the end of the last reply);
    // save the K/V of exactly that prefix.
    const std::vector<int32_t>& kv_tokens = session.kv_tokens();
    size_t n_kv = 0;
    while (n_kv < kv_tokens.size() && n_kv < s.tokens.size() && kv_tokens[n_kv] == s.tokens[n_kv]) ++n_kv;
    const KvSnapshot kv = session.backend().kv_save(static_cast<int32_t>(n_kv));

    nlohmann::json j;
    j["model"] = model_fingerprint(session, kv.kv_type);
    j["template"] = std::string(conversation.chat_template().name());
    nlohmann::json messages = nlohmann::json::array();
    for (const ConversationMessage& m : s.messages)
        messages.push_back({{"role", m.message.role}, {"content", m.message.content}, {"begin", m.begin}});
    j["messages"] = messages;
    j["tokens"] = s.tokens;
    j["kv_tokens"] = n_kv;
    j["kv_shifted"] = session.kv_shifted();
    j["prompt_text"] = s.prompt_text;
    j["stale"] = s.stale;
    j["dropped_turns"] = s.n_dropped_turns;
    j["dropped_tokens"] = s.n_dropped_tokens;
    j["settings"] = settings;
    const std::string doc = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);

    std::string out(kMagic, sizeof kMagic);
    put_u32(out, kConversationFileVersion);
    put_u32(out, 0);
    put_u64(out, doc.size());
    out += doc;
    put_u64(out, kv.bytes.size());
    out.append(reinterpret_cast<const char*>(kv.bytes.data()), kv.bytes.size());
    put_u64(out, XXH3_64bits(out.data(), out.size()));
    write_atomically(path, out);
}

SavedConversation read_conversation(const std::string& path, const Session& session) {
    auto bad = [&](const std::string& what) { return InputError(path + ": " + what); };
    // Regular files only (a FIFO must not block, a directory must not read as nothing), and no
    // larger than this session's conversation can be.
    const std::string bytes = read_input_file(path, "the conversation file", max_conversation_file_bytes(session));
    if (bytes.size() < kHeaderBytes + 16 || std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0)
        throw bad("not a tern conversation file (written by /save)");
    const uint32_t version = get_u32(bytes, 8);
    if (version != kConversationFileVersion)
        throw bad("conversation file version " + std::to_string(version) + ", this tern reads version " +
                  std::to_string(kConversationFileVersion));
    const size_t body = bytes.size() - 8;
    if (get_u64(bytes, body) != XXH3_64bits(bytes.data(), body))
        throw bad("checksum mismatch: the file is damaged or truncated");
    const uint64_t n_json = get_u64(bytes, 16);
    if (n_json > body - kHeaderBytes - 8) throw bad("damaged: the JSON part runs past the end");
    if (n_json > kMaxConversationJsonBytes)
        throw bad("damaged: the JSON part is " + describe_bytes(n_json) + ", more than the " +
                  describe_bytes(kMaxConversationJsonBytes) + " a conversation can have");
    const uint64_t n_kv = get_u64(bytes, kHeaderBytes + n_json);
    if (n_kv != body - kHeaderBytes - n_json - 8) throw bad("damaged: the KV part does not end where the file does");

    // Every field is checked for its type and range here, so that nothing downstream can meet a
    // null, a string for a number or a count that overflows: a damaged file is one line, and the
    // chat goes on.
    SavedConversation saved;
    const auto damaged = [&](const std::string& what) { return bad("the file is damaged: " + what); };
    try {
        const nlohmann::json j = parse_bounded_json(std::string_view(bytes).substr(kHeaderBytes, n_json));
        const Fields root(j, "", damaged);
        const Fields model(root.object("model"), "model.", damaged);
        saved.kv.bytes.assign(bytes.begin() + static_cast<std::ptrdiff_t>(kHeaderBytes + n_json + 8),
                              bytes.begin() + static_cast<std::ptrdiff_t>(body));
        saved.kv.kv_type = kv_type_from_name(model.string("kv_type"));
        const nlohmann::json expected = model_fingerprint(session, saved.kv.kv_type);
        if (root.object("model") != expected)
            throw ConversationMismatch(ConversationMismatch::Kind::model, path,
                                       printable(root.object("model").dump(), 400), expected.dump());
        saved.template_name = root.string("template");
        ConversationState& s = saved.state;
        const int32_t vocab = session.tokenizer().vocab_size();
        for (const nlohmann::json& t : root.array("tokens")) {
            if (!t.is_number_integer())
                throw damaged("tokens: expected token ids, found " + std::string(t.type_name()));
            const int64_t id = t.is_number_unsigned() && t.get<uint64_t>() > INT64_MAX ? INT64_MAX : t.get<int64_t>();
            if (id < 0 || id >= vocab) throw bad("token id " + std::to_string(id) + " outside the vocabulary");
            s.tokens.push_back(static_cast<int32_t>(id));
        }
        const int32_t n_tokens = static_cast<int32_t>(s.tokens.size());
        int32_t last = 0;
        for (const nlohmann::json& m : root.array("messages")) {
            if (!m.is_object()) throw damaged("messages: expected objects, found " + std::string(m.type_name()));
            const Fields fm(m, "messages[].", damaged);
            ConversationMessage cm;
            cm.message.role = fm.string("role");
            cm.message.content = fm.string("content");
            cm.begin = static_cast<int32_t>(fm.integer("begin", 0, INT32_MAX));
            if (cm.message.role != "system" && cm.message.role != "user" && cm.message.role != "assistant")
                throw bad("unknown message role '" + printable(cm.message.role) + "'");
            if (cm.begin < last || cm.begin > n_tokens) throw bad("message spans out of order");
            last = cm.begin;
            s.messages.push_back(std::move(cm));
        }
        s.prompt_text = root.string("prompt_text");
        s.stale = root.boolean("stale");
        s.n_dropped_turns = static_cast<int32_t>(root.integer("dropped_turns", 0, INT32_MAX));
        s.n_dropped_tokens = static_cast<int32_t>(root.integer("dropped_tokens", 0, INT32_MAX));
        saved.kv.n_past = static_cast<int32_t>(root.integer("kv_tokens", 0, INT32_MAX));
        saved.kv_shifted = root.boolean("kv_shifted");
        // The app's settings (sampling, -n): opaque here, but only numbers, as /save writes them.
        saved.settings = root.object("settings");
        for (const auto& [key, value] : saved.settings.items())
            if (!value.is_number())
                throw damaged("settings." + printable(key) + ": expected a number, found " +
                              std::string(value.type_name()));
        if (saved.kv.n_past > n_tokens) throw bad("the KV part holds more positions than the conversation has tokens");
        // The KV part's own count must be the JSON's: restoring either count would pair K/V with other tokens.
        if (const int32_t held = kv_snapshot_positions(saved.kv); held != saved.kv.n_past)
            throw damaged("the KV part holds " + (held < 0 ? std::string("no") : std::to_string(held)) +
                          " positions but kv_tokens says " + std::to_string(saved.kv.n_past));
        // A NaN or infinity in the K/V would make every later logit NaN: refused here, while the chat goes on.
        if (!kv_snapshot_finite(saved.kv)) throw damaged("the KV part holds NaN or infinite values");
        if (static_cast<int64_t>(s.tokens.size()) > session.n_ctx())
            throw ConversationMismatch(ConversationMismatch::Kind::context, path, std::to_string(s.tokens.size()),
                                       std::to_string(session.n_ctx()));
    } catch (const nlohmann::json::exception& e) {
        throw damaged("invalid JSON: " + printable(e.what(), 300));
    } catch (const UsageError& e) {
        throw bad(e.what());
    }
    return saved;
}

namespace {
std::string mismatch_text(ConversationMismatch::Kind kind, const std::string& path, const std::string& saved,
                          const std::string& current) {
    switch (kind) {
    case ConversationMismatch::Kind::model:
        return path + ": saved with another model or KV cache format (" + saved + "), not this one (" + current + ")";
    case ConversationMismatch::Kind::context:
        return path + ": the conversation has " + saved + " tokens but the context is " + current;
    case ConversationMismatch::Kind::chat_template:
        return "the conversation was saved with the chat template " + saved + ", not " + current;
    }
    return path;
}
} // namespace

ConversationMismatch::ConversationMismatch(Kind kind_, std::string path_, std::string saved_, std::string current_)
    : InputError(mismatch_text(kind_, path_, saved_, current_)), kind(kind_), path(std::move(path_)),
      saved(std::move(saved_)), current(std::move(current_)) {}

void apply_conversation(SavedConversation saved, Session& session, Conversation& conversation) {
    if (saved.template_name != conversation.chat_template().name())
        throw ConversationMismatch(ConversationMismatch::Kind::chat_template, "", saved.template_name,
                                   std::string(conversation.chat_template().name()));
    const std::span<const int32_t> kv_tokens(saved.state.tokens.data(), static_cast<size_t>(saved.kv.n_past));
    try {
        session.restore(saved.kv, kv_tokens, saved.kv_shifted);
    } catch (const UsageError& e) {
        throw InputError(std::string("the saved KV cache does not fit this session: ") + e.what());
    }
    conversation.restore(std::move(saved.state));
}

} // namespace tern
