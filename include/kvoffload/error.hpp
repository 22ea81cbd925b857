#pragma once

#include <stdexcept>
#include <string>

#include "kvoffload/export.hpp"

namespace kvoffload {

/// Base of every exception kvoffload throws. Messages name the request, job, group or field
/// that was wrong.
class KVOFFLOAD_EXPORT error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
  ~error() override;
};

/// Bad input from the caller: an invalid configuration, an unknown request or job, block ids
/// that break the contract. The object that threw is unchanged.
class KVOFFLOAD_EXPORT invalid_argument : public error {
 public:
  using error::error;
  ~invalid_argument() override;
};

/// A CUDA runtime or driver call failed.
class KVOFFLOAD_EXPORT cuda_error : public error {
 public:
  using error::error;
  ~cuda_error() override;
};

/// Host or device memory could not be allocated.
class KVOFFLOAD_EXPORT out_of_memory : public error {
 public:
  using error::error;
  ~out_of_memory() override;
};

}  // namespace kvoffload
