// tern chat: an interactive conversation (../shared/CLI.md). On a terminal: line editing, history,
// multi-line input and /commands (app/repl.h), replies streamed as they come, Ctrl-C stopping a
// reply. With stdin not a terminal: one user turn per input line and one reply per turn on stdout,
// followed by a newline, and nothing else there (notices and per-turn statistics go to stderr), so
// scripts and tests can drive it. A reply may itself hold newlines, so --json frames each reply as
// one JSON object on one line (newlines inside it escaped): the unambiguous form for programs.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "app/commands.h"
#include "app/common_options.h"
#include "app/console.h"
#include "app/engine_wording.h"
#include "app/repl.h"
#include "app/signals.h"
#include "app/standard_streams.h"
#include "engine/chat/conversation.h"
#include "engine/chat/conversation_file.h"
#include "engine/chat/reply_channels.h"
#include "base/error.h"
#include "base/terminal_text.h"

namespace tern::app {

namespace {

struct ChatFlags {
    ModelOptions model;
    SamplingOptions sampling;
    DraftOptions draft;
    PromptCacheOptions prompt_cache;  // a conversation's opening turns are reused across runs
    RepeatGuardParams repeat_guard;   // on unless --no-repeat-guard
    int32_t n_predict = -1;
    std::string system;
    std::string chat_template;
    bool no_history = false;
    bool json = false;   // scripted chat: one JSON object per reply, on one line
    std::string reasoning_effort;   // gpt-oss: low, medium, high (empty: the format's default)
    std::string reasoning;   // "show" / "hide" a harmony reply's reasoning; empty: shown on a terminal only
};

struct Counts {
    int64_t turns = 0, prompt = 0, reused = 0, prefilled = 0, generated = 0, drafted = 0, accepted = 0;
    double prefill_ms = 0, decode_ms = 0;

    void add(const GenerateResult& r) {
        ++turns;
        prompt += r.n_prompt();
        reused += r.n_reused;
        prefilled += r.n_prefilled;
        generated += r.n_gen();
        drafted += r.n_drafted;
        accepted += r.n_accepted;
        prefill_ms += r.prefill_ms;
        decode_ms += r.decode_ms;
    }
    std::string describe() const {
        std::string s = "prompt " + std::to_string(prompt) + " tokens (" + std::to_string(reused) + " reused, " +
                        std::to_string(prefilled) + " prefilled" +
                        format_number(", %.1f tok/s)", prefill_ms > 0 ? prefilled * 1000.0 / prefill_ms : 0.0) + ", generated " +
                        std::to_string(generated) + " tokens" +
                        format_number(" (%.1f tok/s)", decode_ms > 0 ? generated * 1000.0 / decode_ms : 0.0);
        if (drafted > 0)
            s += ", drafts accepted " + std::to_string(accepted) + "/" + std::to_string(drafted) +
                 format_number(" (%.0f%%)", 100.0 * accepted / drafted);
        return s;
    }
};

// "1 turn", "2 turns": counts said in words.
std::string count_noun(int64_t n, const char* noun) {
    return std::to_string(n) + " " + noun + (n == 1 ? "" : "s");
}

constexpr const char* kHelp =
    "  /help               this list\n"
    "  /exit               quit (also Ctrl-D, or Ctrl-C twice at an empty prompt)\n"
    "  /clear              start a new conversation (the system prompt stays)\n"
    "  /system TEXT        set the system prompt (\"/system\" alone removes it)\n"
    "  /set NAME VALUE     temp, top-k, top-p, min-p, repeat-penalty, seed, n-predict\n"
    "  /stats              tokens reused and prefilled, generated, tok/s, drafts: last turn and totals\n"
    "  /save FILE          save the conversation with its KV cache\n"
    "  /load FILE          continue a saved conversation\n"
    "  Multi-line input: start with \"\"\" and end with \"\"\", or end a line with \\ to go on.\n"
    "  Ctrl-C stops a reply.\n";

class Chat {
public:
    Chat(const ChatFlags& flags, LoadedSession loaded, bool tty)
        : flags_(flags), loaded_(std::move(loaded)), session_(*loaded_.session), tty_(tty),
          conversation_(session_, resolve_chat_template(session_, flags.chat_template, flags.reasoning_effort),
                        flags.system) {
        conversation_.set_notice_callback(
            [](const ConversationNotice& n) { std::cerr << "tern: " << conversation_notice_line(n) << "\n"; });
        options_.n_predict = flags.n_predict < 0 ? -1 : flags.n_predict;
        options_.sampling = resolve_sampling(flags.sampling);
        drafter_ = make_drafter(flags.draft, flags.model, loaded_);
        options_.drafter = drafter_.get();
        options_.repeat_guard = flags.repeat_guard;
        options_.cancel = interrupt_.flag();
        // A reply that fills the context: drop the oldest turns, keep a quarter of the context free.
        options_.on_context_full = [this](Session&) { conversation_.make_room_for_reply(session_.n_ctx() / 4); };
        // Replies in channels (gpt-oss): the text keeps its control tokens so the reasoning and the answer can be
        // told apart; the answer is the reply, the reasoning is shown (dimmed on a colour terminal) or not.
        channels_ = conversation_.chat_template().reply_has_channels();
        options_.special_text = channels_;
        show_reasoning_ = flags.reasoning.empty() ? tty_ : flags.reasoning == "show";
        dim_ = tty_ && isatty(STDOUT_FILENO) && !(std::getenv("NO_COLOR") && *std::getenv("NO_COLOR"));
    }

