// forward(), forward_with_allocator(): validate, then run the CPU reference or the GPU kernels.
#include <cstdint>
#include <string>

#include "mamba2_ssd/api.hpp"
#include "reference/reference.hpp"
#ifdef MAMBA2_SSD_WITH_CUDA
#include "dispatch/launch.hpp"
#endif

namespace mamba2_ssd {

namespace {
[[noreturn, maybe_unused]] void throw_no_cuda() {
  throw Error(Error::Kind::kUnsupported, "device",
              "device: Device::kCUDA requested, but this build of mamba2-ssd has no CUDA kernels "
              "(configured with MAMBA2_SSD_CUDA=OFF); use Device::kCPU or rebuild with CUDA");
}
}  // namespace

std::size_t workspace_size(const ForwardParams& p) {
  const ProblemShape s = validate(p);
  if (p.device == Device::kCPU) return 0;
#ifdef MAMBA2_SSD_WITH_CUDA
  return detail::gpu_workspace_needs(p, s).now;
#else
  (void)s;
  throw_no_cuda();
#endif
}

void forward(const ForwardParams& p, void* workspace, std::size_t workspace_bytes,
             CUstream_st* stream) {
  const ProblemShape s = validate(p);
  if (p.device == Device::kCPU) {
    reference::forward(p, s);
    return;
  }
#ifdef MAMBA2_SSD_WITH_CUDA
  // (workspace_size() may be more: what the settings resolved now need; with less, forward runs
  // the settings that fit, see there)
  const std::size_t need = detail::gpu_workspace_needs(p, s, false).least;
  if (need > 0 && (workspace == nullptr || workspace_bytes < need)) {
    throw Error(Error::Kind::kInvalidArgument, "workspace",
                "workspace: expected at least " + std::to_string(need) + " bytes (workspace_size()), got " +
                    std::to_string(workspace == nullptr ? 0 : workspace_bytes) +
                    (workspace == nullptr ? " (null pointer)" : ""));
  }
  if (reinterpret_cast<std::uintptr_t>(workspace) % 256 != 0) {
    throw Error(Error::Kind::kInvalidArgument, "workspace",
                "workspace: expected a 256-byte aligned pointer, got address " +
                    std::to_string(reinterpret_cast<std::uintptr_t>(workspace)));
  }
  detail::gpu_forward(p, s, workspace, workspace_bytes, stream);
#else
  (void)workspace;
  (void)workspace_bytes;
  (void)stream;
  throw_no_cuda();
#endif
}

void forward_with_allocator(const ForwardParams& p, WorkspaceAllocator allocate, void* context,
                            CUstream_st* stream) {
  if (allocate == nullptr) {
    throw Error(Error::Kind::kInvalidArgument, "allocate", "allocate: expected a workspace allocator, got nullptr");
  }
  const ProblemShape s = validate(p);
  if (p.device == Device::kCPU) {
    reference::forward(p, s);
    return;
  }
#ifdef MAMBA2_SSD_WITH_CUDA
  detail::gpu_forward_allocating(p, s, allocate, context, stream);
#else
  (void)context;
  (void)stream;
  throw_no_cuda();
#endif
}

bool cuda_available() {
#ifdef MAMBA2_SSD_WITH_CUDA
  return detail::gpu_present();
#else
  return false;
#endif
}

const char* version() { return MAMBA2_SSD_VERSION; }

}  // namespace mamba2_ssd
