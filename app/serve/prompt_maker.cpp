#include "app/serve/prompt_maker.h"

namespace tern::app {

PromptMaker::PromptMaker(const Tokenizer& tokenizer, ChatTemplate tmpl, int32_t n_ctx, bool wrap_prompts,
                         std::string system)
    : tokenizer_(tokenizer), tmpl_(std::move(tmpl)), n_ctx_(n_ctx), wrap_prompts_(wrap_prompts),
      system_(std::move(system)) {}

PreparedPrompt PromptMaker::prepare(const GenerationRequest& r) const {
    const std::string field = r.chat ? "messages" : "prompt";
    if (r.max_tokens_given && r.max_tokens > n_ctx_)
        throw_invalid("max_tokens", "max_tokens: " + std::to_string(r.max_tokens) + " is more than the context (" +
                                        std::to_string(n_ctx_) + " tokens, prompt included)",
                      "context_length_exceeded");
    PreparedPrompt p;
    ChatTemplate tmpl = tmpl_;
    if (!r.reasoning_effort.empty()) tmpl.set_reasoning_effort(r.reasoning_effort);   // checked when read
    if (r.chat)
        p.text = tmpl.render(r.messages, true);
    else if (wrap_prompts_)
        p.text = tmpl.render_prompt(system_, r.prompt);
    else
        p.text = r.prompt;
    EncodeOptions enc;
    enc.add_bos = true;
    enc.parse_special = true;   // the template's control tokens; as `tern run` reads a prompt
    p.tokens = tokenizer_.encode(p.text, enc);
    if (p.tokens.empty()) {
        const int32_t bos = tokenizer_.bos();
        if (bos < 0) throw_invalid(field, field + ": the prompt is empty and the model has no BOS token to start from");
        p.tokens.push_back(bos);
    }
    if (p.tokens.size() > static_cast<size_t>(n_ctx_))
        throw_invalid(field, field + ": the prompt has " + std::to_string(p.tokens.size()) +
                                 " tokens but the context is " + std::to_string(n_ctx_) + " tokens",
                      "context_length_exceeded");
    return p;
}

} // namespace tern::app
