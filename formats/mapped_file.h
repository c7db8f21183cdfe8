#pragma once
// RAII read-only memory map of a whole file. Empty files map to an empty span. Regular files only
// (a directory, FIFO or device is refused). Should the file shrink while mapped, the SIGBUS a read
// of the lost pages raises ends tern with one line naming the file and exit 3, not a silent death.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace tern {

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

private:
    std::string path_;
    const uint8_t* data_ = nullptr;
    size_t size_ = 0;
    int sigbus_slot_ = -1;   // the SIGBUS handler's record of this mapping (mapped_file.cpp)
};

} // namespace tern
