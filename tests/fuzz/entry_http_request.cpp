// fuzz entry "http_request": the HTTP request reader of `tern serve` (app/serve/http_request.h) over
// arbitrary bytes. The first two bytes choose a split point; the rest is what a client sent. The head
// parser must give the same answer fed whole and fed in two pieces split there (the server reads
// sockets in whatever pieces arrive), stay within its caps, and say why it refuses; after a complete
// head the body decoder reads what follows, whole and split, with the same result. The same bytes also
// go through the chunked decoder directly, so mutations reach it without first forming a valid head.
#include <algorithm>
#include <string>
#include <string_view>

#include "app/serve/http_request.h"
#include "tests/fuzz/fuzz_entries.h"

namespace tern::fuzz {
namespace {

using app::BodyDecoder;
using app::HeadParser;
using app::HttpLimits;
using app::ParseState;
using app::RequestHead;

// A body cap small enough that mutations reach the 413 paths.
constexpr uint64_t kMaxBody = 4096;

void require(bool ok) {
    if (!ok) __builtin_trap();
}

struct HeadResult {
    ParseState state;
    size_t used;
};

HeadResult feed_head(HeadParser& p, std::string_view bytes, size_t split) {
    size_t used = p.feed(bytes.substr(0, split));
    if (p.state() == ParseState::need_more) {
        require(used == split); // need_more consumes everything it was given
        used += p.feed(bytes.substr(split));
    }
    return {p.state(), used};
}

bool same_head(const RequestHead& a, const RequestHead& b) {
    if (a.method != b.method || a.target != b.target || a.minor_version != b.minor_version || a.framing != b.framing ||
        a.content_length != b.content_length || a.keep_alive != b.keep_alive ||
        a.expect_continue != b.expect_continue || a.head_bytes != b.head_bytes || a.headers.size() != b.headers.size())
        return false;
    for (size_t i = 0; i < a.headers.size(); ++i)
        if (a.headers[i].name != b.headers[i].name || a.headers[i].value != b.headers[i].value) return false;
    return true;
}

struct BodyResult {
    ParseState state;
    size_t used;
    int status;
    std::string body;
};

BodyResult feed_body(const RequestHead& head, std::string_view bytes, size_t split) {
    BodyDecoder d(head, kMaxBody);
    BodyResult r{ParseState::need_more, 0, 0, {}};
    split = std::min(split, bytes.size());
    r.used = d.feed(bytes.substr(0, split), r.body);
    if (d.state() == ParseState::need_more) {
        require(r.used == split);
        r.used += d.feed(bytes.substr(split), r.body);
    }
    r.state = d.state();
    if (r.state == ParseState::failed) {
        require(!d.error().message.empty());
        r.status = d.error().status;
    }
    require(r.body.size() <= kMaxBody);
    return r;
}

void same_body(const RequestHead& head, std::string_view bytes, size_t split) {
    const BodyResult whole = feed_body(head, bytes, bytes.size());
    const BodyResult parts = feed_body(head, bytes, split);
    require(whole.state == parts.state && whole.used == parts.used && whole.status == parts.status &&
            whole.body == parts.body);
}

} // namespace

void http_request(Input input) {
    if (input.size() < 2) return;
    const std::string_view bytes(reinterpret_cast<const char*>(input.data()) + 2, input.size() - 2);
    const size_t split = (input[0] | (size_t{input[1]} << 8)) % (bytes.size() + 1);
    const HttpLimits limits;

    HeadParser whole(limits), parts(limits);
    const HeadResult a = feed_head(whole, bytes, bytes.size());
    const HeadResult b = feed_head(parts, bytes, split);
    require(a.state == b.state && a.used == b.used);
    require(a.used <= limits.max_head_bytes + 1); // a cap is enforced as the byte that passes it arrives
    if (a.state == ParseState::failed) {
        require(whole.error().status == parts.error().status && whole.error().message == parts.error().message);
        require(!whole.error().message.empty() && whole.error().status >= 400 && whole.error().status < 600);
    } else if (a.state == ParseState::complete) {
        require(same_head(whole.head(), parts.head()));
        const RequestHead& h = whole.head();
        require(h.head_bytes == a.used);
        require(h.headers.size() <= limits.max_header_fields);
        require(!h.method.empty() && !h.target.empty() && h.target.front() == '/');
        (void)h.path();
        const std::string_view rest = bytes.substr(a.used);
        same_body(h, rest, split > a.used ? split - a.used : 0);
    } else {
        require(a.used == bytes.size());
    }

    // The chunked decoder straight on the bytes.
    RequestHead chunked;
    chunked.framing = app::BodyFraming::chunked;
    same_body(chunked, bytes, split);
}

} // namespace tern::fuzz
