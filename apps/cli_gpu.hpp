// The GPU side of the mamba2-ssd tool: device choice, device mirrors of a Problem, timed runs.
// The header needs no CUDA; in a build without CUDA every entry point throws
// mamba2_ssd::Error (Kind::kUnsupported).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cli_problem.hpp"
#include "mamba2_ssd/tuning.hpp"

namespace cli::gpu {

// True when the library was built with the CUDA kernels (MAMBA2_SSD_WITH_CUDA).
bool built_with_cuda();

struct DeviceInfo {
  int index = -1;
  std::string name;
  int major = 0, minor = 0;
  int sms = 0;
  std::size_t memory_bytes = 0;
};

// Makes the first device of compute capability 9.0 (the current one when it qualifies) the
// current device and describes it. Call only when mamba2_ssd::cuda_available().
DeviceInfo select_device();

// "NVIDIA H200 (device 0, sm_90, 132 SMs, 140.4 GiB)"
std::string describe(const DeviceInfo& d);

// cudaMalloc'ed mirrors of every present tensor of `prob` (inputs copied, outputs poisoned),
// the workspace (workspace_size() bytes, poisoned) and a stream. The Problem's tensors point at
// their mirrors (HostTensor::device) while this lives; the destructor frees everything.
class Mirror {
 public:
  explicit Mirror(Problem& prob);
  ~Mirror();
  Mirror(const Mirror&) = delete;
  Mirror& operator=(const Mirror&) = delete;

  std::size_t workspace_bytes() const;
  std::size_t device_bytes() const;  // tensors + workspace

  // All-ones bytes (NaN for the float dtypes) into every output and the workspace.
  void poison_outputs();
  // One forward on the stream, then synchronise (errors of the kernels surface here).
  void run_once();
  // `warmup` untimed calls, then `iters` calls between two CUDA events; returns milliseconds
  // per call. With `graph`, one call is captured in a CUDA graph and its replays are timed.
  double time_calls(int64_t warmup, int64_t iters, bool graph);
  // Copies every output back into the Problem's host tensors.
  void download_outputs();
  // The bytes of every output, concatenated (for the run-to-run determinism check).
  std::vector<unsigned char> output_bytes();
  // mamba2_ssd::tune() on this problem's buffers and stream.
  mamba2_ssd::TuneResult tune(const mamba2_ssd::TuneOptions& options);
  // The kernel settings forward() uses for this problem now, and their source.
  std::string kernel_config_description();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cli::gpu
