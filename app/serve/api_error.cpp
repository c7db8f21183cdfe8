#include "app/serve/api_error.h"

namespace tern::app {

nlohmann::json ApiError::object() const {
    nlohmann::json e;
    e["message"] = message;
    e["type"] = type;
    e["param"] = param.empty() ? nlohmann::json(nullptr) : nlohmann::json(param);
    e["code"] = code.empty() ? nlohmann::json(nullptr) : nlohmann::json(code);
    return e;
}

nlohmann::json ApiError::body() const { return {{"error", object()}}; }

void throw_invalid(const std::string& param, const std::string& message, const std::string& code) {
    ApiError e;
    e.status = 400;
    e.message = message;
    e.param = param;
    e.code = code;
    throw ApiException(std::move(e));
}

} // namespace tern::app
