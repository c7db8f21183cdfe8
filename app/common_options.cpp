#include "app/common_options.h"

#include "app/console.h"
#include "app/engine_wording.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <thread>

#include "engine/backend_factory.h"
#include "engine/chat/chat_template.h"
#include "engine/memory_budget.h"
#include "engine/speculative/drafter_model.h"
#include "engine/model.h"
#include "engine/model_config.h"
#include "engine/model_identity.h"
#include "engine/prefix_cache/prefix_cache.h"
#include "engine/text/tokenizer.h"
#include "base/error.h"
#include "base/terminal_text.h"

namespace tern::app {

namespace {

std::string fmt_gib(double bytes) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f GiB", bytes / (1024.0 * 1024.0 * 1024.0));
    return buf;
}

void check_finite(const char* flag, float v) {
    if (!std::isfinite(v)) throw UsageError(std::string(flag) + ": not a finite number");
}

} // namespace

CLI::Validator integer_in_range(int64_t min, int64_t max, const std::string& meaning) {
    const std::string range = std::to_string(min) + ".." + std::to_string(max);
    return CLI::Validator(
        [min, max, range, meaning](std::string& text) -> std::string {
            int64_t v = 0;
            const char* end = text.data() + text.size();
            const auto [ptr, ec] = std::from_chars(text.data(), end, v);
            if (ec == std::errc() && ptr == end && v >= min && v <= max) return {};
            const std::string shown = "'" + terminal_safe(text.substr(0, 40)) + "'";
            if (ec == std::errc::result_out_of_range || (ec == std::errc() && ptr == end))
                return shown + " is out of range: expected " + range + " (" + meaning + ")";
            return shown + " is not a whole number: expected " + range + " (" + meaning + ")";
        },
        "", "integer in " + range); // no description: help shows the option's own type ("INT")
}

CLI::Validator n_predict_range() {
    return integer_in_range(-1, INT32_MAX, "-1 = until EOS or the context is full");
}

int max_threads() {
    const unsigned hw = std::thread::hardware_concurrency();   // 0 when unknown
    return hw == 0 ? 1024 : static_cast<int>(std::min(4u * hw, 1024u));
}

CLI::Validator chat_template_check() {
    return CLI::Validator(
        [](std::string& text) -> std::string {
            if (ChatTemplate::recognises(text)) return {};
            std::string known;
            for (const std::string& n : ChatTemplate::names()) known += (known.empty() ? "" : ", ") + n;
            return "'" + terminal_safe(text.substr(0, 40)) + (text.size() > 40 ? "...'" : "'") +
                   " is neither a template name nor a template tern recognises (names: " + known + ")";
        },
        "", "chat template name");
}

void add_model_options(CLI::App& cmd, ModelOptions& o) {
    cmd.add_option("-m,--model", o.model, "GGUF model file")->required();
    cmd.add_option("-c,--ctx-size", o.ctx_size,
                   "context size in tokens (default: the model's, capped so the KV cache fits in memory)");
    cmd.add_option("-t,--threads", o.threads,
                   "CPU threads (default: physical cores; at most " + std::to_string(max_threads()) +
                       ", 4x the hardware threads)")
        ->check(integer_in_range(0, max_threads(),
                                 "0 = one per physical core; at most 4x the " +
                                     std::to_string(std::thread::hardware_concurrency()) + " hardware threads"));
    cmd.add_option("--kv-type", o.kv_type, "KV cache format: f16 (default), bf16, f32, q8_0, f8_e4m3");
    cmd.add_option("--device", o.device, "auto (default: CUDA when a usable GPU is present), cpu, cuda");
    // -ngl arrives here as --gpu-layers through rewrite_llama_aliases. llama.cpp reads -1 as "auto"
    // and -2 as "all"; tern offloads all layers for -1, and nothing below -1 means anything.
    cmd.add_option("--gpu-layers,--n-gpu-layers", o.gpu_layers, "layers to offload to the GPU (-ngl; -1 = all, the default)")
        ->check(integer_in_range(-1, INT32_MAX, "-1 = all layers"));
}

