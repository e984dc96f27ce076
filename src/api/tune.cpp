// tune(), the kernel-setting queries and the tuning cache controls of the public API.
#include <string>

#include "dispatch/tuning.hpp"
#include "dispatch/tuning_cache.hpp"
#include "mamba2_ssd/api.hpp"
#include "mamba2_ssd/tuning.hpp"
#ifdef MAMBA2_SSD_WITH_CUDA
#include "dispatch/launch.hpp"
#endif

namespace mamba2_ssd {

std::string to_string(const KernelConfig& c) {
  return "nt=" + std::to_string(c.pass_state_dstate_tile) + " stages=" + std::to_string(c.pass_state_stages) +
         " segments=" + std::to_string(c.pass_state_segments) + " heads=" + std::to_string(c.compute_out_heads_per_cta) +
         " fused=" + std::to_string(c.fused_walk) + " fused_heads=" + std::to_string(c.fused_walk_heads_per_cta);
}

namespace {
void require_gpu_call(const ForwardParams& p, const char* what) {
  if (p.device != Device::kCUDA) {
    throw Error(Error::Kind::kUnsupported, "device",
                std::string("device: ") + what + " concerns the GPU kernels; the call has Device::kCPU");
  }
#ifndef MAMBA2_SSD_WITH_CUDA
  throw Error(Error::Kind::kUnsupported, "device",
              std::string("device: ") + what + " needs the CUDA kernels, and this build has none (MAMBA2_SSD_CUDA=OFF)");
#endif
}
}  // namespace

TuneResult tune(const ForwardParams& p, void* workspace, std::size_t workspace_bytes, CUstream_st* stream,
                const TuneOptions& options) {
  const ProblemShape s = validate(p);
  require_gpu_call(p, "tune()");
#ifdef MAMBA2_SSD_WITH_CUDA
  const std::size_t need = detail::gpu_workspace_needs(p, s, false).least;
  if (need > 0 && (workspace == nullptr || workspace_bytes < need)) {
    throw Error(Error::Kind::kInvalidArgument, "workspace",
                "workspace: expected at least " + std::to_string(need) +
                    " bytes (tune_workspace_size() times every setting), got " +
                    std::to_string(workspace == nullptr ? 0 : workspace_bytes));
  }
  return detail::gpu_tune(p, s, workspace, workspace_bytes, stream, options);
#else
  (void)s; (void)workspace; (void)workspace_bytes; (void)stream; (void)options;
  return {};
#endif
}

KernelConfig kernel_config_for(const ForwardParams& p, std::string* source) {
  const ProblemShape s = validate(p);
  require_gpu_call(p, "kernel_config_for()");
#ifdef MAMBA2_SSD_WITH_CUDA
  return detail::resolve_kernel_config(p, s, source, nullptr);
#else
  (void)s; (void)source;
  return {};
#endif
}

std::string tuning_key(const ForwardParams& p) {
  const ProblemShape s = validate(p);
  require_gpu_call(p, "tuning_key()");
#ifdef MAMBA2_SSD_WITH_CUDA
  // (the key of the call as its kernels run it: a 256-token call may run in 128-token chunks)
  std::string key;
  detail::resolve_kernel_config(p, s, nullptr, &key);
  return key;
#else
  (void)s;
  return {};
#endif
}

std::size_t tune_workspace_size(const ForwardParams& p) {
  const ProblemShape s = validate(p);
  require_gpu_call(p, "tune_workspace_size()");
#ifdef MAMBA2_SSD_WITH_CUDA
  return detail::gpu_workspace_needs(p, s, false).all;
#else
  (void)s;
  return 0;
#endif
}

std::string tuning_cache_path() { return detail::TuningCache::instance().path(); }

void reset_tuning_cache() { detail::TuningCache::instance().reset(); }

}  // namespace mamba2_ssd
