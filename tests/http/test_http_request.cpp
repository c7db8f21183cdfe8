// app/serve/http_request.h: the strict RFC 9112 reading of request heads and bodies (every rule and
// every cap at its edge), the response head the server writes, and that feeding byte by byte gives the
// same result as feeding at once.
#include <doctest/doctest.h>

#include <string>

// The app is an executable, not a library: the code under test is compiled into this test.
#include "app/serve/http_request.h"
#include "app/serve/http_response.h"

using namespace tern::app;

namespace {

struct Parsed {
    ParseState state = ParseState::need_more;
    size_t used = 0;
    RequestHead head;
    HttpError error;
};

Parsed parse(std::string_view bytes, HttpLimits limits = {}) {
    HeadParser p(limits);
    Parsed r;
    r.used = p.feed(bytes);
    r.state = p.state();
    if (r.state == ParseState::complete) r.head = p.head();
    if (r.state == ParseState::failed) r.error = p.error();
    return r;
}

// The same, one byte at a time.
Parsed parse_bytewise(std::string_view bytes, HttpLimits limits = {}) {
    HeadParser p(limits);
    Parsed r;
    for (char c : bytes) {
        if (p.state() != ParseState::need_more) break;
        r.used += p.feed(std::string_view(&c, 1));
    }
    r.state = p.state();
    if (r.state == ParseState::complete) r.head = p.head();
    if (r.state == ParseState::failed) r.error = p.error();
    return r;
}

// The status a head is refused with (0: accepted; -1: still incomplete), checked to be the same fed
// byte by byte.
int status_of(std::string_view bytes, HttpLimits limits = {}) {
    const Parsed whole = parse(bytes, limits);
    const Parsed split = parse_bytewise(bytes, limits);
    CHECK(whole.state == split.state);
    CHECK(whole.used == split.used);
    CHECK(whole.error.status == split.error.status);
    CHECK(whole.error.message == split.error.message);
    if (whole.state == ParseState::need_more) return -1;
    return whole.state == ParseState::complete ? 0 : whole.error.status;
}

std::string get(std::string_view fields) {
    return "GET / HTTP/1.1\r\nHost: x\r\n" + std::string(fields) + "\r\n";
}

struct Body {
    ParseState state;
    std::string body;
    size_t used;
    int status;
};

Body decode(const RequestHead& head, std::string_view bytes, uint64_t max_body = 1 << 20, bool bytewise = false) {
    BodyDecoder d(head, max_body);
    Body r{ParseState::need_more, "", 0, 0};
    if (bytewise) {
        for (char c : bytes) {
            if (d.state() != ParseState::need_more) break;
            r.used += d.feed(std::string_view(&c, 1), r.body);
        }
    } else {
        r.used = d.feed(bytes, r.body);
    }
    r.state = d.state();
    if (r.state == ParseState::failed) r.status = d.error().status;
    return r;
}

RequestHead chunked_head() {
    const Parsed p = parse("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n");
    REQUIRE(p.state == ParseState::complete);
    return p.head;
}

// A chunked body's status, checked to be the same fed byte by byte; 0 when complete.
int chunked_status(std::string_view body, uint64_t max_body = 1 << 20, std::string* out = nullptr) {
    const RequestHead h = chunked_head();
    const Body whole = decode(h, body, max_body);
    const Body split = decode(h, body, max_body, true);
    CHECK(whole.state == split.state);
    CHECK(whole.status == split.status);
    CHECK(whole.body == split.body);
    CHECK(whole.used == split.used);
    if (out) *out = whole.body;
    if (whole.state == ParseState::need_more) return -1;
    return whole.status;
}

} // namespace

TEST_CASE("a complete head: method, target, version, fields in order, the bytes it used") {
    const std::string text = "POST /v1/completions?x=1 HTTP/1.1\r\nHost: localhost:8080\r\nX-A:  one \r\n"
                             "x-a:two\r\nContent-Length: 5\r\n\r\nhello";
    const Parsed p = parse(text);
    REQUIRE(p.state == ParseState::complete);
    CHECK(p.used == text.size() - 5);
    CHECK(p.head.method == "POST");
    CHECK(p.head.target == "/v1/completions?x=1");
    CHECK(p.head.path() == "/v1/completions");
    CHECK(p.head.minor_version == 1);
    REQUIRE(p.head.headers.size() == 4);
    CHECK(p.head.headers[1].name == "X-A");
    CHECK(p.head.headers[1].value == "one");
    CHECK(p.head.headers[2].value == "two");
    CHECK(*p.head.header("x-A") == "one");
    CHECK(p.head.header("Nope") == nullptr);
    CHECK(p.head.framing == BodyFraming::content_length);
    CHECK(p.head.content_length == 5);
    CHECK(p.head.keep_alive);
    CHECK(p.head.head_bytes == p.used);
    CHECK(status_of(text) == 0);
    CHECK(parse_bytewise(text).head.headers.size() == 4);
}

