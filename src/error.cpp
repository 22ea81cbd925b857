#include "kvoffload/error.hpp"

namespace kvoffload {

// Out-of-line destructors anchor the vtables (and type_info) in the shared library, so an
// exception thrown inside it is caught by type in the engine.
error::~error() = default;
invalid_argument::~invalid_argument() = default;
cuda_error::~cuda_error() = default;
out_of_memory::~out_of_memory() = default;

}  // namespace kvoffload
