#pragma once
// The one way tern reads a whole file the user names as text or data (-f for run, tokenize and
// perplexity, quantize --calibrate, chat's /load): regular files only, never blocking, and never
// more than a stated cap. A FIFO would block open() or read() forever, a directory reads as empty
// text, /dev/zero never ends: each is refused with one line naming the file (InputError, exit 2).
// GGUF models are mapped instead (formats/mapped_file.h), with the same regular-file rule.
#include <cstdint>
#include <string>

namespace tern {

// Caps (documented in the README): a prompt or text file may hold 512 MiB (wikitext-103 is
// ~540 MB of which -f reads no more than a model can take anyway); a conversation file's JSON part
// is capped separately (engine/chat/conversation_file.cpp) since its size is bounded by the context.
inline constexpr uint64_t kMaxTextFileBytes = uint64_t{512} << 20;

// The file's bytes. `role` names the file in messages: "PATH: the prompt file (-f) is a directory,
// ...". Throws InputError naming the path: missing, unreadable, not a regular file (directory, FIFO, device, socket),
// or larger than max_bytes (checked before reading, and again while reading a file that grows).
std::string read_input_file(const std::string& path, const std::string& role, uint64_t max_bytes);

// All of standard input (a pipe, a file, /dev/zero), up to max_bytes: more is refused with
// InputError("stdin: <role> is larger than ...") instead of filling memory.
std::string read_standard_input(const std::string& role, uint64_t max_bytes);

// "512 MiB", "1.5 GiB": a cap in messages.
std::string describe_bytes(uint64_t bytes);

} // namespace tern