TEST_CASE("need more until the empty line; empty lines before a request line are skipped") {
    CHECK(status_of("GET / HTTP/1.1\r\nHost: x\r\n") == -1);
    CHECK(status_of("GET / HTTP/1.1\r\nHost: x\r\n\r") == -1);
    CHECK(status_of("\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n") == 0);
    CHECK(status_of("") == -1);
}

TEST_CASE("the request line: METHOD SP /target SP HTTP/1.x, else 400 (505 for other versions)") {
    CHECK(status_of("GET / HTTP/1.0\r\n\r\n") == 0);
    CHECK(status_of("GET  / HTTP/1.1\r\nHost: x\r\n\r\n") == 400);   // two spaces
    CHECK(status_of("GET / HTTP/1.1 \r\nHost: x\r\n\r\n") == 400);   // trailing space
    CHECK(status_of("GET /a b HTTP/1.1\r\nHost: x\r\n\r\n") == 400); // space in the target
    CHECK(status_of("GET\r\nHost: x\r\n\r\n") == 400);
    CHECK(status_of("G(T / HTTP/1.1\r\nHost: x\r\n\r\n") == 400); // a method that is not a token
    CHECK(status_of("GET x HTTP/1.1\r\nHost: x\r\n\r\n") == 400); // not origin-form
    CHECK(status_of("GET http://h/ HTTP/1.1\r\nHost: x\r\n\r\n") == 400);
    CHECK(status_of("GET /\x7f HTTP/1.1\r\nHost: x\r\n\r\n") == 400);
    CHECK(status_of("GET /\xc3\xa9 HTTP/1.1\r\nHost: x\r\n\r\n") == 400);
    CHECK(status_of("GET / HTTP/2.0\r\nHost: x\r\n\r\n") == 505);
    CHECK(status_of("GET / HTTP/0.9\r\nHost: x\r\n\r\n") == 505);
    CHECK(status_of("GET / http/1.1\r\nHost: x\r\n\r\n") == 400);
    CHECK(status_of("GET / HTTP/1.10\r\nHost: x\r\n\r\n") == 400);
}

TEST_CASE("lines end with CRLF: a bare CR or a bare LF anywhere is 400") {
    CHECK(status_of("GET / HTTP/1.1\nHost: x\r\n\r\n") == 400);
    CHECK(status_of("GET / HTTP/1.1\r\nHost: x\n\r\n") == 400);
    CHECK(status_of("GET / HTTP/1.1\r\nHost: x\r\n\n") == 400);
    CHECK(status_of("GET / HTTP/1.1\r\nHost: x\rX: y\r\n\r\n") == 400);
    CHECK(status_of("GET /\r HTTP/1.1\r\nHost: x\r\n\r\n") == 400);
    CHECK(status_of("\nGET / HTTP/1.1\r\nHost: x\r\n\r\n") == 400);
}

TEST_CASE("field lines: name ':' OWS value OWS, else 400") {
    CHECK(status_of(get("A: b\r\n")) == 0);
    CHECK(status_of(get("A:\r\n")) == 0); // an empty value
    CHECK(status_of(get("A:\tb\t\r\n")) == 0);
    CHECK(parse(get("A: \t b c \t\r\n")).head.headers[1].value == "b c");
    CHECK(status_of(get("A : b\r\n")) == 400); // whitespace before the colon
    CHECK(status_of(get("A\t: b\r\n")) == 400);
    CHECK(status_of(get("A b\r\n")) == 400); // no colon
    CHECK(status_of(get("Ab\r\n")) == 400);
    CHECK(status_of(get(": b\r\n")) == 400);        // an empty name
    CHECK(status_of(get("A(b: c\r\n")) == 400);     // not a token
    CHECK(status_of(get("A: b\r\n c\r\n")) == 400); // obs-fold
    CHECK(status_of(get("A: b\r\n\tc\r\n")) == 400);
    CHECK(status_of("GET / HTTP/1.1\r\n Host: x\r\n\r\n") == 400); // whitespace before the first field
    CHECK(status_of(get(std::string("A: b\0c\r\n", 9))) == 400);   // control characters in a value
    CHECK(status_of(get("A: b\x01\r\n")) == 400);
    CHECK(status_of(get("A: b\x7f\r\n")) == 400);
    CHECK(status_of(get("A: caf\xc3\xa9\r\n")) == 0); // obs-text is allowed
    CHECK(parse(get("A: b\r\n")).error.message.empty());
    CHECK(parse(get("A b\r\n")).error.message.find("colon") != std::string::npos);
}

