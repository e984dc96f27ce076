// The one exception type of the library. Nothing in the library calls exit() or abort().
#pragma once

#include <stdexcept>
#include <string>

namespace mamba2_ssd {

class Error : public std::runtime_error {
 public:
  enum class Kind {
    kInvalidArgument,  // a bad input: the message names the argument, the expected and the actual value
    kUnsupported,      // a valid input this build or device cannot run (e.g. no CUDA support compiled in)
    kCuda,             // a CUDA runtime error, with the call that failed
  };

  Error(Kind kind, std::string argument, const std::string& message)
      : std::runtime_error(message), kind_(kind), argument_(std::move(argument)) {}

  Kind kind() const { return kind_; }
  // The name of the offending argument ("x", "cu_seqlens", ...), empty when none applies.
  const std::string& argument() const { return argument_; }

 private:
  Kind kind_;
  std::string argument_;
};

}  // namespace mamba2_ssd
