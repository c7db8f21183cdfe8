// tern run: one-shot completion (../shared/CLI.md). stdout carries only the completion (or one
// JSON document with --json); the load note and one statistics line go to stderr.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>

#include <nlohmann/json.hpp>

#include "app/commands.h"
#include "app/common_options.h"
#include "app/console.h"
#include "app/run_batch.h"
#include "app/signals.h"
#include "app/standard_streams.h"
#include "base/error.h"
#include "engine/backend.h"
#include "engine/chat/chat_template.h"
#include "engine/chat/reply_channels.h"
#include "engine/generation/context_shift.h"
#include "engine/generation/request_decoder.h"
#include "engine/model.h"
#include "engine/speculative/drafter.h"
#include "engine/speculative/drafter_model.h"
#include "formats/input_file.h"

namespace tern::app {

namespace {

struct RunFlags {
    ModelOptions model;
    SamplingOptions sampling;
    RepeatGuardParams repeat_guard;   // on unless --no-repeat-guard
    PromptCacheOptions prompt_cache;
    std::string prompt;
    std::string file;
    int32_t n_predict = 256;
    std::vector<std::string> stop;
    bool echo = false;
    bool chat = false;
    std::string system;
    std::string chat_template;
    std::string reasoning_effort;   // gpt-oss under --chat: low, medium, high (empty: the format's default)
    bool json = false;
    int32_t logprobs = 0;        // --logprobs N: each generated token's log-probability and its step's top N
    bool no_bos = false;
    bool no_parse_special = false; // a raw prompt's control-token texts are text
    bool no_escape = false;
    int32_t keep = -1;           // --keep N: positions a context shift keeps (-1: the prompt)
    bool no_context_shift = false;
    DraftOptions draft;
    std::string batch;           // --batch FILE: JSON lines in, JSON lines out (app/run_batch.h)
    bool unordered = false;
    int32_t parallel = 1;
    CLI::Option* batch_opt = nullptr;
    CLI::Option* keep_opt = nullptr;
    CLI::Option* parallel_opt = nullptr;
    CLI::Option* prompt_opt = nullptr;
    CLI::Option* file_opt = nullptr;
    CLI::Option* system_opt = nullptr;
};

// -f and stdin drop one trailing newline, as llama.cpp's -f does: files and `echo` end with one,
// and the model should continue the text, not start after a line break.
std::string drop_one_newline(std::string s) {
    if (!s.empty() && s.back() == '\n') s.pop_back();
    if (!s.empty() && s.back() == '\r') s.pop_back();
    return s;
}

std::string read_prompt(const RunFlags& f) {
    if (f.prompt_opt->count() > 0) return f.prompt;
    if (f.file_opt->count() > 0) {
        return drop_one_newline(read_input_file(f.file, "the prompt file (-f)", kMaxTextFileBytes));
    }
    if (isatty(STDIN_FILENO))
        throw UsageError("no prompt: give -p TEXT, -f FILE, or pipe the prompt on stdin");
    return drop_one_newline(read_standard_input("the prompt", kMaxTextFileBytes));
}

// --no-parse-special is about raw prompts; under --chat every prompt is a message, always read as text.
void check_parse_special_flag(const RunFlags& f) {
    if (f.no_parse_special && f.chat)
        throw UsageError("--no-parse-special: not with --chat (a chat message's text is always read as text; only "
                         "the template's markers are control tokens)");
}

// --batch: the same model, sampling and chat flags, as defaults for every line.
int run_batch_file(const RunFlags& f) {
    resolve_sampling(f.sampling);
    check_repeat_guard(f.repeat_guard);
    prompt_cache_size_bytes(f.prompt_cache);
    const auto refuse = [](const char* flag, const char* why) {
        throw UsageError(std::string(flag) + ": not with --batch (" + why + ")");
    };
    if (f.json) refuse("--json", "its output is one JSON object per request already");
    if (f.echo) refuse("--echo", "each output line holds the completion only");
    if (f.logprobs > 0) refuse("--logprobs", "the batch's output lines carry no log-probabilities");
    if (f.no_bos) refuse("--no-bos", "every prompt gets the vocabulary's BOS");
    if (f.keep_opt->count() > 0 || f.no_context_shift)
        refuse(f.no_context_shift ? "--no-context-shift" : "--keep",
               "a batch never shifts its context: a request stops when the context is full (stop_reason context)");
    if ((f.draft.lookup_opt && f.draft.lookup_opt->count() > 0) || !f.draft.draft_model.empty())
        refuse(f.draft.draft_model.empty() ? "--lookup" : "--draft-model", "batches decode without drafting");
    if (f.system_opt->count() > 0 && !f.chat)
        throw UsageError("--system: only with --chat (the system turn of the chat template)");
    check_parse_special_flag(f);

    BatchRunOptions o;
    o.unordered = f.unordered;
    o.parallel = f.parallel;
    o.defaults.sampling = f.sampling.params;
    o.defaults.seed = f.sampling.seed;
    o.defaults.n_predict = f.n_predict;
    o.defaults.stop = f.stop;
    if (!f.no_escape)
        for (std::string& s : o.defaults.stop) s = process_escapes(s);
    o.repeat_guard = f.repeat_guard;
    o.chat = f.chat;
    o.system = f.system;
    o.chat_template = f.chat_template;
    o.reasoning_effort = f.reasoning_effort;
    o.parse_special = !f.no_parse_special;

    const std::string input = read_batch_input(f.batch);   // a missing file fails before the model loads
    ModelOptions model = f.model;
    model.sequences = f.parallel;   // the KV pool holds a full context for each sequence
    LoadedSession loaded = load_session(model);
    attach_prompt_cache(loaded, f.model, f.prompt_cache);
    return run_batch(input, loaded, o);
}

// --logprobs: per generated token {"id", "logprob", "top_logprobs": [{"id", "logprob"}, ...]}, most likely first.
nlohmann::json logprobs_json(const std::vector<TokenLogprobs>& steps) {
    nlohmann::json out = nlohmann::json::array();
    for (const TokenLogprobs& s : steps) {
        nlohmann::json top = nlohmann::json::array();
        for (const TokenLogprob& t : s.top) top.push_back({{"id", t.id}, {"logprob", t.logprob}});
        out.push_back({{"id", s.token}, {"logprob", s.logprob}, {"top_logprobs", std::move(top)}});
    }
    return out;
}

int run(const RunFlags& f) {
    if (f.batch_opt->count() > 0) return run_batch_file(f);
    if (f.unordered) throw UsageError("--unordered: only with --batch");
    if (f.parallel_opt->count() > 0) throw UsageError("--parallel: only with --batch (or tern serve)");
    check_parse_special_flag(f);
    const SamplingParams sampling = resolve_sampling(f.sampling);
    check_repeat_guard(f.repeat_guard);
    check_draft_options(f.draft);
    prompt_cache_size_bytes(f.prompt_cache);   // a bad size fails before the model loads
    if (f.keep < -1) throw UsageError("--keep: N must be >= 0, or -1 for the whole prompt");
    if (f.system_opt->count() > 0 && !f.chat)
        throw UsageError("--system: only with --chat (the system turn of the chat template)");
    if (!f.chat_template.empty() && !f.chat) throw UsageError("--chat-template: only with --chat");
    if (!f.reasoning_effort.empty() && !f.chat) throw UsageError("--reasoning-effort: only with --chat");
    if (f.logprobs > 0 && !f.json)
        throw UsageError("--logprobs: only with --json (the log-probabilities are a field of its document)");
    std::string prompt = read_prompt(f);
    if (f.prompt_opt->count() > 0 && !f.no_escape) prompt = process_escapes(prompt);
    std::vector<std::string> stops = f.stop;
    if (!f.no_escape)
        for (std::string& s : stops) s = process_escapes(s);

    LoadedSession loaded = load_session(f.model);
    if (f.keep >= loaded.n_ctx)
        throw UsageError("--keep: " + std::to_string(f.keep) + " tokens is not less than the context (" +
                         std::to_string(loaded.n_ctx) + " tokens); give fewer, or -1 to keep the prompt");
    attach_prompt_cache(loaded, f.model, f.prompt_cache);
    Session& session = *loaded.session;
    const std::unique_ptr<Drafter> drafter = make_drafter(f.draft, f.model, loaded);

    // A chat reply in channels (gpt-oss): its answer is the output, its reasoning only in --json.
    bool channels = false;
    std::vector<int32_t> tokens;
    if (f.chat) {
        // The template's markers are control tokens; the prompt and --system are text, whatever they hold.
        const ChatTemplate tmpl = resolve_chat_template(session, f.chat_template, f.reasoning_effort);
        const PromptText spans = tmpl.render_prompt_spans(f.system, prompt);
        prompt = spans.text();
        tokens = session.tokenizer().encode_prompt(spans, !f.no_bos);
        channels = tmpl.reply_has_channels();
    } else {
        // As llama.cpp's CLI: "<|im_start|>" in a raw prompt is the control token (--no-parse-special: text).
        tokens = session.tokenizer().encode(prompt,
                                            EncodeOptions{.add_bos = !f.no_bos, .parse_special = !f.no_parse_special});
    }
    if (!start_empty_prompt(tokens, session.tokenizer(), !f.no_bos))
        throw UsageError("-p: " + std::string(empty_prompt_refusal()));
    check_prompt_fits(loaded, f.model.model, tokens.size());

    GenerateOptions opts;
    opts.n_predict = f.n_predict < 0 ? -1 : f.n_predict;
    opts.sampling = sampling;
    opts.stop = std::move(stops);
    opts.drafter = drafter.get();
    // -n beyond the context: shift it when full (engine/generation/context_shift.h). -n -1 still ends at the
    // end of the context (CLI.md), or it would never end on a model that emits no EOS.
    bool shift_noted = false;
    if (!f.no_context_shift && opts.n_predict > 0) {
        const int32_t n_prompt = static_cast<int32_t>(tokens.size());
        const int32_t n_keep = f.keep < 0 ? std::min(n_prompt, loaded.n_ctx / 2) : std::min(f.keep, n_prompt);
        opts.on_context_full = [n_keep, &shift_noted](Session& s) {
            const int32_t dropped = shift_context(s, n_keep);
            if (dropped > 0 && !shift_noted) {
                std::cerr << "tern: the context (" << s.n_ctx() << " tokens) is full: keeping the first " << n_keep
                          << " and dropping the older half of the rest (" << dropped
                          << " tokens), each time it fills (--no-context-shift stops instead)\n";
                shift_noted = true;
            }
        };
    }
    opts.repeat_guard = f.repeat_guard;
    opts.logprobs = f.logprobs > 0 ? f.logprobs : -1;
    opts.special_text = channels;

    bool stdout_ok = true;
    if (f.echo && !f.json) stdout_ok = write_stdout(prompt);

    InterruptGuard interrupt;
    opts.cancel = interrupt.flag();
    GenerateResult r;
    if (stdout_ok) {
        TextCallback on_text;
        ReplyChannels split_stream([&](ReplyPart part, std::string_view text) {
            return part == ReplyPart::reasoning || (stdout_ok = write_stdout(text));
        });
        if (!f.json) on_text = [&](std::string_view piece) { return stdout_ok = write_stdout(piece); };
        if (!f.json && channels) on_text = [&](std::string_view piece) { return split_stream.push(piece); };
        r = session.generate(tokens, opts, on_text);
        if (!f.json && channels) split_stream.finish();
    }
    std::string reasoning;
    if (channels) {
        SplitReply split = split_reply_channels(r.text);
        r.text = std::move(split.answer);
        reasoning = std::move(split.reasoning);
    }
    const bool interrupted = interrupt.interrupted();

    // stdout is gone: the reader has what it wanted. Exit quietly, as `cat | head` does.
    if (!stdout_ok) return 0;

    std::string reason{stop_reason_name(r.stop_reason)};
    if (interrupted) reason = "interrupted";
    if (f.json) {
        nlohmann::json j;
        j["text"] = r.text;
        if (channels) j["reasoning"] = reasoning;
        j["prompt_tokens"] = r.prompt_tokens;
        j["tokens"] = r.tokens;
        j["n_prompt"] = r.n_prompt();
        j["n_gen"] = r.n_gen();
        j["stop_reason"] = reason;
        j["timings"] = {{"load_ms", loaded.load_ms},     {"prefill_ms", r.prefill_ms},
                        {"decode_ms", r.decode_ms},      {"prefill_tps", r.prefill_tps()},
                        {"decode_tps", r.decode_tps()}};
        j["lookup"] = {{"drafted", r.n_drafted}, {"accepted", r.n_accepted}};
        j["prefix_cache"] = {{"reused_tokens", r.n_reused}, {"disk_tokens", r.n_from_disk}};
        j["device"] = loaded.device;
        j["model"] = f.model.model;
        j["seed"] = sampling.seed;
        if (f.logprobs > 0) j["logprobs"] = logprobs_json(r.logprobs);
        // Invalid UTF-8 in generated bytes (random models emit lone byte tokens) is replaced,
        // not thrown on: the JSON must always be printed.
        const std::string doc = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
        if (!write_stdout(doc)) return 0;
    } else if (isatty(STDOUT_FILENO)) {
        write_stdout("\n");   // keep the shell prompt off the last line; pipes get the exact text
    }

    if (r.stop_reason == StopReason::repetition) std::cerr << "tern: " << repeat_guard_note(r.repeat_cut) << "\n";
    std::string stats = "tern: prompt " + std::to_string(r.n_prompt()) + " tokens";
    if (r.n_reused > 0) {
        stats += " (" + std::to_string(r.n_reused) + " cached";
        if (r.n_from_disk > 0) stats += ", " + std::to_string(r.n_from_disk) + " restored from disk";
        stats += ")";
    }
    stats += format_number(" in %.1f ms", r.prefill_ms) + format_number(" (%.1f tok/s)", r.prefill_tps()) + ", generated " +
             std::to_string(r.n_gen()) + format_number(" in %.1f ms", r.decode_ms) + format_number(" (%.1f tok/s)", r.decode_tps()) +
             ", stop: " + reason + ", " + loaded.device;
    if (drafter) {
        stats += ", " + std::string(drafter->name()) + " drafted " + std::to_string(r.n_drafted) + ", accepted " +
                 std::to_string(r.n_accepted);
        if (r.n_drafted > 0) stats += format_number(" (%.0f%%)", 100.0 * r.n_accepted / r.n_drafted);
    }
    if (sampling.temp > 0.0f) stats += ", seed " + std::to_string(sampling.seed);
    std::cerr << stats << "\n";
    return interrupted ? static_cast<int>(ExitCode::interrupted) : 0;
}

} // namespace

Command add_run_command(CLI::App& root) {
    auto* cmd = root.add_subcommand("run", "one-shot completion of a prompt (-p, -f or stdin), streamed to stdout");
    auto f = std::make_shared<RunFlags>();
    add_model_options(*cmd, f->model);
    f->prompt_opt = cmd->add_option("-p,--prompt", f->prompt, "prompt text");
    f->file_opt = cmd->add_option("-f,--file", f->file, "read the prompt from a file (one trailing newline dropped)");
    f->prompt_opt->excludes(f->file_opt);
    cmd->add_option("-n,--n-predict", f->n_predict,
                    "tokens to generate; -1 = until EOS or the context is full (default 256)")
        ->check(n_predict_range());
    add_sampling_options(*cmd, f->sampling);
    add_repeat_guard_options(*cmd, f->repeat_guard);
    add_prompt_cache_options(*cmd, f->prompt_cache);
    cmd->add_option("--stop", f->stop, "stop when this text appears; it is not printed (repeatable)")
        ->allow_extra_args(false);
    cmd->add_flag("--echo", f->echo, "print the prompt before the completion");
    cmd->add_flag("--chat", f->chat, "wrap the prompt in the model's chat template as one user turn");
    f->system_opt = cmd->add_option("--system", f->system, "system message for --chat");
    std::string names;
    for (const std::string& n : ChatTemplate::names()) names += (names.empty() ? "" : ", ") + n;
    cmd->add_option("--chat-template", f->chat_template,
                    "chat format for --chat instead of the model's template: " + names)
        ->check(chat_template_check());
    add_reasoning_effort_option(*cmd, f->reasoning_effort);
    add_draft_options(*cmd, f->draft);
    f->keep_opt = cmd->add_option("--keep", f->keep,
                    "when -n goes past a full context, keep the first N tokens (BOS included) and drop the "
                    "older half of the rest, then go on (default -1: the whole prompt, at most half the context)")
        ->check(integer_in_range(-1, INT32_MAX, "-1 = the whole prompt, at most half the context"));
    cmd->add_flag("--no-context-shift", f->no_context_shift,
                  "stop at a full context (stop_reason context) instead of shifting it");
    cmd->add_flag("--json", f->json, "print one JSON document (text, tokens, timings, ...) instead of the text");
    cmd->add_option("--logprobs", f->logprobs,
                    "with --json: each generated token's log-probability and its step's N most likely tokens "
                    "(the model's raw distribution, before penalties and temperature)")
        ->check(integer_in_range(0, 100, "tokens per step"));
    f->batch_opt = cmd->add_option("--batch", f->batch,
                                   "run many requests: FILE (- for stdin) holds one JSON object per line ({\"prompt\": "
                                   "..} or {\"messages\": [..]}, optional \"id\", max_tokens, temperature, seed, stop, "
                                   "...); stdout gets one JSON line per request, in input order");
    f->batch_opt->excludes(f->prompt_opt)->excludes(f->file_opt);
    cmd->add_flag("--unordered", f->unordered, "--batch: write each output line as its request finishes");
    f->parallel_opt = cmd->add_option("--parallel", f->parallel, "--batch: sequences decoded together (default 1)")
                          ->check(integer_in_range(1, 256, "sequences"));
    cmd->add_flag("--no-bos", f->no_bos, "do not add the BOS token (nor EOS) to the prompt");
    cmd->add_flag("--no-parse-special", f->no_parse_special,
                  "read control-token texts such as <start_of_turn> in a raw prompt (-p, -f, --batch \"prompt\" "
                  "lines) as text (a chat message's text always is)");
    cmd->add_flag("--no-escape", f->no_escape,
                  "take -p and --stop literally (default: \\n, \\t, \\xHH... are escapes)");
    return {cmd, [f] { return run(*f); }};
}

} // namespace tern::app
