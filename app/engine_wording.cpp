#include "app/engine_wording.h"

#include "base/terminal_text.h"

namespace tern::app {

std::string chat_template_warning(const ChatTemplateDetection& d) {
    using Fallback = ChatTemplateDetection::Fallback;
    switch (d.fallback) {
    case Fallback::none: return {};
    case Fallback::no_template:
        return "the model has no chat template (tokenizer.chat_template); using chatml (choose another with "
               "--chat-template NAME)";
    case Fallback::unrecognised_template:
        return "the model's chat template is not one tern recognises (" + std::to_string(d.template_chars) +
               " chars); using chatml (choose another with --chat-template NAME)";
    case Fallback::unrecognised_override: {
        std::string known;
        for (const std::string& n : ChatTemplate::names())
            known += (known.empty() ? "" : ", ") + n;
        return "--chat-template '" + d.override_text +
               "' is neither a template name nor a template tern recognises; using chatml (names: " + known + ")";
    }
    }
    return {};
}

std::string conversation_mismatch_message(const ConversationMismatch& m) {
    using Kind = ConversationMismatch::Kind;
    std::string line;
    switch (m.kind) {
    case Kind::model:
        line = m.path + ": saved with another model or --kv-type (" + m.saved + "), not this one (" + m.current + ")";
        break;
    case Kind::context:
        line = m.path + ": the conversation has " + m.saved + " tokens but the context is " + m.current + " (raise -c)";
        break;
    case Kind::chat_template:
        line = "the conversation was saved with the chat template " + m.saved + ", not " + m.current +
               " (start tern chat with --chat-template " + m.saved + ")";
        break;
    }
    return terminal_safe(line);   // it quotes file content, as every error message may
}

} // namespace tern::app
