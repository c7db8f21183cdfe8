// Long conversations (issue 10): a scripted "3-hour" chat far beyond the context runs to the end through
// `tern chat` with piped stdin, and a reply that fills the context mid-generation drops the oldest turns
// and goes on (Conversation::make_room_for_reply through GenerateOptions::on_context_full).
#include <doctest/doctest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend_factory.h"
#include "engine/chat/conversation.h"
#include "engine/model.h"
#include "engine/generation/session.h"
#include "tests/test_support.h"

using namespace tern;

namespace {

std::string stories_path() { return test::shared_path("models/gguf/stories260K-f32.gguf").string(); }

// Turn i of the script: 1 to ~60 tokens, lengths cycling so short and long turns mix.
std::string user_line(int i) {
    static const char* const kWords[] = {"the", "little", "dog", "ran", "to", "a", "big", "tree", "and", "saw",
                                         "bird", "sing"};
    const int n_words = 1 + (i * 7) % 23 + ((i % 10 == 9) ? 30 : 0);
    std::string line;
    for (int w = 0; w < n_words; ++w) {
        if (w) line += ' ';
        line += kWords[(i * 5 + w * 3) % 12];
    }
    return line;
}

size_t count(const std::string& hay, const std::string& needle) {
    size_t n = 0;
    for (size_t at = hay.find(needle); at != std::string::npos; at = hay.find(needle, at + 1)) ++n;
    return n;
}

} // namespace

TEST_CASE("tern chat: 120 scripted turns through a 256-token context run to the end") {
    if (!test::shared_available()) return;
    const int kTurns = 120;
    std::string script;
    for (int i = 0; i < kTurns; ++i) script += user_line(i) + "\n";
    script += "/stats\n";
    // -n -1: each reply runs to EOS (stories260K ends its stories), so some fill the context mid-reply.
    const test::CommandResult r =
        test::run_tern({"chat", "-m", stories_path(), "--device", "cpu", "--chat-template", "chatml", "-c", "256",
                        "-n", "-1", "--temp", "0", "-t", "1"},
                       script);
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    CHECK(count(r.err, "totals: " + std::to_string(kTurns) + " turns") == 1);   // one reply per line
    CHECK(count(r.err, "256-token context: dropping its oldest turns") == 1);    // said once
    CHECK(r.out.size() > size_t(kTurns));
    CHECK(r.err.find("error") == std::string::npos);
}

TEST_CASE("a reply that fills the context drops the oldest turns and goes on") {
    if (!test::shared_available()) return;
    // Random weights (synth-k256, stories260K's vocabulary): greedy replies that never end by themselves.
    const int32_t n_ctx = 256;
    auto model = std::make_shared<Model>(load_model(test::shared_path("models/synth/synth-k256-f32.gguf").string()));
    RunOptions run;
    run.n_ctx = n_ctx;
    run.kv_type = KvType::f16;
    std::unique_ptr<Backend> backend = make_backend("cpu", CpuOptions{1});
    backend->load(model->config, model->weights, run);
    Session s(std::move(backend), Tokenizer::from_gguf(model->file), n_ctx, model);
    Conversation c(s, *ChatTemplate::from_name("chatml"));
    int dropping_notices = 0;
    c.set_notice_callback([&](const ConversationNotice& n) { dropping_notices += n.text.find("dropping") != std::string::npos; });

    GenerateOptions o;
    o.sampling.temp = 0.0f;
    o.n_predict = 16;
    for (int i = 0; i < 3; ++i) {
        const std::vector<int32_t> prompt = c.begin_turn(user_line(i), 16);
        c.end_turn(s.generate(prompt, o));
    }
    const int32_t dropped_before = c.n_dropped_turns();
    // A reply longer than the room left: without the hook it would stop at the context.
    const int32_t reserve = 32;
    const std::vector<int32_t> prompt = c.begin_turn("once upon a time", reserve);
    o.n_predict = 300;
    REQUIRE(static_cast<int32_t>(prompt.size()) + o.n_predict > n_ctx);
    int calls = 0;
    o.on_context_full = [&](Session&) {
        ++calls;
        c.make_room_for_reply(reserve);
    };
    const GenerateResult r = s.generate(prompt, o);
    c.end_turn(r);
    CAPTURE(r.n_gen());
    CAPTURE(calls);
    CHECK(calls >= 1);
    CHECK(c.n_dropped_turns() > dropped_before);
    CHECK(dropping_notices == 1);
    // It went past the context; it ends at -n, or at the context once only the turn in progress is left.
    CHECK(r.n_gen() > n_ctx - static_cast<int32_t>(prompt.size()));
    CHECK((r.stop_reason == StopReason::length || r.stop_reason == StopReason::context));
    // The conversation's tokens are what the cache holds (all but the reply's last token).
    const std::vector<int32_t> kv = s.kv_tokens();
    REQUIRE(kv.size() <= c.tokens().size());
    CHECK(c.tokens().size() - kv.size() <= 1);
    CHECK(std::equal(kv.begin(), kv.end(), c.tokens().begin()));
    // The next turn reuses the shifted cache: only its own tokens are prefilled.
    const std::vector<int32_t> next = c.begin_turn("and then", 16);
    o.n_predict = 8;
    const GenerateResult r2 = s.generate(next, o);
    CHECK(r2.n_reused > 0);
    CHECK(r2.n_prefilled < 40);
}
