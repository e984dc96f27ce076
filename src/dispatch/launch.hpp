// The GPU half of forward(): workspace layout and kernel launches (src/dispatch/launch.cu).
#pragma once

#include <cstddef>

#include "mamba2_ssd/params.hpp"

struct CUstream_st;

namespace mamba2_ssd::detail {

// Bytes of device scratch for a validated call.
std::size_t gpu_workspace_size(const ForwardParams& p, const ProblemShape& s);

// Enqueues the kernels of one validated call on `stream`.
void gpu_forward(const ForwardParams& p, const ProblemShape& s, void* workspace,
                 std::size_t workspace_bytes, CUstream_st* stream);

// True when a device of compute capability 9.0 is present.
bool gpu_present();

}  // namespace mamba2_ssd::detail