    int run() { return tty_ ? run_terminal() : run_script(); }

private:
    // Notices and command output: stderr, so stdout carries only replies.
    void say(const std::string& line) { std::cerr << line << "\n"; }

    int run_script() {
        std::string line;
        while (std::getline(std::cin, line)) {
            if (!line.empty() && line.back() == '\r') line.pop_back();
            if (interrupt_.interrupted()) return static_cast<int>(ExitCode::interrupted);
            if (line.empty()) continue;
            if (line[0] == '/') {
                if (!command(line)) return 0;
                continue;
            }
            const GenerateResult r = turn(line, /*stream=*/!flags_.json);
            if (!stdout_ok_) return 0;
            if (!write_stdout(flags_.json ? reply_json(r) : std::string("\n"))) return 0;
            say("tern: turn " + std::to_string(totals_.turns) + ": " + last_.describe() + ", stop: " +
                std::string(stop_reason_name(r.stop_reason)));
            if (interrupt_.interrupted()) return static_cast<int>(ExitCode::interrupted);
        }
        return 0;
    }

    int run_terminal() {
        const bool color = isatty(STDOUT_FILENO) && !(std::getenv("NO_COLOR") && *std::getenv("NO_COLOR"));
        LineEditor editor(flags_.no_history ? std::string() : default_history_path(), color);
        say("tern chat: " + std::string(conversation_.chat_template().name()) + " format, " +
            std::to_string(loaded_.n_ctx) + "-token context. /help for commands, Ctrl-D to quit.");
        bool interrupted_last = false;
        for (;;) {
            const EditorInput in = editor.read();
            if (in.kind == EditorInput::Kind::eof) {
                write_stdout("\n");
                return 0;
            }
            if (in.kind == EditorInput::Kind::interrupt) {
                write_stdout("^C\n");
                if (in.was_empty && interrupted_last) return 0;
                if (in.was_empty) say("(Ctrl-C again or Ctrl-D to quit)");
                interrupted_last = in.was_empty;
                continue;
            }
            interrupted_last = false;
            if (in.text.empty()) continue;
            if (in.text[0] == '/' && in.text.find('\n') == std::string::npos) {
                if (!command(in.text)) return 0;
                continue;
            }
            const GenerateResult r = turn(in.text, /*stream=*/true);
            if (!stdout_ok_) return 0;
            // After Ctrl-C the terminal echoed "^C" behind the text: the prompt needs a new line.
            if (r.stop_reason == StopReason::cancelled || r.text.empty() || r.text.back() != '\n') write_stdout("\n");
            if (r.stop_reason == StopReason::cancelled) interrupted_last = true;
        }
    }

    // One reply as one line of JSON (--json): the text with its newlines escaped, why it stopped
    // and the turn's counts. Invalid UTF-8 from the model is replaced, so the line always parses.
    std::string reply_json(const GenerateResult& r) const {
        nlohmann::json j;
        j["turn"] = totals_.turns;
        j["text"] = r.text;
        if (channels_) j["reasoning"] = last_reasoning_;
        j["tokens"] = r.tokens;
        j["stop_reason"] = stop_reason_name(r.stop_reason);
        j["n_prompt"] = r.n_prompt();
        j["n_reused"] = r.n_reused;
        j["n_gen"] = r.n_gen();
        j["timings"] = {{"prefill_ms", r.prefill_ms}, {"decode_ms", r.decode_ms},
                        {"prefill_tps", r.prefill_tps()}, {"decode_tps", r.decode_tps()}};
        j["lookup"] = {{"drafted", r.n_drafted}, {"accepted", r.n_accepted}};
        j["context"] = {{"used", conversation_.tokens().size()}, {"size", session_.n_ctx()}};
        return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    }

