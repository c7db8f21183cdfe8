// `tern run` with the on-disk prompt cache, end to end: a hit prints exactly what a cold run
// prints (greedy), with --chat and --lookup too; every kind of damaged entry costs one warning
// and a cold prefill, never the run; two runs writing the same entries at once; a file-size
// limit (`ulimit -f`); the directory never grows past --prompt-cache-size; `run --batch --parallel`
// stores and reads the same entries through the batching engine. On stories260K (fast),
// and on Gemma 3 270M when it is present (TERN_GEMMA or the default model path).
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/quick_mode.h"
#include "tests/test_support.h"

using namespace tern::test;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::string small_model() { return shared_path("models/gguf/stories260K-f32.gguf").string(); }

std::string gemma_model() {
    if (const char* env = std::getenv("TERN_GEMMA"); env && *env) return env;
    const char* home = std::getenv("HOME");
    return home ? std::string(home) + "/.cache/tern/models/gemma-3-270m-q4_k_m.gguf" : std::string();
}

// The prompt cache's block (PrefixCacheOptions::block_tokens), and a story of about 800
// stories260K tokens (twelve blocks) for the prompts, with a question after it.
constexpr int kBlock = 64;
constexpr size_t kBlocks = 12;

std::string document(size_t bytes = 1600, size_t skip = 0) {
    const std::string all = read_file(shared_path("data/tinystories/cs336-tinystories_sample.txt"));
    return all.substr(skip, bytes);
}

struct Run {
    CommandResult r;
    json j;
};

// tern run, greedy, on `model`, with `prompt` given as a file; `extra` flags appended.
Run run_prompt(const TempDir& tmp, const std::string& model, const std::string& prompt,
               std::vector<std::string> extra, const std::string& ctx = "1024") {
    static int n = 0;
    const fs::path file = tmp / ("prompt-" + std::to_string(n++) + ".txt");
    write_file(file, prompt);
    std::vector<std::string> args = {"run", "-m", model, "--device", "cpu", "-c", ctx, "--temp", "0", "-n", "12",
                                     "-t", "2", "-f", file.string(), "--json"};
    args.insert(args.end(), extra.begin(), extra.end());
    Run out;
    out.r = run_tern(args);
    if (out.r.exit_code == 0) out.j = json::parse(out.r.out);
    return out;
}

std::vector<std::string> warnings(const std::string& err) {
    std::vector<std::string> lines;
    size_t at = 0;
    while (at < err.size()) {
        const size_t end = err.find('\n', at);
        const std::string line = err.substr(at, end == std::string::npos ? std::string::npos : end - at);
        if (line.find("prompt cache:") != std::string::npos) lines.push_back(line);
        if (end == std::string::npos) break;
        at = end + 1;
    }
    return lines;
}

std::vector<fs::path> entries(const fs::path& dir) {
    std::vector<fs::path> out;
    if (!fs::exists(dir)) return out;
    for (const auto& e : fs::directory_iterator(dir))
        if (e.path().extension() == ".tpc") out.push_back(e.path());
    std::sort(out.begin(), out.end());
    return out;
}

uint64_t dir_bytes(const fs::path& dir) {
    uint64_t n = 0;
    for (const auto& e : fs::directory_iterator(dir)) {
        struct stat st {};
        if (::lstat(e.path().c_str(), &st) == 0 && S_ISREG(st.st_mode)) n += static_cast<uint64_t>(st.st_size);
    }
    return n;
}

} // namespace

