#pragma once
// HTTP/1.1 requests read strictly (RFC 9112) and incrementally, with no sockets: bytes go in as they
// arrive, and out comes "need more", a complete head, or an error with the status to answer. Pure code,
// so the tests and the fuzzer drive it directly; http_server.h feeds it from the sockets.
//
// What is accepted:
//   request line  METHOD SP origin-form-target SP ("HTTP/1.1" | "HTTP/1.0") CRLF
//   field line    token ":" OWS value OWS CRLF   (value: visible ASCII, obs-text, SP, HTAB)
//   empty lines (CRLF) before a request line are skipped (RFC 9112 section 2.2: a client may send one
//   after a body).
// Lines end with CRLF only: a bare LF is refused (400) as well as a bare CR, since a server that reads
// a bare LF as the end of a line and a proxy that does not would see two different requests.
//
// What is refused, and with what:
//   400  a malformed request line or field line (whitespace before the colon, no colon, a field name
//        that is not a token, a control character in a value, an obs-fold continuation line, a bare CR
//        or LF); Transfer-Encoding with Content-Length, or in an HTTP/1.0 request, or whose last coding
//        is not chunked, or chunked twice; Content-Length values that differ or are not digits; an
//        HTTP/1.1 request without exactly one Host (HTTP/1.0: more than one); a target that is not
//        origin-form ("/path?query"); a malformed chunked body
//   413  a body over the caller's limit (a Content-Length over it is refused before any body is read)
//   414  a request line over HttpLimits::max_request_line
//   417  an Expect other than 100-continue
//   431  more than max_header_fields field lines, or a head over max_head_bytes (trailers included)
//   501  a transfer coding other than chunked (gzip, ...)
//   505  an HTTP version other than 1.0 and 1.1
// Every cap is checked as each byte arrives, so nothing larger than the cap is ever held.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tern::app {

struct HttpHeader {
    std::string name;  // as sent (compare with same_field_name: names are case-insensitive)
    std::string value; // without the surrounding whitespace
};

struct HttpLimits {
    size_t max_request_line = 8 * 1024; // bytes without the CRLF: the longest URL a client needs is far below
    size_t max_header_fields = 100;     // field lines of the head, and of a chunked body's trailers with them
    size_t max_head_bytes = 32 * 1024;  // the head from its first byte to its empty line (trailers: the same)
};

enum class BodyFraming { none, content_length, chunked };

struct RequestHead {
    std::string method;
    std::string target; // origin-form: "/path" or "/path?query"
    int minor_version = 1;
    std::vector<HttpHeader> headers; // in the order sent
    BodyFraming framing = BodyFraming::none;
    uint64_t content_length = 0;  // framing == content_length: the body's length (> 0)
    bool keep_alive = true;       // HTTP/1.1 without "Connection: close", or HTTP/1.0 with "keep-alive"
    bool expect_continue = false; // HTTP/1.1 "Expect: 100-continue": the client waits for 100 before its body
    size_t head_bytes = 0;        // bytes of the head, its empty line included (trailers share the cap)

    // The first field of that name (case-insensitive), or null.
    const std::string* header(std::string_view name) const;
    // The target's path without its query, percent-decoded where the escapes are valid.
    std::string path() const;
};

// What to answer instead of a request: the status and one sentence for the error body.
struct HttpError {
    int status = 400;
    std::string message;
};

enum class ParseState { need_more, complete, failed };

// Field names are tokens, compared without regard to case.
bool same_field_name(std::string_view a, std::string_view b);

// The request head, fed as bytes arrive. feed() consumes bytes up to the end of the head and no
// further (what follows is the body or the next request); once complete or failed it consumes nothing.
class HeadParser {
public:
    explicit HeadParser(HttpLimits limits = {});

    // Returns how many of `bytes` belong to the head.
    size_t feed(std::string_view bytes);
    ParseState state() const { return state_; }
    // Whether any byte of a head has arrived (its deadline runs from then).
    bool started() const { return head_bytes_ > 0; }
    // The head, once complete (the caller may move from it).
    RequestHead& head() { return head_; }
    // Why, once failed.
    const HttpError& error() const { return error_; }
    // Ready for the next request on the same connection.
    void reset();

private:
    void fail(int status, std::string message);
    void end_of_line();
    void request_line(std::string_view line);
    void field_line(std::string_view line);
    void finish();

    HttpLimits limits_;
    ParseState state_ = ParseState::need_more;
    RequestHead head_;
    HttpError error_;
    std::string line_;            // the line being read, without its CRLF
    bool after_cr_ = false;       // the last byte was a CR: only LF may follow
    bool in_request_line_ = true; // before the request line ended
    size_t head_bytes_ = 0;
};

// A request's body, fed as bytes arrive after its head: Content-Length bytes, or a chunked body
// (hex sizes with an overflow check, extensions of a bounded length, trailers read and dropped under
// the head's caps). The payload is appended to `body`; over max_body bytes of it is a 413.
class BodyDecoder {
public:
    BodyDecoder(const RequestHead& head, uint64_t max_body, HttpLimits limits = {});

    // Returns how many of `bytes` belong to the body (the rest is the next request).
    size_t feed(std::string_view bytes, std::string& body);
    ParseState state() const { return state_; }
    const HttpError& error() const { return error_; }

private:
    enum class Step { size_line, data, data_end, trailer, done };
    void fail(int status, std::string message);
    void chunk_size_line(std::string_view line, const std::string& body);
    void trailer_line(std::string_view line);

    uint64_t max_body_;
    ParseState state_ = ParseState::need_more;
    HttpError error_;
    bool chunked_ = false;
    uint64_t remaining_ = 0; // bytes of the body (Content-Length) or of the current chunk
    Step step_ = Step::size_line;
    std::string line_;
    bool after_cr_ = false;
    size_t fields_left_ = 0; // trailers: what the head left of the caps
    size_t trailer_bytes_left_ = 0;
};

} // namespace tern::app
