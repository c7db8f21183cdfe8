#pragma once
// The on-disk half of the prefix cache (the in-memory half is Session's kv_tokens reuse). A
// prompt's tokens are cut into fixed blocks; block i is keyed by a chain hash: XXH3-64 of its
// tokens seeded with block i-1's key (block 0's seed is the model identity), so one key names
// the block AND everything before it, for this model and these settings. Each entry file holds
// only its own block's K/V (engine/prefix_cache/prefix_cache_entry.h). A run restores the longest run of
// cached blocks from the start of its prompt and prefills the rest; afterwards it stores the
// prompt's blocks that were not cached yet, then evicts least-recently-used entries so that the
// directory stays within its size limit.
//
// Restored K/V equal a cold prefill's bit for bit (the CPU kernels are batch-invariant), so a hit
// changes no output. Any fault (a corrupt, truncated, foreign or unreadable entry, a full disk)
// costs one warning line and a cold prefill; it never fails the run.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/backend.h"

namespace tern {

struct PrefixCacheOptions {
    std::filesystem::path dir;
    uint64_t max_bytes = uint64_t(1) << 30;   // --prompt-cache-size
    // Small enough that the uncached tail (the partial last block of the shared part, which is
    // prefilled again) stays a small fraction of a long prompt; large enough that a prompt is a
    // few dozen files (Gemma 3 270M: 1.2 MB of f16 K/V per block).
    int32_t block_tokens = 64;
};

// $XDG_CACHE_HOME/tern/prompts, else $HOME/.cache/tern/prompts; empty when neither is set.
std::filesystem::path default_prefix_cache_dir();

// "1073741824", "512M", "2G", "64k", "1.5G" (powers of 1024; an optional trailing "B" or "iB").
// nullopt when the text is not such a size.
std::optional<uint64_t> parse_byte_size(std::string_view text);

// The chain keys of the full blocks of `tokens` (a last partial block has none).
std::vector<uint64_t> prefix_chain_keys(std::span<const int32_t> tokens, int32_t block_tokens, uint64_t identity);

class PrefixCache {
public:
    // One line, no newline. no_directory: the cache directory cannot be made, so the caller may add
    // how to choose another (it knows which setting gave the directory).
    struct Warning {
        Warning(std::string text_, bool no_directory_ = false) : text(std::move(text_)), no_directory(no_directory_) {}
        std::string text;
        bool no_directory = false;
    };
    using Warn = std::function<void(const Warning&)>;
    // The engine prints nothing: without `warn` the warnings are dropped (the app prints them).
    PrefixCache(PrefixCacheOptions options, uint64_t identity, KvType kv_type, Warn warn = {});

    struct Restored {
        int32_t n_held = 0;   // positions the backend holds afterwards (a prefix of the prompt)
        int32_t n_disk = 0;   // of which were read from disk in this call
    };
    // Sequence `seq` of `backend` (0: the backend's own; others: a batching engine's, through
    // Backend::seq_*) holds the first `n_held` tokens of `prompt`. Restores the cached blocks that
    // follow, in order, up to position `limit` (the caller prefills at least the last prompt token).
    // A block that starts at or before n_held replaces the positions from its start (the same bytes
    // a cold prefill makes); the backend is touched only once the next block was read and checked.
    // A paged KV pool without free pages ends the restore quietly (the rest is prefilled).
    Restored restore(Backend& backend, std::span<const int32_t> prompt, int32_t n_held, int32_t limit,
                     int32_t seq = 0);

    // Stores the full blocks of `tokens` whose K/V sequence `seq` of the backend holds at positions
    // [0, n_valid) and that are not cached yet, then evicts down to the size limit. Blocks are
    // stored in order and only while the chain so far fits the limit (a block is useless without
    // those before it).
    void store(const Backend& backend, std::span<const int32_t> tokens, int32_t n_valid, int32_t seq = 0);

    std::filesystem::path entry_path(uint64_t chain) const;
    const PrefixCacheOptions& options() const { return options_; }
    uint64_t identity() const { return identity_; }
    // Bytes of the entries (and leftover temporaries) in the directory now.
    uint64_t directory_bytes() const;

private:
    // The entry of block `index` if it is on disk and valid; a faulty one is reported and removed.
    std::optional<std::vector<uint8_t>> read_block(uint64_t chain, uint32_t index, std::span<const int32_t> tokens);
    void fault(const std::filesystem::path& path, const std::string& why);
    bool ensure_directory();

    PrefixCacheOptions options_;
    uint64_t identity_ = 0;
    KvType kv_type_ = KvType::f16;
    Warn warn_;
    bool disabled_ = false;     // the directory or the backend cannot take entries: warned once
    bool store_warned_ = false; // one warning per run for a failing write
};

} // namespace tern