TEST_CASE("prompt cache: a second run with another question restores the document and prints the same text") {
    if (!shared_available()) return;
    TempDir tmp;
    const std::string cache = (tmp / "cache").string();
    const std::string doc = document();
    const std::vector<std::string> flags = {"--prompt-cache", cache};

    const Run first = run_prompt(tmp, small_model(), doc + " Who was happy?", flags);
    REQUIRE_MESSAGE(first.r.exit_code == 0, first.r.err);
    CHECK(first.j["prefix_cache"]["reused_tokens"] == 0);
    CHECK(entries(cache).size() == kBlocks);

    const Run second = run_prompt(tmp, small_model(), doc + " Where did they go?", flags);
    REQUIRE_MESSAGE(second.r.exit_code == 0, second.r.err);
    const Run cold = run_prompt(tmp, small_model(), doc + " Where did they go?", {"--no-prompt-cache"});
    REQUIRE(cold.r.exit_code == 0);
    CHECK(second.j["prefix_cache"]["reused_tokens"] == 768);   // 12 blocks: the document's common part
    CHECK(second.j["prefix_cache"]["disk_tokens"] == 768);
    CHECK(cold.j["prefix_cache"]["reused_tokens"] == 0);
    CHECK(second.j["tokens"] == cold.j["tokens"]);
    CHECK(second.j["text"] == cold.j["text"]);
    CHECK(second.r.err.find("768 restored from disk") != std::string::npos);
    CHECK(warnings(second.r.err).empty());

    // Plain text output is byte-identical too.
    write_file(tmp / "q.txt", doc + " Where did they go?");
    const std::vector<std::string> base = {"run", "-m", small_model(), "--device", "cpu", "-c", "1024", "--temp", "0",
                                           "-n", "12", "-f", (tmp / "q.txt").string()};
    std::vector<std::string> hit = base, off = base;
    hit.insert(hit.end(), {"--prompt-cache", cache});
    off.push_back("--no-prompt-cache");
    const CommandResult a = run_tern(hit), b = run_tern(off);
    CHECK(a.exit_code == 0);
    CHECK(a.out == b.out);
    CHECK(a.err.find("restored from disk") != std::string::npos);
}

TEST_CASE("prompt cache: --chat and --lookup hit and give the same tokens as without the cache") {
    if (!shared_available()) return;
    TempDir tmp;
    const std::string cache = (tmp / "cache").string();
    const std::string doc = document();
    for (const std::vector<std::string>& mode : {std::vector<std::string>{"--chat"}, std::vector<std::string>{"--lookup"}}) {
        CAPTURE(mode[0]);
        std::vector<std::string> flags = mode;
        flags.insert(flags.end(), {"--prompt-cache", cache});
        REQUIRE(run_prompt(tmp, small_model(), doc + " Who was happy?", flags).r.exit_code == 0);
        const Run hit = run_prompt(tmp, small_model(), doc + " Where did they go?", flags);
        std::vector<std::string> off = mode;
        off.push_back("--no-prompt-cache");
        const Run cold = run_prompt(tmp, small_model(), doc + " Where did they go?", off);
        REQUIRE_MESSAGE(hit.r.exit_code == 0, hit.r.err);
        REQUIRE(cold.r.exit_code == 0);
        CHECK(hit.j["prefix_cache"]["disk_tokens"].get<int>() >= 8 * kBlock);
        CHECK(hit.j["tokens"] == cold.j["tokens"]);
        CHECK(hit.j["text"] == cold.j["text"]);
    }
}

