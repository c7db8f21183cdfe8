// main() of the test executables: doctest's, plus one rule. Each CTest test runs its folder's executable on one
// file's test cases (--source-file, tests/CMakeLists.txt); a run whose filters match no test case at all (a
// renamed file, a mistyped filter) fails instead of passing by running nothing.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

namespace {

unsigned g_matched_test_cases = 0;
bool g_run_ended = false;

// Records how many test cases passed the filters; every other event is doctest's console reporter's business.
struct MatchedTestCases : doctest::IReporter {
    explicit MatchedTestCases(const doctest::ContextOptions&) {}
    void report_query(const doctest::QueryData&) override {}
    void test_run_start() override {}
    void test_run_end(const doctest::TestRunStats& stats) override {
        g_matched_test_cases = stats.numTestCasesPassingFilters;
        g_run_ended = true;
    }
    void test_case_start(const doctest::TestCaseData&) override {}
    void test_case_reenter(const doctest::TestCaseData&) override {}
    void test_case_end(const doctest::CurrentTestCaseStats&) override {}
    void test_case_exception(const doctest::TestCaseException&) override {}
    void subcase_start(const doctest::SubcaseSignature&) override {}
    void subcase_end() override {}
    void log_assert(const doctest::AssertData&) override {}
    void log_message(const doctest::MessageData&) override {}
    void test_case_skipped(const doctest::TestCaseData&) override {}
};
REGISTER_LISTENER("matched_test_cases", 1, MatchedTestCases);

}  // namespace

int main(int argc, char** argv) {
    doctest::Context context(argc, argv);
    const int rc = context.run();
    if (context.shouldExit()) return rc;   // --help, --list-test-cases and the like: no run to judge
    if (rc == 0 && g_run_ended && g_matched_test_cases == 0) {
        std::fprintf(stderr, "test: no test case matched this run's filters (a renamed or moved test file? "
                             "tests/CMakeLists.txt names each suite's file)\n");
        return 1;
    }
    return rc;
}