    GenerateResult turn(const std::string& text, bool stream) {
        const int32_t n_ctx = session_.n_ctx();
        const int32_t reserve = options_.n_predict > 0 ? std::min(options_.n_predict, n_ctx / 2) : n_ctx / 4;
        GenerateResult r;
        std::vector<int32_t> prompt;
        try {
            prompt = conversation_.begin_turn(text, reserve);
        } catch (const NoRoomForReplyError& e) {
            say("tern: " + no_room_for_reply_message(e));
            return r;
        } catch (const UsageError& e) {
            say(std::string("tern: ") + e.what());
            return r;
        }
        if (tty_) interrupt_.clear();   // a stray SIGINT at the prompt must not cancel this reply
        TextCallback on_text;
        if (stream) on_text = [this](std::string_view piece) { return stdout_ok_ = write_stdout(piece); };
        ReplyChannels channels(
            [this, stream, shown = false, apart = false](ReplyPart part, std::string_view text) mutable {
                if (!stream) return true;
                if (part == ReplyPart::reasoning) {
                    if (!show_reasoning_) return true;
                    shown = true;
                    const std::string shown(text);
                    return stdout_ok_ = write_stdout(dim_ ? "\x1b[2m" + shown + "\x1b[0m" : shown);
                }
                if (shown && !apart) {   // a blank line between the reasoning and the answer
                    apart = true;
                    if (!(stdout_ok_ = write_stdout("\n\n"))) return false;
                }
                return stdout_ok_ = write_stdout(text);
            });
        if (channels_) on_text = [&channels](std::string_view piece) { return channels.push(piece); };
        r = session_.generate(prompt, options_, on_text);
        if (r.stop_reason == StopReason::repetition)   // on a terminal the reply's line is still open
            say(std::string(tty_ ? "\n" : "") + "tern: " + repeat_guard_note(r.repeat_cut));
        conversation_.end_turn(r);
        if (channels_) {   // the reply is its answer from here on; the history already keeps only that
            if (stream) channels.finish();
            SplitReply split = split_reply_channels(r.text);
            r.text = std::move(split.answer);
            last_reasoning_ = std::move(split.reasoning);
        }
        last_ = Counts{};
        last_.add(r);
        totals_.add(r);
        if (tty_) interrupt_.clear();   // Ctrl-C stopped this reply, not the program
        return r;
    }

    // Runs a /command; false to quit.
    bool command(const std::string& line) {
        std::istringstream words(line);
        std::string name;
        words >> name;
        std::string rest;
        std::getline(words, rest);
        rest.erase(0, rest.find_first_not_of(" \t"));
        while (!rest.empty() && (rest.back() == ' ' || rest.back() == '\t')) rest.pop_back();

        if (name == "/exit" || name == "/quit" || name == "/bye") return false;
        if (name == "/help") {
            std::cerr << kHelp;
        } else if (name == "/clear") {
            conversation_.clear();
            say("(new conversation)");
        } else if (name == "/system") {
            conversation_.set_system(rest);
            say(rest.empty() ? "(system prompt removed)" : "(system prompt set)");
        } else if (name == "/set") {
            set(rest);
        } else if (name == "/stats") {
            say("last turn: " + (last_.turns ? last_.describe() : std::string("none yet")));
            say("totals: " + count_noun(totals_.turns, "turn") + ", " + totals_.describe());
            say("context: " + std::to_string(conversation_.tokens().size()) + " of " +
                std::to_string(session_.n_ctx()) + " tokens, " + count_noun(conversation_.n_dropped_turns(), "turn") +
                " dropped (" + count_noun(conversation_.n_dropped_tokens(), "token") + ")");
        } else if (name == "/save") {
            if (rest.empty()) return say("tern: /save: give a file name (/save FILE)"), true;
            try {
                save_conversation(rest, conversation_, session_, settings());
                say("(saved to " + rest + ")");
            } catch (const TernError& e) {
                say(std::string("tern: ") + e.what());
            }
        } else if (name == "/load") {
            if (rest.empty()) return say("tern: /load: give a file name (/load FILE)"), true;
            try {
                SavedConversation saved = read_conversation(rest, session_);
                // Checked before anything changes: a damaged file leaves the conversation as it was.
                const LoadedSettings loaded = settings_from_file(rest, saved.settings);
                apply_conversation(std::move(saved), session_, conversation_);
                options_.sampling = loaded.sampling;
                options_.n_predict = loaded.n_predict;
                say("(loaded " + rest + ": " + std::to_string(conversation_.messages().size()) + " messages, " +
                    std::to_string(conversation_.tokens().size()) + " tokens)");
            } catch (const ConversationMismatch& e) {
                say("tern: /load: " + conversation_mismatch_message(e) + " (the conversation is unchanged)");
            } catch (const TernError& e) {
                say(std::string("tern: /load: ") + e.what() + " (the conversation is unchanged)");
            }
        } else {
            say("tern: unknown command " + name + " (/help lists the commands)");
        }
        return true;
    }