TEST_CASE("prompt cache: every damaged entry gives one warning naming it, the run succeeds, the cache recovers") {
    if (!shared_available()) return;
    TempDir tmp;
    const std::string doc = document();
    const std::string prompt = doc + " Who was happy?";
    const Run want = run_prompt(tmp, small_model(), prompt, {"--no-prompt-cache"});
    REQUIRE(want.r.exit_code == 0);

    // Another model's entry: stories260K-f16 stores the same prompt under other names.
    const fs::path foreign_dir = tmp / "foreign";
    REQUIRE(run_prompt(tmp, shared_path("models/gguf/stories260K-f16.gguf").string(), prompt,
                       {"--prompt-cache", foreign_dir.string()})
                .r.exit_code == 0);
    const std::vector<fs::path> foreign = entries(foreign_dir);
    REQUIRE(foreign.size() == kBlocks);

    using Damage = std::function<void(const fs::path&)>;
    auto cut_to = [](size_t n) {
        return [n](const fs::path& f) { fs::resize_file(f, std::min<uintmax_t>(n, fs::file_size(f))); };
    };
    auto flip_at = [](double where) {
        return [where](const fs::path& f) {
            std::string b = read_file(f);
            b[static_cast<size_t>(where * static_cast<double>(b.size() - 1))] ^= 0x01;
            write_file(f, b);
        };
    };
    const std::vector<std::pair<std::string, Damage>> damages = {
        {"empty", cut_to(0)},
        {"cut in the header", cut_to(20)},
        {"cut in the tokens", cut_to(300)},
        {"cut in the K/V", cut_to(20000)},
        {"cut before the checksum", [](const fs::path& f) { fs::resize_file(f, fs::file_size(f) - 1); }},
        {"bit flip at the start", flip_at(0.0)},
        {"bit flip in the tokens", flip_at(0.002)},
        {"bit flip in the K/V", flip_at(0.5)},
        {"bit flip in the checksum", flip_at(1.0)},
        {"another model's entry", [&](const fs::path& f) { fs::copy_file(foreign[0], f, fs::copy_options::overwrite_existing); }},
        {"a directory", [](const fs::path& f) {
             fs::remove(f);
             fs::create_directory(f);
         }},
        {"a FIFO", [](const fs::path& f) {
             fs::remove(f);
             REQUIRE(::mkfifo(f.c_str(), 0644) == 0);
         }},
        {"a dangling symlink", [&](const fs::path& f) {
             fs::remove(f);
             fs::create_symlink(tmp / "gone", f);
         }},
    };
    // One cache for the first block's damages and one for the last's, each filled once: every damage below ends
    // with the run that finds its cache whole again, so the next damage starts from a whole cache too.
    for (const size_t which : {size_t{0}, kBlocks - 1}) {
        const fs::path cache = tmp / ("cache-" + std::to_string(which));
        REQUIRE(run_prompt(tmp, small_model(), prompt, {"--prompt-cache", cache.string()}).r.exit_code == 0);
    }
    for (size_t d = 0; d < damages.size(); ++d) {
        const auto& [name, damage] = damages[d];
        {
            const size_t which = d % 2 == 0 ? 0 : kBlocks - 1;   // the first or the last block, in turn
            CAPTURE(name);
            CAPTURE(which);
            const fs::path cache = tmp / ("cache-" + std::to_string(which));
            const std::vector<fs::path> files = entries(cache);
            REQUIRE(files.size() == kBlocks);
            // The entries' names do not say which block they hold: find block `which` by content.
            fs::path target;
            for (const fs::path& f : files) {
                const std::string b = read_file(f);
                uint32_t index = 0;
                std::memcpy(&index, b.data() + 24, 4);
                if (index == which) target = f;
            }
            REQUIRE(!target.empty());
            damage(target);

            const Run r = run_prompt(tmp, small_model(), prompt, {"--prompt-cache", cache.string()});
            REQUIRE_MESSAGE(r.r.exit_code == 0, r.r.err);
            CHECK(r.j["tokens"] == want.j["tokens"]);
            CHECK(r.j["prefix_cache"]["disk_tokens"] == static_cast<int>(which) * kBlock);
            const std::vector<std::string> w = warnings(r.r.err);
            REQUIRE(w.size() == 1);
            CHECK(w[0].find(target.string()) != std::string::npos);

            // Recovered: the entry was rewritten, the next run restores every block quietly.
            const Run again = run_prompt(tmp, small_model(), prompt, {"--prompt-cache", cache.string()});
            REQUIRE(again.r.exit_code == 0);
            CHECK(again.j["tokens"] == want.j["tokens"]);
            CHECK(again.j["prefix_cache"]["disk_tokens"] == 768);
            CHECK(warnings(again.r.err).empty());
        }
    }
}