void add_sampling_options(CLI::App& cmd, SamplingOptions& o) {
    SamplingParams& p = o.params;
    // Values at or below 0 mean what llama.cpp documents: greedy for --temp, off for --top-k.
    cmd.add_option("--temp", p.temp, "temperature; 0 or below = greedy, as in llama.cpp (default 0.8)");
    cmd.add_option("--top-k", p.top_k, "keep the k most likely tokens; 0 or below = off, as in llama.cpp (default 40)");
    cmd.add_option("--top-p", p.top_p, "keep the smallest set with this much probability; 1 = off (default 0.95)");
    cmd.add_option("--min-p", p.min_p, "drop tokens below min-p times the top probability; 0 = off (default 0.05)");
    cmd.add_option("--repeat-penalty", p.repeat_penalty, "penalise repeated tokens; 1 = off (default 1.0)");
    cmd.add_option("--repeat-last-n", p.repeat_last_n,
                   "tokens the penalties look back at; 0 = off, -1 = the whole context (default 64)");
    cmd.add_option("--frequency-penalty", p.frequency_penalty, "subtract count * this; 0 = off (default 0)");
    cmd.add_option("--presence-penalty", p.presence_penalty, "subtract this once per seen token; 0 = off (default 0)");
    cmd.add_option("--seed", o.seed, "RNG seed; -1 = random (default), reported on stderr and in --json")
        ->check(integer_in_range(-1, INT64_MAX, "-1 = a random seed"));
}

SamplingParams resolve_sampling(const SamplingOptions& o) {
    SamplingParams p = o.params;
    check_finite("--temp", p.temp);
    check_finite("--top-p", p.top_p);
    check_finite("--min-p", p.min_p);
    check_finite("--repeat-penalty", p.repeat_penalty);
    check_finite("--frequency-penalty", p.frequency_penalty);
    check_finite("--presence-penalty", p.presence_penalty);
    if (p.top_p < 0.0f || p.top_p > 1.0f) throw UsageError("--top-p: must be between 0 and 1 (1 turns it off)");
    if (p.min_p < 0.0f || p.min_p > 1.0f) throw UsageError("--min-p: must be between 0 and 1 (0 turns it off)");
    if (p.repeat_penalty <= 0.0f) throw UsageError("--repeat-penalty: must be > 0 (1 turns it off)");
    if (p.repeat_last_n < -1) throw UsageError("--repeat-last-n: must be -1 (whole context), 0 (off) or more");
    if (o.seed < -1) throw UsageError("--seed: must be -1 (random) or a non-negative number");
    if (o.seed == -1) {
        std::random_device rd;
        // 32 bits like llama.cpp's seeds, so a reported seed is easy to paste back.
        p.seed = rd();
    } else {
        p.seed = static_cast<uint64_t>(o.seed);
    }
    return p;
}

void add_repeat_guard_options(CLI::App& cmd, RepeatGuardParams& p) {
    p.enabled = true;
    // Two flags rather than CLI11's "--repeat-guard,!--no-repeat-guard", whose help line reads
    // "--repeat-guard,--no-repeat-guard{false}". Given both, off wins (its callback runs last).
    cmd.add_flag_callback(
        "--repeat-guard", [&p] { p.enabled = true; },
        "stop when the output loops (a span repeated back to back) and trim it to one occurrence; text copied "
        "from the prompt is never cut (default: on)");
    cmd.add_flag_callback("--no-repeat-guard", [&p] { p.enabled = false; }, "turn --repeat-guard off");
    cmd.add_option("--repeat-guard-count", p.min_repeats,
                   "back-to-back occurrences of a span that make a loop (default 3)");
    cmd.add_option("--repeat-guard-min-tokens", p.min_loop_tokens,
                   "... which must also cover this many tokens, so short spans need more (default 32)");
    cmd.add_option("--repeat-guard-long-span", p.long_span,
                   "a span of this many tokens loops on its 2nd occurrence; 0 = off (default 32)");
    cmd.add_option("--repeat-guard-max-span", p.max_span, "the longest span looked for, in tokens (default 128)");
}

void check_repeat_guard(const RepeatGuardParams& p) {
    const std::optional<RepeatGuardParamsError> error = check_repeat_guard_params(p);
    if (!error) return;
    using Field = RepeatGuardParamsError::Field;
    const char* flag = error->field == Field::min_repeats       ? "--repeat-guard-count"
                       : error->field == Field::min_loop_tokens ? "--repeat-guard-min-tokens"
                       : error->field == Field::long_span       ? "--repeat-guard-long-span"
                                                                : "--repeat-guard-max-span";
    throw UsageError(std::string(flag) + ": " + error->rule);
}

