#pragma once
// Conversation: the messages of a chat (system, user, assistant) and the exact tokens they became,
// turn after turn, for `tern chat`. Each turn's prompt is the whole conversation's tokens, so
// Session::generate's prefix reuse prefills only what is new: the earlier turns are kept token for
// token as the KV cache holds them (a reply stays the tokens the model generated, never a
// re-tokenization of its text, which can differ), and only the new turn's text is tokenized.
//
// Messages are text: the template's markers are control tokens, and what the user and system prompt say is
// tokenized as plain text whatever it holds (ChatTemplate::render_spans, Tokenizer::encode_prompt).
//
// The template renders whole conversations; a turn's new text is what the rendering of the longer
// conversation adds after the shorter one's. That holds for every family in chat_template.h except
// where a template moves text between turns (mistral-v3 puts the system prompt into the LAST user
// message): begin_turn sees it (the earlier turns' text changed) and re-tokenizes the whole
// conversation instead, reporting it once through the notice callback.
//
// Long conversations: when the next turn and a reserve for the reply would not fit the context,
// the oldest whole turns are dropped (Session::erase shifts the cache; a backend that cannot shift
// gets reset() and a prefill of the kept tokens). The system prompt and the first tokens (the
// attention sink) are always kept.
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/chat/chat_template.h"
#include "base/error.h"
#include "engine/generation/generate_options.h"

namespace tern {

class Session;

// One message and where its tokens start in Conversation::tokens(); it ends where the next one
// starts (or at the end). A message rendered inside the next one (the system prompt of Gemma,
// which goes into the first user turn) has an empty span.
struct ConversationMessage {
    ChatMessage message;
    int32_t begin = 0;
};

// Everything /save needs besides the KV cache, and what /load gives back.
struct ConversationState {
    std::vector<ConversationMessage> messages;
    std::vector<int32_t> tokens;
    std::string prompt_text;   // the text of the last turn's prompt (the template check)
    bool stale = false;        // the system prompt changed: the next turn re-renders everything
    int32_t n_dropped_turns = 0;
    int32_t n_dropped_tokens = 0;
};

// One line for the user (the caller prints it; nothing in engine/ does). `text` is the engine's own
// wording; the kinds that a flag changes carry their numbers so the caller can name the flag.
struct ConversationNotice {
    enum class Kind { template_rerenders, dropping_turns, no_kv_shift };
    Kind kind = Kind::template_rerenders;
    std::string text;
    int32_t n_ctx = 0;   // dropping_turns: the context that filled up
};
using NoticeCallback = std::function<void(const ConversationNotice&)>;

// A message that leaves no room for a reply: turn_tokens of its own plus the kept tokens (system
// prompt, first tokens) fill the n_ctx-token context.
struct NoRoomForReplyError : UsageError {
    NoRoomForReplyError(int64_t turn_tokens, int64_t kept, int32_t n_ctx);
    int64_t turn_tokens, kept;
    int32_t n_ctx;
};

class Conversation {
public:
    // The attention sink: the first positions every later token attends to heavily. Dropping them
    // degrades the model's output far more than their count suggests, so they always stay.
    static constexpr int32_t kSinkTokens = 4;

    Conversation(Session& session, ChatTemplate tmpl, std::string system = {});

    void set_notice_callback(NoticeCallback cb) { notice_ = std::move(cb); }

    // Adds a user message and returns the prompt of its reply: the tokens of the whole
    // conversation, ending with the assistant's header. Drops the oldest turns first when the
    // prompt plus `reply_reserve` tokens would not fit the context. Throws UsageError, leaving the
    // conversation as it was (bar dropped turns), when the message cannot fit at all.
    std::vector<int32_t> begin_turn(std::string_view user_text, int32_t reply_reserve);
    // Records the reply of the turn begun last: its generated tokens and streamed text.
    void end_turn(const GenerateResult& reply);

    // Drops the oldest whole turns (never the system prompt, the first kSinkTokens tokens nor the
    // turn in progress) until `extra` more tokens fit the context; returns the tokens dropped
    // (fewer than needed when nothing more can go). Keeps the session's KV consistent with
    // tokens().
    int32_t make_room(int64_t extra);
    // GenerateOptions::on_context_full for the reply in progress: its tokens so far are in the
    // session's cache but not yet in tokens(); drops the oldest turns so `room` more positions fit
    // behind them. Returns the tokens dropped (0: only the system prompt and this turn are left,
    // and the reply stops with StopReason::context).
    int32_t make_room_for_reply(int32_t room);

    // A new conversation with the same system prompt.
    void clear();
    // Replaces the system prompt ("" removes it) and re-renders the conversation; the session
    // prefills again from the first token that changed.
    void set_system(std::string text);
    const std::string& system() const { return system_; }

    const ChatTemplate& chat_template() const { return tmpl_; }
    const std::vector<ConversationMessage>& messages() const { return messages_; }
    // The conversation's tokens. The session's KV holds a prefix of them (all but the last
    // reply's final token and end-of-turn text, which the next turn's prefill runs).
    const std::vector<int32_t>& tokens() const { return tokens_; }
    int32_t n_dropped_turns() const { return n_dropped_turns_; }
    int32_t n_dropped_tokens() const { return n_dropped_tokens_; }

    ConversationState state() const;
    // Takes a saved state (checked by the caller against this model: conversation_file.h). The
    // session's KV must already hold a prefix of state.tokens or be empty.
    void restore(ConversationState state);

private:
    struct Piece {
        PromptText text; // markup and message content, as the template rendered them
        size_t owner;   // index into the message list the pieces were split for
    };
    // Splits render(msgs, true) after `known` (text already in tokens_) into one piece per message
    // from `first` on plus the generation header (owner msgs.size()). False when the rendering does
    // not start with `known`.
    bool split(const std::vector<ChatMessage>& msgs, size_t first, const std::string& known,
               std::vector<Piece>& pieces) const;
    std::vector<int32_t> encode(const PromptText& text, bool at_start) const;
    std::vector<ChatMessage> plain_messages() const;
    void notice_once(bool& said, ConversationNotice notice);

    Session& session_;
    ChatTemplate tmpl_;
    std::string system_;
    std::vector<ConversationMessage> messages_;
    std::vector<int32_t> tokens_;
    std::string prompt_text_;
    bool stale_ = false;
    bool turn_open_ = false;   // begin_turn without end_turn yet
    int32_t n_dropped_turns_ = 0;
    int32_t n_dropped_tokens_ = 0;
    NoticeCallback notice_;
    bool said_dropping_ = false;
    bool said_no_shift_ = false;
    bool said_rerender_ = false;
};

} // namespace tern
