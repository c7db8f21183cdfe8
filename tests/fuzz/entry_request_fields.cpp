// fuzz entry "request_fields": the input as a request body (POST /v1/chat/completions, /v1/completions)
// and as a `run --batch` line, through parse_request_json and read_generation_request for every request
// kind. The only allowed outcomes are a request or an ApiException with a 4xx status whose error body
// serialises (the server and the batch writer dump it); anything else escapes as a finding.
#include <stdexcept>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "app/serve/api_error.h"
#include "app/serve/request_fields.h"
#include "tests/fuzz/fuzz_entries.h"

namespace tern::fuzz {
namespace {

using app::ApiException;

void check_refusal(const ApiException& e) {
    const app::ApiError& error = e.error();
    if (error.status < 400 || error.status > 499)
        throw std::logic_error("request_fields: refused with status " + std::to_string(error.status) + ": " +
                               error.message);
    (void)error.body().dump(); // throws on text that is not UTF-8
}

} // namespace

void request_fields(Input input) {
    const std::string_view text(reinterpret_cast<const char*>(input.data()), input.size());
    app::RequestDefaults defaults;
    defaults.seed = 1; // no draw from the system's entropy per input
    for (const char* what : {"the request body", "the line"}) {
        nlohmann::json body;
        try {
            body = app::parse_request_json(text, what);
        } catch (const ApiException& e) {
            check_refusal(e);
            continue;
        }
        for (const app::RequestKind kind :
             {app::RequestKind::chat_completions, app::RequestKind::completions, app::RequestKind::batch_line}) {
            try {
                const app::GenerationRequest r = app::read_generation_request(body, kind, defaults);
                (void)r.id.dump(); // a batch line's id is written back as given
            } catch (const ApiException& e) {
                check_refusal(e);
            }
        }
    }
}

} // namespace tern::fuzz