TEST_CASE("prompt cache: two runs writing the same entries at once both succeed and leave valid entries") {
    if (!shared_available()) return;
    TempDir tmp;
    const std::string prompt = document() + " Who was happy?";
    const Run want = run_prompt(tmp, small_model(), prompt, {"--no-prompt-cache"});
    const fs::path cache = tmp / "cache";
    write_file(tmp / "p.txt", prompt);
    std::string cmd;
    for (int i = 0; i < 2; ++i) {
        cmd += "XDG_CACHE_HOME='" + (tmp / "xdg").string() + "' '" + std::string(TERN_BIN) + "' run -m '" +
               small_model() + "' --device cpu -c 1024 --temp 0 -n 12 -t 1 --json -f '" + (tmp / "p.txt").string() +
               "' --prompt-cache '" + cache.string() + "' >'" + (tmp / ("out" + std::to_string(i))).string() +
               "' 2>'" + (tmp / ("err" + std::to_string(i))).string() + "' & ";
    }
    cmd += "wait";
    for (int round = 0; round < 3; ++round) {
        CAPTURE(round);
        if (round == 2) fs::remove_all(cache);   // both writing from scratch, twice
        REQUIRE(std::system(("bash -c \"" + cmd + "\"").c_str()) == 0);
        for (int i = 0; i < 2; ++i) {
            const std::string out = read_file(tmp / ("out" + std::to_string(i)));
            REQUIRE_MESSAGE(!out.empty(), read_file(tmp / ("err" + std::to_string(i))));
            CHECK(json::parse(out)["tokens"] == want.j["tokens"]);
            CHECK(warnings(read_file(tmp / ("err" + std::to_string(i)))).empty());
        }
    }
    CHECK(entries(cache).size() == kBlocks);
    const Run after = run_prompt(tmp, small_model(), prompt, {"--prompt-cache", cache.string()});
    CHECK(after.j["prefix_cache"]["disk_tokens"] == 768);
    CHECK(warnings(after.r.err).empty());
    for (const auto& e : fs::directory_iterator(cache))   // no temporary files left behind
        CHECK(e.path().filename().string().find(".tmp.") == std::string::npos);
}

TEST_CASE("prompt cache: a file size limit (ulimit -f) gives one warning, no temporary file, a correct run") {
    if (!shared_available()) return;
    TempDir tmp;
    const std::string prompt = document() + " Who was happy?";
    const Run want = run_prompt(tmp, small_model(), prompt, {"--no-prompt-cache"});
    write_file(tmp / "p.txt", prompt);
    const fs::path cache = tmp / "cache";
    // 20 KiB: the JSON on stdout fits, an entry (41 KiB) does not.
    const std::string cmd = "bash -c \"ulimit -f 20; XDG_CACHE_HOME='" + (tmp / "xdg").string() + "' '" +
                            std::string(TERN_BIN) + "' run -m '" + small_model() +
                            "' --device cpu -c 1024 --temp 0 -n 12 --json -f '" + (tmp / "p.txt").string() +
                            "' --prompt-cache '" + cache.string() + "' >'" + (tmp / "out").string() + "' 2>'" +
                            (tmp / "err").string() + "'\"";
    const int status = std::system(cmd.c_str());
    const std::string err = read_file(tmp / "err");
    REQUIRE_MESSAGE(status == 0, err);
    CHECK(json::parse(read_file(tmp / "out"))["tokens"] == want.j["tokens"]);
    const std::vector<std::string> w = warnings(err);
    REQUIRE(w.size() == 1);
    CHECK(w[0].find("File too large") != std::string::npos);
    CHECK(dir_bytes(cache) == 0);   // the lock file only: the temporary was removed
    // Without the limit the next run stores its entries.
    const Run r = run_prompt(tmp, small_model(), prompt, {"--prompt-cache", cache.string()});
    CHECK(r.r.exit_code == 0);
    CHECK(entries(cache).size() == kBlocks);
}

