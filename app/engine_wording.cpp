#include "app/engine_wording.h"

#include "base/error.h"
#include "base/terminal_text.h"
#include "engine/backend_factory.h"
#include "engine/load_errors.h"
#include "engine/memory_budget.h"
#include "engine/speculative/drafter_model.h"

namespace tern::app {

std::string chat_template_warning(const ChatTemplateDetection& d) {
    using Fallback = ChatTemplateDetection::Fallback;
    switch (d.fallback) {
    case Fallback::none: return {};
    case Fallback::no_template:
        return "the model has no chat template (tokenizer.chat_template); using chatml (choose another with "
               "--chat-template NAME)";
    case Fallback::unrecognised_template:
        return "the model's chat template is not one tern recognises (" + std::to_string(d.template_chars) +
               " chars); using chatml (choose another with --chat-template NAME)";
    case Fallback::unrecognised_override: {
        std::string known;
        for (const std::string& n : ChatTemplate::names())
            known += (known.empty() ? "" : ", ") + n;
        return "--chat-template '" + d.override_text +
               "' is neither a template name nor a template tern recognises; using chatml (names: " + known + ")";
    }
    }
    return {};
}

std::string conversation_mismatch_message(const ConversationMismatch& m) {
    using Kind = ConversationMismatch::Kind;
    std::string line;
    switch (m.kind) {
    case Kind::model:
        line = m.path + ": saved with another model or --kv-type (" + m.saved + "), not this one (" + m.current + ")";
        break;
    case Kind::context:
        line = m.path + ": the conversation has " + m.saved + " tokens but the context is " + m.current + " (raise -c)";
        break;
    case Kind::chat_template:
        line = "the conversation was saved with the chat template " + m.saved + ", not " + m.current +
               " (start tern chat with --chat-template " + m.saved + ")";
        break;
    }
    return terminal_safe(line);   // it quotes file content, as every error message may
}

std::string conversation_notice_line(const ConversationNotice& n) {
    if (n.kind != ConversationNotice::Kind::dropping_turns) return n.text;
    return "the conversation reached the " + std::to_string(n.n_ctx) +
           "-token context: dropping its oldest turns to continue (the system prompt and the first tokens are kept; "
           "-c sets the size)";
}

std::string no_room_for_reply_message(const NoRoomForReplyError& e) {
    return "the message takes " + std::to_string(e.turn_tokens) + " tokens and the conversation keeps " +
           std::to_string(e.kept) + " (system prompt, first tokens), which leaves no room in the " +
           std::to_string(e.n_ctx) + "-token context for a reply (shorten it or raise -c)";
}

std::string prompt_cache_warning_line(const PrefixCache::Warning& w) {
    if (!w.no_directory) return w.text;
    return w.text + " (choose another with --prompt-cache DIR or turn it off with --no-prompt-cache)";
}

std::string memory_shortfall_line(const MemoryShortfall& s) {
    std::string hint = "a smaller -c (the KV cache grows with it)";
    if (!kv_format_info(s.request.kv_type).quantized) hint += ", --kv-type q8_0 (about half of f16's KV bytes)";
    hint += " or a smaller quantization of the model";
    return "-c " + std::to_string(s.request.n_ctx) + ": needs " + format_memory(s.wanted) + " of memory (" +
           (s.resident() ? "weights " : "packed weights ") + format_memory(s.weights) + ", KV cache " +
           format_memory(s.need.kv) + " as " + std::string(kv_type_name(s.request.kv_type)) + ", buffers " +
           format_memory(s.need.buffers) + ") but " + format_memory(s.limit.available) + " is available (" +
           s.limit.source + "); use " + hint;
}

void rethrow_with_flags() {
    try {
        throw;
    } catch (const DeviceUnavailable& e) {
        if (e.reason == DeviceUnavailable::Reason::not_built)
            throw UsageError("--device " + e.device + ": tern was built without CUDA; use --device cpu");
        throw;
    } catch (const DeviceCannotRun& e) {
        throw InputError("--device " + e.device + ": " + std::string(e.what()).substr(e.device.size() + 1) +
                         "; use --device cpu");
    } catch (const GpuUnavailable& e) {
        throw RuntimeFailure("--device " + e.device + ": " + e.why + "; use --device cpu or auto");
    } catch (const MemoryShortfallError& e) {
        throw RuntimeFailure(memory_shortfall_line(e.shortfall));
    } catch (const KvHeadDimsUnfit& e) {
        throw UsageError("--kv-type " + std::string(kv_type_name(e.type)) +
                         " needs head dimensions that are multiples of " + std::to_string(e.block) +
                         ", this model has " + std::to_string(e.head_dim) + " (K) and " +
                         std::to_string(e.head_dim_v) + " (V); use --kv-type f16");
    } catch (const KvAllocationFailed& e) {
        throw RuntimeFailure("out of memory allocating the KV cache for " + std::to_string(e.n_ctx) +
                             " positions; use a smaller context (-c)");
    } catch (const DraftModelUnfit& e) {
        // Its vocabulary line starts with the file's path; a file that does not open says why.
        throw InputError((e.vocabulary ? "--draft-model " : "--draft-model: ") + std::string(e.what()));
    }
}

} // namespace tern::app
