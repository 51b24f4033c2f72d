// What the bench clients (bench serve, bench soak) ask an OpenAI-compatible server first.
#pragma once

#include <string>

namespace duet {

// The id of the first model /v1/models lists at base_url (sending "Authorization: Bearer
// api_key" unless it is empty). Throws duet::Error naming the URL if the request fails or the
// list is empty.
std::string first_served_model(const std::string& base_url, const std::string& api_key = "");

}  // namespace duet
