#pragma once
// A request's prompt as tokens: messages through the chat template (the one `tern chat` and
// `run --chat` use), a plain prompt as it is (or as one user turn under `run --batch --chat`), BOS
// by the vocabulary's rule and control-token texts recognised, as `tern run` does. Refuses, with a
// 400 naming the field, a prompt the context cannot hold and a max_tokens beyond the context.
// Thread-safe: the tokenizer and template are only read.
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

class PromptMaker {
public:
    // `wrap_prompts`: a plain prompt becomes one user turn (with `system` before it when not empty).
    PromptMaker(const Tokenizer& tokenizer, ChatTemplate tmpl, int32_t n_ctx, bool wrap_prompts = false,
                std::string system = "");

    PreparedPrompt prepare(const GenerationRequest& request) const;
    int32_t n_ctx() const { return n_ctx_; }
    const ChatTemplate& chat_template() const { return tmpl_; }
    const Tokenizer& tokenizer() const { return tokenizer_; }

private:
    const Tokenizer& tokenizer_;
    ChatTemplate tmpl_;
    int32_t n_ctx_;
    bool wrap_prompts_;
    std::string system_;
};

} // namespace tern::app
