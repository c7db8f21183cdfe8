#pragma once
// The three standard descriptors at the edges of main(). A script that closes stdout
// (`tern info m.gguf >&-`) must get an error, not a silent exit 0 with the output lost; a reader
// that stops early (`tern run ... | head -c 20`) must not. And a closed descriptor must never be
// reused by a file tern opens, or the product would be written into the model or a file being written.
#include <string>
#include <string_view>

namespace tern::app {

// Puts /dev/null on each of fds 0, 1, 2 that is closed: read-only on 0 and 1 (reads see EOF,
// writes to stdout fail with EBADF like the closed descriptor did), write-only on 2.
void occupy_closed_standard_fds();

// Flushes stdout once the command is done. When a write failed and the command had succeeded,
// prints one line and returns 3, unless the reader of a pipe went away (quiet, as `cat | head`).
// A failed command's status is returned unchanged: its error line is the one that counts.
int finish_stdout(int status);

// "stdout: write failed: <why>" for a failed write's errno, with a hint that fits it (a closed
// stdout, a full disk), for the commands that stream to stdout and stop at the first failure.
std::string stdout_write_error(int err);

// Writes one piece of streamed output and flushes it, so a reader sees text as it is produced.
// False once stdout is gone (EPIPE: `tern run | head -c 20`; SIGPIPE is ignored in main()). Any
// other failure (a full disk) throws RuntimeFailure: the user would otherwise get a silently
// short file. On a terminal the text goes through terminal_display (base/terminal_text.h) first;
// pipes and files get the bytes exactly.
bool write_stdout(std::string_view s);

} // namespace tern::app