TEST_CASE("Host: exactly one in HTTP/1.1, at most one in HTTP/1.0") {
    CHECK(status_of("GET / HTTP/1.1\r\n\r\n") == 400);
    CHECK(status_of("GET / HTTP/1.1\r\nHost: a\r\nhost: b\r\n\r\n") == 400);
    CHECK(status_of("GET / HTTP/1.0\r\n\r\n") == 0);
    CHECK(status_of("GET / HTTP/1.0\r\nHost: a\r\nHost: a\r\n\r\n") == 400);
}

TEST_CASE("framing: Transfer-Encoding and Content-Length (RFC 9112 section 6)") {
    CHECK(parse(get("Transfer-Encoding: chunked\r\n")).head.framing == BodyFraming::chunked);
    CHECK(parse(get("Transfer-Encoding: CHUNKED\r\n")).head.framing == BodyFraming::chunked);
    CHECK(status_of(get("Transfer-Encoding: chunked\r\nContent-Length: 3\r\n")) == 400);
    CHECK(status_of(get("Content-Length: 3\r\nTransfer-Encoding: chunked\r\n")) == 400);
    CHECK(status_of(get("Transfer-Encoding: gzip\r\n")) == 400);          // not chunked last: no length
    CHECK(status_of(get("Transfer-Encoding: gzip, chunked\r\n")) == 501); // a coding we do not decode
    CHECK(status_of(get("Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n")) == 501);
    CHECK(status_of(get("Transfer-Encoding: chunked, chunked\r\n")) == 400);
    CHECK(status_of(get("Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n")) == 400);
    CHECK(status_of(get("Transfer-Encoding:\r\n")) == 400);
    CHECK(status_of("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n") == 400);

    CHECK(parse(get("Content-Length: 0\r\n")).head.framing == BodyFraming::none);
    CHECK(parse(get("Content-Length: 007\r\n")).head.content_length == 7);
    CHECK(parse(get("Content-Length: 5, 5\r\nContent-Length: 5\r\n")).head.content_length == 5);
    CHECK(status_of(get("Content-Length: 5\r\nContent-Length: 6\r\n")) == 400);
    CHECK(status_of(get("Content-Length: 5, 6\r\n")) == 400);
    CHECK(status_of(get("Content-Length: -1\r\n")) == 400);
    CHECK(status_of(get("Content-Length: +1\r\n")) == 400);
    CHECK(status_of(get("Content-Length: 1 2\r\n")) == 400);
    CHECK(status_of(get("Content-Length: 0x10\r\n")) == 400);
    CHECK(status_of(get("Content-Length:\r\n")) == 400);
    CHECK(parse(get("Content-Length: 18446744073709551615\r\n")).head.content_length == UINT64_MAX);
    CHECK(status_of(get("Content-Length: 18446744073709551616\r\n")) == 400); // beyond 64 bits
}

TEST_CASE("Connection and Expect") {
    CHECK(parse(get("")).head.keep_alive);
    CHECK_FALSE(parse(get("Connection: close\r\n")).head.keep_alive);
    CHECK_FALSE(parse(get("Connection: keep-alive, Close\r\n")).head.keep_alive);
    CHECK_FALSE(parse("GET / HTTP/1.0\r\n\r\n").head.keep_alive);
    CHECK(parse("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n").head.keep_alive);
    CHECK(parse(get("Expect: 100-continue\r\n")).head.expect_continue);
    CHECK_FALSE(parse("GET / HTTP/1.0\r\nExpect: 100-continue\r\n\r\n").head.expect_continue);
    CHECK(status_of(get("Expect: something\r\n")) == 417);
    CHECK(status_of(get("Expect: 100-continue\r\nExpect: 100-continue\r\n")) == 417);
}

