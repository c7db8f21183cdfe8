#include "app/serve/http_request.h"

#include <algorithm>
#include <optional>

namespace tern::app {

namespace {

// A chunk's size line with its extensions: extensions are ignored, so a few hundred bytes of them are
// plenty, and a longer line is a client filling memory or time.
constexpr size_t kMaxChunkLine = 4096;

bool is_tchar(unsigned char c) {
    if (c >= '0' && c <= '9') return true;
    if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return true;
    return c != 0 && std::string_view("!#$%&'*+-.^_`|~").find(static_cast<char>(c)) != std::string_view::npos;
}

bool is_token(std::string_view s) {
    return !s.empty() &&
           std::all_of(s.begin(), s.end(), [](char c) { return is_tchar(static_cast<unsigned char>(c)); });
}

bool is_ows(char c) {
    return c == ' ' || c == '\t';
}

// A field value's byte: visible ASCII, obs-text (bytes >= 0x80), SP or HTAB; no other control character.
bool is_field_byte(unsigned char c) {
    return c == '\t' || (c >= 0x20 && c != 0x7f);
}

std::string_view trim_ows(std::string_view s) {
    while (!s.empty() && is_ows(s.front()))
        s.remove_prefix(1);
    while (!s.empty() && is_ows(s.back()))
        s.remove_suffix(1);
    return s;
}

char lower(char c) {
    return (c >= 'A' && c <= 'Z') ? static_cast<char>(c + 32) : c;
}

// The elements of a comma-separated list (RFC 9110 section 5.6.1), trimmed; empty elements skipped.
std::vector<std::string_view> list_elements(std::string_view s) {
    std::vector<std::string_view> out;
    while (true) {
        const size_t comma = s.find(',');
        const std::string_view e = trim_ows(s.substr(0, comma));
        if (!e.empty()) out.push_back(e);
        if (comma == std::string_view::npos) return out;
        s.remove_prefix(comma + 1);
    }
}

bool same_text_nocase(std::string_view a, std::string_view b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
        if (lower(a[i]) != lower(b[i])) return false;
    return true;
}

// One byte of a line that must end with CRLF. `line` collects the bytes before the CR.
enum class LineByte { more, end, bare_cr, bare_lf };
LineByte take_line_byte(char c, std::string& line, bool& after_cr) {
    if (after_cr) {
        after_cr = false;
        return c == '\n' ? LineByte::end : LineByte::bare_cr;
    }
    if (c == '\r') {
        after_cr = true;
        return LineByte::more;
    }
    if (c == '\n') return LineByte::bare_lf;
    line.push_back(c);
    return LineByte::more;
}

const char* line_error(LineByte b) {
    return b == LineByte::bare_cr ? "a CR not followed by LF (lines end with CRLF)"
                                  : "a line ends with LF without CR (lines end with CRLF)";
}

// A field line (the head's or a trailer's) into `out`; the error when it is malformed.
std::optional<HttpError> parse_field_line(std::string_view line, HttpHeader& out) {
    if (is_ows(line.front())) // obs-fold (RFC 9112 section 5.2), or whitespace before the first field
        return HttpError{400, "a header line starts with whitespace (folded header lines are not accepted)"};
    size_t i = 0;
    while (i < line.size() && is_tchar(static_cast<unsigned char>(line[i])))
        ++i;
    if (i == line.size()) return HttpError{400, "a header line has no colon (expected 'Name: value')"};
    if (line[i] != ':') {
        if (is_ows(line[i])) return HttpError{400, "whitespace between a header name and its colon"};
        return HttpError{400, "a header name holds a character that is not allowed in a token"};
    }
    if (i == 0) return HttpError{400, "a header line has an empty name"};
    const std::string_view value = trim_ows(line.substr(i + 1));
    for (char c : value)
        if (!is_field_byte(static_cast<unsigned char>(c)))
            return HttpError{400, "a header value holds a control character"};
    out.name.assign(line.substr(0, i));
    out.value.assign(value);
    return std::nullopt;
}

// A Content-Length element: 1*DIGIT within 64 bits.
std::optional<uint64_t> parse_length(std::string_view s) {
    if (s.empty()) return std::nullopt;
    uint64_t v = 0;
    for (char c : s) {
        if (c < '0' || c > '9') return std::nullopt;
        const uint64_t d = static_cast<uint64_t>(c - '0');
        if (v > (UINT64_MAX - d) / 10) return std::nullopt;
        v = v * 10 + d;
    }
    return v;
}

int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    c = lower(c);
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

} // namespace

bool same_field_name(std::string_view a, std::string_view b) {
    return same_text_nocase(a, b);
}

const std::string* RequestHead::header(std::string_view name) const {
    for (const HttpHeader& h : headers)
        if (same_field_name(h.name, name)) return &h.value;
    return nullptr;
}

std::string RequestHead::path() const {
    const std::string_view raw = std::string_view(target).substr(0, target.find('?'));
    std::string out;
    out.reserve(raw.size());
    for (size_t i = 0; i < raw.size(); ++i) {
        if (raw[i] == '%' && i + 2 < raw.size() && hex_value(raw[i + 1]) >= 0 && hex_value(raw[i + 2]) >= 0) {
            out.push_back(static_cast<char>(hex_value(raw[i + 1]) * 16 + hex_value(raw[i + 2])));
            i += 2;
        } else {
            out.push_back(raw[i]);
        }
    }
    return out;
}

HeadParser::HeadParser(HttpLimits limits) : limits_(limits) {}

void HeadParser::reset() {
    state_ = ParseState::need_more;
    head_ = RequestHead{};
    error_ = HttpError{};
    line_.clear();
    after_cr_ = false;
    in_request_line_ = true;
    head_bytes_ = 0;
}

void HeadParser::fail(int status, std::string message) {
    state_ = ParseState::failed;
    error_ = HttpError{status, std::move(message)};
    line_.clear();
    line_.shrink_to_fit();
}

size_t HeadParser::feed(std::string_view bytes) {
    size_t used = 0;
    while (used < bytes.size() && state_ == ParseState::need_more) {
        const char c = bytes[used++];
        if (++head_bytes_ > limits_.max_head_bytes) {
            fail(431, "the request head is larger than " + std::to_string(limits_.max_head_bytes) + " bytes");
            break;
        }
        const LineByte b = take_line_byte(c, line_, after_cr_);
        if (b == LineByte::more) {
            if (in_request_line_ && line_.size() > limits_.max_request_line)
                fail(414, "the request line is longer than " + std::to_string(limits_.max_request_line) + " bytes");
            continue;
        }
        if (b != LineByte::end) {
            fail(400, line_error(b));
            break;
        }
        end_of_line();
        line_.clear();
    }
    return used;
}

void HeadParser::end_of_line() {
    if (in_request_line_) {
        if (!line_.empty()) request_line(line_); // empty lines before a request line are skipped
        return;
    }
    if (line_.empty()) return finish();
    if (head_.headers.size() >= limits_.max_header_fields)
        return fail(431, "the request has more than " + std::to_string(limits_.max_header_fields) + " header fields");
    HttpHeader h;
    if (std::optional<HttpError> e = parse_field_line(line_, h)) return fail(e->status, std::move(e->message));
    head_.headers.push_back(std::move(h));
}

void HeadParser::request_line(std::string_view line) {
    static const char* const kShape = "the request line must be 'METHOD /path HTTP/1.1'";
    const size_t sp1 = line.find(' ');
    if (sp1 == std::string_view::npos) return fail(400, kShape);
    const size_t sp2 = line.find(' ', sp1 + 1);
    if (sp2 == std::string_view::npos) return fail(400, kShape);
    const std::string_view method = line.substr(0, sp1);
    const std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
    const std::string_view version = line.substr(sp2 + 1);
    if (!is_token(method)) return fail(400, kShape);
    if (target.empty() || target.front() != '/')
        return fail(400, "the request target must be a path starting with '/'");
    for (char c : target)
        if (c <= 0x20 || c >= 0x7f) return fail(400, "the request target holds a byte that is not visible ASCII");
    if (version == "HTTP/1.1") {
        head_.minor_version = 1;
    } else if (version == "HTTP/1.0") {
        head_.minor_version = 0;
    } else if (version.size() == 8 && version.substr(0, 5) == "HTTP/" && version[5] >= '0' && version[5] <= '9' &&
               version[6] == '.' && version[7] >= '0' && version[7] <= '9') {
        return fail(505, "HTTP version " + std::string(version.substr(5)) + " is not supported (1.0 and 1.1 are)");
    } else {
        return fail(400, kShape);
    }
    head_.method.assign(method);
    head_.target.assign(target);
    in_request_line_ = false;
}

void HeadParser::finish() {
    RequestHead& h = head_;
    size_t hosts = 0;
    std::vector<std::string_view> codings, lengths, connection;
    const std::string* expect = nullptr;
    for (const HttpHeader& f : h.headers) {
        if (same_field_name(f.name, "Host")) {
            ++hosts;
        } else if (same_field_name(f.name, "Transfer-Encoding")) {
            for (std::string_view e : list_elements(f.value))
                codings.push_back(e);
            if (list_elements(f.value).empty()) return fail(400, "an empty Transfer-Encoding");
        } else if (same_field_name(f.name, "Content-Length")) {
            const std::vector<std::string_view> v = list_elements(f.value);
            if (v.empty()) return fail(400, "an empty Content-Length");
            lengths.insert(lengths.end(), v.begin(), v.end());
        } else if (same_field_name(f.name, "Connection")) {
            for (std::string_view e : list_elements(f.value))
                connection.push_back(e);
        } else if (same_field_name(f.name, "Expect")) {
            if (expect) return fail(417, "more than one Expect header");
            expect = &f.value;
        }
    }
    if (h.minor_version == 1 ? hosts != 1 : hosts > 1)
        return fail(400, hosts == 0 ? "an HTTP/1.1 request without a Host header" : "more than one Host header");

    // Framing (RFC 9112 section 6.3): a request whose body length two readers could disagree on is refused.
    if (!codings.empty()) {
        if (!lengths.empty())
            return fail(400, "both Transfer-Encoding and Content-Length (the body length is ambiguous)");
        if (h.minor_version == 0) return fail(400, "Transfer-Encoding in an HTTP/1.0 request");
        if (!same_text_nocase(codings.back(), "chunked"))
            return fail(400, "the last transfer coding is not chunked (the body length is unknown)");
        for (size_t i = 0; i + 1 < codings.size(); ++i) {
            if (same_text_nocase(codings[i], "chunked")) return fail(400, "chunked applied more than once");
            return fail(501, "transfer coding '" + std::string(codings[i].substr(0, 40)) +
                                 "' is not supported (only chunked is)");
        }
        h.framing = BodyFraming::chunked;
    } else if (!lengths.empty()) {
        std::optional<uint64_t> n;
        for (std::string_view e : lengths) {
            const std::optional<uint64_t> v = parse_length(e);
            if (!v) return fail(400, "Content-Length is not a number of bytes");
            if (n && *n != *v) return fail(400, "Content-Length values that differ");
            n = v;
        }
        h.content_length = *n;
        if (*n > 0) h.framing = BodyFraming::content_length;
    }

    bool close = false, keep_alive = false;
    for (std::string_view e : connection) {
        close = close || same_text_nocase(e, "close");
        keep_alive = keep_alive || same_text_nocase(e, "keep-alive");
    }
    h.keep_alive = !close && (h.minor_version == 1 || keep_alive);
    if (expect) {
        if (!same_text_nocase(*expect, "100-continue")) return fail(417, "Expect: only 100-continue is supported");
        h.expect_continue = h.minor_version == 1; // RFC 9110 section 10.1.1: HTTP/1.0 ignores it
    }
    h.head_bytes = head_bytes_;
    line_.clear();
    line_.shrink_to_fit();
    state_ = ParseState::complete;
}

BodyDecoder::BodyDecoder(const RequestHead& head, uint64_t max_body, HttpLimits limits) : max_body_(max_body) {
    switch (head.framing) {
    case BodyFraming::none:
        state_ = ParseState::complete;
        break;
    case BodyFraming::content_length:
        if (head.content_length > max_body_)
            fail(413, "the request body is larger than " + std::to_string(max_body_) + " bytes");
        remaining_ = head.content_length;
        break;
    case BodyFraming::chunked:
        chunked_ = true;
        fields_left_ = limits.max_header_fields - std::min(limits.max_header_fields, head.headers.size());
        trailer_bytes_left_ = limits.max_head_bytes - std::min(limits.max_head_bytes, head.head_bytes);
        break;
    }
}

void BodyDecoder::fail(int status, std::string message) {
    state_ = ParseState::failed;
    error_ = HttpError{status, std::move(message)};
}

size_t BodyDecoder::feed(std::string_view bytes, std::string& body) {
    size_t used = 0;
    while (used < bytes.size() && state_ == ParseState::need_more) {
        if (!chunked_ || step_ == Step::data) {
            const size_t n = static_cast<size_t>(std::min<uint64_t>(remaining_, bytes.size() - used));
            body.append(bytes.substr(used, n));
            used += n;
            remaining_ -= n;
            if (remaining_ == 0) {
                if (!chunked_)
                    state_ = ParseState::complete;
                else
                    step_ = Step::data_end;
            }
            continue;
        }
        const char c = bytes[used++];
        if (step_ == Step::trailer && trailer_bytes_left_-- == 0) {
            fail(431, "the chunked body's trailers are larger than the request head may be");
            break;
        }
        const LineByte b = take_line_byte(c, line_, after_cr_);
        if (b == LineByte::more) {
            if (step_ == Step::data_end && !line_.empty()) {
                fail(400, "a chunk's data is longer than its size says (no CRLF after it)");
            } else if (step_ == Step::size_line && line_.size() > kMaxChunkLine) {
                fail(400, "a chunk size line is longer than " + std::to_string(kMaxChunkLine) + " bytes");
            }
            continue;
        }
        if (b != LineByte::end) {
            fail(400, line_error(b));
            break;
        }
        switch (step_) {
        case Step::size_line:
            chunk_size_line(line_, body);
            break;
        case Step::data_end:
            step_ = Step::size_line;
            break;
        case Step::trailer:
            trailer_line(line_);
            break;
        case Step::data:
        case Step::done:
            break;
        }
        line_.clear();
    }
    return used;
}

void BodyDecoder::chunk_size_line(std::string_view line, const std::string& body) {
    uint64_t size = 0;
    size_t i = 0;
    for (; i < line.size() && hex_value(line[i]) >= 0; ++i) {
        if (size > (UINT64_MAX >> 4)) return fail(413, "a chunk size beyond 64 bits");
        size = size * 16 + static_cast<uint64_t>(hex_value(line[i]));
    }
    if (i == 0) return fail(400, "a chunk size is not a hexadecimal number");
    std::string_view ext = line.substr(i); // BWS ";" ... (RFC 9112 section 7.1.1); ignored
    while (!ext.empty() && is_ows(ext.front()))
        ext.remove_prefix(1);
    if (!ext.empty() && ext.front() != ';') return fail(400, "a chunk size is followed by something other than ';'");
    for (char c : ext)
        if (!is_field_byte(static_cast<unsigned char>(c)))
            return fail(400, "a chunk extension holds a control character");
    if (size > max_body_ - std::min<uint64_t>(max_body_, body.size()))
        return fail(413, "the request body is larger than " + std::to_string(max_body_) + " bytes");
    if (size == 0) {
        step_ = Step::trailer;
        return;
    }
    remaining_ = size;
    step_ = Step::data;
}

void BodyDecoder::trailer_line(std::string_view line) {
    if (line.empty()) {
        step_ = Step::done;
        state_ = ParseState::complete;
        return;
    }
    if (fields_left_ == 0) return fail(431, "the chunked body's trailers hold more fields than the head may");
    --fields_left_;
    HttpHeader h; // read to check it, then dropped: nothing here uses trailers
    if (std::optional<HttpError> e = parse_field_line(line, h)) fail(e->status, std::move(e->message));
}

} // namespace tern::app
