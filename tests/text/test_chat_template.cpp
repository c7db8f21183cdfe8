// Chat templates: each family renders the exact string its documentation shows (the leading BOS
// is the tokenizer's job, so the expected strings are compared after it), detection from real
// tokenizer.chat_template texts, the chatml fallback with its warning, and the rendered prompt
// tokenized with the special tokens recognised.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "engine/chat/chat_template.h"
#include "engine/chat/reply_channels.h"
#include "engine/text/tokenizer.h"
#include "formats/gguf.h"
#include "tests/test_support.h"
#include "tests/test_tokenizer_support.h"

using namespace tern;

namespace {

ChatTemplate named(const char* name) {
    auto t = ChatTemplate::from_name(name);
    REQUIRE(t.has_value());
    return *t;
}

using Chat = std::vector<ChatMessage>;

// The documented strings start with the BOS text; render() leaves BOS to the tokenizer.
std::string without_bos(const std::string& documented, const std::string& bos) {
    REQUIRE(documented.compare(0, bos.size(), bos) == 0);
    return documented.substr(bos.size());
}

} // namespace

TEST_CASE("ChatML (OpenAI ChatML / Qwen documentation)") {
    const Chat chat = {{"system", "You are a helpful assistant."}, {"user", "Hello"}};
    CHECK(named("chatml").render(chat) ==
          "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
          "<|im_start|>assistant\n");
}

