#pragma once
// /save and /load of `tern chat`: a conversation (messages, tokens, the app's settings) and the
// KV cache that holds it, in one file, so a loaded conversation continues exactly where it was
// without prefilling anything again.
//
// Layout, little-endian:
//   "TERNCHAT"  u32 version  u32 0  u64 n_json  json[n_json]  u64 n_kv  kv[n_kv]  u64 xxh3
// where json is the conversation and the model it was made with, kv the backend's KvSnapshot
// bytes, and xxh3 the XXH3-64 of every byte before it. Written to a unique temporary file beside
// PATH and renamed over it (formats/atomic_file.h), mode 0600, so a crash never leaves a
// half-written file under the name; a PATH that is not a regular file is refused.
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "engine/backend.h"
#include "engine/chat/conversation.h"

namespace tern {

class Session;

inline constexpr uint32_t kConversationFileVersion = 1;

// A conversation file that is sound but was made for another setup. `saved` and `current` are what
// the file says and what this session has (the model fingerprints, the token count against the
// context size, the chat template names); app/ words the message with the setting that fixes it.
struct ConversationMismatch : InputError {
    enum class Kind { model, context, chat_template };
    ConversationMismatch(Kind kind, std::string path, std::string saved, std::string current);
    Kind kind;
    std::string path, saved, current;
};

struct SavedConversation {
    ConversationState state;
    nlohmann::json settings;   // the app's (sampling, -n), opaque here
    std::string template_name;
    KvSnapshot kv;
    bool kv_shifted = false;
};

// Writes the conversation and the KV of the session's cached tokens (a prefix of its tokens).
// Throws RuntimeFailure naming the file when it cannot be written, UsageError when PATH exists and is
// not a regular file (PATH is then untouched).
void save_conversation(const std::string& path, const Conversation& conversation, Session& session,
                       const nlohmann::json& settings);

// Reads and checks a file: magic, version, checksum, that it was made with this model and KV
// type, tokens inside the vocabulary, spans in order, and that it fits this session's context.
// Throws InputError with one line naming the file and what is wrong; changes nothing.
SavedConversation read_conversation(const std::string& path, const Session& session);

// Puts a checked file into the session (its KV) and the conversation (its messages and tokens).
void apply_conversation(SavedConversation saved, Session& session, Conversation& conversation);

} // namespace tern