std::string repeat_guard_note(const RepeatCut& c) {
    return "repetition guard: cut a looping tail of " + std::to_string(c.cut) + " tokens (span " +
           std::to_string(c.span) + " x " + std::to_string(c.repeats) + "; --no-repeat-guard keeps it)";
}

void rewrite_llama_aliases(int argc, char** argv) {
    static char gpu_layers[] = "--gpu-layers";
    for (int i = 1; i < argc; ++i) {
        if (std::strcmp(argv[i], "--") == 0) break;   // everything after is positional
        if (std::strcmp(argv[i], "-ngl") == 0) argv[i] = gpu_layers;
    }
}

std::string process_escapes(std::string_view t) {
    std::string out;
    out.reserve(t.size());
    auto hex = [](char c) -> int {
        if (c >= '0' && c <= '9') return c - '0';
        if (c >= 'a' && c <= 'f') return c - 'a' + 10;
        if (c >= 'A' && c <= 'F') return c - 'A' + 10;
        return -1;
    };
    for (size_t i = 0; i < t.size(); ++i) {
        if (t[i] != '\\' || i + 1 == t.size()) {
            out += t[i];
            continue;
        }
        const char c = t[i + 1];
        switch (c) {
        case 'n': out += '\n'; ++i; break;
        case 'r': out += '\r'; ++i; break;
        case 't': out += '\t'; ++i; break;
        case '\\': out += '\\'; ++i; break;
        case '\'': out += '\''; ++i; break;
        case '"': out += '"'; ++i; break;
        case 'x':
            if (i + 3 < t.size() && hex(t[i + 2]) >= 0 && hex(t[i + 3]) >= 0) {
                out += static_cast<char>(hex(t[i + 2]) * 16 + hex(t[i + 3]));
                i += 3;
            } else {
                out += t[i];
            }
            break;
        default: out += t[i]; break;   // unknown escape: keep the backslash, the next char follows
        }
    }
    return out;
}

namespace {

ChatTemplate with_effort(ChatTemplate t, const std::string& effort) {
    if (!effort.empty()) t.set_reasoning_effort(effort);
    return t;
}

} // namespace

void add_reasoning_effort_option(CLI::App& cmd, std::string& effort) {
    cmd.add_option("--reasoning-effort", effort,
                   "how much a reasoning model thinks before it answers: low, medium (default) or high (gpt-oss)")
        ->check(CLI::Validator(
            [](std::string& text) -> std::string {
                if (ChatTemplate::is_reasoning_effort(text)) return {};
                return "'" + terminal_safe(text.substr(0, 40)) + "' is not a choice: expected low, medium or high";
            },
            "", "low|medium|high"));
}

ChatTemplate resolve_chat_template(const Session& session, const std::string& template_override,
                                   const std::string& reasoning_effort) {
    const Model* model = session.model();
    const std::string model_template = model ? model->file.get_string("tokenizer.chat_template", "") : std::string();
    if (template_override.empty() && model_template.empty() && model) {
        // Some conversions drop tokenizer.chat_template. The Gemma family has one format for all
        // its instruction-tuned models, so its architecture is a safe guide; elsewhere the
        // architecture says nothing about the fine-tune and chatml (with a warning) stays.
        // gpt-oss was trained on one format, harmony, alike.
        const std::string arch = model->file.get_string("general.architecture", "");
        const char* family = arch.starts_with("gemma") ? "gemma" : arch == "gpt-oss" ? "gpt-oss" : nullptr;
        if (family) {
            if (std::optional<ChatTemplate> t = ChatTemplate::from_name(family)) {
                std::cerr << "tern: the model has no chat template (tokenizer.chat_template); using " << family
                          << ", the format of its architecture (choose another with --chat-template NAME)\n";
                return with_effort(*t, reasoning_effort);
            }
        }
    }
    const ChatTemplate::Detection d = ChatTemplate::resolve(template_override, model_template);
    if (!d.recognised()) std::cerr << "tern: " << chat_template_warning(d) << "\n";
    return with_effort(d.tmpl, reasoning_effort);
}

