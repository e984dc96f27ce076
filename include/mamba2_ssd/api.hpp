// The entry points: validate, workspace_size, forward (and forward_with_allocator).
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

// Where forward_with_allocator() gets its scratch memory: returns at least `bytes` bytes
// (never 0) of device memory of the current device, 256-byte aligned, usable by the work the
// call enqueues next on its stream (a stream-ordered or caching allocator qualifies) and kept
// until that work is enqueued. May throw; the error reaches the caller. `context` is passed on.
using WorkspaceAllocator = void* (*)(std::size_t bytes, void* context);

// forward() for callers that allocate the workspace per call (a framework's caching allocator):
// validates `p` once, sizes the workspace as workspace_size(p) does, takes it from `allocate`
// (at most one call; none for Device::kCPU or when no scratch is needed) and runs as forward().
// workspace_size() followed by forward() validates `p` and resolves its settings twice.
void forward_with_allocator(const ForwardParams& p, WorkspaceAllocator allocate, void* context,
                            CUstream_st* stream = nullptr);

// True when this build has the CUDA kernels and a device of compute capability 9.0 is present.
bool cuda_available();

// "0.1.0"
const char* version();

}  // namespace mamba2_ssd