    void set(const std::string& args) {
        std::istringstream in(args);
        std::string name, value;
        in >> name >> value;
        if (name.empty() || value.empty()) {
            say("tern: /set NAME VALUE, NAME one of temp, top-k, top-p, min-p, repeat-penalty, seed, n-predict");
            return;
        }
        SamplingOptions next;
        next.params = options_.sampling;
        next.seed = static_cast<int64_t>(options_.sampling.seed);
        int32_t n_predict = options_.n_predict;
        try {
            size_t used = 0;
            auto as_float = [&] { return std::stof(value, &used); };
            auto as_int = [&] { return std::stoll(value, &used); };
            if (name == "temp") next.params.temp = as_float();
            else if (name == "top-k") next.params.top_k = static_cast<int32_t>(as_int());
            else if (name == "top-p") next.params.top_p = as_float();
            else if (name == "min-p") next.params.min_p = as_float();
            else if (name == "repeat-penalty") next.params.repeat_penalty = as_float();
            else if (name == "seed") next.seed = as_int();
            else if (name == "n-predict") n_predict = static_cast<int32_t>(as_int());
            else {
                say("tern: /set: unknown setting '" + name +
                    "' (temp, top-k, top-p, min-p, repeat-penalty, seed, n-predict)");
                return;
            }
            if (used != value.size()) throw std::invalid_argument("trailing characters");
            options_.sampling = resolve_sampling(next);
            options_.n_predict = n_predict < 0 ? -1 : n_predict;
            say("(" + name + " = " + value + ")");
        } catch (const TernError& e) {
            say(std::string("tern: /set ") + e.what());
        } catch (const std::exception&) {
            say("tern: /set " + name + ": '" + value + "' is not a number");
        }
    }

    nlohmann::json settings() const {
        const SamplingParams& p = options_.sampling;
        return {{"temp", p.temp},         {"top_k", p.top_k},
                {"top_p", p.top_p},       {"min_p", p.min_p},
                {"repeat_penalty", p.repeat_penalty}, {"seed", p.seed},
                {"n_predict", options_.n_predict}};
    }

    struct LoadedSettings {
        SamplingParams sampling;
        int32_t n_predict = -1;
    };

    // A loaded file's settings, checked as /set checks a value (engine/chat/conversation_file.cpp has
    // already made sure each is a number): out of range or refused by resolve_sampling, the file is
    // damaged. Settings the file lacks keep their current values.
    LoadedSettings settings_from_file(const std::string& path, const nlohmann::json& s) const {
        const auto damaged = [&](const std::string& key, const std::string& what) {
            return InputError(path + ": the file is damaged: settings." + key + ": " + what);
        };
        const auto number = [&](const char* key, double lo, double hi, double current) {
            if (!s.contains(key)) return current;
            const double v = s.at(key).get<double>();
            if (!std::isfinite(v) || v < lo || v > hi)
                throw damaged(key, s.at(key).dump() + " is outside " + nlohmann::json(lo).dump() + ".." +
                                       nlohmann::json(hi).dump());
            return v;
        };
        const auto integer = [&](const char* key, int32_t current) {
            if (s.contains(key) && !s.at(key).is_number_integer()) throw damaged(key, "expected an integer");
            return static_cast<int32_t>(number(key, INT32_MIN, INT32_MAX, current));
        };
        constexpr double kFloat = 1e30;   // beyond any meaningful value, inside float's range
        SamplingOptions next;
        next.params = options_.sampling;
        next.params.temp = static_cast<float>(number("temp", -kFloat, kFloat, next.params.temp));
        next.params.top_k = integer("top_k", next.params.top_k);
        next.params.top_p = static_cast<float>(number("top_p", -kFloat, kFloat, next.params.top_p));
        next.params.min_p = static_cast<float>(number("min_p", -kFloat, kFloat, next.params.min_p));
        next.params.repeat_penalty =
            static_cast<float>(number("repeat_penalty", -kFloat, kFloat, next.params.repeat_penalty));
        next.seed = 0;   // the saved seed is set below, as saved (resolve_sampling would draw a new one for -1)
        uint64_t seed = options_.sampling.seed;
        if (s.contains("seed")) {
            const nlohmann::json& v = s.at("seed");
            if (!v.is_number_unsigned()) throw damaged("seed", v.dump() + " is not a seed (0..2^64-1)");
            seed = v.get<uint64_t>();
        }
        LoadedSettings out;
        try {
            out.sampling = resolve_sampling(next);
        } catch (const UsageError& e) {
            throw InputError(path + ": the file is damaged: its settings: " + e.what());
        }
        out.sampling.seed = seed;
        const int32_t n_predict = integer("n_predict", options_.n_predict);
        out.n_predict = n_predict < 0 ? -1 : n_predict;
        return out;
    }