void add_draft_options(CLI::App& cmd, DraftOptions& o) {
    o.lookup_opt = cmd.add_option("--lookup", o.lookup,
                                  "speculative decoding by prompt lookup: draft up to K tokens by copying what "
                                  "followed the last n-gram earlier in the text (same output, faster on "
                                  "repetitive text)")
                       ->expected(0, 1)
                       ->default_str("8")
                       ->check(integer_in_range(1, kMaxDraftTokens, "the most tokens drafted per step"));
    o.lookup_ngram_opt = cmd.add_option("--lookup-ngram", o.lookup_ngram,
                                        "--lookup: longest n-gram matched, shorter ones tried next (default 3)");
    cmd.add_option("--draft-model", o.draft_model,
                   "speculative decoding with a smaller model of the same vocabulary drafting greedily");
    o.draft_max_opt =
        cmd.add_option("--draft-max", o.draft_max, "--draft-model: most tokens drafted per step (default 8)")
            ->check(integer_in_range(1, kMaxDraftTokens, "the most tokens drafted per step"));
}

void check_draft_options(const DraftOptions& f) {
    const bool lookup = f.lookup_opt && f.lookup_opt->count() > 0;
    if (lookup && f.lookup < 1) throw UsageError("--lookup: K must be >= 1 (the most tokens drafted per step)");
    if (f.lookup_ngram_opt && f.lookup_ngram_opt->count() > 0 && !lookup)
        throw UsageError("--lookup-ngram: only with --lookup");
    if (f.lookup_ngram < 1 || f.lookup_ngram > 16) throw UsageError("--lookup-ngram: N must be in 1..16");
    if (f.draft_max_opt && f.draft_max_opt->count() > 0 && f.draft_model.empty())
        throw UsageError("--draft-max: only with --draft-model");
    if (f.draft_max < 1) throw UsageError("--draft-max: K must be >= 1 (the most tokens drafted per step)");
    if (lookup && !f.draft_model.empty())
        throw UsageError("--lookup and --draft-model: choose one drafter (prompt lookup or a draft model)");
}

std::unique_ptr<Drafter> make_drafter(const DraftOptions& f, const ModelOptions& model_options,
                                      const LoadedSession& loaded) {
    if (f.lookup_opt && f.lookup_opt->count() > 0) return std::make_unique<PromptLookupDrafter>(f.lookup, f.lookup_ngram);
    if (f.draft_model.empty()) return nullptr;
    const Model* target = loaded.session->model();
    if (!target) throw std::logic_error("--draft-model: the session has no model file");
    // The target's device, KV type and threads, at the target's context; the notes about a device or
    // context choice were said when the target opened, and are not repeated.
    OpenRequest request = open_request(model_options);
    request.path = f.draft_model;
    request.n_ctx = loaded.n_ctx;
    request.on_device_note = nullptr;
    request.on_context = nullptr;
    return with_flag_words([&] { return load_draft_model(request, *target, f.draft_max); });
}

OpenRequest open_request(const ModelOptions& o) {
    OpenRequest r;
    r.path = o.model;
    r.n_ctx = o.ctx_size;
    r.kv_type = kv_type_from_name(o.kv_type);
    r.device = o.device;
    r.gpu_layers = o.gpu_layers;
    r.sequences = o.sequences;
    r.cpu.n_threads = o.threads;
    r.on_device_note = [](const std::string& note) { std::cerr << "tern: " << note << "\n"; };
    // The weights' copy to a GPU: a bar on a terminal (a large model takes seconds).
    auto bar = std::make_shared<std::unique_ptr<ProgressBar>>();
    r.on_upload = [bar](uint64_t done, uint64_t total) {
        if (!*bar) *bar = std::make_unique<ProgressBar>("upload", total);
        (*bar)->update(done);
        if (done >= total) (*bar)->finish();
    };
    r.on_context = [](const ContextChoice& c) {
        if (c.origin != ContextOrigin::memory_cap) return;
        std::cerr << "tern: -c: using a context of " << c.n_ctx << " tokens: the model's " << c.n_ctx_train
                  << " would need " << fmt_gib(static_cast<double>(c.kv_bytes_at_train))
                  << " of KV cache and half the memory left after the weights is " << format_memory(c.kv_budget)
                  << " (set -c to choose)\n";
    };
    return r;
}

