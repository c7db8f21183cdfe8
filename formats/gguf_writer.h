#pragma once
// GgufWriter: writes GGUF v3 (metadata, tensor infos, aligned data) to a unique temporary file
// beside PATH (PATH.tmp.<pid>.<random>, formats/atomic_file.h) and renames it into place only when
// everything was written and flushed. On any failure (including a full disk) the temporary file is
// removed and RuntimeFailure/InputError names the path. A PATH that exists and is not a regular file
// (symlink, directory, device node, FIFO) is refused with UsageError, never replaced.
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "formats/gguf.h"

namespace tern {

class GgufWriter {
public:
    void set(const std::string& key, GgufValue value);   // replaces an existing key, keeps order
    void remove(const std::string& key);
    void copy_metadata_from(const GgufFile& file);      // all keys, in file order
    const std::vector<GgufKv>& metadata() const { return kvs_; }

    // Declare a tensor (ne[0] contiguous). Its bytes come from `data` or, when `data` is empty,
    // from the fill callback at write time (so quantize can stream without holding the model).
    void add_tensor(const std::string& name, GgmlType type, std::vector<int64_t> ne,
                    std::span<const uint8_t> data = {});

    using FillFn = std::function<void(size_t tensor_index, std::span<uint8_t> out)>;
    // Writes a temporary file beside PATH then renames it to PATH. `alignment` is also stored as general.alignment when
    // it differs from 32 (an existing general.alignment key is always set to `alignment`, so the
    // key matches the layout). Spans given to add_tensor must stay valid until write returns.
    // Errors: RuntimeFailure naming PATH for I/O failures (ENOSPC, EFBIG, ...) and for a std::exception
    // thrown by `fill`; a TernError or std::bad_alloc from `fill` propagates unchanged. Either way
    // the temporary file is removed and an existing PATH is left untouched. Bad declarations: InputError.
    void write(const std::string& path, const FillFn& fill = {}, uint32_t alignment = 32) const;

private:
    struct PendingTensor {
        std::string name;
        GgmlType type;
        std::vector<int64_t> ne;
        std::span<const uint8_t> data;
    };
    std::vector<GgufKv> kvs_;
    std::vector<PendingTensor> tensors_;
};

} // namespace tern
