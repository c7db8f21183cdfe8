// The non-finite logit guard (engine/logit_guard.h): the scan itself (base/finite.h), a Session whose
// backend produces NaN, +inf or a row of -inf only, and every command on a model whose weights hold NaN
// (stories260K with a NaN output matrix, or one token's embedding row NaN): one line naming the file and
// exit 3 instead of token 0 forever; in `run --batch` only the requests that meet the damage fail.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/fake_backend.h"
#include "base/finite.h"
#include "engine/generation/session.h"
#include "engine/logit_guard.h"
#include "tests/fake_tokenizer.h"
#include "tests/gguf_rewrite.h"
#include "tests/test_support.h"

using namespace tern;
using namespace tern::test;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
const float kNan = std::numeric_limits<float>::quiet_NaN();

// A backend whose every forward leaves `row` as the logits (vocab 16); the rest of the interface does nothing.
class RowBackend : public test::FakeBackendBase {
public:
    std::vector<float> row = std::vector<float>(16, 0.0f);

    void forward(const ForwardBatch& b) override {
        n_past_ += static_cast<int32_t>(b.tokens.size());
        rows_ = b.wanted == LogitsWanted::all ? static_cast<int>(b.tokens.size()) : 1;
    }
    std::span<const float> logits(int r) override {
        REQUIRE(r < rows_);
        return row;
    }
    void argmax(std::span<int32_t> per_row) override {
        for (int32_t& t : per_row)
            t = 0; // what a NaN row gave before the guard: token 0 forever
    }

private:
    int rows_ = 0;
};

std::vector<std::string> pieces() {
    std::vector<std::string> p = {"", "", ""};
    for (char c = 'a'; c <= 'm'; ++c)
        p.push_back(std::string(1, c));
    return p;
}

// Generates 8 tokens after a 3-token prompt from a backend whose rows are `row`; the error's text, or "".
std::string generate_error(const std::vector<float>& row, float temp) {
    auto b = std::make_unique<RowBackend>();
    b->row = row;
    Session session(std::move(b), std::make_unique<FakeTokenizer>(pieces()), 64);
    GenerateOptions o;
    o.n_predict = 8;
    o.sampling.temp = temp;
    const std::vector<int32_t> prompt = {1, 5, 6};
    try {
        session.generate(prompt, o);
    } catch (const NonFiniteLogits& e) {
        CHECK(e.code() == ExitCode::runtime);
        CHECK(e.position == 2); // the prompt's last token, whose row is sampled first
        return e.what();
    }
    return "";
}

} // namespace

TEST_CASE("scan_floats finds NaN, +inf and finite values in every position of a row; -inf is none of them") {
    CHECK(!scan_floats({}).finite);
    for (size_t n : {size_t{1}, size_t{63}, size_t{64}, size_t{65}, size_t{1000}}) {
        std::vector<float> v(n, 0.5f);
        FloatScan s = scan_floats(v);
        CHECK((s.finite && !s.nan && !s.pos_inf));
        for (size_t at : {size_t{0}, n / 2, n - 1}) {
            std::vector<float> w = v;
            w[at] = kNan;
            CHECK(scan_floats(w).nan);
            w[at] = -kNan; // a NaN with the sign bit set is NaN too
            CHECK(scan_floats(w).nan);
            w[at] = kInf;
            s = scan_floats(w);
            CHECK((s.pos_inf && !s.nan));
            w[at] = -kInf;
            s = scan_floats(w);
            CHECK((!s.pos_inf && !s.nan && s.finite == (n > 1))); // -inf: a masked entry, not damage
            w[at] = std::numeric_limits<float>::max();            // large and subnormal values are finite
            CHECK(!scan_floats(w).pos_inf);
            w[at] = std::numeric_limits<float>::denorm_min();
            CHECK(!scan_floats(w).nan);
        }
    }
    const std::vector<float> masked(100, -kInf);
    const FloatScan s = scan_floats(masked);
    CHECK((!s.finite && !s.pos_inf && !s.nan));
}

TEST_CASE("a Session stops at a row holding NaN, +inf or no finite value, naming the model; -inf alone is fine") {
    std::vector<float> row(16, 0.0f);
    row[5] = 3.0f;
    row[2] = -kInf; // EOS masked: legitimate
    for (float temp : {0.0f, 0.8f}) {
        CHECK(generate_error(row, temp).empty());
        std::vector<float> bad = row;
        bad[9] = kNan; // one NaN anywhere, not the best entry: fatal
        const std::string nan = generate_error(bad, temp);
        CHECK(nan == "the model: the model produced non-finite logits at position 2 (NaN); the file's weights or "
                     "metadata are damaged (`tern info --check` scans every tensor)");
        bad = row;
        bad[0] = kInf;
        CHECK(generate_error(bad, temp).find("(+inf)") != std::string::npos);
        CHECK(generate_error(std::vector<float>(16, -kInf), temp).find("(no finite value)") != std::string::npos);
    }
}

// ---- End to end on a damaged copy of stories260K --------------------------------------------------

