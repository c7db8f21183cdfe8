#include "engine/chat/conversation.h"

#include <algorithm>
#include <utility>

#include "engine/chat/reply_channels.h"
#include "engine/generation/session.h"
#include "base/error.h"

namespace tern {

namespace {

// Stands in for the last reply while rendering the next turn: the text before it must be the last
// prompt's text (the template is incremental), the text after it is what the next turn adds. No
// whitespace, since templates trim message contents.
constexpr std::string_view kReplySentinel = "\x1e\x1ftern-reply\x1f\x1e";

bool only_whitespace(std::string_view s) {
    return std::all_of(s.begin(), s.end(), [](char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; });
}

int32_t span_end(const std::vector<ConversationMessage>& messages, size_t i, size_t n_tokens) {
    return i + 1 < messages.size() ? messages[i + 1].begin : static_cast<int32_t>(n_tokens);
}

// The first message a context shift may drop: everything before it is the kept head (the system
// prompt; with Gemma-style templates, which render it inside the first user turn, that whole turn).
size_t first_droppable(const std::vector<ConversationMessage>& messages, size_t n_tokens) {
    if (messages.empty() || messages[0].message.role != "system") return 0;
    size_t f = 1;
    if (span_end(messages, 0, n_tokens) == messages[0].begin) {   // rendered inside the next message
        f = 2;
        while (f < messages.size() && messages[f].message.role != "user") ++f;
    }
    return f;
}

// Tokens no shift can remove: the head before the first droppable message, at least the sink.
int64_t min_kept_tokens(const std::vector<ConversationMessage>& messages, size_t n_tokens) {
    const size_t f = first_droppable(messages, n_tokens);
    const int64_t head = f < messages.size() ? messages[f].begin : static_cast<int64_t>(n_tokens);
    return std::min<int64_t>(static_cast<int64_t>(n_tokens), std::max<int64_t>(head, Conversation::kSinkTokens));
}

} // namespace

Conversation::Conversation(Session& session, ChatTemplate tmpl, std::string system)
    : session_(session), tmpl_(std::move(tmpl)) {
    set_system(std::move(system));
}

std::vector<int32_t> Conversation::encode(const PromptText& text, bool at_start) const {
    if (text.empty()) return {};
    // The template's control tokens; the messages' text as text. The vocabulary's BOS rule applies to the first
    // piece only.
    return session_.tokenizer().encode_prompt(text, at_start);
}

std::vector<ChatMessage> Conversation::plain_messages() const {
    std::vector<ChatMessage> out;
    out.reserve(messages_.size());
    for (const ConversationMessage& m : messages_) out.push_back(m.message);
    return out;
}

bool Conversation::split(const std::vector<ChatMessage>& msgs, size_t first, const std::string& known,
                         std::vector<Piece>& pieces) const {
    const PromptText full = tmpl_.render_spans(msgs, true);
    if (full.text().compare(0, known.size(), known) != 0) return false;
    size_t pos = known.size();
    for (size_t i = first; i < msgs.size(); ++i) {
        const std::vector<ChatMessage> upto(msgs.begin(), msgs.begin() + static_cast<std::ptrdiff_t>(i + 1));
        const std::string t = tmpl_.render(upto, false);
        size_t end = pos;
        // Where the rendering of the messages so far is not a prefix of the whole (a system prompt
        // folded into the next turn), this message's text goes with the next one.
        if (t.size() >= pos && full.text().compare(0, t.size(), t) == 0) end = t.size();
        pieces.push_back({full.slice(pos, end), i});
        pos = end;
    }
    pieces.push_back({full.slice(pos, full.size()), msgs.size()});
    return true;
}

void Conversation::notice_once(bool& said, ConversationNotice notice) {
    if (said) return;
    said = true;
    if (notice_) notice_(notice);
}

NoRoomForReplyError::NoRoomForReplyError(int64_t turn_tokens_, int64_t kept_, int32_t n_ctx_)
    : UsageError("the message takes " + std::to_string(turn_tokens_) + " tokens and the conversation keeps " +
                 std::to_string(kept_) + " (system prompt, first tokens), which leaves no room in the " +
                 std::to_string(n_ctx_) + "-token context for a reply (shorten it or use a larger context)"),
      turn_tokens(turn_tokens_), kept(kept_), n_ctx(n_ctx_) {}

std::vector<int32_t> Conversation::begin_turn(std::string_view user_text, int32_t reply_reserve) {
    if (turn_open_) end_turn(GenerateResult{});   // the last reply never came (an error): keep it empty
    const ChatMessage user{"user", std::string(user_text)};
    std::vector<ChatMessage> msgs = plain_messages();
    std::vector<Piece> pieces;
    bool incremental = false;
    if (!stale_ && tokens_.empty()) {
        msgs.push_back(user);
        incremental = split(msgs, 0, "", pieces);
    } else if (!stale_ && !messages_.empty() && messages_.back().message.role == "assistant") {
        std::vector<ChatMessage> with_sentinel = msgs;
        with_sentinel.back().content = std::string(kReplySentinel);
        with_sentinel.push_back(user);
        const std::string full = tmpl_.render(with_sentinel, true);
        const size_t at = full.find(kReplySentinel, std::min(prompt_text_.size(), full.size()));
        // The template is incremental when the text before the reply is the last prompt, give or
        // take the whitespace some formats put before a reply (Llama 2's "[/INST] answer") or the
        // channel header of a harmony answer (which end_turn put into the reply's tokens).
        const std::string_view gap =
            at == std::string::npos || at < prompt_text_.size()
                ? std::string_view()
                : std::string_view(full).substr(prompt_text_.size(), at - prompt_text_.size());
        if (at != std::string::npos && full.compare(0, prompt_text_.size(), prompt_text_) == 0 &&
            (only_whitespace(gap) || (tmpl_.reply_has_channels() && gap == tmpl_.reply_prefix()))) {
            incremental = split(with_sentinel, msgs.size() - 1, full.substr(0, at + kReplySentinel.size()), pieces);
            msgs = std::move(with_sentinel);
            msgs[msgs.size() - 2].content = messages_.back().message.content;
        }
        if (!incremental)
            notice_once(said_rerender_, {ConversationNotice::Kind::template_rerenders,
                                         "the chat template (" + std::string(tmpl_.name()) +
                                             ") renders earlier turns differently once a new one follows, so each "
                                             "turn re-tokenizes the conversation and prefills it from the first "
                                             "changed token"});
    }

    // The new turn's tokens, encoded piece by piece so every message's span is known.
    std::vector<ConversationMessage> new_messages;
    std::vector<int32_t> new_tokens;
    if (incremental) {
        new_messages = messages_;
        new_tokens = tokens_;
    } else {
        // Re-tokenize the whole conversation from its rendering (first turn after /system, a
        // non-incremental template, or a conversation emptied by drops).
        msgs = plain_messages();
        msgs.push_back(user);
        pieces.clear();
        split(msgs, 0, "", pieces);
    }
    for (const Piece& p : pieces) {
        if (p.owner >= new_messages.size()) {
            const ChatMessage m = p.owner < msgs.size() ? msgs[p.owner] : ChatMessage{"assistant", ""};
            new_messages.push_back({m, static_cast<int32_t>(new_tokens.size())});
        }
        const std::vector<int32_t> ids = encode(p.text, new_tokens.empty());
        new_tokens.insert(new_tokens.end(), ids.begin(), ids.end());
    }
    if (new_messages.size() < 2) throw std::logic_error("Conversation: the turn rendered no user message");
    const size_t user_index = new_messages.size() - 2;

    // Refuse a message that cannot fit even with every droppable turn gone.
    const int64_t turn_tokens = static_cast<int64_t>(new_tokens.size()) - new_messages[user_index].begin;
    const int64_t kept = min_kept_tokens(new_messages, new_messages[user_index].begin);
    if (kept + turn_tokens >= session_.n_ctx())
        throw NoRoomForReplyError(turn_tokens, kept, session_.n_ctx());

    messages_ = std::move(new_messages);
    tokens_ = std::move(new_tokens);
    stale_ = false;
    turn_open_ = true;
    make_room(std::max<int64_t>(reply_reserve, 1));

    // The prompt's text for the next turn's check, from the messages as they are now (after drops).
    std::vector<ChatMessage> prompt_msgs = plain_messages();
    prompt_msgs.pop_back();   // the reply to come
    prompt_text_ = tmpl_.render(prompt_msgs, true);
    return tokens_;
}

void Conversation::end_turn(const GenerateResult& reply) {
    if (!turn_open_) return;
    if (tmpl_.reply_has_channels()) {
        // Harmony: the history keeps the answer only, as the template renders it (a later turn never sees
        // the reasoning), so the reply's tokens become that rendering; the next prefill replaces the
        // cache's copy of the reasoning from where the two part.
        std::string answer = split_reply_channels(reply.text).answer;
        const std::vector<int32_t> ids =
            encode(PromptText().markup(tmpl_.reply_prefix()).content(answer), tokens_.empty());
        tokens_.insert(tokens_.end(), ids.begin(), ids.end());
        messages_.back().message.content = std::move(answer);
    } else {
        tokens_.insert(tokens_.end(), reply.tokens.begin(), reply.tokens.end());
        messages_.back().message.content = reply.text;
    }
    turn_open_ = false;
}

namespace {

int32_t saturating_add(int32_t a, int32_t b) {
    int32_t sum = 0;
    return __builtin_add_overflow(a, b, &sum) ? (b > 0 ? INT32_MAX : INT32_MIN) : sum;
}

} // namespace

int32_t Conversation::make_room(int64_t extra) {
    const int64_t n_ctx = session_.n_ctx();
    const int64_t need = static_cast<int64_t>(tokens_.size()) + extra - n_ctx;
    if (need <= 0) return 0;
    // The turn in progress (its user message and reply) is never dropped.
    const size_t protect_from = turn_open_ && messages_.size() >= 2 ? messages_.size() - 2 : messages_.size();
    const size_t f = first_droppable(messages_, tokens_.size());
    if (f >= protect_from) return 0;
    const int32_t begin = std::max<int32_t>(messages_[f].begin, kSinkTokens);
    int32_t end = begin;
    size_t next = f;
    int32_t turns = 0;
    while (next < protect_from && (end - begin < need || end <= begin)) {
        size_t j = next + 1;
        while (j < protect_from && messages_[j].message.role != "user") ++j;
        end = std::max(end, span_end(messages_, j - 1, tokens_.size()));
        next = j;
        ++turns;
    }
    if (end <= begin) return 0;

    notice_once(said_dropping_, {ConversationNotice::Kind::dropping_turns,
                                 "the conversation reached the " + std::to_string(n_ctx) +
                                     "-token context: dropping its oldest turns to continue (the system prompt and "
                                     "the first tokens are kept)",
                                 static_cast<int32_t>(n_ctx)});

    // The KV cache: shift it when it holds the dropped range exactly; otherwise the next
    // generate() finds where it stops matching and prefills from there.
    const std::vector<int32_t>& kv = session_.kv_tokens();
    size_t common = 0;
    while (common < kv.size() && common < tokens_.size() && kv[common] == tokens_[common]) ++common;
    if (common >= static_cast<size_t>(end)) {
        try {
            session_.erase(begin, end);
        } catch (const RuntimeFailure&) {
            notice_once(said_no_shift_, {ConversationNotice::Kind::no_kv_shift,
                                         "this device cannot shift the KV cache, so after dropping turns the kept "
                                         "conversation is prefilled again"});
            session_.reset();
        }
    }

    tokens_.erase(tokens_.begin() + begin, tokens_.begin() + end);
    messages_.erase(messages_.begin() + static_cast<std::ptrdiff_t>(f),
                    messages_.begin() + static_cast<std::ptrdiff_t>(next));
    for (size_t i = f; i < messages_.size(); ++i) messages_[i].begin -= end - begin;
    // Counts for /stats, saturating: a loaded file may start them anywhere in 0..INT32_MAX.
    n_dropped_turns_ = saturating_add(n_dropped_turns_, turns);
    n_dropped_tokens_ = saturating_add(n_dropped_tokens_, end - begin);
    return end - begin;
}

int32_t Conversation::make_room_for_reply(int32_t room) {
    const int64_t generated = static_cast<int64_t>(session_.kv_tokens().size()) - static_cast<int64_t>(tokens_.size());
    return make_room(std::max<int64_t>(generated, 0) + std::max(room, 1));
}

void Conversation::clear() {
    messages_.clear();
    if (!system_.empty()) messages_.push_back({{"system", system_}, 0});
    tokens_.clear();
    prompt_text_.clear();
    stale_ = false;
    turn_open_ = false;
    n_dropped_turns_ = 0;
    n_dropped_tokens_ = 0;
    // The KV cache stays: the next turn's prompt shares the system prompt with it.
}

void Conversation::set_system(std::string text) {
    system_ = std::move(text);
    if (!messages_.empty() && messages_.front().message.role == "system") messages_.erase(messages_.begin());
    if (!system_.empty()) messages_.insert(messages_.begin(), {{"system", system_}, 0});
    // A conversation with turns is re-rendered with its next turn.
    if (!tokens_.empty()) stale_ = true;
}

ConversationState Conversation::state() const {
    ConversationState s;
    s.messages = messages_;
    s.tokens = tokens_;
    s.prompt_text = prompt_text_;
    s.stale = stale_;
    s.n_dropped_turns = n_dropped_turns_;
    s.n_dropped_tokens = n_dropped_tokens_;
    return s;
}

void Conversation::restore(ConversationState s) {
    messages_ = std::move(s.messages);
    tokens_ = std::move(s.tokens);
    prompt_text_ = std::move(s.prompt_text);
    stale_ = s.stale;
    n_dropped_turns_ = s.n_dropped_turns;
    n_dropped_tokens_ = s.n_dropped_tokens;
    turn_open_ = false;
    system_.clear();
    if (!messages_.empty() && messages_.front().message.role == "system") system_ = messages_.front().message.content;
}

} // namespace tern
