#pragma once
// The socket calls of the HTTP server (http_server.h), each bounded in time: every socket is
// non-blocking, and a call that must wait polls with a deadline, so no thread ever blocks on a client.
#include <chrono>
#include <string>
#include <string_view>

namespace tern::app {

using SteadyClock = std::chrono::steady_clock;

// A listening TCP socket on host:port (IPv4 or IPv6; port 0: any free one). Returns the fd and sets
// `port` to the one bound, or returns -1 with `why` (strerror or the resolver's message).
int listen_socket(const std::string& host, int& port, int backlog, std::string& why);

// O_NONBLOCK, and TCP_NODELAY so streamed pieces leave at once.
void prepare_accepted(int fd);

// Writes every byte, waiting for room; false when the peer is gone or nothing could be written for
// `stall_limit` (a client that stopped reading).
bool send_all(int fd, std::string_view bytes, std::chrono::milliseconds stall_limit);

// Reads what is there, waiting until `deadline` for something. >0: bytes read; 0: the peer closed;
// -1: the socket failed; kRecvTimedOut: nothing came before the deadline.
inline constexpr long kRecvTimedOut = -2;
long recv_some(int fd, char* buf, size_t n, SteadyClock::time_point deadline);

// Whether the peer has hung up or the socket failed, without consuming anything: bytes waiting (a
// pipelined request) do not count as gone, a FIN (a closed socket) or an error does.
bool peer_gone(int fd);

// The host as it goes into a URL: an IPv6 literal in brackets ("[::1]"), anything else as given.
std::string host_for_url(const std::string& host);

} // namespace tern::app
