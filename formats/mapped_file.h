#pragma once
// RAII read-only memory map of a whole file. Empty files map to an empty span. Regular files only
// (a directory, FIFO or device is refused). Should the file shrink while mapped, the SIGBUS a read
// of the lost pages raises ends tern with one line naming the file and exit 3, not a silent death.
//
// A file rewritten in place keeps its length, so no read faults: the mapping simply shows the new bytes.
// The file's size and modification time (nanoseconds) are recorded at open from the descriptor, which
// stays open, and check_mapped_files() compares them again: long-running commands call it between steps
// (before a logit row is used), so a rewrite is noticed at the next step. Replacing the file by rename
// is safe and never reported: the descriptor and the mapping keep the old file.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "base/error.h"

namespace tern {

// A mapped file found changed since it was opened: exit 3, the message names it.
struct FileChanged : RuntimeFailure {
    explicit FileChanged(std::string path);
    std::string path;
};

// What check_mapped_files() compares. Not the inode or device (the open descriptor always has the
// ones it was opened with), nor the status-change time (a chmod or a rename of the file changes it
// and neither changes a byte).
struct FileIdentity {
    int64_t size = 0;
    int64_t mtime_sec = 0;
    int64_t mtime_nsec = 0;
    friend bool operator==(const FileIdentity&, const FileIdentity&) = default;
};

// Throws FileChanged for the first file mapped now (every live MappedFile of the process) whose size or
// modification time is no longer what it was at open. One fstat per mapped file: well under a
// microsecond each.
void check_mapped_files();

class MappedFile {
public:
    // Throws InputError naming the path: missing, a directory, unreadable, not a regular file.
    static MappedFile open(const std::string& path);

    MappedFile() = default;
    MappedFile(MappedFile&& other) noexcept;
    MappedFile& operator=(MappedFile&& other) noexcept;
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;
    ~MappedFile();

    std::span<const uint8_t> bytes() const { return {data_, size_}; }
    const uint8_t* data() const { return data_; }
    size_t size() const { return size_; }
    const std::string& path() const { return path_; }
    // True when the file's size or modification time differs from what it was at open (or it can no
    // longer be examined). An empty file, which has no mapping, is never watched: false.
    bool changed() const;

private:
    void close_mapping() noexcept;   // unwatch, unmap, close: the destructor and the move assignment

    std::string path_;
    const uint8_t* data_ = nullptr;
    size_t size_ = 0;
    int fd_ = -1;            // kept open for changed(): it names the file that was mapped, whatever renames follow
    FileIdentity identity_;  // at open
    int sigbus_slot_ = -1;   // the SIGBUS handler's record of this mapping (mapped_file.cpp)
    uint64_t watch_id_ = 0;  // check_mapped_files()'s record of this mapping; 0: none
};

} // namespace tern
