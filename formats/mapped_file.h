#pragma once
// RAII read-only memory map of a whole file. Empty files map to an empty span.
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
};

} // namespace tern
