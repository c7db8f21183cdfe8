#include "engine/tensor_scan.h"

#include <algorithm>
#include <atomic>
#include <mutex>

#include "base/parallel_for.h"

namespace tern {
namespace {

// A piece of one tensor: whole blocks, about kPieceBytes, so that a large tensor spreads over the threads and a
// bad block found early lets the pieces after it be skipped.
struct Piece {
    size_t tensor;
    int64_t first_block, n_blocks;
};

constexpr uint64_t kPieceBytes = uint64_t{4} << 20;

} // namespace

TensorScan scan_tensor_values(const GgufFile& file, int n_threads,
                              const std::function<void(uint64_t, uint64_t)>& on_progress) {
    TensorScan scan;
    const std::vector<GgufTensor>& tensors = file.tensors();
    std::vector<Piece> pieces;
    uint64_t total = 0;
    for (size_t i = 0; i < tensors.size(); ++i) {
        const GgufTensor& t = tensors[i];
        if (!values_checkable(t.type)) {
            scan.skipped.push_back(t.name + " (" + std::string(type_name(t.type)) + ")");
            continue;
        }
        const TypeInfo& ti = type_info(t.type);
        const int64_t n_blocks = t.n_elements() / ti.block_elems;
        const int64_t per_piece = std::max<int64_t>(1, static_cast<int64_t>(kPieceBytes / ti.block_bytes));
        for (int64_t b = 0; b < n_blocks; b += per_piece)
            pieces.push_back({i, b, std::min(per_piece, n_blocks - b)});
        ++scan.tensors_checked;
        total += t.n_bytes;
    }
    scan.bytes_checked = total;

    // One result slot per piece; `first_bad` is the lowest piece known bad, so later ones need not be read.
    std::vector<std::optional<BadValue>> found(pieces.size());
    std::atomic<size_t> first_bad{pieces.size()};
    std::atomic<uint64_t> done{0};
    std::mutex progress_mutex;
    parallel_for(static_cast<int64_t>(pieces.size()), n_threads, 1, [&](int64_t begin, int64_t end) {
        for (int64_t p = begin; p < end; ++p) {
            const Piece& piece = pieces[static_cast<size_t>(p)];
            if (static_cast<size_t>(p) > first_bad.load(std::memory_order_relaxed)) continue;
            const GgufTensor& t = tensors[piece.tensor];
            const TypeInfo& ti = type_info(t.type);
            found[static_cast<size_t>(p)] =
                find_bad_value(t.type, t.data + static_cast<size_t>(piece.first_block) * ti.block_bytes,
                               piece.n_blocks * ti.block_elems, piece.first_block);
            if (found[static_cast<size_t>(p)]) {
                size_t cur = first_bad.load();
                while (static_cast<size_t>(p) < cur && !first_bad.compare_exchange_weak(cur, static_cast<size_t>(p))) {
                }
            }
            const uint64_t now = done.fetch_add(static_cast<uint64_t>(piece.n_blocks) * ti.block_bytes) +
                                 static_cast<uint64_t>(piece.n_blocks) * ti.block_bytes;
            if (on_progress && progress_mutex.try_lock()) {
                on_progress(now, total);
                progress_mutex.unlock();
            }
        }
    });
    if (const size_t p = first_bad.load(); p < pieces.size())
        scan.bad = TensorScan::Bad{tensors[pieces[p].tensor].name, *found[p]};
    else if (on_progress)
        on_progress(total, total);
    return scan;
}

std::string describe_bad_tensor(const GgufFile& file, const TensorScan::Bad& bad) {
    return file.path() + ": tensor " + bad.tensor + ": " + bad.value.what +
           " (a damaged or wrongly converted file: running it gives NaN or infinite values)";
}

} // namespace tern
