#include "formats/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "formats/error.h"

namespace tern {
namespace {

// Closes the descriptor on every path out of open(); the mapping outlives it.
struct FdGuard {
    int fd;
    ~FdGuard() {
        if (fd >= 0) ::close(fd);
    }
};

std::string errno_text(int err) {
    return std::strerror(err);
}

} // namespace

MappedFile MappedFile::open(const std::string& path) {
    // O_NONBLOCK so that a FIFO given by mistake fails below instead of blocking forever in
    // open(); it has no effect on regular files.
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        const int err = errno;
        if (err == ENOENT) throw InputError(path + ": no such file");
        if (err == EACCES) throw InputError(path + ": cannot open: permission denied");
        if (err == ENOTDIR) throw InputError(path + ": no such file (a parent in the path is not a directory)");
        throw InputError(path + ": cannot open: " + errno_text(err));
    }
    FdGuard guard{fd};

    struct stat st {};
    if (::fstat(fd, &st) != 0) throw InputError(path + ": cannot stat: " + errno_text(errno));
    if (S_ISDIR(st.st_mode)) throw InputError(path + ": is a directory, expected a GGUF file");
    if (!S_ISREG(st.st_mode)) throw InputError(path + ": is not a regular file, expected a GGUF file");

    MappedFile m;
    m.path_ = path;
    if (st.st_size == 0) return m; // mmap of length 0 is EINVAL; an empty span is the honest answer

    const size_t size = static_cast<size_t>(st.st_size);
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
        const int err = errno;
        if (err == ENOMEM)
            throw RuntimeFailure(path + ": cannot map " + std::to_string(size) +
                                 " bytes: out of address space or memory");
        throw InputError(path + ": cannot map the file: " + errno_text(err));
    }
    m.data_ = static_cast<const uint8_t*>(p);
    m.size_ = size;
    return m;
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)), data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
    if (this != &other) {
        if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
        path_ = std::move(other.path_);
        data_ = std::exchange(other.data_, nullptr);
        size_ = std::exchange(other.size_, 0);
    }
    return *this;
}

MappedFile::~MappedFile() {
    if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

} // namespace tern
