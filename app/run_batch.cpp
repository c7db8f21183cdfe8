#include "app/run_batch.h"

#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <iostream>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "app/console.h"
#include "app/serve/api_error.h"
#include "app/serve/api_response.h"
#include "app/serve/prompt_maker.h"
#include "app/signals.h"
#include "app/standard_streams.h"
#include "base/error.h"
#include "engine/batch/batch_engine.h"
#include "engine/chat/reply_channels.h"
#include "formats/input_file.h"

namespace tern::app {

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

// One non-blank input line, read and checked before anything runs.
struct BatchLine {
    int64_t line_no = 0;                      // 1-based, in the file
    json id;                                  // the line's "id", else its line number
    std::optional<GenerationRequest> request; // empty: `error` says why
    ApiError error;
};

std::vector<BatchLine> read_lines(const std::string& input, const RequestDefaults& defaults) {
    std::vector<BatchLine> lines;
    size_t pos = 0;
    int64_t line_no = 0;
    while (pos < input.size()) {
        size_t end = input.find('\n', pos);
        if (end == std::string::npos) end = input.size();
        const std::string_view text(input.data() + pos, end - pos);
        pos = end + 1;
        ++line_no;
        if (text.find_first_not_of(" \t\r") == std::string_view::npos) continue; // blank lines are no requests
        BatchLine l;
        l.line_no = line_no;
        l.id = line_no;
        try {
            const json j = parse_request_json(text, "the line");
            if (const auto id = j.find("id"); id != j.end() && !id->is_null()) l.id = *id;
            l.request = read_generation_request(j, RequestKind::batch_line, defaults);
        } catch (const ApiException& e) {
            l.error = e.error();
        }
        lines.push_back(std::move(l));
    }
    return lines;
}

// Output lines keep their keys in this order ("id" first), unlike nlohmann::json's sorted objects.
using ordered = nlohmann::ordered_json;

std::string dump_line(const ordered& j) {
    return j.dump(-1, ' ', false, ordered::error_handler_t::replace) + "\n";
}

std::string error_line(const BatchLine& l, const ApiError& e) {
    ordered j;
    j["id"] = l.id;
    j["error"] = {{"message", e.message},
                  {"type", e.type},
                  {"param", e.param.empty() ? ordered(nullptr) : ordered(e.param)},
                  {"code", e.code.empty() ? ordered(nullptr) : ordered(e.code)}};
    return dump_line(j);
}

std::string result_line(const BatchLine& l, const BatchResult& r, bool channels) {
    ordered j;
    j["id"] = l.id;
    if (channels) {
        const SplitReply split = split_reply_channels(r.text);
        j["text"] = split.answer;
        j["reasoning"] = split.reasoning;
    } else {
        j["text"] = r.text;
    }
    j["n_prompt"] = r.n_prompt;
    j["n_gen"] = r.n_gen();
    j["stop_reason"] = stop_reason_name(r.stop_reason);
    if (l.request->sampling.temp > 0.0f) j["seed"] = l.request->sampling.seed;
    j["timings"] = {{"queue_ms", r.timings.queue_ms},
                    {"first_token_ms", r.timings.first_token_ms},
                    {"prefill_ms", r.timings.prefill_ms},
                    {"decode_ms", r.timings.decode_ms},
                    {"total_ms", r.timings.total_ms}};
    return dump_line(j);
}

// Writes lines in input order (holding those that finish early) or as they come.
class Output {
public:
    Output(size_t n, bool unordered) : lines_(n), unordered_(unordered) {}

    // False once stdout is gone.
    bool put(size_t index, std::string line) {
        if (!ok_) return false;
        if (unordered_) return ok_ = write_stdout(line);
        lines_[index] = std::move(line);
        while (next_ < lines_.size() && lines_[next_]) {
            if (!(ok_ = write_stdout(*lines_[next_]))) return false;
            lines_[next_].reset();
            ++next_;
        }
        return true;
    }
    // Interrupted: what finished, in order, past the first request that did not.
    void flush_rest() {
        for (size_t i = next_; ok_ && i < lines_.size(); ++i)
            if (lines_[i]) ok_ = write_stdout(*lines_[i]);
    }
    bool ok() const { return ok_; }

private:
    std::vector<std::optional<std::string>> lines_;
    size_t next_ = 0;
    bool unordered_;
    bool ok_ = true;
};

} // namespace

std::string read_batch_input(const std::string& file) {
    if (file == "-") return read_standard_input("the batch input (--batch -)", kMaxTextFileBytes);
    return read_input_file(file, "the batch file (--batch)", kMaxTextFileBytes);
}

