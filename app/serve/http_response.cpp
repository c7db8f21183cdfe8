#include "app/serve/http_response.h"

#include <cstdio>

namespace tern::app {

std::string_view reason_phrase(int status) {
    switch (status) {
    case 100:
        return "Continue";
    case 200:
        return "OK";
    case 400:
        return "Bad Request";
    case 401:
        return "Unauthorized";
    case 403:
        return "Forbidden";
    case 404:
        return "Not Found";
    case 405:
        return "Method Not Allowed";
    case 408:
        return "Request Timeout";
    case 413:
        return "Content Too Large";
    case 414:
        return "URI Too Long";
    case 417:
        return "Expectation Failed";
    case 429:
        return "Too Many Requests";
    case 431:
        return "Request Header Fields Too Large";
    case 500:
        return "Internal Server Error";
    case 501:
        return "Not Implemented";
    case 503:
        return "Service Unavailable";
    case 505:
        return "HTTP Version Not Supported";
    default:
        return "Unknown";
    }
}

std::string response_head(int status, std::string_view content_type, const std::vector<HttpHeader>& headers,
                          std::optional<uint64_t> content_length, bool chunked, ConnectionAfter after) {
    std::string out = "HTTP/1.1 " + std::to_string(status) + " ";
    out += reason_phrase(status);
    out += "\r\n";
    if (!content_type.empty()) {
        out += "Content-Type: ";
        out += content_type;
        out += "\r\n";
    }
    for (const HttpHeader& h : headers)
        out += h.name + ": " + h.value + "\r\n";
    if (content_length)
        out += "Content-Length: " + std::to_string(*content_length) + "\r\n";
    else if (chunked)
        out += "Transfer-Encoding: chunked\r\n";
    if (after == ConnectionAfter::close)
        out += "Connection: close\r\n";
    else if (after == ConnectionAfter::keep_alive_http10)
        out += "Connection: keep-alive\r\n";
    out += "\r\n";
    return out;
}

std::string chunk(std::string_view data) {
    if (data.empty()) return {};
    char size[24];
    std::snprintf(size, sizeof size, "%zx\r\n", data.size());
    std::string out = size;
    out.append(data);
    out += "\r\n";
    return out;
}

} // namespace tern::app
