// The entry points: validate, workspace_size, forward.
#pragma once

#include <cstddef>

#include "mamba2_ssd/error.hpp"
#include "mamba2_ssd/params.hpp"

struct CUstream_st;  // cudaStream_t without including the CUDA headers

namespace mamba2_ssd {

// Checks every argument of `p` and returns the derived sizes. Throws mamba2_ssd::Error (kind
// kInvalidArgument) naming the argument, the expected and the actual value. It reads tensor
// contents (cu_seqlens order, seq_idx order) only for Device::kCPU: device memory is never
// read on the host, so the GPU path cannot check those and treats them as documented.
ProblemShape validate(const ForwardParams& p);

// Bytes of scratch memory forward() needs for `p` (device memory for Device::kCUDA, 0 for CPU),
// with the kernel settings it resolves now (explicit, environment, tuning cache or heuristic:
// include/mamba2_ssd/tuning.hpp). fused_walk keeps the chunk states on chip, so the settings that
// run it need less. Given less than the two kernels need, forward() runs fused_walk whatever the
// settings say, and it accepts any workspace that fits fused_walk (or, where fused_walk does not
// apply, the two kernels): a workspace sized once stays valid when the tuning cache changes.
std::size_t workspace_size(const ForwardParams& p);

// Runs the forward. Device::kCPU: the float64 CPU reference, synchronously; `workspace` and
// `stream` are ignored. Device::kCUDA: enqueues the kernels on `stream` (nullptr: the legacy
// default stream); no host synchronisation, no allocation: `workspace` must hold
// workspace_size(p) bytes, 256-byte aligned. Safe inside CUDA graph capture. Results are
// bitwise identical from run to run.
void forward(const ForwardParams& p, void* workspace, std::size_t workspace_bytes,
             CUstream_st* stream = nullptr);

// True when this build has the CUDA kernels and a device of compute capability 9.0 is present.
bool cuda_available();

// "0.1.0"
const char* version();

}  // namespace mamba2_ssd
