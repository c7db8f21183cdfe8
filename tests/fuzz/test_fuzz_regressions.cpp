// Replays every input the fuzzers found a bug with (tests/data/fuzz/<entry>/<file>) through the
// same entry function the libFuzzer target calls (tests/fuzz/fuzz_entries.h). Under the ASan
// preset this repeats the sanitizer checks; in every build an uncaught non-TernError exception
// fails the case. Files are named after the finding (see bench/results/fuzz.md).
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_entries.h"
#include "tests/test_support.h"

namespace fs = std::filesystem;

namespace {

fs::path regressions_dir() {
    return fs::path(TERN_SOURCE_DIR) / "tests/data/fuzz";
}

const tern::fuzz::Entry* entry_named(const std::string& name) {
    for (const tern::fuzz::Entry& e : tern::fuzz::entries())
        if (e.name == name) return &e;
    return nullptr;
}

} // namespace

TEST_CASE("every tests/data/fuzz folder names a fuzz entry") {
    REQUIRE(fs::is_directory(regressions_dir()));
    for (const auto& d : fs::directory_iterator(regressions_dir())) {
        INFO(d.path().string());
        CHECK(d.is_directory());
        CHECK(entry_named(d.path().filename().string()) != nullptr);
    }
}

TEST_CASE("saved fuzz findings no longer crash") {
    int replayed = 0;
    for (const tern::fuzz::Entry& e : tern::fuzz::entries()) {
        const fs::path dir = regressions_dir() / std::string(e.name);
        if (!fs::is_directory(dir)) continue;
        std::vector<fs::path> files;
        for (const auto& f : fs::directory_iterator(dir))
            if (f.is_regular_file()) files.push_back(f.path());
        std::sort(files.begin(), files.end());
        for (const fs::path& f : files) {
            INFO(f.string());
            const std::string bytes = tern::test::read_file(f);
            CHECK_NOTHROW(e.run({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()}));
            ++replayed;
        }
    }
    MESSAGE("replayed " << replayed << " saved inputs");
}