TEST_CASE("prompt cache: the directory never grows past --prompt-cache-size") {
    if (!shared_available()) return;
    TempDir tmp;
    const fs::path cache = tmp / "cache";
    const uint64_t limit = 100 * 1024;   // two 41 KiB entries
    for (int i = 0; i < 4; ++i) {
        CAPTURE(i);
        const Run r = run_prompt(tmp, small_model(), document(900, 700 * static_cast<size_t>(i)) + " Why?",
                                 {"--prompt-cache", cache.string(), "--prompt-cache-size", "100K"});
        REQUIRE_MESSAGE(r.r.exit_code == 0, r.r.err);
        CHECK(dir_bytes(cache) <= limit);
        CHECK(entries(cache).size() >= 1);
        CHECK(warnings(r.r.err).empty());
    }
    // A limit below one entry: nothing is stored, the run is fine.
    const fs::path small = tmp / "small";
    const Run r = run_prompt(tmp, small_model(), document(), {"--prompt-cache", small.string(), "--prompt-cache-size", "30K"});
    CHECK(r.r.exit_code == 0);
    CHECK(entries(small).empty());
    // A lowered limit evicts on the next run.
    const Run lower = run_prompt(tmp, small_model(), document(900, 3000) + " Why?",
                                 {"--prompt-cache", cache.string(), "--prompt-cache-size", "50K"});
    CHECK(lower.r.exit_code == 0);
    CHECK(dir_bytes(cache) <= 50 * 1024);
}

TEST_CASE("prompt cache: flags") {
    if (!shared_available()) return;
    TempDir tmp;
    const Run bad = run_prompt(tmp, small_model(), "Once", {"--prompt-cache-size", "lots"});
    CHECK(bad.r.exit_code == 1);
    CHECK(bad.r.err.find("--prompt-cache-size") != std::string::npos);
    // The default directory is under XDG_CACHE_HOME (run_tern points it at a temporary one).
    const fs::path xdg = tmp / "xdg";
    write_file(tmp / "p.txt", document());
    const CommandResult r = run_tern({"run", "-m", small_model(), "--device", "cpu", "-c", "1024", "-n", "1", "-f",
                                      (tmp / "p.txt").string()},
                                     "", {"XDG_CACHE_HOME=" + xdg.string()});
    CHECK(r.exit_code == 0);
    CHECK(entries(xdg / "tern" / "prompts").size() == kBlocks);
    // --no-prompt-cache neither reads nor writes.
    const CommandResult off = run_tern({"run", "-m", small_model(), "--device", "cpu", "-c", "1024", "-n", "1", "-f",
                                        (tmp / "p.txt").string(), "--no-prompt-cache", "--json"},
                                       "", {"XDG_CACHE_HOME=" + (tmp / "xdg2").string()});
    CHECK(off.exit_code == 0);
    CHECK(json::parse(off.out)["prefix_cache"]["reused_tokens"] == 0);
    CHECK_FALSE(fs::exists(tmp / "xdg2" / "tern"));
    // A directory that cannot be made: one warning, the run goes on.
    write_file(tmp / "file", "x");
    const Run no_dir = run_prompt(tmp, small_model(), document(), {"--prompt-cache", (tmp / "file" / "sub").string()});
    CHECK(no_dir.r.exit_code == 0);
    CHECK(warnings(no_dir.r.err).size() == 1);
}

