#include "app/serve/prompt_maker.h"

#include "engine/generation/request_decoder.h"

namespace tern::app {

PromptMaker::PromptMaker(const Tokenizer& tokenizer, ChatTemplate tmpl, int32_t n_ctx, PromptRules rules)
    : tokenizer_(tokenizer), tmpl_(std::move(tmpl)), n_ctx_(n_ctx), rules_(std::move(rules)) {}

PreparedPrompt PromptMaker::prepare(const GenerationRequest& r) const {
    const std::string field = r.chat ? "messages" : "prompt";
    if (r.max_tokens_given && r.max_tokens > n_ctx_)
        throw_invalid("max_tokens", "max_tokens: " + std::to_string(r.max_tokens) + " is more than the context (" +
                                        std::to_string(n_ctx_) + " tokens, prompt included)",
                      "context_length_exceeded");
    PreparedPrompt p;
    ChatTemplate tmpl = tmpl_;
    if (!r.reasoning_effort.empty()) tmpl.set_reasoning_effort(r.reasoning_effort);   // checked when read
    if (r.chat || rules_.wrap_prompts) {
        const PromptText spans =
            r.chat ? tmpl.render_spans(r.messages, true) : tmpl.render_prompt_spans(rules_.system, r.prompt);
        p.text = spans.text();
        p.tokens = tokenizer_.encode_prompt(spans, true);
    } else {
        p.text = r.prompt;
        p.tokens = tokenizer_.encode(p.text, EncodeOptions{.add_bos = true, .parse_special = rules_.parse_special});
    }
    if (!start_empty_prompt(p.tokens, tokenizer_))
        throw_invalid(field, field + ": " + std::string(empty_prompt_refusal()));
    if (p.tokens.size() > static_cast<size_t>(n_ctx_))
        throw_invalid(field, field + ": the prompt has " + std::to_string(p.tokens.size()) +
                                 " tokens but the context is " + std::to_string(n_ctx_) + " tokens",
                      "context_length_exceeded");
    return p;
}

} // namespace tern::app
