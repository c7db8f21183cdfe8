#pragma once
// Flags shared by the commands that generate text (`run`, later `chat`): model and device
// options, sampling options, and loading a model into a ready Session. Spellings follow CLI.md
// (which follows llama.cpp).
#include <CLI/CLI.hpp>

#include <cstdint>
#include <memory>
#include <string>

#include "engine/chat/chat_template.h"
#include "engine/open_model.h"
#include "engine/speculative/drafter.h"
#include "engine/generation/sampler.h"
#include "engine/generation/session.h"

namespace tern::app {

struct ModelOptions {
    std::string model;             // -m
    std::string device = "auto";   // --device auto|cpu|cuda
    int threads = 0;               // -t; 0 = physical cores
    std::string kv_type = "f16";   // --kv-type
    int32_t ctx_size = 0;          // -c; 0 = the model's context, capped to what memory allows
    int32_t gpu_layers = -1;       // -ngl; -1 = all (on a GPU; ignored on the CPU)
    int32_t sequences = 1;         // not a flag: the KV cache's sequences (serve's and run --batch's --parallel)
};

// -m/--model (required), -c/--ctx-size, -t/--threads, --kv-type, --device, --gpu-layers.
void add_model_options(CLI::App& cmd, ModelOptions& options);

// A whole number in [min, max], checked on the text as typed (CLI11 would clamp a value beyond
// int64 to its limit). `meaning` ends the message, e.g. "-1 = until EOS". Attach with ->check().
CLI::Validator integer_in_range(int64_t min, int64_t max, const std::string& meaning);

// -n/--n-predict of run and chat: -1 (until EOS or the context is full) or a count.
CLI::Validator n_predict_range();

// The most -t/--threads accepts: 4x the hardware threads, at most 1024. More threads than that
// only contend for the same cores.
int max_threads();

// --chat-template: a name from ChatTemplate::names() or a template text tern recognises; anything
// else is refused with the list of names (a typo must not silently fall back to chatml).
CLI::Validator chat_template_check();

// The most tokens one draft may hold (--lookup K, --draft-max K): a draft is verified in one
// forward over K + 1 positions and acceptance falls off geometrically, so larger K only costs.
inline constexpr int32_t kMaxDraftTokens = 64;

struct SamplingOptions {
    SamplingParams params;   // llama.cpp's defaults: temp 0.8, top-k 40, top-p 0.95, min-p 0.05
    int64_t seed = -1;       // -1: a random seed, reported in the stats line and --json
};

// --temp, --top-k, --top-p, --min-p, --repeat-penalty, --repeat-last-n, --frequency-penalty,
// --presence-penalty, --seed.
void add_sampling_options(CLI::App& cmd, SamplingOptions& options);

// Validates the values and draws the seed when none was given.
SamplingParams resolve_sampling(const SamplingOptions& options);

// --repeat-guard / --no-repeat-guard and the thresholds --repeat-guard-count, -min-tokens,
// -long-span, -max-span (engine/generation/repeat_guard.h). Turns `params` on: the CLI's default.
void add_repeat_guard_options(CLI::App& cmd, RepeatGuardParams& params);

// Checks the thresholds before anything loads (UsageError naming the flag).
void check_repeat_guard(const RepeatGuardParams& params);

// The stderr note when the guard cut a loop: "repetition guard: cut a looping tail of ...".
std::string repeat_guard_note(const RepeatCut& cut);

// CLI11 only knows one-letter single-dash options; llama.cpp users type `-ngl 99`. Rewrites such
// spellings in argv to their long form before parsing ("-ngl" -> "--gpu-layers").
void rewrite_llama_aliases(int argc, char** argv);

// llama.cpp's CLI reads \n, \r, \t, \\, \', \" and \xHH in -p and stop strings as escapes, and
// users' scripts rely on it; other backslashes are kept as typed.
std::string process_escapes(std::string_view text);

// The chat format of a session: the one --chat-template names (or template text to recognise),
// else the model's tokenizer.chat_template; Gemma-family and gpt-oss files without one get their format. Prints the
// line about an unrecognised or missing template on stderr.
// `reasoning_effort` (--reasoning-effort; empty: the format's default) goes to a reasoning model's format.
ChatTemplate resolve_chat_template(const Session& session, const std::string& template_override,
                                   const std::string& reasoning_effort = "");
// --reasoning-effort low|medium|high: what gpt-oss's harmony system message asks for.
void add_reasoning_effort_option(CLI::App& cmd, std::string& effort);

struct LoadedSession;

// Speculative decoding, shared by run and chat: --lookup [K], --lookup-ngram N, --draft-model
// PATH, --draft-max K.
struct DraftOptions {
    int32_t lookup = 0;          // --lookup [K]: prompt-lookup drafts of up to K tokens
    int32_t lookup_ngram = 3;    // --lookup-ngram N: longest n-gram matched
    std::string draft_model;     // --draft-model PATH
    int32_t draft_max = 8;       // --draft-max K
    CLI::Option* lookup_opt = nullptr;
    CLI::Option* lookup_ngram_opt = nullptr;
    CLI::Option* draft_max_opt = nullptr;
};
void add_draft_options(CLI::App& cmd, DraftOptions& options);
// Checks the values before anything loads (UsageError naming the flag).
void check_draft_options(const DraftOptions& options);
// The drafter the flags ask for (null: plain decoding). A draft model runs on the target's device
// with its context, KV type and threads.
std::unique_ptr<Drafter> make_drafter(const DraftOptions& options, const ModelOptions& model_options,
                                      const LoadedSession& loaded);

struct PromptCacheOptions {
    std::string dir;              // --prompt-cache DIR; empty: default_prefix_cache_dir()
    bool disabled = false;        // --no-prompt-cache
    std::string size = "1G";      // --prompt-cache-size BYTES (suffixes K, M, G, T)
};

// --prompt-cache, --no-prompt-cache, --prompt-cache-size.
void add_prompt_cache_options(CLI::App& cmd, PromptCacheOptions& options);

// Checks the size before anything loads (UsageError naming the flag).
uint64_t prompt_cache_size_bytes(const PromptCacheOptions& options);

struct LoadedSession {
    std::unique_ptr<Session> session;
    std::string device;    // "cpu", "cuda:0"
    DeviceKind device_kind = DeviceKind::cpu;
    int32_t n_ctx = 0;
    // Where n_ctx came from, for messages about a prompt that does not fit: -c (requested), the
    // model's own context length (this key), or that length capped to fit memory.
    ContextOrigin ctx_origin = ContextOrigin::requested;
    std::string ctx_key;   // "llama.context_length"
    double load_ms = 0;    // file open + checks + backend load + tokenizer
};

// The engine's open request for the model flags (engine/open_model.h), its notes printed on stderr
// (an automatic device choice, a context capped to memory). The caller may add its hooks.
OpenRequest open_request(const ModelOptions& options);

// Opens the model (open_request), its errors worded with the flags (app/engine_wording.h).
OpenedModel open_model_for(const OpenRequest& request);

// Opens the model, picks the device, sizes the context and builds the session. Prints at most a
// line or two on stderr (an automatic device choice, a context capped to memory).
LoadedSession load_session(const ModelOptions& options);

// Throws when a prompt of `n_tokens` does not fit the context, blaming what set it: -c (exit 1,
// "raise -c"), or, when no -c was given, the model's own context length (exit 2, naming the file
// and its key, with -c as the remedy).
void check_prompt_fits(const LoadedSession& loaded, const std::string& model_path, size_t n_tokens);

// Gives the session its on-disk prefix cache (engine/prefix_cache/prefix_cache.h), keyed by the loaded model
// and `model_options`' KV type; nothing when disabled or when no cache directory is known.
void attach_prompt_cache(LoadedSession& loaded, const ModelOptions& model_options, const PromptCacheOptions& options);

} // namespace tern::app
