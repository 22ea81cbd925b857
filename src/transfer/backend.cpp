#include "kvoffload/backend.hpp"

namespace kvoffload {

Backend::~Backend() = default;

}  // namespace kvoffload
