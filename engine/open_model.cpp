#include "engine/open_model.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "base/error.h"
#include "engine/backend_factory.h"
#include "engine/load_errors.h"
#include "engine/memory_budget.h"

namespace tern {

ContextChoice choose_context(int32_t requested, int32_t n_ctx_train, uint64_t bytes_per_position,
                             uint64_t memory_left_for_kv) {
    ContextChoice c;
    c.n_ctx_train = n_ctx_train;
    c.kv_bytes_at_train = bytes_per_position * static_cast<uint64_t>(std::max(n_ctx_train, 0));
    c.kv_budget = memory_left_for_kv / 2;
    if (requested > 0) {
        c.n_ctx = requested;
        c.origin = ContextOrigin::requested;
        return c;
    }
    // Files that do not say (rare) get 4096, a size every supported architecture handles.
    const int32_t wanted = n_ctx_train > 0 ? n_ctx_train : 4096;
    const uint64_t fits = bytes_per_position ? c.kv_budget / bytes_per_position : uint64_t(wanted);
    c.origin = ContextOrigin::model;
    c.n_ctx = wanted;
    if (fits >= static_cast<uint64_t>(wanted)) return c;
    // Round down to a multiple of 256 for tidy numbers, but never below 256 positions.
    const uint64_t rounded = std::max<uint64_t>(fits / 256 * 256, 256);
    c.origin = ContextOrigin::memory_cap;
    c.n_ctx = static_cast<int32_t>(std::min<uint64_t>(rounded, static_cast<uint64_t>(wanted)));
    return c;
}

namespace {

// One backend's memory for the model. Each request shape is planned once: the automatic device probe at a given
// context and the final check ask for the same one, as do the automatic context's base and a 512-position
// context. The limits are read at each check: the file and the caller's checks (a tokenizer) take their share
// in between.
class BackendMemory {
public:
    BackendMemory(const Backend& backend, const Model& model) : backend_(backend), model_(model) {}

    MemoryNeed plan(const MemoryRequest& request) {
        for (const Planned& p : plans_)
            if (same_shape(p.request, request)) return p.need;
        plans_.push_back({request, backend_.plan_memory(model_.config, model_.weights, request)});
        return plans_.back().need;
    }
    // Nothing when model + `request` fit the backend's memory; else the first limit they exceed.
    std::optional<MemoryShortfall> shortfall(const MemoryRequest& request) {
        return find_memory_shortfall(plan(request), backend_.memory_limits(), request);
    }
    // What the weights and buffers of `request` leave for the KV cache.
    uint64_t left_for_kv(const MemoryRequest& request) {
        return memory_left_for_kv(plan(request), backend_.memory_limits());
    }

private:
    static bool same_shape(const MemoryRequest& a, const MemoryRequest& b) {
        return a.kv_type == b.kv_type && a.n_ctx == b.n_ctx && a.n_batch == b.n_batch &&
               a.n_logit_rows == b.n_logit_rows && a.kv_pool_positions == b.kv_pool_positions;
    }
    struct Planned {
        MemoryRequest request;
        MemoryNeed need;
    };
    const Backend& backend_;
    const Model& model_;
    std::vector<Planned> plans_;
};

// The positions of a KV pool that holds `sequences` contexts of n_ctx.
int32_t pool_positions(int64_t sequences, int32_t n_ctx) {
    return static_cast<int32_t>(std::min<int64_t>(sequences * n_ctx, std::numeric_limits<int32_t>::max()));
}

bool automatic_device(const std::string& device) {
    const auto parsed = parse_device(device);
    return parsed && parsed->automatic;
}

} // namespace

OpenedModel open_model(const OpenRequest& r) {
    OpenedModel opened;
    std::string note;
    opened.backend = make_backend(r.device, r.cpu, r.on_device_note ? &note : nullptr, r.gpu_layers);

    opened.model = std::make_shared<Model>(r.open_file ? r.open_file() : load_model(r.path));
    const Model& m = *opened.model;
    if (r.on_file_opened) r.on_file_opened(m);

    // The automatic context sizes its KV cache against what the weights and buffers leave; any
    // context, chosen or given, must then fit before the backend allocates.
    MemoryRequest request = r.shape;
    request.kv_type = r.kv_type;
    std::optional<BackendMemory> memory(std::in_place, *opened.backend, m);

    // An automatic choice of the GPU falls back to the CPU when the model does not fit the GPU's memory
    // even with the smallest automatic context (or the context asked for).
    if (opened.backend->device_kind() != DeviceKind::cpu && automatic_device(r.device)) {
        request.n_ctx = r.n_ctx > 0 ? r.n_ctx : 256;
        if (const std::optional<MemoryShortfall> shortfall = memory->shortfall(request)) {
            note = "device auto: " + describe_memory_shortfall(*shortfall) + " on " + opened.backend->device_name() +
                   "; running on the cpu";
            memory.reset();   // planned for the backend that goes
            opened.backend = make_backend("cpu", r.cpu);
            memory.emplace(*opened.backend, m);
        }
    }

    const Backend& backend = *opened.backend;
    const int64_t sequences = backend.supports_sequences() ? std::max(r.sequences, 1) : 1;
    request.n_ctx = 512;   // the batch the base need is sized with, as a forward of a full prefill chunk
    const uint64_t left = memory->left_for_kv(request);
    opened.context = choose_context(r.n_ctx, m.config.n_ctx_train,
                                    kv_bytes_per_position(m.config, r.kv_type) * static_cast<uint64_t>(sequences), left);
    if (r.on_context) r.on_context(opened.context);

    // The limits read again: the file and the caller's checks (a tokenizer) have taken their share.
    request.n_ctx = opened.context.n_ctx;
    if (sequences > 1) request.kv_pool_positions = pool_positions(sequences, opened.context.n_ctx);
    if (const std::optional<MemoryShortfall> shortfall = memory->shortfall(request))
        throw MemoryShortfallError(*shortfall);

    RunOptions options;
    options.n_ctx = opened.context.n_ctx;
    options.kv_type = r.kv_type;
    options.kv_pool_positions = request.kv_pool_positions;
    options.on_upload = r.on_upload;
    try {
        opened.backend->load(m.config, m.weights, options);
    } catch (const DeviceCannotRun& e) {
        // A GPU chosen automatically whose kernels lack one of the model's formats or shapes: the CPU
        // runs it, at the context already chosen (checked against the host's memory first).
        if (!automatic_device(r.device)) throw;
        note = "device auto: " + std::string(e.what()) + "; running on the cpu";
        memory.reset();   // planned for the backend that goes
        opened.backend = make_backend("cpu", r.cpu);
        memory.emplace(*opened.backend, m);
        if (r.sequences > 1)   // the CPU's pool holds the sequences a GPU's single cache would not
            request.kv_pool_positions = options.kv_pool_positions = pool_positions(r.sequences, opened.context.n_ctx);
        if (const std::optional<MemoryShortfall> shortfall = memory->shortfall(request))
            throw MemoryShortfallError(*shortfall);
        opened.backend->load(m.config, m.weights, options);
    }
    // Said once the model is loaded: an error on the way stays the one line on stderr.
    if (!note.empty() && r.on_device_note) r.on_device_note(note);
    return opened;
}

} // namespace tern
