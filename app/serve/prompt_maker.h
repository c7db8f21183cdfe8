#pragma once
// A request's prompt as tokens: messages through the chat template (the one `tern chat` and
// `run --chat` use), a plain prompt as it is (or as one user turn under `run --batch --chat`), BOS
// by the vocabulary's rule. In a chat prompt only the template's markers are control tokens: what the
// messages say is text, whatever it holds (engine/text/prompt_text.h). A plain prompt's control-token
// texts are those tokens, as `tern run -p` reads them, unless PromptRules::parse_special is off
// (--no-parse-special). Refuses, with a 400 naming the field, a prompt the context cannot hold and a
// max_tokens beyond the context. Thread-safe: the tokenizer and template are only read.
#include <cstdint>
#include <string>
#include <vector>

#include "app/serve/request_fields.h"
#include "engine/chat/chat_template.h"
#include "engine/text/tokenizer.h"

namespace tern::app {

struct PreparedPrompt {
    std::string text;              // what was tokenized (the template's rendering for chat)
    std::vector<int32_t> tokens;
};

struct PromptRules {
    bool wrap_prompts = false; // a plain prompt becomes one user turn (`run --batch --chat`) ...
    std::string system;        // ... with this system turn before it when not empty
    bool parse_special = true; // a plain (unwrapped) prompt's control-token texts are those tokens
};

class PromptMaker {
public:
    PromptMaker(const Tokenizer& tokenizer, ChatTemplate tmpl, int32_t n_ctx, PromptRules rules = {});

    PreparedPrompt prepare(const GenerationRequest& request) const;
    int32_t n_ctx() const { return n_ctx_; }
    const ChatTemplate& chat_template() const { return tmpl_; }
    const Tokenizer& tokenizer() const { return tokenizer_; }

private:
    const Tokenizer& tokenizer_;
    ChatTemplate tmpl_;
    int32_t n_ctx_;
    PromptRules rules_;
};

} // namespace tern::app
