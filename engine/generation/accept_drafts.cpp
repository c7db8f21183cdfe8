#include "engine/generation/accept_drafts.h"

namespace tern {

AcceptedDrafts accept_drafts(std::span<const int32_t> drafts, const std::function<ProducedToken(size_t row)>& produce) {
    AcceptedDrafts out;
    for (size_t row = 0;; ++row) {
        const ProducedToken p = produce(row);
        // A token that ends generation still confirms its draft: it is kept, and so are its K/V.
        const bool confirms = p.token && row < drafts.size() && *p.token == drafts[row];
        if (confirms) ++out.accepted;
        if (p.stop) {
            out.stop = p.stop;
            return out;
        }
        if (!confirms) return out;
    }
}

} // namespace tern