namespace {

// stories260K with output.weight NaN: every logit row is NaN. (A matrix: a NaN in a norm, bias, sink
// or router is refused when the model loads.)
std::string nan_matrix_model(const TempDir& dir) {
    return rewrite_filled(
        dir, stories(), "nan-matrix.gguf", [](const std::string& name) { return name == "output.weight"; },
        std::numeric_limits<float>::quiet_NaN());
}

// stories260K with the embedding row of token `id` NaN: only a sequence holding that token goes wrong.
std::string nan_token_model(const TempDir& dir, int32_t id) {
    static std::vector<float> embd;
    return rewrite_gguf(
        dir, stories(), "nan-token.gguf", [](GgufWriter&) {},
        [id](GgufWriter& w, const GgufTensor& t) {
            if (t.name != "token_embd.weight") return false;
            REQUIRE(t.type == GgmlType::F32);
            embd.assign(reinterpret_cast<const float*>(t.data),
                        reinterpret_cast<const float*>(t.data) + t.n_elements());
            const auto dim = static_cast<size_t>(t.ne[0]);
            for (size_t i = 0; i < dim; ++i)
                embd[static_cast<size_t>(id) * dim + i] = std::numeric_limits<float>::quiet_NaN();
            w.add_tensor(t.name, GgmlType::F32, std::vector<int64_t>(t.ne, t.ne + std::max(1, t.n_dims)),
                         std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(embd.data()), embd.size() * 4));
            return true;
        });
}

// One line on stderr, naming the file and the NaN, and exit 3.
void check_nan_line(const CommandResult& r, const std::string& model) {
    CHECK_MESSAGE(r.exit_code == 3, r.err);
    const std::string head = "tern: " + model + ": the model produced non-finite logits at position ";
    const std::string tail =
        " (NaN); the file's weights or metadata are damaged (`tern info --check` scans every tensor)\n";
    CHECK_MESSAGE(r.err.rfind(head, 0) == 0, r.err);
    CHECK_MESSAGE((r.err.size() > tail.size() && r.err.substr(r.err.size() - tail.size()) == tail), r.err);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
}

const std::vector<std::string> kCpu = {"--device", "cpu", "-t", "1", "--no-prompt-cache"};

std::vector<std::string> with(std::vector<std::string> args, const std::vector<std::string>& more) {
    args.insert(args.end(), more.begin(), more.end());
    return args;
}

} // namespace

TEST_CASE("run, run --chat, chat, perplexity and bench on NaN weights: one line naming the file, exit 3") {
    if (!shared_available()) return;
    TempDir dir;
    const std::string model = nan_matrix_model(dir);
    for (const char* temp : {"0", "0.8"}) {
        const CommandResult r =
            run_tern(with({"run", "-m", model, "-p", "Once upon a time", "-n", "16", "--temp", temp}, kCpu));
        check_nan_line(r, model);
        CHECK(r.err.find("position 4 (NaN)") != std::string::npos); // BOS + 4 prompt tokens: the last is at 4
        CHECK(r.out.empty());
    }
    check_nan_line(run_tern(with({"run", "-m", model, "-p", "Hi", "-n", "8", "--chat", "--chat-template", "chatml",
                                  "--json", "--logprobs", "2"},
                                 kCpu)),
                   model);
    // The REPL ends like run does: the model will produce NaN again on the next turn.
    check_nan_line(
        run_tern(with({"chat", "-m", model, "-n", "8", "--chat-template", "chatml"}, kCpu), "Hello\n/quit\n"), model);

    std::string text;
    for (int i = 0; i < 40; ++i)
        text += "Once upon a time there was a little girl named Lily. ";
    write_file(dir / "text.txt", text);
    check_nan_line(run_tern({"perplexity", "-m", model, "-f", (dir / "text.txt").string(), "-c", "64", "--chunks", "1",
                             "--device", "cpu", "-t", "1"}),
                   model);
    const CommandResult bench =
        run_tern({"bench", "-m", model, "-p", "0", "-n", "4", "-r", "1", "--device", "cpu", "-t", "1"});
    check_nan_line(bench, model);
}

TEST_CASE("run --batch on a model whose NaN meets some requests only: those get an error line, the others their text") {
    if (!shared_available()) return;
    TempDir dir;
    // "zebra" holds tokens that "Once upon a time" and what stories260K writes after it never do.
    const CommandResult tok = run_tern({"tokenize", "-m", stories(), "-p", " zebra", "--ids"});
    REQUIRE_MESSAGE(tok.exit_code == 0, tok.err);
    const int32_t zebra = std::stoi(tok.out.substr(tok.out.rfind(' ', tok.out.size() - 3) + 1));
    const std::string model = nan_token_model(dir, zebra);
    const std::string in = R"({"id": "fine", "prompt": "Once upon a time", "max_tokens": 12, "temperature": 0}
{"id": "damaged", "prompt": "The zebra", "max_tokens": 12, "temperature": 0}
{"id": "sampled", "prompt": "Once upon a time", "max_tokens": 12, "temperature": 0.7, "seed": 3}
)";
    for (const char* parallel : {"1", "3"}) {
        const CommandResult r = run_tern(with({"run", "-m", model, "--batch", "-", "--parallel", parallel}, kCpu), in);
        CHECK_MESSAGE(r.exit_code == 3, r.err);
        std::istringstream lines(r.out);
        std::vector<nlohmann::json> out;
        for (std::string line; std::getline(lines, line);)
            out.push_back(nlohmann::json::parse(line));
        REQUIRE(out.size() == 3);
        CHECK(out[0]["id"] == "fine");
        CHECK(!out[0].contains("error"));
        CHECK(out[2]["id"] == "sampled");
        CHECK(!out[2].contains("error"));
        CHECK(out[1]["id"] == "damaged");
        REQUIRE(out[1].contains("error"));
        const std::string message = out[1]["error"]["message"];
        CHECK(message.find(model + ": the model produced non-finite logits at position ") == 0);
        CHECK(message.find("(NaN)") != std::string::npos);
        CHECK(out[1]["error"]["type"] == "server_error");
    }
}