int run_batch(const std::string& input, LoadedSession& loaded, const BatchRunOptions& o) {
    Session& session = *loaded.session;
    const std::vector<BatchLine> lines = read_lines(input, o.defaults);
    bool any_chat = o.chat;
    for (const BatchLine& l : lines)
        any_chat = any_chat || (l.request && l.request->chat);
    // The template is resolved (with its note on stderr) only when some line needs it.
    const PromptMaker prompts(session.tokenizer(),
                              any_chat ? resolve_chat_template(session, o.chat_template, o.reasoning_effort)
                                       : *ChatTemplate::from_name("chatml"),
                              loaded.n_ctx,
                              {.wrap_prompts = o.chat, .system = o.system, .parse_special = o.parse_special});

    // At most this many requests handed to the engine at once: enough to keep `parallel` sequences
    // busy, few enough that the waiting queue never refuses one.
    const int32_t window = std::max(2 * o.parallel, 4);
    BatchEngine engine(served_model(session), {.parallel = o.parallel, .max_waiting = window});

    std::mutex mutex;
    std::condition_variable finished_cv;
    std::deque<std::pair<size_t, BatchResult>> finished;

    Output out(lines.size(), o.unordered);
    InterruptGuard interrupt;
    ProgressBar bar("batch", lines.size());
    const Clock::time_point t0 = Clock::now();
    Clock::time_point last_line = t0;
    size_t next = 0, outstanding = 0, done = 0, refused = 0, failed = 0;
    uint64_t n_prompt = 0, n_gen = 0;
    bool interrupted = false;

    const auto progress = [&](bool force) {
        bar.set_label("batch " + std::to_string(done) + "/" + std::to_string(lines.size()));
        bar.update(done);
        if (bar.enabled()) return;
        const Clock::time_point now = Clock::now();
        if (!force && now - last_line < std::chrono::seconds(10)) return;
        last_line = now;
        const double s = std::chrono::duration<double>(now - t0).count();
        std::cerr << "tern: batch: " << done << " of " << lines.size() << " done (" << refused + failed << " failed), "
                  << n_gen << " tokens generated" << format_number(" (%.1f tok/s)", s > 0 ? n_gen / s : 0.0) << "\n";
    };

    // The engine runs on this thread, the one that loaded the model (a GPU's current device is a
    // per-thread setting of the CUDA runtime); the driver hands it the lines and writes the answers.
    std::exception_ptr driver_error;
    const auto drive = [&] {
        while (done < lines.size() && out.ok()) {
            if (interrupt.interrupted()) {
                interrupted = true;
                break;
            }
            // Hand over lines while the window has room; refused lines are answered at once.
            while (next < lines.size() && outstanding < static_cast<size_t>(window) && out.ok()) {
                const size_t i = next++;
                const BatchLine& l = lines[i];
                std::optional<ApiError> refusal;
                if (!l.request) refusal = l.error;
                BatchRequest br;
                if (!refusal) {
                    try {
                        br.prompt = prompts.prepare(*l.request).tokens;
                    } catch (const ApiException& e) {
                        refusal = e.error();
                    }
                }
                if (!refusal) {
                    br.n_predict = l.request->max_tokens;
                    br.sampling = l.request->sampling;
                    br.stop = l.request->stop;
                    br.repeat_guard = o.repeat_guard;
                    // A chat reply in channels (gpt-oss): "text" is its answer, "reasoning" the rest.
                    br.special_text = (l.request->chat || o.chat) && prompts.chat_template().reply_has_channels();
                    br.on_done = [&, i](BatchResult r) {
                        {
                            std::lock_guard<std::mutex> lock(mutex);
                            finished.emplace_back(i, std::move(r));
                        }
                        finished_cv.notify_one();
                    };
                    const Submission s = engine.submit(std::move(br));
                    if (s) {
                        ++outstanding;
                        continue;
                    }
                    refusal =
                        ApiError{400, s.message, "invalid_request_error", "", std::string(batch_error_name(s.refused))};
                }
                ++refused;
                ++done;
                out.put(i, error_line(l, *refusal));
            }
            std::deque<std::pair<size_t, BatchResult>> ready;
            {
                std::unique_lock<std::mutex> lock(mutex);
                finished_cv.wait_for(lock, std::chrono::milliseconds(100), [&] { return !finished.empty(); });
                ready.swap(finished);
            }
            for (auto& [i, r] : ready) {
                --outstanding;
                ++done;
                if (!r.ok()) {
                    ++failed;
                    out.put(i, error_line(lines[i], ApiError{500, r.message, "server_error", "", "engine_failure"}));
                    continue;
                }
                n_prompt += static_cast<uint64_t>(r.n_prompt);
                n_gen += static_cast<uint64_t>(r.n_gen());
                const bool channels =
                    (lines[i].request->chat || o.chat) && prompts.chat_template().reply_has_channels();
                out.put(i, result_line(lines[i], r, channels));
            }
            progress(false);
        }
    };
    std::thread driver([&] {
        try {
            drive();
        } catch (...) { // a full disk under stdout, out of memory: rethrown below
            driver_error = std::current_exception();
        }
        engine.stop(); // interrupted, stdout gone or failed: cancel what is left (nothing, when all ran)
    });
    engine.run();
    driver.join();
    bar.finish();
    if (driver_error) std::rethrow_exception(driver_error);
    if (!out.ok()) return 0; // the reader went away: quiet, as `tern run | head` is
    if (interrupted) out.flush_rest();

    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    std::string summary = "tern: batch: " + std::to_string(done) + " of " + std::to_string(lines.size()) + " requests";
    if (refused) summary += ", " + std::to_string(refused) + " refused (their lines hold an \"error\")";
    if (failed) summary += ", " + std::to_string(failed) + " failed";
    if (interrupted) summary += ", interrupted";
    summary += ", prompt " + std::to_string(n_prompt) + " tokens, generated " + std::to_string(n_gen) + " tokens in " +
               format_duration(s) + format_number(" (%.1f tok/s)", s > 0 ? n_gen / s : 0.0) + ", " + loaded.device;
    std::cerr << summary << "\n";
    if (interrupted) return static_cast<int>(ExitCode::interrupted);
    if (failed) return static_cast<int>(ExitCode::runtime);
    if (refused) return static_cast<int>(ExitCode::bad_input);
    return 0;
}

} // namespace tern::app
