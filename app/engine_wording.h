#pragma once
// How the command line words what the engine reports. The engine gives kinds and numbers and never
// names a flag (it does not know which front end drives it); the sentences that tell a user which
// flag to change live here, next to the flags themselves.
#include <string>

#include "engine/chat/chat_template.h"
#include "engine/chat/conversation_file.h"

namespace tern::app {

// The one-line warning for a chat template that fell back to chatml; "" when it was recognised.
std::string chat_template_warning(const ChatTemplateDetection& detection);

// The one-line error for a conversation file made for another setup, naming the flag that fits it.
std::string conversation_mismatch_message(const ConversationMismatch& mismatch);

} // namespace tern::app
