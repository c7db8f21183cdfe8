// fuzz entry "chat_template": the input as a model's tokenizer.chat_template (detection, and as a
// --chat-template override), then a conversation built from the input rendered in every family.
// Conversation layout: byte 0 holds the flags (bit 0: add the generation prompt); the rest is
// split at NUL bytes into messages whose first byte picks the role (system, user, assistant, or
// an odd role spelled by the message itself).
#include <string>
#include <string_view>
#include <vector>

#include "engine/chat/chat_template.h"
#include "base/error.h"
#include "tests/fuzz/fuzz_entries.h"

namespace tern::fuzz {
namespace {

std::vector<ChatMessage> messages_from(std::string_view body) {
    std::vector<ChatMessage> out;
    size_t pos = 0;
    while (pos <= body.size()) {
        size_t end = body.find('\0', pos);
        if (end == std::string_view::npos) end = body.size();
        std::string_view m = body.substr(pos, end - pos);
        pos = end + 1;
        if (m.empty()) continue;
        static const char* roles[] = {"system", "user", "assistant"};
        const unsigned pick = static_cast<unsigned char>(m[0]) % 4;
        m.remove_prefix(1);
        if (pick < 3) out.push_back({roles[pick], std::string(m)});
        else out.push_back({std::string(m.substr(0, 8)), std::string(m)});
    }
    return out;
}

} // namespace

void chat_template(Input input) {
    const std::string_view text(reinterpret_cast<const char*>(input.data()), input.size());
    try {
        (void)ChatTemplate::detect(text).tmpl.render({{"user", "hi"}});
        (void)ChatTemplate::resolve(text, text);
        (void)ChatTemplate::resolve("", text);
        (void)ChatTemplate::from_name(text);
    } catch (const TernError&) {
    }
    if (text.empty()) return;
    const bool add_generation_prompt = (input[0] & 1) != 0;
    const std::vector<ChatMessage> messages = messages_from(text.substr(1));
    const std::string_view half = text.substr(1, text.size() / 2);
    const std::string_view rest = text.substr(1 + half.size());
    for (const std::string& name : ChatTemplate::names()) {
        try {
            const ChatTemplate t = *ChatTemplate::from_name(name);
            (void)t.render(messages, add_generation_prompt);
            (void)t.render_prompt(half, rest);
            (void)t.render_prompt("", rest);
        } catch (const TernError&) {
        }
    }
}

} // namespace tern::fuzz
