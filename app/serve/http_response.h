#pragma once
// What the HTTP server writes: an answer (status, content type, body, extra fields) and the bytes of a
// response head. The server alone writes the framing fields (Content-Length, Transfer-Encoding) and
// Connection, each once, so no handler can send two that disagree.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "app/serve/http_request.h"

namespace tern::app {

struct HttpReply {
    int status = 200;
    std::string content_type; // empty: no Content-Type (and no body expected)
    std::string body;
    std::vector<HttpHeader> headers; // more fields (Retry-After, Cache-Control); never framing or Connection
};

// "OK", "Bad Request", ... ("Unknown" for a status without one here).
std::string_view reason_phrase(int status);

// How the connection goes on after a response, as its Connection field says.
enum class ConnectionAfter {
    keep_alive,        // HTTP/1.1: no field (persistent is the default)
    keep_alive_http10, // HTTP/1.0 that asked for it: "Connection: keep-alive"
    close,             // "Connection: close"
};

// The status line and fields up to the empty line. `content_length`: the body's length, or none for a
// chunked body (`chunked`) or a body ended by closing the connection (an HTTP/1.0 stream).
std::string response_head(int status, std::string_view content_type, const std::vector<HttpHeader>& headers,
                          std::optional<uint64_t> content_length, bool chunked, ConnectionAfter after);

// One chunk of a chunked body ("size CRLF data CRLF"); empty data gives nothing (that would end the body).
std::string chunk(std::string_view data);
inline constexpr std::string_view kLastChunk = "0\r\n\r\n";

} // namespace tern::app
