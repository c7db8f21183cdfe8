#pragma once
// How the command line words what the engine reports. The engine gives kinds and numbers and never
// names a flag (it does not know which front end drives it): its structured errors
// (engine/load_errors.h, DeviceUnavailable, DraftModelUnfit, ConversationMismatch, ...) and
// fallbacks become here the one-line messages that name the flag which set the number and the flag
// that changes it.
#include <string>

#include "engine/chat/chat_template.h"
#include "engine/chat/conversation.h"
#include "engine/chat/conversation_file.h"
#include "engine/memory_need.h"
#include "engine/prefix_cache/prefix_cache.h"

namespace tern::app {

// The one-line warning for a chat template that fell back to chatml; "" when it was recognised.
std::string chat_template_warning(const ChatTemplateDetection& detection);

// The one-line error for a conversation file made for another setup, naming the flag that fits it.
std::string conversation_mismatch_message(const ConversationMismatch& mismatch);

// A chat notice as printed (the one about dropping turns names -c).
std::string conversation_notice_line(const ConversationNotice& notice);

// A message with no room for a reply, naming -c.
std::string no_room_for_reply_message(const NoRoomForReplyError& error);

// A prompt-cache warning as printed (a directory that cannot be made names the flags that choose one).
std::string prompt_cache_warning_line(const PrefixCache::Warning& warning);


// "-c N: needs X of memory (weights W, KV cache K as f16, buffers B) but A is available (source);
// use a smaller -c (...), --kv-type q8_0 (...) or a smaller quantization of the model".
std::string memory_shortfall_line(const MemoryShortfall& shortfall);

// Call inside a catch block: rethrows the exception being handled, worded with the flags when it
// is one of the engine's structured errors, else as it is.
[[noreturn]] void rethrow_with_flags();

// Runs `open` (an engine call that opens a model) and words its structured errors.
template <class F> auto with_flag_words(F&& open) -> decltype(open()) {
    try {
        return open();
    } catch (...) {
        rethrow_with_flags();
    }
}

} // namespace tern::app
