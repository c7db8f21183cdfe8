#pragma once
// Chat formats: which family a model's tokenizer.chat_template (a Jinja program) belongs to,
// recognised by the markers each family uses, and rendering a conversation in that family's
// documented format. We do not run Jinja: every family here is written out by hand from its
// documentation, and the tests hold the documented strings.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/text/prompt_text.h"

namespace tern {

struct ChatTemplateDetection;

struct ChatMessage {
    std::string role; // "system", "user" or "assistant"
    std::string content;
};

class ChatTemplate {
public:
    enum class Family {
        chatml,
        qwen,
        llama2,
        llama3,
        mistral_v1,
        mistral_v3,
        mistral_v3_tekken,
        mistral_v7,
        mistral_v7_tekken,
        gemma,
        phi3,
        phi4,
        zephyr,
        deepseek,
        deepseek3,
        command_r,
        gpt_oss,   // OpenAI's harmony format
        glm4,      // GLM-4.5 / 4.6 / 4.7: [gMASK]<sop><|role|>\n..., earlier replies behind an empty <think></think>
        gemma4,    // Gemma 4's <|turn>role ... <turn|> turns, its thinking channel left empty
    };

    // Every name from_name accepts, in a stable order (for --help and error messages).
    static const std::vector<std::string>& names();
    // A family by name ("chatml", "llama3", "mistral-v7", ...); nullopt when unknown.
    static std::optional<ChatTemplate> from_name(std::string_view name);
    // Whether --chat-template's value means a format: one of names(), or template text detect()
    // recognises. Anything else is a typo to refuse, not a reason to fall back to chatml.
    static bool recognises(std::string_view name_or_template);

    using Detection = ChatTemplateDetection;
    // The family of a tokenizer.chat_template text. An empty or unrecognised template gives
    // chatml and says why in `fallback` (app/ words the warning; nothing below app/ prints).
    static Detection detect(std::string_view jinja);
    // What `--chat-template NAME` plus the model's template resolve to: the override when given
    // (a family name, or else template text to detect, as llama.cpp accepts both), else the model's.
    static Detection resolve(std::string_view override_name, std::string_view model_template);

    Family family() const { return family_; }
    std::string_view name() const;
    // System prompt used when the conversation has none (Qwen 2/2.5 templates carry one).
    const std::string& default_system() const { return default_system_; }

    // The conversation in the family's format, ending with the assistant's header when
    // add_generation_prompt: the format's own text is markup, every message's content is content
    // (engine/text/prompt_text.h), so Tokenizer::encode_prompt reads a "<end_of_turn>" typed in a
    // message as text and only the format's markers as control tokens. The leading BOS is NOT
    // included: encode with add_bos so the vocabulary's BOS rule applies. Later BOS/EOS tokens that
    // the format puts between turns (Llama 2's "</s><s>") are markup.
    PromptText render_spans(const std::vector<ChatMessage>& messages, bool add_generation_prompt = true) const;
    // Convenience: an optional system turn and one user turn, with the generation prompt.
    PromptText render_prompt_spans(std::string_view system, std::string_view user) const;

    // The same renderings as plain text, for showing and comparing (to tokenize, use the spans: this text
    // encoded with parse_special would read control-token texts inside messages as control tokens).
    std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt = true) const;
    std::string render_prompt(std::string_view system, std::string_view user) const;

    // The format's replies name their channels in control tokens (harmony): generate them with
    // GenerateOptions::special_text and split them with engine/chat/reply_channels.h.
    bool reply_has_channels() const { return family_ == Family::gpt_oss; }
    // How hard a reasoning model is told to think: "low", "medium" (the default) or "high", the words of
    // harmony's system message (gpt-oss; other formats have no such setting and ignore it). Throws
    // std::invalid_argument for any other word.
    static bool is_reasoning_effort(std::string_view effort);
    void set_reasoning_effort(std::string_view effort);
    const std::string& reasoning_effort() const { return reasoning_effort_; }
    // The text that render() puts between the generation prompt and an earlier reply's answer
    // ("<|channel|>final<|message|>" in harmony; empty elsewhere): what a kept reply is re-encoded with.
    std::string_view reply_prefix() const;

private:
    explicit ChatTemplate(Family f) : family_(f) {}
    Family family_ = Family::chatml;
    std::string default_system_;
    std::string reasoning_effort_ = "medium";
};

struct ChatTemplateDetection {
    // Why chatml was chosen when the template was not recognised.
    enum class Fallback {
        none,                    // recognised
        no_template,             // the model has no tokenizer.chat_template
        unrecognised_template,   // the model's template matches no family
        unrecognised_override,   // the override is neither a family name nor a recognised template
    };
    ChatTemplate tmpl;
    Fallback fallback = Fallback::none;
    size_t template_chars = 0;     // unrecognised_template: the template's length
    std::string override_text;     // unrecognised_override: the override as given (at most 40 bytes)
    bool recognised() const { return fallback == Fallback::none; }
};

} // namespace tern
