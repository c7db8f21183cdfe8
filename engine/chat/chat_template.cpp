#include "engine/chat/chat_template.h"

#include <array>
#include <ctime>
#include <stdexcept>

namespace tern {

namespace {

struct FamilyName {
    ChatTemplate::Family family;
    const char* name;
};

constexpr std::array<FamilyName, 19> kFamilies = {{
    {ChatTemplate::Family::chatml, "chatml"},
    {ChatTemplate::Family::qwen, "qwen"},
    {ChatTemplate::Family::llama2, "llama2"},
    {ChatTemplate::Family::llama3, "llama3"},
    {ChatTemplate::Family::mistral_v1, "mistral-v1"},
    {ChatTemplate::Family::mistral_v3, "mistral-v3"},
    {ChatTemplate::Family::mistral_v3_tekken, "mistral-v3-tekken"},
    {ChatTemplate::Family::mistral_v7, "mistral-v7"},
    {ChatTemplate::Family::mistral_v7_tekken, "mistral-v7-tekken"},
    {ChatTemplate::Family::gemma, "gemma"},
    {ChatTemplate::Family::phi3, "phi3"},
    {ChatTemplate::Family::phi4, "phi4"},
    {ChatTemplate::Family::zephyr, "zephyr"},
    {ChatTemplate::Family::deepseek, "deepseek"},
    {ChatTemplate::Family::deepseek3, "deepseek3"},
    {ChatTemplate::Family::command_r, "command-r"},
    {ChatTemplate::Family::gpt_oss, "gpt-oss"},
    {ChatTemplate::Family::glm4, "glm4"},
    {ChatTemplate::Family::gemma4, "gemma4"},
}};

bool has(std::string_view text, std::string_view what) {
    return text.find(what) != std::string_view::npos;
}

std::string trim(std::string_view s) {
    const char* ws = " \t\n\r\f\v";
    const size_t b = s.find_first_not_of(ws);
    if (b == std::string_view::npos) return {};
    return std::string(s.substr(b, s.find_last_not_of(ws) - b + 1));
}

// Qwen 2/2.5 templates write a literal default system turn for conversations without one:
// "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n". Take its text when it is a
// plain literal (no expression inside).
std::string literal_default_system(std::string_view jinja) {
    for (std::string_view open :
         {std::string_view("<|im_start|>system\\n"), std::string_view("<|im_start|>system\n")}) {
        for (size_t at = jinja.find(open); at != std::string_view::npos; at = jinja.find(open, at + 1)) {
            const size_t start = at + open.size();
            const size_t end = jinja.find("<|im_end|>", start);
            if (end == std::string_view::npos) break;
            const std::string_view body = jinja.substr(start, end - start);
            if (body.empty() || body.find_first_of("{}'\"+") != std::string_view::npos) continue;
            std::string out;
            for (size_t i = 0; i < body.size(); ++i) {
                if (body[i] == '\\' && i + 1 < body.size() && body[i + 1] == 'n') {
                    out += '\n';
                    ++i;
                } else {
                    out += body[i];
                }
            }
            return out;
        }
    }
    return {};
}

// System turns for the families without a system role go into a user turn, joined with a blank
// line: the first user turn (Mistral v1, Gemma) or the last one (Mistral v3 and Tekken), as
// those families' documentation says.
std::vector<ChatMessage> fold_system(const std::vector<ChatMessage>& messages, bool into_last_user) {
    std::string system;
    std::vector<ChatMessage> out;
    for (const ChatMessage& m : messages) {
        if (m.role == "system")
            system += (system.empty() ? "" : "\n\n") + m.content;
        else
            out.push_back(m);
    }
    if (system.empty()) return out;
    ChatMessage* target = nullptr;
    for (ChatMessage& m : out) {
        if (m.role != "user") continue;
        target = &m;
        if (!into_last_user) break;
    }
    if (target)
        target->content = system + "\n\n" + target->content;
    else
        out.insert(out.begin(), ChatMessage{"user", system});
    return out;
}

// gpt-oss's harmony format as its GGUF's template writes it for a plain conversation (no tools, no reasoning
// history): a system turn naming the model, its knowledge cutoff, today's date, the reasoning effort and the
// channels; the caller's system prompt as the developer's instructions; user turns; earlier answers on the final
// channel; the generation prompt opens an assistant turn and leaves the channel to the model.
constexpr std::string_view kHarmonyFinal = "<|channel|>final<|message|>";

PromptText render_harmony(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                          const std::string& effort) {
    const std::time_t now = std::time(nullptr);
    std::tm utc{};
    gmtime_r(&now, &utc);
    char today[16];
    std::strftime(today, sizeof today, "%Y-%m-%d", &utc);
    PromptText out;
    out.markup("<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
               "Knowledge cutoff: 2024-06\nCurrent date: " +
               std::string(today) + "\n\nReasoning: " + effort +
               "\n\n"
               "# Valid channels: analysis, commentary, final. Channel must be included for every message."
               "<|end|>");
    PromptText developer; // the system messages, joined by blank lines
    for (const ChatMessage& m : messages) {
        if (m.role != "system" && m.role != "developer") continue;
        if (!developer.empty()) developer.markup("\n\n");
        developer.content(m.content);
    }
    if (!developer.empty())
        out.markup("<|start|>developer<|message|># Instructions\n\n").append(developer).markup("\n\n<|end|>");
    for (size_t i = 0; i < messages.size(); ++i) {
        const ChatMessage& m = messages[i];
        if (m.role == "system" || m.role == "developer") continue;
        if (m.role == "assistant") {
            // The last message of a finished conversation ends with <|return|>, as the model wrote it; an answer
            // in the history ends its turn with <|end|>.
            const bool last = i + 1 == messages.size() && !add_generation_prompt;
            out.markup("<|start|>assistant" + std::string(kHarmonyFinal))
                .content(m.content)
                .markup(last ? "<|return|>" : "<|end|>");
        } else {
            out.markup("<|start|>" + m.role + "<|message|>").content(m.content).markup("<|end|>");
        }
    }
    if (add_generation_prompt) out.markup("<|start|>assistant");
    return out;
}

} // namespace

const std::vector<std::string>& ChatTemplate::names() {
    static const std::vector<std::string> list = [] {
        std::vector<std::string> v;
        for (const FamilyName& f : kFamilies)
            v.emplace_back(f.name);
        return v;
    }();
    return list;
}

std::optional<ChatTemplate> ChatTemplate::from_name(std::string_view name) {
    for (const FamilyName& f : kFamilies)
        if (name == f.name) return ChatTemplate(f.family);
    // Spellings other tools use for the same formats.
    if (name == "mistral") return ChatTemplate(Family::mistral_v1);
    if (name == "gemma2" || name == "gemma3") return ChatTemplate(Family::gemma);
    if (name == "qwen2" || name == "qwen2.5") return ChatTemplate(Family::chatml);
    if (name == "deepseek2") return ChatTemplate(Family::deepseek);
    if (name == "deepseek-r1") return ChatTemplate(Family::deepseek3);
    if (name == "harmony") return ChatTemplate(Family::gpt_oss);
    if (name == "chatglm4" || name == "glm4.5" || name == "glm4moe") return ChatTemplate(Family::glm4);
    return std::nullopt;
}

bool ChatTemplate::is_reasoning_effort(std::string_view effort) {
    return effort == "low" || effort == "medium" || effort == "high";
}

void ChatTemplate::set_reasoning_effort(std::string_view effort) {
    if (!is_reasoning_effort(effort))
        throw std::invalid_argument("reasoning effort '" + std::string(effort) + "': expected low, medium or high");
    reasoning_effort_ = std::string(effort);
}

std::string_view ChatTemplate::reply_prefix() const {
    return family_ == Family::gpt_oss ? kHarmonyFinal : std::string_view();
}

std::string_view ChatTemplate::name() const {
    for (const FamilyName& f : kFamilies)
        if (f.family == family_) return f.name;
    return "chatml";
}

ChatTemplate::Detection ChatTemplate::detect(std::string_view t) {
    auto found = [](Family f) { return Detection{ChatTemplate(f)}; };
    if (trim(t).empty()) return {ChatTemplate(Family::chatml), Detection::Fallback::no_template};
    // Most specific markers first: Phi-4 also uses <|im_start|>, Llama 2 also uses [INST].
    if (has(t, "<|im_sep|>")) return found(Family::phi4);
    if (has(t, "<|start|>") && has(t, "<|channel|>")) return found(Family::gpt_oss);
    if (has(t, "<|im_start|>")) {
        ChatTemplate c(Family::chatml);
        c.default_system_ = literal_default_system(t);
        if (!c.default_system_.empty()) c.family_ = Family::qwen;
        return {c};
    }
    if (has(t, "<|start_header_id|>")) return found(Family::llama3);
    if (has(t, "[gMASK]<sop>")) return found(Family::glm4);   // before phi3 / zephyr, which share <|user|>
    if (has(t, "<|turn>")) return found(Family::gemma4);
    if (has(t, "<start_of_turn>")) return found(Family::gemma);
    if (has(t, "<|START_OF_TURN_TOKEN|>")) return found(Family::command_r);
    if (has(t, "[SYSTEM_PROMPT]")) return found(has(t, "[INST] ") ? Family::mistral_v7 : Family::mistral_v7_tekken);
    if (has(t, "<<SYS>>")) return found(Family::llama2);
    if (has(t, "[INST]")) {
        if (has(t, " [/INST]")) return found(Family::mistral_v1);
        return found(has(t, "[INST] ") ? Family::mistral_v3 : Family::mistral_v3_tekken);
    }
    if (has(t, "<|user|>")) return found(has(t, "<|end|>") ? Family::phi3 : Family::zephyr);
    // Phi-4-mini builds its role tags as '<|' + role + '|>': only the generation prompt is written out.
    if (has(t, "<|assistant|>") && has(t, "<|end|>")) return found(Family::phi3);
    if (has(t, "<｜User｜>") || has(t, "<｜Assistant｜>")) return found(Family::deepseek3);
    if (has(t, "User: ") && has(t, "Assistant:")) return found(Family::deepseek);
    return {ChatTemplate(Family::chatml), Detection::Fallback::unrecognised_template, t.size()};
}

bool ChatTemplate::recognises(std::string_view name_or_template) {
    return from_name(name_or_template).has_value() || detect(name_or_template).recognised();
}

ChatTemplate::Detection ChatTemplate::resolve(std::string_view override_name, std::string_view model_template) {
    if (!override_name.empty()) {
        if (auto t = from_name(override_name)) return {*t};
        Detection d = detect(override_name);
        if (!d.recognised()) {
            d.fallback = Detection::Fallback::unrecognised_override;
            d.override_text = std::string(override_name.substr(0, 40));
        }
        return d;
    }
    return detect(model_template);
}

PromptText ChatTemplate::render_spans(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
    PromptText out;
    switch (family_) {
    case Family::chatml:
    case Family::qwen: {
        if (family_ == Family::qwen && (messages.empty() || messages.front().role != "system"))
            out.markup("<|im_start|>system\n").content(default_system_).markup("<|im_end|>\n");
        for (const ChatMessage& m : messages)
            out.markup("<|im_start|>" + m.role + "\n").content(m.content).markup("<|im_end|>\n");
        if (add_generation_prompt) out.markup("<|im_start|>assistant\n");
        break;
    }
    case Family::llama3:
        for (const ChatMessage& m : messages)
            out.markup("<|start_header_id|>" + m.role + "<|end_header_id|>\n\n")
                .content(trim(m.content))
                .markup("<|eot_id|>");
        if (add_generation_prompt) out.markup("<|start_header_id|>assistant<|end_header_id|>\n\n");
        break;
    case Family::llama2: {
        // [INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {answer} </s><s>[INST] {user} [/INST]
        std::string system;
        bool first = true;
        for (const ChatMessage& m : messages) {
            if (m.role == "system") {
                system = trim(m.content);
            } else if (m.role == "assistant") {
                out.markup(" ").content(trim(m.content)).markup(" </s>");
            } else {
                if (!first) out.markup("<s>");
                out.markup("[INST] ");
                if (!system.empty()) out.markup("<<SYS>>\n").content(system).markup("\n<</SYS>>\n\n");
                system.clear();
                out.content(trim(m.content)).markup(" [/INST]");
                first = false;
            }
        }
        break;
    }
    case Family::mistral_v1:
        for (const ChatMessage& m : fold_system(messages, false)) {
            if (m.role == "assistant")
                out.markup(" ").content(m.content).markup("</s>");
            else
                out.markup(" [INST] ").content(m.content).markup(" [/INST]");
        }
        break;
    case Family::mistral_v3:
    case Family::mistral_v3_tekken: {
        const bool tekken = family_ == Family::mistral_v3_tekken;
        for (const ChatMessage& m : fold_system(messages, true)) {
            if (m.role == "assistant")
                out.markup(tekken ? "" : " ").content(m.content).markup("</s>");
            else
                out.markup(tekken ? "[INST]" : "[INST] ").content(m.content).markup("[/INST]");
        }
        break;
    }
    case Family::mistral_v7:
    case Family::mistral_v7_tekken: {
        const std::string sp = family_ == Family::mistral_v7 ? " " : "";
        for (const ChatMessage& m : messages) {
            if (m.role == "system")
                out.markup("[SYSTEM_PROMPT]" + sp).content(m.content).markup("[/SYSTEM_PROMPT]");
            else if (m.role == "assistant")
                out.markup(sp).content(m.content).markup("</s>");
            else
                out.markup("[INST]" + sp).content(m.content).markup("[/INST]");
        }
        break;
    }
    case Family::gemma:
        for (const ChatMessage& m : fold_system(messages, false))
            out.markup("<start_of_turn>" + std::string(m.role == "assistant" ? "model" : "user") + "\n")
                .content(trim(m.content))
                .markup("<end_of_turn>\n");
        if (add_generation_prompt) out.markup("<start_of_turn>model\n");
        break;
    case Family::gemma4:
        // Every role its own turn (a system message too), the assistant's as "model". The generation prompt opens
        // the model's turn only: Gemma 4's own template also writes an empty thinking channel there when thinking
        // is off, which the history it renders then drops, so every later turn would re-tokenize the last reply;
        // without a <|think|> in the system turn the model answers directly either way.
        for (const ChatMessage& m : messages)
            out.markup("<|turn>" + std::string(m.role == "assistant" ? "model" : m.role) + "\n")
                .content(trim(m.content))
                .markup("<turn|>\n");
        if (add_generation_prompt) out.markup("<|turn>model\n");
        break;
    case Family::phi3:
        for (const ChatMessage& m : messages)
            out.markup("<|" + m.role + "|>\n").content(m.content).markup("<|end|>\n");
        if (add_generation_prompt) out.markup("<|assistant|>\n");
        break;
    case Family::phi4:
        for (const ChatMessage& m : messages)
            out.markup("<|im_start|>" + m.role + "<|im_sep|>").content(m.content).markup("<|im_end|>");
        if (add_generation_prompt) out.markup("<|im_start|>assistant<|im_sep|>");
        break;
    case Family::zephyr:
        for (const ChatMessage& m : messages)
            out.markup("<|" + m.role + "|>\n").content(m.content).markup("</s>\n");
        if (add_generation_prompt) out.markup("<|assistant|>\n");
        break;
    case Family::deepseek:
        for (const ChatMessage& m : messages) {
            if (m.role == "system")
                out.content(m.content).markup("\n\n");
            else if (m.role == "assistant")
                out.markup("Assistant: ").content(m.content).markup("<｜end▁of▁sentence｜>");
            else
                out.markup("User: ").content(m.content).markup("\n\n");
        }
        if (add_generation_prompt) out.markup("Assistant:");
        break;
    case Family::deepseek3:
        for (const ChatMessage& m : messages) {
            if (m.role == "system")
                out.content(m.content);
            else if (m.role == "assistant")
                out.markup("<｜Assistant｜>").content(m.content).markup("<｜end▁of▁sentence｜>");
            else
                out.markup("<｜User｜>").content(m.content);
        }
        if (add_generation_prompt) out.markup("<｜Assistant｜>");
        break;
    case Family::command_r:
        for (const ChatMessage& m : messages) {
            const char* who = m.role == "system"      ? "<|SYSTEM_TOKEN|>"
                              : m.role == "assistant" ? "<|CHATBOT_TOKEN|>"
                                                      : "<|USER_TOKEN|>";
            out.markup(std::string("<|START_OF_TURN_TOKEN|>") + who).content(m.content).markup("<|END_OF_TURN_TOKEN|>");
        }
        if (add_generation_prompt) out.markup("<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>");
        break;
    case Family::gpt_oss: out = render_harmony(messages, add_generation_prompt, reasoning_effort_); break;
    case Family::glm4: {
        // GLM-4.5's template: a reply's "<think>reasoning</think>" is split from its answer; the reasoning of a
        // reply before the last user turn is dropped (an empty think block stands for it), a later one's kept; the
        // answer is trimmed. The generation prompt leaves the model to open its own <think>.
        size_t last_user = 0;
        for (size_t i = 0; i < messages.size(); ++i)
            if (messages[i].role == "user") last_user = i;
        out.markup("[gMASK]<sop>");
        for (size_t i = 0; i < messages.size(); ++i) {
            const ChatMessage& m = messages[i];
            if (m.role != "assistant") {
                out.markup("<|" + m.role + "|>\n").content(m.content);
                continue;
            }
            std::string answer = m.content, reasoning;
            if (const size_t end = answer.rfind("</think>"); end != std::string::npos) {
                const std::string before = answer.substr(0, end);
                const size_t open = before.rfind("<think>");
                reasoning = trim(open == std::string::npos ? before : before.substr(open + 7));
                answer = answer.substr(end + 8);
            }
            out.markup("<|assistant|>\n<think>");
            if (i > last_user && !reasoning.empty()) out.content(reasoning);
            out.markup("</think>");
            answer = trim(answer);
            if (!answer.empty()) out.markup("\n").content(answer);
        }
        if (add_generation_prompt) out.markup("<|assistant|>");
        break;
    }
    }
    return out;
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
    return render_spans(messages, add_generation_prompt).text();
}

PromptText ChatTemplate::render_prompt_spans(std::string_view system, std::string_view user) const {
    std::vector<ChatMessage> messages;
    if (!system.empty()) messages.push_back({"system", std::string(system)});
    messages.push_back({"user", std::string(user)});
    return render_spans(messages, true);
}

std::string ChatTemplate::render_prompt(std::string_view system, std::string_view user) const {
    return render_prompt_spans(system, user).text();
}

} // namespace tern
