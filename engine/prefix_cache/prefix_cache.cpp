#include "engine/prefix_cache/prefix_cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>

#include "engine/prefix_cache/prefix_cache_entry.h"
#include "engine/prefix_cache/prefix_cache_files.h"
#include "base/error.h"
#include "engine/load_errors.h"

namespace tern {
namespace fs = std::filesystem;
namespace {

constexpr const char* kEntrySuffix = ".tpc";
constexpr const char* kLockName = "lock";

bool older(const CacheFileInfo& a, const CacheFileInfo& b) {
    if (a.mtime.tv_sec != b.mtime.tv_sec) return a.mtime.tv_sec < b.mtime.tv_sec;
    if (a.mtime.tv_nsec != b.mtime.tv_nsec) return a.mtime.tv_nsec < b.mtime.tv_nsec;
    return a.path < b.path;
}

// Serialises the store-and-evict step of concurrent runs on one directory (flock, released when
// the descriptor closes), so that their combined entries never exceed the limit. Readers take no
// lock: entries appear by rename, whole.
struct DirLock {
    int fd = -1;
    explicit DirLock(const fs::path& dir) {
        fd = ::open((dir / kLockName).c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
        if (fd >= 0 && ::flock(fd, LOCK_EX) != 0) {
            ::close(fd);
            fd = -1;
        }
    }
    ~DirLock() {
        if (fd >= 0) ::close(fd);
    }
    bool held() const { return fd >= 0; }
};

// Sequence 0 through the methods every backend has (a backend without sequences has only it).
int32_t positions_held(const Backend& backend, int32_t seq) {
    return seq == 0 ? backend.n_past() : backend.seq_n_past(seq);
}

void keep_positions(Backend& backend, int32_t seq, int32_t n) {
    if (seq == 0) backend.kv_truncate(n);
    else backend.seq_truncate(seq, n);
}

} // namespace

fs::path default_prefix_cache_dir() {
    if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return fs::path(xdg) / "tern" / "prompts";
    if (const char* home = std::getenv("HOME"); home && *home) return fs::path(home) / ".cache" / "tern" / "prompts";
    return {};
}

std::optional<uint64_t> parse_byte_size(std::string_view text) {
    std::string s(text);
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
    if (s.empty() || !(std::isdigit(static_cast<unsigned char>(s[0])) || s[0] == '.')) return std::nullopt;
    size_t used = 0;
    double value = 0;
    try {
        value = std::stod(s, &used);
    } catch (const std::exception&) {
        return std::nullopt;
    }
    std::string unit = s.substr(used);
    for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    if (unit.ends_with("IB")) unit.resize(unit.size() - 2);
    else if (unit.size() > 1 && unit.ends_with("B")) unit.pop_back();
    else if (unit == "B") unit.clear();
    double scale = 1;
    if (unit == "K") scale = 1024.0;
    else if (unit == "M") scale = 1024.0 * 1024;
    else if (unit == "G") scale = 1024.0 * 1024 * 1024;
    else if (unit == "T") scale = 1024.0 * 1024 * 1024 * 1024;
    else if (!unit.empty()) return std::nullopt;
    const double bytes = std::floor(value * scale);
    if (!std::isfinite(bytes) || bytes < 0 || bytes > 1.8e19) return std::nullopt;
    return static_cast<uint64_t>(bytes);
}

std::vector<uint64_t> prefix_chain_keys(std::span<const int32_t> tokens, int32_t block_tokens, uint64_t identity) {
    std::vector<uint64_t> keys;
    if (block_tokens <= 0) return keys;
    const size_t block = static_cast<size_t>(block_tokens);
    uint64_t seed = identity;
    for (size_t i = 0; i + block <= tokens.size(); i += block) {
        seed = XXH3_64bits_withSeed(tokens.data() + i, block * sizeof(int32_t), seed);
        keys.push_back(seed);
    }
    return keys;
}

PrefixCache::PrefixCache(PrefixCacheOptions options, uint64_t identity, KvType kv_type, Warn warn)
    : options_(std::move(options)), identity_(identity), kv_type_(kv_type), warn_(std::move(warn)) {
    if (!warn_) warn_ = [](const Warning&) {};   // the caller words and prints its warnings
    if (options_.block_tokens <= 0) throw std::invalid_argument("PrefixCache: block_tokens must be positive");
}

fs::path PrefixCache::entry_path(uint64_t chain) const {
    char name[32];
    std::snprintf(name, sizeof name, "%016llx%s", static_cast<unsigned long long>(chain), kEntrySuffix);
    return options_.dir / name;
}

uint64_t PrefixCache::directory_bytes() const {
    uint64_t total = 0;
    for (const CacheFileInfo& f : list_cache_files(options_.dir, kEntrySuffix)) total += f.bytes;
    return total;
}

void PrefixCache::fault(const fs::path& path, const std::string& why) {
    const bool removed = remove_cache_path(path);
    warn_(path.string() + ": " + why + (removed ? "; removed it" : "; could not remove it") +
          " (the prompt is computed instead)");
}

std::optional<std::vector<uint8_t>> PrefixCache::read_block(uint64_t chain, uint32_t index,
                                                            std::span<const int32_t> tokens) {
    const fs::path path = entry_path(chain);
    bool missing = false;
    std::string why;
    // An entry is never larger than the limit (store() refuses those), so neither is a read.
    std::optional<std::vector<uint8_t>> bytes = read_cache_file(path, options_.max_bytes, &missing, &why);
    if (missing) return std::nullopt;
    if (!bytes) {
        fault(path, why);
        return std::nullopt;
    }
    PrefixEntry e;
    if (!parse_prefix_entry(*bytes, e, &why)) {
        fault(path, "corrupt entry (" + why + ")");
        return std::nullopt;
    }
    if (e.identity != identity_) why = "made by another model or other settings";
    else if (e.chain != chain) why = "its chain hash differs from its file name";
    else if (e.block_index != index) why = "holds block " + std::to_string(e.block_index) + ", not " + std::to_string(index);
    else if (e.kv_type != kv_type_) why = "holds another KV type";
    else if (!std::equal(e.tokens.begin(), e.tokens.end(), tokens.begin(), tokens.end()))
        why = "its tokens differ from the prompt's (hash collision)";
    if (!why.empty()) {
        fault(path, why);
        return std::nullopt;
    }
    return std::move(e.payload);
}

PrefixCache::Restored PrefixCache::restore(Backend& backend, std::span<const int32_t> prompt, int32_t n_held,
                                           int32_t limit, int32_t seq) {
    Restored r{n_held, 0};
    if (disabled_) return r;
    const int32_t block = options_.block_tokens;
    limit = std::min<int32_t>(limit, static_cast<int32_t>(prompt.size()));
    if (limit < block) return r;
    const std::vector<uint64_t> keys = prefix_chain_keys(prompt.first(static_cast<size_t>(limit)), block, identity_);
    for (size_t i = static_cast<size_t>(r.n_held / block); i < keys.size(); ++i) {
        const int32_t begin = static_cast<int32_t>(i) * block;
        const std::span<const int32_t> tokens = prompt.subspan(static_cast<size_t>(begin), static_cast<size_t>(block));
        std::optional<std::vector<uint8_t>> payload = read_block(keys[i], static_cast<uint32_t>(i), tokens);
        if (!payload) break;
        KvSnapshot snap;
        snap.n_past = block;
        snap.kv_type = kv_type_;
        snap.bytes = std::move(*payload);
        try {
            if (positions_held(backend, seq) != begin) keep_positions(backend, seq, begin);
            r.n_held = begin;
            backend.seq_append(seq, snap);   // checks the shape; the cache is unchanged when it throws
        } catch (const KvPoolExhausted&) {
            break;   // other sequences hold the pages: not the entry's fault nor the backend's
        } catch (const UsageError& e) {
            fault(entry_path(keys[i]), std::string("does not fit this model's KV cache (") + e.what() + ")");
            break;
        } catch (const RuntimeFailure& e) {
            warn_(std::string(e.what()) + "; the prompt cache is off for this run");
            disabled_ = true;
            break;
        }
        r.n_held = begin + block;
        r.n_disk += block;
    }
    return r;
}

bool PrefixCache::ensure_directory() {
    if (disabled_) return false;
    std::error_code ec;
    create_private_directories(options_.dir, ec);
    if (ec || !fs::is_directory(options_.dir, ec)) {
        warn_({options_.dir.string() + ": cannot create the prompt-cache directory" +
                   (ec ? " (" + ec.message() + ")" : std::string()) + "; prompts are not cached",
               true});
        disabled_ = true;
        return false;
    }
    return true;
}

void PrefixCache::store(const Backend& backend, std::span<const int32_t> tokens, int32_t n_valid, int32_t seq) {
    if (disabled_) return;
    const int32_t block = options_.block_tokens;
    n_valid = std::clamp<int32_t>(n_valid, 0, static_cast<int32_t>(tokens.size()));
    const std::vector<uint64_t> keys = prefix_chain_keys(tokens.first(static_cast<size_t>(n_valid)), block, identity_);
    // A short prompt has nothing to store: make no directory for it (it still enforces a lowered
    // limit on an existing one).
    std::error_code ec;
    if (keys.empty() && !fs::exists(options_.dir, ec)) return;
    if (!ensure_directory()) return;

    DirLock lock(options_.dir);   // without it (a read-only lock file) the limit still holds per run
    std::vector<CacheFileInfo> files = list_cache_files(options_.dir, kEntrySuffix);
    if (lock.held()) {
        // Writers hold the lock while a temporary exists: any left now is from a killed run.
        std::erase_if(files, [](const CacheFileInfo& f) { return f.temporary && remove_cache_path(f.path); });
    }
    uint64_t total = 0;
    for (const CacheFileInfo& f : files) total += f.bytes;
    std::set<fs::path> chain;   // this prompt's entries, kept while others are evicted
    auto evict_until = [&](uint64_t room) {
        std::sort(files.begin(), files.end(), older);
        for (auto it = files.begin(); it != files.end() && total + room > options_.max_bytes;) {
            if (chain.count(it->path) || !remove_cache_path(it->path)) {
                ++it;
                continue;
            }
            total -= it->bytes;
            it = files.erase(it);
        }
        return total + room <= options_.max_bytes;
    };

    uint64_t chain_bytes = 0;
    for (size_t i = 0; i < keys.size(); ++i) {
        const fs::path path = entry_path(keys[i]);
        const auto existing = std::find_if(files.begin(), files.end(), [&](const CacheFileInfo& f) { return f.path == path; });
        if (existing != files.end()) {
            chain_bytes += existing->bytes;
            if (chain_bytes > options_.max_bytes) break;
            chain.insert(path);
            continue;
        }
        PrefixEntry e;
        e.identity = identity_;
        e.chain = keys[i];
        e.block_index = static_cast<uint32_t>(i);
        e.kv_type = kv_type_;
        const size_t begin = i * static_cast<size_t>(block);
        e.tokens.assign(tokens.begin() + static_cast<std::ptrdiff_t>(begin),
                        tokens.begin() + static_cast<std::ptrdiff_t>(begin + static_cast<size_t>(block)));
        try {
            e.payload = backend.seq_save_range(seq, static_cast<int32_t>(begin), static_cast<int32_t>(begin) + block).bytes;
        } catch (const TernError& err) {
            warn_(std::string(err.what()) + "; prompts are not cached");
            disabled_ = true;
            break;
        }
        const std::vector<uint8_t> bytes = serialize_prefix_entry(e);
        chain_bytes += bytes.size();
        if (chain_bytes > options_.max_bytes || !evict_until(bytes.size())) break;
        std::string why;
        if (!write_cache_file_atomically(path, bytes, &why)) {
            if (!store_warned_)
                warn_(why + " (a full disk, a file size limit or a read-only directory?); the prompt cache was not updated, the run goes on");
            store_warned_ = true;
            break;
        }
        total += bytes.size();
        chain.insert(path);
        CacheFileInfo info{path, bytes.size(), {}, false};
        ::clock_gettime(CLOCK_REALTIME, &info.mtime);
        files.push_back(info);
    }
    // Entries beyond what this prompt keeps are candidates too: a lower limit than last time.
    evict_until(0);
    if (total > options_.max_bytes) {
        // Only this prompt's entries are left: drop its last blocks first (the first ones serve
        // every prompt that starts the same way).
        for (size_t i = keys.size(); i-- > 0 && total > options_.max_bytes;) {
            const auto it = std::find_if(files.begin(), files.end(),
                                         [&](const CacheFileInfo& f) { return f.path == entry_path(keys[i]); });
            if (it == files.end() || !remove_cache_path(it->path)) continue;
            total -= it->bytes;
            files.erase(it);
        }
    }
}

} // namespace tern