TEST_CASE("prompt cache on Gemma 3 270M: a hit gives the greedy tokens of a cold run") {
    const std::string gemma = gemma_model();
    if (gemma.empty() || !fs::exists(gemma)) return;
    TempDir tmp;
    const std::string cache = (tmp / "cache").string();
    const std::string doc = document(2400);
    REQUIRE(run_prompt(tmp, gemma, doc + "\nQuestion: Who was happy?\nAnswer:", {"--prompt-cache", cache}, "2048")
                .r.exit_code == 0);
    const Run hit = run_prompt(tmp, gemma, doc + "\nQuestion: Where did they go?\nAnswer:", {"--prompt-cache", cache}, "2048");
    const Run cold = run_prompt(tmp, gemma, doc + "\nQuestion: Where did they go?\nAnswer:", {"--no-prompt-cache"}, "2048");
    REQUIRE_MESSAGE(hit.r.exit_code == 0, hit.r.err);
    REQUIRE(cold.r.exit_code == 0);
    CHECK(hit.j["prefix_cache"]["disk_tokens"].get<int>() >= 8 * kBlock);
    CHECK(hit.j["tokens"] == cold.j["tokens"]);
    CHECK(hit.j["text"] == cold.j["text"]);
    // TERN_TEST_QUICK=1 (tests/quick_mode.h): the plain hit above only (past Gemma's sliding window, a real
    // tokenizer); --chat with the cache runs on stories260K in "--chat and --lookup hit" above.
    if (quick_mode()) return;
    // With --chat (Gemma has a template) as well.
    REQUIRE(run_prompt(tmp, gemma, doc + "\nWho was happy?", {"--chat", "--prompt-cache", cache}, "2048").r.exit_code == 0);
    const Run chat_hit = run_prompt(tmp, gemma, doc + "\nWhere did they go?", {"--chat", "--prompt-cache", cache}, "2048");
    const Run chat_cold = run_prompt(tmp, gemma, doc + "\nWhere did they go?", {"--chat", "--no-prompt-cache"}, "2048");
    CHECK(chat_hit.j["prefix_cache"]["disk_tokens"].get<int>() >= 8 * kBlock);
    CHECK(chat_hit.j["tokens"] == chat_cold.j["tokens"]);
}

TEST_CASE("prompt cache: run --batch --parallel 3 stores the prompts' blocks and reads them back, the lines unchanged") {
    if (!shared_available()) return;
    TempDir tmp;
    std::string input;
    for (const char* question : {" What did she find?", " Where did they go?", " Who came?"})
        input += json{{"prompt", document() + question}, {"max_tokens", 12}, {"temperature", 0}}.dump() + "\n";
    write_file(tmp / "in.jsonl", input);
    // The output lines without their timings, and the prompt-cache warnings.
    auto batch = [&](std::vector<std::string> cache_flags) {
        std::vector<std::string> args = {"run", "-m", small_model(), "--device", "cpu", "-c", "1024", "-t", "1",
                                         "--batch", (tmp / "in.jsonl").string(), "--parallel", "3"};
        args.insert(args.end(), cache_flags.begin(), cache_flags.end());
        const CommandResult r = run_tern(args);
        REQUIRE_MESSAGE(r.exit_code == 0, r.err);
        std::vector<std::string> lines;
        size_t at = 0;
        for (size_t end; (end = r.out.find('\n', at)) != std::string::npos; at = end + 1) {
            json j = json::parse(r.out.substr(at, end - at));
            j.erase("timings");
            lines.push_back(j.dump());
        }
        return std::make_pair(lines, warnings(r.err));
    };
    const auto off = batch({"--no-prompt-cache"});
    REQUIRE(off.first.size() == 3);
    const fs::path dir = tmp / "cache";
    const auto cold = batch({"--prompt-cache", dir.string()});
    CHECK(cold.first == off.first);
    CHECK(cold.second.empty());
    const std::vector<fs::path> stored = entries(dir);
    CHECK(stored.size() >= kBlocks);   // the document's blocks, once for the three prompts
    // A damaged entry proves the batch reads the cache: one warning, the same lines, the entry mended.
    write_file(stored[0], "damaged");
    const auto warm = batch({"--prompt-cache", dir.string()});
    CHECK(warm.first == off.first);
    CHECK(warm.second.size() == 1);
    const auto again = batch({"--prompt-cache", dir.string()});
    CHECK(again.first == off.first);
    CHECK(again.second.empty());
}