TEST_CASE("caps at their edges: request line 8 KiB (414), 100 fields and 32 KiB of head (431)") {
    const HttpLimits lim;
    // The request line without its CRLF: exactly the cap passes, one more byte is 414, before the line ends.
    const std::string prefix = "GET /", suffix = " HTTP/1.1";
    const std::string at_cap(lim.max_request_line - prefix.size() - suffix.size(), 'a');
    CHECK(status_of(prefix + at_cap + suffix + "\r\nHost: x\r\n\r\n") == 0);
    CHECK(status_of(prefix + at_cap + "a" + suffix + "\r\nHost: x\r\n\r\n") == 414);
    CHECK(status_of(prefix + std::string(lim.max_request_line, 'a')) == 414); // no line end needed

    // 100 fields (Host is one of them) pass, 101 do not.
    std::string fields;
    for (int i = 1; i < 100; ++i)
        fields += "F" + std::to_string(i) + ": v\r\n";
    CHECK(status_of(get(fields)) == 0);
    CHECK(status_of(get(fields + "G: v\r\n")) == 431);

    // The whole head: exactly max_head_bytes passes, one more is 431, before the head ends.
    std::string head = "GET / HTTP/1.1\r\nHost: x\r\nF: ";
    const size_t fill = lim.max_head_bytes - head.size() - 4; // the value, CRLF, then the empty line
    head += std::string(fill, 'v') + "\r\n\r\n";
    REQUIRE(head.size() == lim.max_head_bytes);
    CHECK(status_of(head) == 0);
    const std::string over = head.substr(0, head.size() - 4) + "v\r\n\r\n";
    CHECK(status_of(over) == 431);
    // A flood never completes but is refused once the cap is passed, whatever follows.
    std::string flood = "GET / HTTP/1.1\r\nHost: x\r\n";
    while (flood.size() < 40'000)
        flood += "X-Flood: " + std::string(100, 'f') + "\r\n";
    const Parsed p = parse(flood);
    CHECK(p.state == ParseState::failed);
    CHECK(p.error.status == 431);
    CHECK(p.used <= lim.max_head_bytes + 1);

    HttpLimits small;
    small.max_header_fields = 2;
    CHECK(status_of(get("A: b\r\n"), small) == 0);
    CHECK(status_of(get("A: b\r\nC: d\r\n"), small) == 431);
}

TEST_CASE("after a complete or failed head, feed consumes nothing; reset reads the next request") {
    const std::string two = get("") + get("A: b\r\n");
    HeadParser p;
    const size_t used = p.feed(two);
    REQUIRE(p.state() == ParseState::complete);
    CHECK(used == get("").size());
    CHECK(p.feed("more") == 0);
    p.reset();
    CHECK_FALSE(p.started());
    CHECK(p.feed(std::string_view(two).substr(used)) == two.size() - used);
    REQUIRE(p.state() == ParseState::complete);
    CHECK(*p.head().header("A") == "b");

    HeadParser bad;
    bad.feed("GET / HTTP/1.1\nHost");
    CHECK(bad.state() == ParseState::failed);
    CHECK(bad.feed("x") == 0);
}

TEST_CASE("path(): the target without its query, percent-decoded where valid") {
    RequestHead h;
    h.target = "/v1/models/a%20b?x=%41";
    CHECK(h.path() == "/v1/models/a b");
    h.target = "/bad%zz%4";
    CHECK(h.path() == "/bad%zz%4");
}

TEST_CASE("Content-Length bodies: exactly that many bytes, the rest is the next request; over the cap 413") {
    const Parsed p = parse("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n");
    REQUIRE(p.state == ParseState::complete);
    Body b = decode(p.head, "hello GET");
    CHECK(b.state == ParseState::complete);
    CHECK(b.body == "hello");
    CHECK(b.used == 5);
    b = decode(p.head, "hel");
    CHECK(b.state == ParseState::need_more);
    CHECK(decode(p.head, "hello", 5).state == ParseState::complete);
    CHECK(decode(p.head, "hello", 4).status == 413); // refused before any byte
    CHECK(decode(p.head, "", 4).status == 413);
    CHECK(decode(p.head, "hello GET", 1 << 20, true).body == "hello");
    CHECK(BodyDecoder(parse(get("")).head, 10).state() == ParseState::complete); // no body
}

TEST_CASE("chunked bodies: sizes, extensions, trailers, and everything malformed") {
    std::string body;
    CHECK(chunked_status("5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n", 1 << 20, &body) == 0);
    CHECK(body == "hello world");
    CHECK(chunked_status("A\r\n0123456789\r\n0\r\n\r\n", 1 << 20, &body) == 0);
    CHECK(body == "0123456789");
    CHECK(chunked_status("a;name=value;x\r\n0123456789\r\n0\r\n\r\n", 1 << 20, &body) == 0);     // extensions
    CHECK(chunked_status("a ;n=v\r\n0123456789\r\n0\r\n\r\n") == 0);                             // BWS before ';'
    CHECK(chunked_status("00000000000000000000005\r\nhello\r\n0\r\n\r\n", 1 << 20, &body) == 0); // leading zeros
    CHECK(body == "hello");
    CHECK(chunked_status("5\r\nhello\r\n0\r\nTrailer-A: b\r\nC: d\r\n\r\n") == 0);
    CHECK(chunked_status("5\r\nhello\r\n0\r\n") == -1);
    CHECK(chunked_status("5\r\nhel") == -1);

    CHECK(chunked_status("\r\nhello\r\n0\r\n\r\n") == 400); // no size
    CHECK(chunked_status("x\r\nhello\r\n0\r\n\r\n") == 400);
    CHECK(chunked_status("-5\r\nhello\r\n0\r\n\r\n") == 400);
    CHECK(chunked_status("5 x\r\nhello\r\n0\r\n\r\n") == 400);    // not ';' after the size
    CHECK(chunked_status("5;\x01\r\nhello\r\n0\r\n\r\n") == 400); // a control character in an extension
    CHECK(chunked_status("5\nhello\r\n0\r\n\r\n") == 400);        // bare LF
    CHECK(chunked_status("5\r\nhello\n0\r\n\r\n") == 400);
    CHECK(chunked_status("5\r\nhelloX\r\n0\r\n\r\n") == 400); // data longer than its size
    CHECK(chunked_status("5\r\nhello\r\n0\r\nbad trailer\r\n\r\n") == 400);
    CHECK(chunked_status("5\r\nhello\r\n0\r\nA: b\r\n c\r\n\r\n") == 400);                  // folded trailer
    CHECK(chunked_status("5;" + std::string(5000, 'e') + "\r\nhello\r\n0\r\n\r\n") == 400); // extension too long
    CHECK(chunked_status("10000000000000000\r\n") == 413);                                  // beyond 64 bits
    CHECK(chunked_status("FFFFFFFFFFFFFFFF\r\n") == 413);                                   // fits 64 bits, not the cap
}

TEST_CASE("chunked bodies: the --max-body cap counts the payload only, at its edge") {
    CHECK(chunked_status("5\r\nhello\r\n5\r\nworld\r\n0\r\n\r\n", 10) == 0);
    CHECK(chunked_status("5\r\nhello\r\n6\r\nworld!\r\n0\r\n\r\n", 10) == 413);
    CHECK(chunked_status("b\r\n", 10) == 413); // refused at the size line, before its data
}

TEST_CASE("chunked trailers count against the head's caps") {
    // The head used 3 of 100 fields (Host, Transfer-Encoding, and 1 more): 97 trailers fit, 98 do not.
    const Parsed p = parse("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nA: b\r\n\r\n");
    REQUIRE(p.state == ParseState::complete);
    std::string trailers;
    for (int i = 0; i < 97; ++i)
        trailers += "T: v\r\n";
    CHECK(decode(p.head, "0\r\n" + trailers + "\r\n").state == ParseState::complete);
    CHECK(decode(p.head, "0\r\n" + trailers + "T: v\r\n\r\n").status == 431);
    // Bytes: the head's size plus the trailers' may not pass 32 KiB.
    const std::string big = "T: " + std::string(40'000, 'v') + "\r\n\r\n";
    CHECK(decode(p.head, "0\r\n" + big).status == 431);
}

TEST_CASE("response heads: the framing field and Connection once each") {
    const std::string h =
        response_head(503, "application/json", {{"Retry-After", "1"}}, 12, false, ConnectionAfter::close);
    CHECK(h == "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
               "Content-Length: 12\r\nConnection: close\r\n\r\n");
    CHECK(response_head(200, "", {}, std::nullopt, true, ConnectionAfter::keep_alive) ==
          "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
    CHECK(response_head(200, "", {}, 0, false, ConnectionAfter::keep_alive_http10) ==
          "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: keep-alive\r\n\r\n");
    CHECK(chunk("hello") == "5\r\nhello\r\n");
    CHECK(chunk(std::string(26, 'a')).substr(0, 4) == "1a\r\n");
    CHECK(chunk("").empty());
    CHECK(reason_phrase(431) == "Request Header Fields Too Large");
}
