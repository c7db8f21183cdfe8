// The on-disk prefix cache (engine/prefix_cache*.h): chain keys, the entry format and every way
// an entry can be damaged, KV range save/append, the LRU size limit, and that a restored prefix
// gives bit-identical K/V and the same tokens as a cold prefill on a real model (stories260K).
// End to end through `tern run`: test_cli_prompt_cache.cpp.
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "engine/backend_factory.h"
#include "engine/cpu/kv_cache.h"
#include "engine/model.h"
#include "engine/model_identity.h"
#include "engine/prefix_cache/prefix_cache.h"
#include "engine/prefix_cache/prefix_cache_entry.h"
#include "engine/prefix_cache/prefix_cache_files.h"
#include "engine/generation/session.h"
#include "base/error.h"
#include "tests/test_support.h"

using namespace tern;
namespace fs = std::filesystem;

namespace {

std::vector<int32_t> random_tokens(size_t n, uint32_t seed, int32_t vocab = 512) {
    std::mt19937 rng(seed);
    std::vector<int32_t> t(n);
    for (int32_t& x : t) x = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
    return t;
}

PrefixEntry small_entry() {
    PrefixEntry e;
    e.identity = 0x1234567890abcdefull;
    e.chain = 0xfedcba0987654321ull;
    e.block_index = 3;
    e.kv_type = KvType::q8_0;
    e.tokens = {5, 17, 99, 3};
    for (int i = 0; i < 40; ++i) e.payload.push_back(static_cast<uint8_t>(i * 7 + 1));
    return e;
}

} // namespace

TEST_CASE("chain keys: one per full block, each depending on the identity and every earlier token") {
    const std::vector<int32_t> t = random_tokens(70, 1);
    const std::vector<uint64_t> k = prefix_chain_keys(t, 16, 42);
    REQUIRE(k.size() == 4);   // 70 tokens: 4 full blocks, the partial fifth has no key
    CHECK(prefix_chain_keys(t, 16, 42) == k);
    CHECK(prefix_chain_keys(std::span(t).first(64), 16, 42) == k);
    for (size_t i = 0; i < k.size(); ++i)
        for (size_t j = i + 1; j < k.size(); ++j) CHECK(k[i] != k[j]);

    const std::vector<uint64_t> other_model = prefix_chain_keys(t, 16, 43);
    for (size_t i = 0; i < k.size(); ++i) CHECK(other_model[i] != k[i]);

    // A token changed in block 2 changes keys 2 and 3 only; one in block 0 changes all of them.
    std::vector<int32_t> t2 = t;
    t2[40] ^= 1;
    const std::vector<uint64_t> k2 = prefix_chain_keys(t2, 16, 42);
    CHECK(k2[0] == k[0]);
    CHECK(k2[1] == k[1]);
    CHECK(k2[2] != k[2]);
    CHECK(k2[3] != k[3]);
    t2 = t;
    t2[0] ^= 1;
    const std::vector<uint64_t> k3 = prefix_chain_keys(t2, 16, 42);
    for (size_t i = 0; i < k.size(); ++i) CHECK(k3[i] != k[i]);
}

