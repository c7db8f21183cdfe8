#pragma once
// File operations of the on-disk prefix cache, written for a directory that other processes
// share and that anything may have been put into: nothing here follows a symlink, opens a
// non-regular file (a FIFO would block the run) or leaves a half-written file under a final name.
#include <cstdint>
#include <ctime>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace tern {

// The bytes of a regular file, read without following a symlink or blocking. nullopt with
// *missing = true when the file does not exist (a miss, not a fault); otherwise nullopt with
// the reason in *why. Files over max_bytes are refused unread. On success the file's mtime is
// set to now (least-recently-used bookkeeping).
std::optional<std::vector<uint8_t>> read_cache_file(const std::filesystem::path& path, uint64_t max_bytes,
                                                    bool* missing, std::string* why);

// Writes bytes to a new unique temporary file next to `path` (formats/atomic_file.h, mode 0600),
// then renames it over `path`, so a reader sees either no file or the whole file. No fsync: a crash
// may lose the entry, and the checksum catches a torn one. On failure (EFBIG under `ulimit -f`,
// ENOSPC, a non-regular file at `path`, ...) the temporary file is removed and false is returned
// with the reason in *why.
bool write_cache_file_atomically(const std::filesystem::path& path, std::span<const uint8_t> bytes, std::string* why);

// Creates `dir` and its missing parents with mode 0700 (the entries hold users' prompts); existing
// directories keep their mode. True when `dir` is a directory afterwards.
bool create_private_directories(const std::filesystem::path& dir, std::error_code& ec);

// Removes what sits at `path` (file, symlink, FIFO or empty directory) without following links.
// True when nothing is there afterwards.
bool remove_cache_path(const std::filesystem::path& path);

struct CacheFileInfo {
    std::filesystem::path path;
    uint64_t bytes = 0;
    timespec mtime{};
    bool temporary = false;   // a write_cache_file_atomically() temporary
};

// The regular files in `dir` whose names end with `suffix` (entries) or contain `suffix` + ".tmp."
// (temporaries), from lstat (links and other kinds are skipped).
std::vector<CacheFileInfo> list_cache_files(const std::filesystem::path& dir, const std::string& suffix);

} // namespace tern