TEST_CASE("Qwen 2.5: ChatML with the template's default system prompt") {
    const std::string jinja =
        "{%- if tools %}{{- '<|im_start|>system\\n' }}{%- if messages[0]['role'] == 'system' %}{{- "
        "messages[0]['content'] "
        "}}{%- else %}{{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}{%- endif %}"
        "{%- else %}{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + "
        "'<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a "
        "helpful assistant.<|im_end|>\\n' }}{%- endif %}{%- endif %}";
    const auto d = ChatTemplate::detect(jinja);
    CHECK(d.recognised());
    CHECK(d.tmpl.name() == "qwen");
    CHECK(d.tmpl.render({{"user", "Give me a short introduction to large language model."}}) ==
          "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
          "<|im_start|>user\nGive me a short introduction to large language model.<|im_end|>\n"
          "<|im_start|>assistant\n");
    // A system message of the caller's replaces the default.
    CHECK(d.tmpl.render({{"system", "Be brief."}, {"user", "Hi"}}) ==
          "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

TEST_CASE("Llama 2 chat (Meta's documented prompt format)") {
    const Chat chat = {{"system", "You are a helpful assistant."},
                       {"user", "Hi"},
                       {"assistant", "Hello! How can I help?"},
                       {"user", "Tell me a joke."}};
    CHECK(named("llama2").render(chat) ==
          without_bos("<s>[INST] <<SYS>>\nYou are a helpful assistant.\n<</SYS>>\n\nHi [/INST] Hello! How can I help? "
                      "</s><s>[INST] Tell me a joke. [/INST]",
                      "<s>"));
}

TEST_CASE("Llama 3 (Meta's documented prompt format)") {
    const Chat chat = {{"system", "You are a helpful AI assistant for travel tips and recommendations"},
                       {"user", "What is France's capital?"},
                       {"assistant", "Bonjour! The capital of France is Paris!"},
                       {"user", "What can I do there?"}};
    CHECK(named("llama3").render(chat) ==
          without_bos(
              "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
              "You are a helpful AI assistant for travel tips and recommendations<|eot_id|>"
              "<|start_header_id|>user<|end_header_id|>\n\nWhat is France's capital?<|eot_id|>"
              "<|start_header_id|>assistant<|end_header_id|>\n\nBonjour! The capital of France is Paris!<|eot_id|>"
              "<|start_header_id|>user<|end_header_id|>\n\nWhat can I do there?<|eot_id|>"
              "<|start_header_id|>assistant<|end_header_id|>\n\n",
              "<|begin_of_text|>"));
}

TEST_CASE("Mistral v1, v3, v3-Tekken (Mistral's tokenization and chat templates documentation)") {
    const Chat chat = {{"user", "Hello, how are you?"},
                       {"assistant", "Fine, and you?"},
                       {"user", "I'm doing great!"},
                       {"assistant", "Glad to hear!"}};
    CHECK(
        named("mistral-v1").render(chat, false) ==
        without_bos("<s> [INST] Hello, how are you? [/INST] Fine, and you?</s> [INST] I'm doing great! [/INST] Glad to "
                    "hear!</s>",
                    "<s>"));
    CHECK(named("mistral-v3").render(chat, false) ==
          without_bos("<s>[INST] Hello, how are you?[/INST] Fine, and you?</s>[INST] I'm doing great![/INST] Glad to "
                      "hear!</s>",
                      "<s>"));
    CHECK(named("mistral-v3-tekken").render(chat, false) ==
          without_bos(
              "<s>[INST]Hello, how are you?[/INST]Fine, and you?</s>[INST]I'm doing great![/INST]Glad to hear!</s>",
              "<s>"));
    // "the system prompt is prepended to the first user message" (v1) / "to the last" (v3, Tekken)
    const Chat sys = {{"system", "S"}, {"user", "A"}, {"assistant", "B"}, {"user", "C"}};
    CHECK(named("mistral-v1").render(sys) == " [INST] S\n\nA [/INST] B</s> [INST] C [/INST]");
    CHECK(named("mistral-v3").render(sys) == "[INST] A[/INST] B</s>[INST] S\n\nC[/INST]");
    CHECK(named("mistral-v3-tekken").render(sys) == "[INST]A[/INST]B</s>[INST]S\n\nC[/INST]");
}

TEST_CASE("Mistral v7 (Mistral Large 2411 and Mistral Small 3 model cards)") {
    const Chat chat = {{"system", "<system prompt>"},
                       {"user", "<user message>"},
                       {"assistant", "<assistant response>"},
                       {"user", "<user message>"}};
    CHECK(named("mistral-v7").render(chat) ==
          without_bos("<s>[SYSTEM_PROMPT] <system prompt>[/SYSTEM_PROMPT][INST] <user message>[/INST] <assistant "
                      "response></s>[INST] <user message>[/INST]",
                      "<s>"));
    CHECK(named("mistral-v7-tekken").render(chat) ==
          without_bos("<s>[SYSTEM_PROMPT]<system prompt>[/SYSTEM_PROMPT][INST]<user message>[/INST]<assistant "
                      "response></s>[INST]<user message>[/INST]",
                      "<s>"));
}

TEST_CASE("Gemma (Google's Gemma formatting documentation)") {
    const Chat chat = {
        {"user", "knock knock"}, {"assistant", "who is there"}, {"user", "Gemma"}, {"assistant", "Gemma who?"}};
    CHECK(named("gemma").render(chat, false) ==
          "<start_of_turn>user\nknock knock<end_of_turn>\n<start_of_turn>model\nwho is there<end_of_turn>\n"
          "<start_of_turn>user\nGemma<end_of_turn>\n<start_of_turn>model\nGemma who?<end_of_turn>\n");
    // No system role: system instructions go at the start of the first user turn.
    CHECK(named("gemma").render({{"system", "Answer in French."}, {"user", "Hello"}}) ==
          "<start_of_turn>user\nAnswer in French.\n\nHello<end_of_turn>\n<start_of_turn>model\n");
}

TEST_CASE("Gemma 4 (its GGUF's template: a system turn of its own, <|turn>role ... <turn|>)") {
    CHECK(named("gemma4").render({{"system", " Answer in French. "}, {"user", "Hello"}, {"assistant", "Bonjour"},
                                  {"user", "Thanks"}}) ==
          "<|turn>system\nAnswer in French.<turn|>\n<|turn>user\nHello<turn|>\n<|turn>model\nBonjour<turn|>\n"
          "<|turn>user\nThanks<turn|>\n<|turn>model\n");
    CHECK(ChatTemplate::resolve("", "{{- '<|turn>model\\n' -}}").tmpl.name() == "gemma4");
}

TEST_CASE("Phi-3 and Phi-4 (Microsoft model cards)") {
    const Chat chat = {{"user", "I am going to Paris, what should I see?"},
                       {"assistant", "Paris, the capital of France, is known for its stunning architecture."},
                       {"user", "What is so great about #1?"}};
    CHECK(named("phi3").render(chat) ==
          "<|user|>\nI am going to Paris, what should I see?<|end|>\n<|assistant|>\nParis, the capital of France, is "
          "known for its stunning architecture.<|end|>\n<|user|>\nWhat is so great about #1?<|end|>\n<|assistant|>\n");
    CHECK(
        named("phi3").render({{"system", "You are a helpful assistant."}, {"user", "How to explain Internet?"}}) ==
        "<|system|>\nYou are a helpful assistant.<|end|>\n<|user|>\nHow to explain Internet?<|end|>\n<|assistant|>\n");
    CHECK(named("phi4").render({{"system", "You are a medieval knight and must provide explanations to modern people."},
                                {"user", "How should I explain the Internet?"}}) ==
          "<|im_start|>system<|im_sep|>You are a medieval knight and must provide explanations to modern "
          "people.<|im_end|><|im_start|>user<|im_sep|>How should I explain the Internet?<|im_end|>"
          "<|im_start|>assistant<|im_sep|>");
}

TEST_CASE("Zephyr (HuggingFaceH4/zephyr-7b-beta model card)") {
    CHECK(named("zephyr").render({{"system", "You are a friendly chatbot who always responds in the style of a pirate"},
                                  {"user", "How many helicopters can a human eat in one sitting?"}}) ==
          "<|system|>\nYou are a friendly chatbot who always responds in the style of a pirate</s>\n<|user|>\n"
          "How many helicopters can a human eat in one sitting?</s>\n<|assistant|>\n");
}

TEST_CASE("DeepSeek LLM chat and DeepSeek V3 (model cards)") {
    const Chat chat = {{"user", "Who are you?"}, {"assistant", "I am DeepSeek."}, {"user", "Tell me more."}};
    CHECK(
        named("deepseek").render(chat) ==
        without_bos("<｜begin▁of▁sentence｜>User: Who are you?\n\nAssistant: I am DeepSeek.<｜end▁of▁sentence｜>User: "
                    "Tell me more.\n\nAssistant:",
                    "<｜begin▁of▁sentence｜>"));
    CHECK(named("deepseek3").render({{"system", "You are helpful."}, {"user", "Hi"}}) ==
          without_bos("<｜begin▁of▁sentence｜>You are helpful.<｜User｜>Hi<｜Assistant｜>", "<｜begin▁of▁sentence｜>"));
}

TEST_CASE("Command R (Cohere model card)") {
    CHECK(named("command-r").render({{"user", "Hello, how are you?"}}) ==
          without_bos("<BOS_TOKEN><|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hello, how are you?<|END_OF_TURN_TOKEN|>"
                      "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>",
                      "<BOS_TOKEN>"));
}

TEST_CASE("gpt-oss: the harmony format of its GGUF's template (system, developer, final channel, return)") {
    // The expected texts are what gpt-oss's own template (llama.cpp's models/templates/openai-gpt-oss-120b.jinja, as
    // its GGUF carries it) renders for these conversations under jinja2. The system turn carries today's date:
    // replace it by a placeholder before comparing.
    const auto undated = [](std::string text) {
        const std::string key = "Current date: ";
        const size_t at = text.find(key);
        REQUIRE(at != std::string::npos);
        REQUIRE(text.size() >= at + key.size() + 10);
        const std::string date = text.substr(at + key.size(), 10);
        CHECK((date[4] == '-' && date[7] == '-' && std::all_of(date.begin(), date.begin() + 4, ::isdigit)));
        return text.replace(at + key.size(), 10, "YYYY-MM-DD");
    };
    const std::string system = "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
                               "Knowledge cutoff: 2024-06\nCurrent date: YYYY-MM-DD\n\nReasoning: medium\n\n"
                               "# Valid channels: analysis, commentary, final. Channel must be included for every "
                               "message.<|end|>";
    const ChatTemplate t = named("gpt-oss");
    CHECK(undated(t.render({{"user", "Hello"}})) == system + "<|start|>user<|message|>Hello<|end|><|start|>assistant");
    const Chat chat = {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello!"}, {"user", "2+2?"}};
    CHECK(undated(t.render(chat)) == system +
                                         "<|start|>developer<|message|># Instructions\n\nBe brief.\n\n<|end|>"
                                         "<|start|>user<|message|>Hi<|end|>"
                                         "<|start|>assistant<|channel|>final<|message|>Hello!<|end|>"
                                         "<|start|>user<|message|>2+2?<|end|><|start|>assistant");
    // A finished conversation: the model's last answer ends with <|return|>.
    CHECK(undated(t.render({{"user", "Hi"}, {"assistant", "Hello!"}}, false)) ==
          system + "<|start|>user<|message|>Hi<|end|><|start|>assistant<|channel|>final<|message|>Hello!<|return|>");
    CHECK(named("harmony").name() == "gpt-oss");

    // The reasoning effort is the system message's "Reasoning:" line; other formats ignore it.
    ChatTemplate effort = named("gpt-oss");
    CHECK(effort.reasoning_effort() == "medium");
    effort.set_reasoning_effort("high");
    CHECK(undated(effort.render({{"user", "Hello"}})).find("\n\nReasoning: high\n\n") != std::string::npos);
    CHECK_THROWS_AS(effort.set_reasoning_effort("max"), std::invalid_argument);
    CHECK(effort.reasoning_effort() == "high");
    ChatTemplate chatml = named("chatml");
    chatml.set_reasoning_effort("low");
    CHECK(chatml.render({{"user", "Hello"}}) == named("chatml").render({{"user", "Hello"}}));
}

TEST_CASE("glm4: GLM-4.5/4.6's format ([gMASK]<sop>, <|role|> lines, earlier replies behind an empty think block)") {
    // The expected texts are what GLM-4.6's template (llama.cpp's models/templates/GLM-4.6.jinja) renders under
    // jinja2 with trim_blocks and lstrip_blocks, as transformers applies it.
    const ChatTemplate t = named("glm4");
    CHECK(t.render({{"user", "Hello"}}) == "[gMASK]<sop><|user|>\nHello<|assistant|>");
    const Chat chat = {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", " Hello! \n"}, {"user", "2+2?"}};
    CHECK(t.render(chat) == "[gMASK]<sop><|system|>\nBe brief.<|user|>\nHi<|assistant|>\n<think></think>\nHello!"
                            "<|user|>\n2+2?<|assistant|>");
    CHECK(t.render({{"user", "Hi"}, {"assistant", ""}}, false) ==
          "[gMASK]<sop><|user|>\nHi<|assistant|>\n<think></think>");
    // A reply that kept its reasoning: dropped before a later user turn, kept after the last one.
    const Chat thought = {{"user", "Hi"}, {"assistant", "\n<think>greet back</think>\nHello!"}, {"user", "2+2?"}};
    CHECK(t.render(thought) ==
          "[gMASK]<sop><|user|>\nHi<|assistant|>\n<think></think>\nHello!<|user|>\n2+2?<|assistant|>");
    CHECK(t.render({{"user", "Hi"}, {"assistant", "<think> greet back </think>Hello!"}}, false) ==
          "[gMASK]<sop><|user|>\nHi<|assistant|>\n<think>greet back</think>\nHello!");
    CHECK(named("chatglm4").name() == "glm4");
    const std::string jinja = "[gMASK]<sop>\n{%- if tools -%}\n<|system|>\n# Tools\n{%- elif m.role == 'assistant' -%}"
                              "\n<|assistant|>\n{%- if m.role == 'user' -%}<|user|>\n";
    CHECK(ChatTemplate::detect(jinja).tmpl.name() == "glm4");
}

TEST_CASE("harmony replies split into reasoning and answer, whole or streamed in any pieces") {
    const ChatTemplate t = named("gpt-oss");
    CHECK(t.reply_has_channels());
    CHECK(t.reply_prefix() == "<|channel|>final<|message|>");
    CHECK_FALSE(named("chatml").reply_has_channels());
    CHECK(named("chatml").reply_prefix().empty());

    struct Case {
        std::string text, reasoning, answer;
    };
    const std::vector<Case> cases = {
        {"<|channel|>analysis<|message|>User greets. Reply.<|end|><|start|>assistant<|channel|>final<|message|>Hello!",
         "User greets. Reply.", "Hello!"},
        // A tool call's header: the recipient and the constraint are neither reasoning nor answer.
        {"<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Oslo\"}",
         "{\"city\": \"Oslo\"}", ""},
        // A model that ignores the format: everything is answer, a stray "<|" or unknown marker included.
        {"just text", "", "just text"},
        {"a <| b and <|foo|> c", "", "a <| b and <|foo|> c"},
        {"x < y", "", "x < y"},
        // An answer without a channel name, and a message after <|end|> with no header text.
        {"<|start|>assistant<|message|>plain", "", "plain"},
        // Reasoning only (stopped by max tokens), and a marker cut off by the end of generation.
        {"<|channel|>analysis<|message|>thinking", "thinking", ""},
        {"<|channel|>final<|message|>ok <|chan", "", "ok <|chan"},
        {"<|channel|>final<|message|>ends with <", "", "ends with <"},
    };
    for (const Case& c : cases) {
        CAPTURE(c.text);
        const SplitReply whole = split_reply_channels(c.text);
        CHECK(whole.reasoning == c.reasoning);
        CHECK(whole.answer == c.answer);
        // Every split into two pieces, and byte by byte: the same parts, each byte delivered once.
        for (size_t cut = 0; cut <= c.text.size(); ++cut) {
            std::string seen_reasoning, seen_answer;
            ReplyChannels r([&](ReplyPart part, std::string_view text) {
                (part == ReplyPart::reasoning ? seen_reasoning : seen_answer) += text;
                return true;
            });
            r.push(std::string_view(c.text).substr(0, cut));
            r.push(std::string_view(c.text).substr(cut));
            r.finish();
            CHECK(seen_reasoning == c.reasoning);
            CHECK(seen_answer == c.answer);
            CHECK(r.answer() == c.answer);
        }
        ReplyChannels bytes;
        for (char ch : c.text) bytes.push(std::string_view(&ch, 1));
        bytes.finish();
        CHECK(bytes.reasoning() == c.reasoning);
        CHECK(bytes.answer() == c.answer);
    }

    // A callback that refuses text stops the reply.
    int calls = 0;
    ReplyChannels refusing([&](ReplyPart, std::string_view) { return ++calls < 2; });
    CHECK(refusing.push("<|channel|>analysis<|message|>a"));
    CHECK_FALSE(refusing.push("<|end|><|start|>assistant<|channel|>final<|message|>b"));
    CHECK_FALSE(refusing.push("c"));
    CHECK(calls == 2);
}

TEST_CASE("detection from real tokenizer.chat_template texts") {
    struct Case {
        const char* jinja;
        const char* family;
    };
    const Case cases[] = {
        {"{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' "
         "+ "
         "'\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
         "chatml"},
        {"{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
         "message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == "
         "0 "
         "%}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}",
         "llama3"},
        {"{{ bos_token }}{% for message in messages %}{{'<start_of_turn>' + role + '\\n' + message['content'] | trim + "
         "'<end_of_turn>\\n'}}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}",
         "gemma"},
        {"{% if message['role'] == 'system' %}{{ '<<SYS>>\\n' + content.strip() + '\\n<</SYS>>\\n\\n' }}{% endif %}"
         "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}",
         "llama2"},
        // Mistral 7B Instruct v0.1/v0.2 (tokenizer v1), v0.3 (v3) and Nemo (Tekken)
        {"{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] "
         "== "
         "'assistant' %}{{ message['content'] + eos_token}}{% endif %}",
         "mistral-v1"},
        {"{%- if message['role'] == 'user' %}{{- '[INST] ' + message['content'] + '[/INST]' }}{%- elif message['role'] "
         "== "
         "'assistant' %}{{- ' ' + message['content']|trim + eos_token}}{%- endif %}",
         "mistral-v3"},
        {"{%- if message['role'] == 'user' %}{{- '[INST]' + message['content'] + '[/INST]' }}{%- elif message['role'] "
         "== "
         "'assistant' %}{{- message['content'] + eos_token}}{%- endif %}",
         "mistral-v3-tekken"},
        {"{{- bos_token }}{%- if system_message is defined %}{{- '[SYSTEM_PROMPT]' + system_message + "
         "'[/SYSTEM_PROMPT]' "
         "}}{%- endif %}{%- if message['role'] == 'user' %}{{- '[INST]' + message['content'] + '[/INST]' }}",
         "mistral-v7-tekken"},
        // Ministral 3 (mistral3): a default system prompt, tools and the v7 markers without spaces
        {"{%- set default_system_message = 'You are a helpful assistant.' %}{{- bos_token }}{%- if tools %}"
         "{{- '[AVAILABLE_TOOLS]' + tools|tojson + '[/AVAILABLE_TOOLS]' }}{%- endif %}{{- '[SYSTEM_PROMPT]' + "
         "system_message + '[/SYSTEM_PROMPT]' }}{%- for message in loop_messages %}{%- if message['role'] == 'user' %}"
         "{{- '[INST]' + message['content'] + '[/INST]' }}{%- elif message['role'] == 'assistant' %}{{- "
         "message['content'] + eos_token }}{%- endif %}{%- endfor %}",
         "mistral-v7-tekken"},
        {"{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') %}{{'<|user|>' + '\\n' + "
         "message['content'] + '<|end|>' + '\\n' + '<|assistant|>' + '\\n'}}{% elif (message['role'] == 'assistant') "
         "%}{{message['content'] + '<|end|>' + '\\n'}}{% endif %}{% endfor %}",
         "phi3"},
        {"{% for message in messages %}{% if (message['role'] == 'system') %}{{'<|im_start|>system<|im_sep|>' + "
         "message['content'] + '<|im_end|>'}}{% endif %}{% endfor %}",
         "phi4"},
        {"{% for message in messages %}{% if message['role'] == 'user' %}{{ '<|user|>\\n' + message['content'] + "
         "eos_token }}{% endif %}{% endfor %}",
         "zephyr"},
        {"{% if message['role'] == 'user' %}{{ 'User: ' + message['content'] + '\\n\\n' }}{% elif message['role'] == "
         "'assistant' %}{{ 'Assistant: ' + message['content'] + eos_token }}{% endif %}{% if add_generation_prompt "
         "%}{{ "
         "'Assistant:' }}{% endif %}",
         "deepseek"},
        {"{{'<｜User｜>' + message['content']}}{%- endif %}{%- if message['role'] == 'assistant' %}{{'<｜Assistant｜>' "
         "+ "
         "content + '<｜end▁of▁sentence｜>'}}",
         "deepseek3"},
        {"{{ '<|START_OF_TURN_TOKEN|><|USER_TOKEN|>' + content.strip() + '<|END_OF_TURN_TOKEN|>' }}", "command-r"},
        // gpt-oss (harmony): excerpts of its GGUF's template
        {"{%- if add_generation_prompt -%}\n<|start|>assistant\n{%- endif -%}{{- \"<|start|>assistant<|channel|>final"
         "<|message|>\" + message.content + \"<|end|>\" }}{{- \"<|start|>user<|message|>\" + message.content + "
         "\"<|end|>\" }}",
         "gpt-oss"},
        // Gemma 4 (31B it), an excerpt: its turn markers.
        {"{{- '<|turn>system\\n' -}}{{- messages[0]['content'] | trim -}}{{- '<turn|>\\n' -}}{%- if "
         "add_generation_prompt -%}{{- '<|turn>model\\n' -}}{%- endif -%}",
         "gemma4"},
        // Mixtral 8x7B Instruct v0.1: Mistral's v1 format (" [INST] ... [/INST]").
        {"{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) "
         "%}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% "
         "if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == "
         "'assistant' %}{{ message['content'] + eos_token}}{% endif %}{% endfor %}",
         "mistral-v1"},
        // SmolLM3 3B, abridged: ChatML with its own system block (metadata lines); its default system text is
        // built from expressions, so there is no literal to take.
        {"{{- \"<|im_start|>system\\n\" -}}{{- \"## Metadata\\n\\n\" -}}{{- \"Knowledge Cutoff Date: June 2025\\n\" "
         "-}}{%- for message in messages -%}{{- \"<|im_start|>\" + message.role + \"\\n\" + message.content + "
         "\"<|im_end|>\\n\" -}}{%- endfor -%}{%- if add_generation_prompt -%}{{- \"<|im_start|>assistant\\n\" -}}"
         "{%- endif -%}",
         "chatml"},
        // Phi-4-mini: the role tags built as '<|' + role + '|>'; llama.cpp renders it as Phi-3.
        {"{% for message in messages %}{% if message['role'] == 'system' and 'tools' in message and message['tools'] "
         "is not none %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|tool|>' + message['tools'] + "
         "'<|/tool|>' + '<|end|>' }}{% else %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}{% "
         "endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% else %}{{ eos_token }}{% endif %}",
         "phi3"},
    };
    for (const Case& c : cases) {
        CAPTURE(c.family);
        const auto d = ChatTemplate::detect(c.jinja);
        CHECK(d.tmpl.name() == c.family);
        CHECK(d.recognised());
    }
}

TEST_CASE("unknown or missing templates fall back to chatml and say why; names and overrides") {
    const std::string odd = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}";
    auto unknown = ChatTemplate::detect(odd);
    CHECK(unknown.tmpl.name() == "chatml");
    CHECK(unknown.fallback == ChatTemplateDetection::Fallback::unrecognised_template);
    CHECK(unknown.template_chars == odd.size());
    auto none = ChatTemplate::detect("");
    CHECK(none.tmpl.name() == "chatml");
    CHECK(none.fallback == ChatTemplateDetection::Fallback::no_template);

    const auto& names = ChatTemplate::names();
    CHECK(names.size() >= 15);
    for (const std::string& n : names) {
        CAPTURE(n);
        auto t = ChatTemplate::from_name(n);
        REQUIRE(t.has_value());
        CHECK(t->name() == n);
        CHECK_FALSE(t->render({{"user", "x"}}).empty());
    }
    CHECK_FALSE(ChatTemplate::from_name("no-such-template").has_value());

    // --chat-template NAME beats the model's template; template text is accepted too.
    CHECK(ChatTemplate::resolve("gemma", "<|im_start|>").tmpl.name() == "gemma");
    CHECK(ChatTemplate::resolve("", "<start_of_turn>").tmpl.name() == "gemma");
    CHECK(ChatTemplate::resolve("{{'<|user|>' + x + '<|end|>'}}", "").tmpl.name() == "phi3");
    const auto bad = ChatTemplate::resolve("nonsense", "<start_of_turn>");
    CHECK(bad.tmpl.name() == "chatml");
    CHECK(bad.fallback == ChatTemplateDetection::Fallback::unrecognised_override);
    CHECK(bad.override_text == "nonsense");
    const std::string long_override(100, 'x');
    CHECK(ChatTemplate::resolve(long_override, "").override_text == std::string(40, 'x'));
}

TEST_CASE("rendered prompts tokenize with their control tokens (phi-3 vocabulary, Gemma 3)") {
    if (test::shared_available()) {
        GgufFile f = GgufFile::open(test::shared_path("models/vocab/ggml-vocab-phi-3.gguf").string());
        const auto d = ChatTemplate::detect(f.get_string("tokenizer.chat_template", ""));
        CHECK(d.tmpl.name() == "phi3");
        auto tok = Tokenizer::from_gguf(f);
        const auto ids = tok->encode(d.tmpl.render_prompt("", "Hi"), {true, true});
        REQUIRE(ids.size() >= 4);
        CHECK(ids.front() == tok->bos());
        CHECK(ids[1] == tok->token_id("<|user|>"));
        CHECK(std::find(ids.begin(), ids.end(), tok->token_id("<|end|>")) != ids.end());
        CHECK(tok->is_eog(tok->token_id("<|end|>")));
    }
    const std::string gemma = test::find_gemma_model();
    if (gemma.empty()) {
        MESSAGE("SKIPPED Gemma part: model not found (set TERN_GEMMA)");
        return;
    }
    auto tok = Tokenizer::from_gguf(GgufFile::open(gemma));
    const auto ids = tok->encode(named("gemma").render_prompt("", "Hi"), {true, true});
    // <bos> <start_of_turn> user \n Hi <end_of_turn> \n <start_of_turn> model \n
    CHECK(test::ids_to_string(ids) == "2 105 2364 107 10979 106 107 105 4368 107");
}