TEST_CASE("prefix entries round-trip and every truncation, bit flip or extra byte is refused") {
    const PrefixEntry e = small_entry();
    const std::vector<uint8_t> bytes = serialize_prefix_entry(e);
    CHECK(bytes.size() == kPrefixEntryHeaderBytes + 4 * 4 + 40 + kPrefixEntryChecksumBytes);
    PrefixEntry back;
    std::string why;
    REQUIRE(parse_prefix_entry(bytes, back, &why));
    CHECK(back.identity == e.identity);
    CHECK(back.chain == e.chain);
    CHECK(back.block_index == e.block_index);
    CHECK(back.kv_type == e.kv_type);
    CHECK(back.tokens == e.tokens);
    CHECK(back.payload == e.payload);

    for (size_t n = 0; n < bytes.size(); ++n) {
        CAPTURE(n);
        CHECK_FALSE(parse_prefix_entry(std::span(bytes).first(n), back, &why));
        CHECK_FALSE(why.empty());
    }
    for (size_t bit = 0; bit < bytes.size() * 8; ++bit) {
        CAPTURE(bit);
        std::vector<uint8_t> flipped = bytes;
        flipped[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
        CHECK_FALSE(parse_prefix_entry(flipped, back, &why));
    }
    std::vector<uint8_t> longer = bytes;
    longer.push_back(0);
    CHECK_FALSE(parse_prefix_entry(longer, back, &why));

    // Huge counts in a header with a valid checksum cannot make the reader allocate or overrun.
    std::vector<uint8_t> forged = bytes;
    const uint64_t huge = ~uint64_t(0) - 10;
    std::memcpy(forged.data() + 36, &huge, 8);   // payload length
    CHECK_FALSE(parse_prefix_entry(forged, back, &why));
    CHECK(why == "truncated");
}

TEST_CASE("parse_byte_size: plain numbers and K/M/G/T suffixes") {
    CHECK(parse_byte_size("1073741824") == uint64_t(1073741824));
    CHECK(parse_byte_size("512M") == uint64_t(512) << 20);
    CHECK(parse_byte_size("2G") == uint64_t(2) << 30);
    CHECK(parse_byte_size("2GiB") == uint64_t(2) << 30);
    CHECK(parse_byte_size("64k") == uint64_t(64) << 10);
    CHECK(parse_byte_size("1.5G") == uint64_t(3) << 29);
    CHECK(parse_byte_size("100B") == uint64_t(100));
    CHECK(parse_byte_size("0") == uint64_t(0));
    CHECK_FALSE(parse_byte_size(""));
    CHECK_FALSE(parse_byte_size("G"));
    CHECK_FALSE(parse_byte_size("-5M"));
    CHECK_FALSE(parse_byte_size("12Q"));
    CHECK_FALSE(parse_byte_size("1e30G"));
}

TEST_CASE("KvCache ranges: save_range + append rebuild the same cache, refusing what does not fit") {
    for (KvType type : {KvType::f32, KvType::f16, KvType::q8_0, KvType::f8_e4m3}) {
        CAPTURE(std::string(kv_type_name(type)));
        KvCache a;
        a.init(type, {2, 1}, 64, 32, 40);
        std::mt19937 rng(7);
        std::uniform_real_distribution<float> d(-2.0f, 2.0f);
        for (int32_t pos = 0; pos < 30; ++pos)
            for (int32_t l = 0; l < 2; ++l) {
                std::vector<float> k(2 * 64), v(2 * 32);
                for (float& x : k) x = d(rng);
                for (float& x : v) x = d(rng);
                a.write(l, pos, k.data(), v.data());
            }
        a.set_n_past(30);

        KvCache b;
        b.init(type, {2, 1}, 64, 32, 64);   // another context size: ranges do not depend on it
        const KvSnapshot r0 = a.save_range(0, 10), r1 = a.save_range(10, 25);
        CHECK_THROWS_AS(b.append(r1), UsageError);   // must start at n_past
        b.append(r0);
        b.append(r1);
        CHECK(b.n_past() == 25);
        CHECK(b.save_range(0, 25).bytes == a.save_range(0, 25).bytes);
        CHECK_THROWS_AS(a.save_range(20, 31), UsageError);

        KvSnapshot cut = a.save_range(25, 30);
        cut.bytes.pop_back();
        CHECK_THROWS_AS(b.append(cut), UsageError);
        CHECK(b.n_past() == 25);
        KvCache other_shape;
        other_shape.init(type, {2, 1}, 32, 32, 64);
        CHECK_THROWS_AS(other_shape.append(r0), UsageError);
        KvCache small;
        small.init(type, {2, 1}, 64, 32, 8);
        CHECK_THROWS_AS(small.append(r0), UsageError);   // 10 positions do not fit 8
        CHECK_THROWS_AS(b.load(r0), UsageError);          // a range is not a whole snapshot
    }
}

// ---------------------------------------------------------------------------------------------
// A real model on the CPU backend.

namespace {

struct Loaded {
    std::shared_ptr<Model> model;
    std::unique_ptr<Session> session;
};

Loaded real_session(int n_threads, KvType kv = KvType::f16, const char* file = "models/gguf/stories260K-f32.gguf") {
    Loaded l;
    l.model = std::make_shared<Model>(load_model(test::shared_path(file).string()));
    RunOptions run;
    run.n_ctx = 256;
    run.kv_type = kv;
    std::unique_ptr<Backend> backend = make_backend("cpu", CpuOptions{n_threads});
    backend->load(l.model->config, l.model->weights, run);
    l.session = std::make_unique<Session>(std::move(backend), Tokenizer::from_gguf(l.model->file), 256, l.model);
    return l;
}

uint64_t identity_of(const Loaded& l, KvType kv = KvType::f16) {
    KvProducer producer;
    producer.kv_type = kv;
    return model_identity(*l.model, producer);
}

GenerateOptions greedy(int32_t n) {
    GenerateOptions o;
    o.n_predict = n;
    o.sampling.temp = 0.0f;
    return o;
}

std::vector<int32_t> story_prompt(const Session& s, const std::string& question) {
    return s.tokenizer().encode(
        "Once upon a time there was a little girl named Lily. She loved to play in the park with her dog Max. "
        "One day the sun was hot and the sky was blue, and Lily found a big red ball under a tree. She ran "
        "to her mom and said: look what I found! Her mom smiled and said they could play with it together. " +
            question,
        {true, true});
}

struct Warnings {
    std::vector<std::string> lines;
    PrefixCache::Warn sink() {
        return [this](const PrefixCache::Warning& w) { lines.push_back(w.text); };
    }
};

std::unique_ptr<PrefixCache> make_cache(const fs::path& dir, uint64_t identity, Warnings& w,
                                        uint64_t max_bytes = uint64_t(1) << 30, KvType kv = KvType::f16) {
    PrefixCacheOptions o;
    o.dir = dir;
    o.max_bytes = max_bytes;
    o.block_tokens = 16;
    return std::make_unique<PrefixCache>(o, identity, kv, w.sink());
}

} // namespace

TEST_CASE("batch invariance: a position's K/V bytes do not depend on the chunking or the thread count") {
    if (!test::shared_available()) return;
    Loaded a = real_session(1), b = real_session(2);
    const std::vector<int32_t> p = story_prompt(*a.session, "What did Lily find?");
    GenerateOptions oa = greedy(1), ob = greedy(1);
    oa.prefill_chunk = 7;
    ob.prefill_chunk = 512;
    a.session->generate(p, oa);
    b.session->generate(p, ob);
    const int32_t n = static_cast<int32_t>(p.size());
    CHECK(a.session->backend().kv_save_range(0, n).bytes == b.session->backend().kv_save_range(0, n).bytes);
}

TEST_CASE("a restored prefix gives bit-identical K/V and the same tokens as a cold run") {
    if (!test::shared_available()) return;
    test::TempDir dir;
    Warnings w;
    Loaded cold = real_session(2);
    const uint64_t id = identity_of(cold);
    const std::vector<int32_t> p1 = story_prompt(*cold.session, "What did Lily find?");
    const std::vector<int32_t> p2 = story_prompt(*cold.session, "Where did they play?");
    const GenerateResult want = cold.session->generate(p2, greedy(24));

    // Run 1 stores p1's blocks; run 2 (a fresh session, as a new process) restores them for p2.
    {
        Loaded s = real_session(1);
        s.session->set_prefix_cache(make_cache(dir.path(), id, w));
        const GenerateResult r = s.session->generate(p1, greedy(4));
        CHECK(r.n_from_disk == 0);
    }
    const size_t n_blocks = (p1.size() - 1) / 16;
    CHECK(test::read_file(dir.path() / "lock").empty());
    Loaded s = real_session(2);
    s.session->set_prefix_cache(make_cache(dir.path(), id, w));
    const GenerateResult r = s.session->generate(p2, greedy(24));
    size_t shared = 0;
    while (p1[shared] == p2[shared]) ++shared;
    CHECK(r.n_from_disk == static_cast<int32_t>(shared / 16 * 16));
    CHECK(r.n_reused == r.n_from_disk);
    CHECK(r.n_from_disk >= 16 * 5);
    CHECK(r.tokens == want.tokens);
    CHECK(r.text == want.text);
    const int32_t n = static_cast<int32_t>(p2.size());
    CHECK(s.session->backend().kv_save_range(0, n).bytes == cold.session->backend().kv_save_range(0, n).bytes);
    CHECK(w.lines.empty());
    CHECK(n_blocks >= 5);

    // The same prompt again in the same session: memory holds it all, the disk adds nothing.
    const GenerateResult again = s.session->generate(p2, greedy(24));
    CHECK(again.n_reused == n - 1);
    CHECK(again.tokens == want.tokens);
}

TEST_CASE("every damaged or foreign entry gives one warning naming it, is removed, and the run is cold") {
    if (!test::shared_available()) return;
    Loaded base = real_session(2);
    const uint64_t id = identity_of(base);
    const std::vector<int32_t> p = story_prompt(*base.session, "What did Lily find?");
    const GenerateResult want = base.session->generate(p, greedy(12));
    const std::vector<uint64_t> keys = prefix_chain_keys(p, 16, id);
    REQUIRE(keys.size() >= 3);

    // Fill a directory, then damage block 1 in one of many ways.
    struct Fault {
        const char* name;
        std::function<void(const fs::path& entry, const fs::path& dir)> apply;
    };
    const std::vector<uint8_t> good_bytes = [&] {
        test::TempDir d;
        Warnings w;
        Loaded s = real_session(2);
        s.session->set_prefix_cache(make_cache(d.path(), id, w));
        s.session->generate(p, greedy(1));
        const std::string b = test::read_file(make_cache(d.path(), id, w)->entry_path(keys[1]));
        return std::vector<uint8_t>(b.begin(), b.end());
    }();
    REQUIRE(!good_bytes.empty());
    auto write_bytes = [](const fs::path& f, const std::vector<uint8_t>& b) {
        test::write_file(f, std::string(b.begin(), b.end()));
    };
    std::vector<Fault> faults;
    for (size_t cut : {size_t(0), size_t(10), size_t(44), size_t(60), good_bytes.size() / 2, good_bytes.size() - 1})
        faults.push_back({"truncated", [=](const fs::path& f, const fs::path&) {
                              write_bytes(f, std::vector<uint8_t>(good_bytes.begin(), good_bytes.begin() + cut));
                          }});
    for (size_t at : {size_t(2), size_t(20), size_t(50), good_bytes.size() / 2, good_bytes.size() - 3})
        faults.push_back({"bit flip", [=](const fs::path& f, const fs::path&) {
                              std::vector<uint8_t> b = good_bytes;
                              b[at] ^= 0x10;
                              write_bytes(f, b);
                          }});
    faults.push_back({"foreign model", [=](const fs::path& f, const fs::path&) {
                          PrefixEntry e;
                          std::string why;
                          REQUIRE(parse_prefix_entry(good_bytes, e, &why));
                          e.identity ^= 1;   // another model's entry under this name
                          write_bytes(f, serialize_prefix_entry(e));
                      }});
    faults.push_back({"wrong tokens", [=](const fs::path& f, const fs::path&) {
                          PrefixEntry e;
                          std::string why;
                          REQUIRE(parse_prefix_entry(good_bytes, e, &why));
                          e.tokens[3] += 1;   // a hash collision, as far as the reader can tell
                          write_bytes(f, serialize_prefix_entry(e));
                      }});
    faults.push_back({"wrong block", [=](const fs::path& f, const fs::path&) {
                          PrefixEntry e;
                          std::string why;
                          REQUIRE(parse_prefix_entry(good_bytes, e, &why));
                          e.block_index = 2;
                          write_bytes(f, serialize_prefix_entry(e));
                      }});
    faults.push_back({"payload of another shape", [=](const fs::path& f, const fs::path&) {
                          PrefixEntry e;
                          std::string why;
                          REQUIRE(parse_prefix_entry(good_bytes, e, &why));
                          e.payload.resize(e.payload.size() - 4);
                          write_bytes(f, serialize_prefix_entry(e));
                      }});
    faults.push_back({"directory", [](const fs::path& f, const fs::path&) { fs::create_directory(f); }});
    faults.push_back({"fifo", [](const fs::path& f, const fs::path&) { REQUIRE(::mkfifo(f.c_str(), 0644) == 0); }});
    faults.push_back({"dangling symlink", [](const fs::path& f, const fs::path& d) {
                          fs::create_symlink(d / "nowhere", f);
                      }});
    faults.push_back({"symlink to a good entry", [=](const fs::path& f, const fs::path& d) {
                          write_bytes(d / "elsewhere", good_bytes);
                          fs::create_symlink(d / "elsewhere", f);
                      }});

    for (const Fault& fault : faults) {
        CAPTURE(fault.name);
        test::TempDir d;
        Warnings w;
        {
            Loaded s = real_session(2);
            s.session->set_prefix_cache(make_cache(d.path(), id, w));
            s.session->generate(p, greedy(1));
        }
        const fs::path entry = make_cache(d.path(), id, w)->entry_path(keys[1]);
        fs::remove(entry);
        fault.apply(entry, d.path());

        Loaded s = real_session(2);
        s.session->set_prefix_cache(make_cache(d.path(), id, w));
        const GenerateResult r = s.session->generate(p, greedy(12));
        CHECK(r.tokens == want.tokens);
        CHECK(r.n_from_disk == 16);   // block 0 only: block 1 is bad and the rest needs it
        REQUIRE(w.lines.size() == 1);
        CHECK(w.lines[0].find(entry.string()) != std::string::npos);
        CHECK(w.lines[0].find("removed") != std::string::npos);
        // Recovered: the run stored a good entry in its place, and the next run restores it all.
        struct stat st {};
        REQUIRE(::lstat(entry.c_str(), &st) == 0);
        CHECK(S_ISREG(st.st_mode));
        Loaded t = real_session(2);
        t.session->set_prefix_cache(make_cache(d.path(), id, w));
        const GenerateResult r2 = t.session->generate(p, greedy(12));
        CHECK(r2.tokens == want.tokens);
        CHECK(r2.n_from_disk == static_cast<int32_t>((p.size() - 1) / 16 * 16));
        CHECK(w.lines.size() == 1);
    }
}

TEST_CASE("the identity tells models and KV types apart; another model's directory entries are misses") {
    if (!test::shared_available()) return;
    Loaded a = real_session(1), b = real_session(1, KvType::f16, "models/gguf/stories260K-f16.gguf");
    CHECK(identity_of(a) == identity_of(a));
    CHECK(identity_of(a) != identity_of(b));
    CHECK(identity_of(a, KvType::f16) != identity_of(a, KvType::q8_0));
    KvProducer exact;
    exact.exact_matmul = true;
    CHECK(model_identity(*a.model, exact) != identity_of(a));
    CHECK(model_identity(*a.model, KvProducer{KvType::f16, false, DeviceKind::cuda, "cuda:0"}) != identity_of(a));
}

TEST_CASE("LRU: the directory never exceeds the limit, recent entries stay, oversized ones are not stored") {
    if (!test::shared_available()) return;
    test::TempDir d;
    Warnings w;
    Loaded s = real_session(2);
    const uint64_t id = identity_of(s);
    const std::vector<int32_t> p = story_prompt(*s.session, "What did Lily find?");
    // The size of one entry, from a first store.
    s.session->set_prefix_cache(make_cache(d.path(), id, w));
    s.session->generate(std::span(p).first(17), greedy(1));
    const uint64_t entry = make_cache(d.path(), id, w)->directory_bytes();
    REQUIRE(entry > 0);
    fs::remove_all(d.path());

    // Room for 3 entries: distinct prompts of 2 blocks each.
    const uint64_t limit = entry * 3 + entry / 2;
    for (uint32_t i = 0; i < 6; ++i) {
        Loaded t = real_session(2);
        t.session->set_prefix_cache(make_cache(d.path(), id, w, limit));
        std::vector<int32_t> q = random_tokens(40, 100 + i, 500);
        q[0] = 1;
        t.session->generate(q, greedy(1));
        CHECK(make_cache(d.path(), id, w, limit)->directory_bytes() <= limit);
    }
    // The last prompt's 2 blocks are there (the newest), and 3 entries in all.
    size_t n_entries = 0;
    for (const auto& e : fs::directory_iterator(d.path())) n_entries += e.path().extension() == ".tpc";
    CHECK(n_entries == 3);
    std::vector<int32_t> last = random_tokens(40, 105, 500);
    last[0] = 1;
    for (uint64_t k : prefix_chain_keys(std::span(last).first(32), 16, id))
        CHECK(fs::exists(make_cache(d.path(), id, w, limit)->entry_path(k)));

    // A hit refreshes an entry: prompt 4's first block (older) is used, then a new prompt evicts
    // the least recently used, which is no longer it.
    std::vector<int32_t> p4 = random_tokens(40, 104, 500);
    p4[0] = 1;
    const fs::path p4_block0 = make_cache(d.path(), id, w, limit)->entry_path(prefix_chain_keys(p4, 16, id)[0]);
    if (fs::exists(p4_block0)) {
        Loaded t = real_session(2);
        t.session->set_prefix_cache(make_cache(d.path(), id, w, limit));
        const GenerateResult r = t.session->generate(std::vector<int32_t>(p4.begin(), p4.begin() + 20), greedy(1));
        CHECK(r.n_from_disk == 16);
        Loaded u = real_session(2);
        u.session->set_prefix_cache(make_cache(d.path(), id, w, limit));
        std::vector<int32_t> q = random_tokens(20, 200, 500);
        q[0] = 1;
        u.session->generate(q, greedy(1));
        CHECK(fs::exists(p4_block0));
    }

    // A limit below one entry stores nothing and empties nothing it need not.
    test::TempDir tiny;
    Loaded t = real_session(2);
    t.session->set_prefix_cache(make_cache(tiny.path(), id, w, entry - 1));
    t.session->generate(p, greedy(1));
    CHECK(make_cache(tiny.path(), id, w)->directory_bytes() == 0);
    CHECK(w.lines.empty());
}

TEST_CASE("a failing write (file size limit) warns once, leaves no temporary file, and the run goes on") {
    if (!test::shared_available()) return;
    test::TempDir d;
    // A file where the directory should be: the directory cannot be made.
    test::write_file(d / "file", "x");
    Warnings w;
    Loaded s = real_session(2);
    s.session->set_prefix_cache(make_cache(d / "file" / "cache", identity_of(s), w));
    const std::vector<int32_t> p = story_prompt(*s.session, "What did Lily find?");
    const GenerateResult r = s.session->generate(p, greedy(4));
    CHECK(r.n_gen() == 4);
    s.session->generate(p, greedy(4));
    CHECK(w.lines.size() == 1);
    CHECK(w.lines[0].find("cannot create") != std::string::npos);
    // EFBIG itself is exercised end to end under `ulimit -f` (test_cli_prompt_cache.cpp); here the
    // temporary file of a failed write is gone.
    std::string why;
    std::vector<uint8_t> bytes(100, 1);
    CHECK_FALSE(write_cache_file_atomically(d / "no-such-dir" / "x.tpc", bytes, &why));
    CHECK(why.find("cannot create") != std::string::npos);
}
