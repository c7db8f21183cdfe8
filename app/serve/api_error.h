#pragma once
// An error answered to an API client: the HTTP status and OpenAI's error body,
// {"error": {"message": .., "type": .., "param": .., "code": ..}}, which the official clients turn into
// their exception classes (400 BadRequestError, 401 AuthenticationError, 404 NotFoundError, 429
// RateLimitError, ...). `tern run --batch` puts the same object in a failed request's output line.
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

namespace tern::app {

struct ApiError {
    int status = 400;
    std::string message;                         // one sentence: what is wrong and what is expected
    std::string type = "invalid_request_error";  // OpenAI's types: invalid_request_error, authentication_error, ...
    std::string param;                           // the request field at fault; empty: null
    std::string code;                            // a stable machine-readable name; empty: null

    nlohmann::json body() const;   // {"error": {...}}
    nlohmann::json object() const; // the inner {...}
};

// Thrown by the request parsers and checks; the HTTP layer answers it, the batch driver writes it.
class ApiException : public std::runtime_error {
public:
    explicit ApiException(ApiError error) : std::runtime_error(error.message), error_(std::move(error)) {}
    const ApiError& error() const { return error_; }

private:
    ApiError error_;
};

// 400 invalid_request_error naming `param`.
[[noreturn]] void throw_invalid(const std::string& param, const std::string& message, const std::string& code = "");

} // namespace tern::app
