#include "engine/conversation_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

#include "engine/model.h"
#include "engine/session.h"
#include "formats/error.h"

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

void write_atomically(const std::string& path, const std::string& bytes) {
    const std::string tmp = path + ".tmp";
    auto fail = [&](const std::string& what) {
        const int err = errno;
        ::unlink(tmp.c_str());
        throw RuntimeFailure(path + ": cannot save the conversation: " + what + ": " + std::strerror(err) +
                             " (check the directory and free space)");
    };
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        const int err = errno;
        throw RuntimeFailure(path + ": cannot save the conversation: cannot create " + tmp + ": " +
                             std::strerror(err) + " (check the directory and its permissions)");
    }
    size_t done = 0;
    while (done < bytes.size()) {
        const ssize_t w = ::write(fd, bytes.data() + done, bytes.size() - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            ::close(fd);
            fail("write failed");
        }
        done += static_cast<size_t>(w);
    }
    if (::fsync(fd) != 0) {
        ::close(fd);
        fail("fsync failed");
    }
    if (::close(fd) != 0) fail("close failed");
    if (::rename(tmp.c_str(), path.c_str()) != 0) fail("rename failed");
}

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
    std::ifstream in(path, std::ios::binary);
    if (!in) throw bad(std::string("cannot open the conversation file: ") + std::strerror(errno));
    const std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    if (in.bad()) throw bad("read error");
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
    const uint64_t n_kv = get_u64(bytes, kHeaderBytes + n_json);
    if (n_kv != body - kHeaderBytes - n_json - 8) throw bad("damaged: the KV part does not end where the file does");

    SavedConversation saved;
    try {
        const nlohmann::json j = nlohmann::json::parse(bytes.substr(kHeaderBytes, n_json));
        saved.kv.bytes.assign(bytes.begin() + static_cast<std::ptrdiff_t>(kHeaderBytes + n_json + 8),
                              bytes.begin() + static_cast<std::ptrdiff_t>(body));
        const std::string kv_type = j.at("model").at("kv_type").get<std::string>();
        saved.kv.kv_type = kv_type_from_name(kv_type);
        const nlohmann::json expected = model_fingerprint(session, saved.kv.kv_type);
        if (j.at("model") != expected)
            throw bad("saved with another model or --kv-type (" + j.at("model").dump() + "), not this one (" +
                      expected.dump() + ")");
        saved.template_name = j.at("template").get<std::string>();
        ConversationState& s = saved.state;
        s.tokens = j.at("tokens").get<std::vector<int32_t>>();
        const int32_t vocab = session.tokenizer().vocab_size();
        for (int32_t t : s.tokens)
            if (t < 0 || t >= vocab) throw bad("token id " + std::to_string(t) + " outside the vocabulary");
        int32_t last = 0;
        for (const nlohmann::json& m : j.at("messages")) {
            ConversationMessage cm;
            cm.message.role = m.at("role").get<std::string>();
            cm.message.content = m.at("content").get<std::string>();
            cm.begin = m.at("begin").get<int32_t>();
            if (cm.message.role != "system" && cm.message.role != "user" && cm.message.role != "assistant")
                throw bad("unknown message role '" + cm.message.role + "'");
            if (cm.begin < last || cm.begin > static_cast<int32_t>(s.tokens.size()))
                throw bad("message spans out of order");
            last = cm.begin;
            s.messages.push_back(std::move(cm));
        }
        s.prompt_text = j.at("prompt_text").get<std::string>();
        s.stale = j.at("stale").get<bool>();
        s.n_dropped_turns = j.at("dropped_turns").get<int32_t>();
        s.n_dropped_tokens = j.at("dropped_tokens").get<int32_t>();
        saved.kv.n_past = j.at("kv_tokens").get<int32_t>();
        saved.kv_shifted = j.at("kv_shifted").get<bool>();
        saved.settings = j.at("settings");
        if (saved.kv.n_past < 0 || saved.kv.n_past > static_cast<int32_t>(s.tokens.size()))
            throw bad("the KV part holds more positions than the conversation has tokens");
        if (static_cast<int64_t>(s.tokens.size()) > session.n_ctx())
            throw bad("the conversation has " + std::to_string(s.tokens.size()) + " tokens but the context is " +
                      std::to_string(session.n_ctx()) + " (raise -c)");
    } catch (const nlohmann::json::exception& e) {
        throw bad(std::string("damaged conversation data: ") + e.what());
    } catch (const UsageError& e) {
        throw bad(e.what());
    }
    return saved;
}

void apply_conversation(SavedConversation saved, Session& session, Conversation& conversation) {
    if (saved.template_name != conversation.chat_template().name())
        throw InputError("the conversation was saved with the chat template " + saved.template_name + ", not " +
                         std::string(conversation.chat_template().name()) + " (start tern chat with --chat-template " +
                         saved.template_name + ")");
    const std::span<const int32_t> kv_tokens(saved.state.tokens.data(), static_cast<size_t>(saved.kv.n_past));
    try {
        session.restore(saved.kv, kv_tokens, saved.kv_shifted);
    } catch (const UsageError& e) {
        throw InputError(std::string("the saved KV cache does not fit this session: ") + e.what());
    }
    conversation.restore(std::move(saved.state));
}

} // namespace tern