    const ChatFlags& flags_;
    LoadedSession loaded_;
    Session& session_;
    bool tty_ = false;
    InterruptGuard interrupt_;
    Conversation conversation_;
    GenerateOptions options_;
    std::unique_ptr<Drafter> drafter_;
    Counts last_, totals_;
    bool stdout_ok_ = true;
    bool channels_ = false;         // the template's replies carry channels (engine/chat/reply_channels.h)
    bool show_reasoning_ = false;   // stream a channelled reply's reasoning too
    bool dim_ = false;              // ... dimmed (a colour terminal)
    std::string last_reasoning_;    // the last channelled reply's reasoning (--json)
};

int run(const ChatFlags& f) {
    resolve_sampling(f.sampling);   // bad values fail before the model loads
    check_draft_options(f.draft);
    check_repeat_guard(f.repeat_guard);
    prompt_cache_size_bytes(f.prompt_cache);   // a bad size fails before the model loads
    const bool tty = isatty(STDIN_FILENO);
    if (f.json && tty)
        throw UsageError("--json: frames replies for scripts and needs stdin to be a pipe or a file, not a terminal "
                         "(drop --json to chat interactively)");
    LoadedSession loaded = load_session(f.model);
    attach_prompt_cache(loaded, f.model, f.prompt_cache);
    Chat chat(f, std::move(loaded), tty);
    return chat.run();
}

} // namespace

Command add_chat_command(CLI::App& root) {
    auto* cmd = root.add_subcommand("chat", "interactive conversation (a REPL on a terminal; one turn per line "
                                            "when stdin is not a terminal)");
    auto f = std::make_shared<ChatFlags>();
    add_model_options(*cmd, f->model);
    cmd->add_option("-n,--n-predict", f->n_predict,
                    "most tokens per reply; -1 = until the end of the turn (default -1)")
        ->check(n_predict_range());
    add_sampling_options(*cmd, f->sampling);
    add_repeat_guard_options(*cmd, f->repeat_guard);
    cmd->add_option("--system", f->system, "system prompt");
    std::string names;
    for (const std::string& n : ChatTemplate::names()) names += (names.empty() ? "" : ", ") + n;
    cmd->add_option("--chat-template", f->chat_template, "chat format instead of the model's template: " + names)
        ->check(chat_template_check());
    add_draft_options(*cmd, f->draft);
    add_prompt_cache_options(*cmd, f->prompt_cache);
    cmd->add_flag("--no-history", f->no_history,
                  "neither read nor write the input history ($XDG_STATE_HOME/tern/chat_history)");
    add_reasoning_effort_option(*cmd, f->reasoning_effort);
    cmd->add_option("--reasoning", f->reasoning,
                    "show or hide the reasoning of models that reply in channels (gpt-oss); default: shown on a "
                    "terminal, dimmed, and left out when stdin is not a terminal")
        ->check(CLI::Validator(
            [](std::string& text) -> std::string {
                if (text == "show" || text == "hide") return {};
                return "'" + terminal_safe(text.substr(0, 40)) + "' is not a choice: expected show or hide";
            },
            "", "show|hide"));
    cmd->add_flag("--json", f->json,
                  "stdin not a terminal: print each reply as one JSON object on its own line (text, tokens, "
                  "stop_reason, counts, timings) instead of the raw text");
    return {cmd, [f] { return run(*f); }};
}

} // namespace tern::app