OpenedModel open_model_for(const OpenRequest& request) {
    return with_flag_words([&] { return open_model(request); });
}

LoadedSession load_session(const ModelOptions& o) {
    // Flag errors first, so a typo does not wait for a multi-gigabyte model to load.
    if (o.ctx_size < 0) throw UsageError("--ctx-size: must be > 0 (or 0 for the model's context)");
    if (o.threads < 0) throw UsageError("--threads: must be > 0 (or 0 for the number of physical cores)");
    OpenRequest request = open_request(o);
    std::unique_ptr<Tokenizer> tokenizer;
    request.on_file_opened = [&](const Model& m) { tokenizer = Tokenizer::from_gguf(m.file); };

    const auto t0 = std::chrono::steady_clock::now();
    OpenedModel opened = open_model_for(request);

    LoadedSession s;
    s.device = opened.backend->device_name();
    s.device_kind = opened.backend->device_kind();
    s.n_ctx = opened.context.n_ctx;
    s.ctx_origin = opened.context.origin;
    s.ctx_key = std::string(arch_name(opened.model->config.arch)) + ".context_length";
    s.session = std::make_unique<Session>(std::move(opened.backend), std::move(tokenizer), s.n_ctx, opened.model);
    s.load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return s;
}

void check_prompt_fits(const LoadedSession& loaded, const std::string& model_path, size_t n_tokens) {
    if (n_tokens <= static_cast<size_t>(loaded.n_ctx)) return;
    const std::string has = "the prompt has " + std::to_string(n_tokens) + " tokens but ";
    if (loaded.ctx_origin == ContextOrigin::model)
        throw InputError(model_path + ": " + has + "the model's own context length is " + std::to_string(loaded.n_ctx) +
                         " (" + loaded.ctx_key + "; give -c N to run it with a larger context)");
    const std::string why = loaded.ctx_origin == ContextOrigin::memory_cap
                                ? " (capped to fit memory; raise -c if it fits)"
                                : " (raise -c)";
    throw UsageError("--ctx-size: " + has + "the context is " + std::to_string(loaded.n_ctx) + why);
}

void add_prompt_cache_options(CLI::App& cmd, PromptCacheOptions& o) {
    cmd.add_option("--prompt-cache", o.dir,
                   "directory of the on-disk prompt cache (default: $XDG_CACHE_HOME/tern/prompts, else "
                   "~/.cache/tern/prompts)");
    cmd.add_flag("--no-prompt-cache", o.disabled, "neither read nor write the on-disk prompt cache");
    cmd.add_option("--prompt-cache-size", o.size,
                   "most bytes the prompt cache directory holds, least recently used entries evicted first; "
                   "suffixes K, M, G (default 1G)");
}

uint64_t prompt_cache_size_bytes(const PromptCacheOptions& o) {
    const std::optional<uint64_t> bytes = parse_byte_size(o.size);
    if (!bytes) throw UsageError("--prompt-cache-size: '" + o.size + "' is not a size (examples: 1073741824, 512M, 2G)");
    return *bytes;
}

void attach_prompt_cache(LoadedSession& loaded, const ModelOptions& model_options, const PromptCacheOptions& o) {
    if (o.disabled) return;
    const Model* model = loaded.session->model();
    if (!model) return;
    PrefixCacheOptions options;
    options.dir = o.dir.empty() ? default_prefix_cache_dir() : std::filesystem::path(o.dir);
    options.max_bytes = prompt_cache_size_bytes(o);
    if (options.dir.empty() || options.max_bytes == 0) return;
    KvProducer producer;
    producer.kv_type = kv_type_from_name(model_options.kv_type);
    producer.device = loaded.device_kind;
    producer.device_name = loaded.device;
    producer.rope_long_factors = model->config.rope_long_factors(loaded.n_ctx);
    const uint64_t identity = model_identity(*model, producer);
    loaded.session->set_prefix_cache(std::make_unique<PrefixCache>(
        std::move(options), identity, producer.kv_type,
        [](const PrefixCache::Warning& w) { std::cerr << "tern: prompt cache: " << prompt_cache_warning_line(w) << "\n"; }));
}

} // namespace tern::app
