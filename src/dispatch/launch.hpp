// The GPU half of forward() and tune(): workspace layout, kernel settings, launches
// (src/dispatch/launch.cu).
#pragma once

#include <cstddef>
#include <string>

#include "dispatch/tuning_cache.hpp"
#include "mamba2_ssd/api.hpp"
#include "mamba2_ssd/params.hpp"
#include "mamba2_ssd/tuning.hpp"

struct CUstream_st;

namespace mamba2_ssd::detail {

// Bytes of device scratch for a validated call: `now` for the settings forward() resolves now,
// `least` what it runs in (fused_walk, where it applies, needs no room for the chunk states),
// `all` what every setting fits in (tune() times them all). with_now = false skips resolving the
// settings (a cache lookup): `now` is then left at `least`.
struct WorkspaceNeeds {
  std::size_t now = 0, least = 0, all = 0;
};
WorkspaceNeeds gpu_workspace_needs(const ForwardParams& p, const ProblemShape& s, bool with_now = true);

// Enqueues the kernels of one validated call on `stream`.
void gpu_forward(const ForwardParams& p, const ProblemShape& s, void* workspace,
                 std::size_t workspace_bytes, CUstream_st* stream);

// gpu_forward with the workspace from `allocate` (sized as gpu_workspace_needs(p, s).now, the
// settings resolved once for both).
void gpu_forward_allocating(const ForwardParams& p, const ProblemShape& s, WorkspaceAllocator allocate, void* context,
                            CUstream_st* stream);

// Times the kernel settings on one validated call (see mamba2_ssd::tune).
TuneResult gpu_tune(const ForwardParams& p, const ProblemShape& s, void* workspace, std::size_t workspace_bytes,
                    CUstream_st* stream, const TuneOptions& options);

// The settings forward() uses for a validated call (no tuning), where they come from
// ("explicit", "env", "cache", "heuristic") and the cache key.
KernelConfig resolve_kernel_config(const ForwardParams& p, const ProblemShape& s, std::string* source,
                                   std::string* key);

// Whether forward() of this validated call, under the settings it resolves now, has chunk_cumsum
// store the specialised fused_walk's per-chunk quantities (kernels::SsdParams::walk_meta; tests).
bool stores_walk_meta(const ForwardParams& p, const ProblemShape& s);

// Name and SM count of the current device.
DeviceId current_device_id();

// True when a device of compute capability 9.0 is present.
bool gpu_present();

}  // namespace mamba2_ssd::detail
