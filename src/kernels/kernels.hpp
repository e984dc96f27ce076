// Host-side entry points of the kernels (one .cu file each) and their tunable settings.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "kernels/common.cuh"
#include "kernels/fused_walk_variant.hpp"

namespace mamba2_ssd::kernels {

// Throws mamba2_ssd::Error (kind kCuda) naming `what` when `err` is not cudaSuccess.
void check_cuda(cudaError_t err, const char* what);
// Throws mamba2_ssd::Error (kind kUnsupported) for a shape a single launch cannot cover.
[[noreturn]] void throw_launch_error(const std::string& message);

// Raises `kernel`'s dynamic shared-memory limit to at least `bytes` on the current device, and
// where `max_carveout` asks for the largest shared-memory carveout. Both attributes belong to
// the device that is current when they are set, so they are kept per (kernel, device): a process
// that calls on a second GPU sets them there too. Safe to call from several host threads.
void raise_smem_limit(const void* kernel, int bytes, bool max_carveout, const char* what);

// Launches `kernel` on `stream`, where `early`, with programmatic dependent launch (see
// pdl_wait_primary: it may start while the kernel before it runs), and on clusters of `cluster`
// CTAs along x where cluster > 1. A driver that refuses the early start gets a plain launch
// (the kernel's wait then returns at once). Every kernel of the library is launched here, and
// early but compute_out without progress counters: each early one waits (pdl_wait_primary)
// before it reads or writes global memory, so the launch latency of the stream's next kernel,
// ours or the caller's, overlaps the end of the one before.
template <class... Params, class... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, int smem, cudaStream_t stream, bool early,
                   int cluster, const char* what, Args&&... args) {
  cudaLaunchAttribute attrs[2] = {};
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = static_cast<size_t>(smem);
  cfg.stream = stream;
  cfg.attrs = attrs;
  if (cluster > 1) {
    attrs[cfg.numAttrs].id = cudaLaunchAttributeClusterDimension;
    attrs[cfg.numAttrs].val.clusterDim.x = static_cast<unsigned>(cluster);
    attrs[cfg.numAttrs].val.clusterDim.y = 1;
    attrs[cfg.numAttrs].val.clusterDim.z = 1;
    ++cfg.numAttrs;
  }
  if (early) {
    attrs[cfg.numAttrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[cfg.numAttrs].val.programmaticStreamSerializationAllowed = 1;
    ++cfg.numAttrs;
  }
  cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, args...);
  if (err != cudaSuccess && early) {
    (void)cudaGetLastError();
    --cfg.numAttrs;
    err = cudaLaunchKernelEx(&cfg, kernel, args...);
  }
  check_cuda(err, what);
}

// fwd_pass_state: dstate columns per CTA (64 or 32; 32 doubles the CTAs for small batches) and
// the depth of its load ring (4: one CTA per SM with many loads in flight; 2: small enough for
// two or three CTAs per SM when walks x heads is large).
struct PassStateConfig {
  int dstate_tile = 64;
  int stages = 4;
  int segments = 1;  // walk segments wanted (SsdParams::nseg; the dispatcher fits it to the shape)
};

// What one CTA occupies on an SM: shared memory (with the 1 KB the runtime reserves per CTA) and
// registers (allocated per warp in steps of 8 per thread).
struct CtaFootprint {
  int smem = 0;
  int regs = 0;
};

// compute_out: heads of one group served by one CTA (C B^T is computed once for them; each head
// keeps its output accumulator in registers, so the count is 1, 2 or 4 for headdim 64 and 1 or 2
// for headdim 128).
struct ComputeOutConfig {
  int heads_per_cta = 2;
  int stages = 0;  // depth of the load ring, 2-4; 0: the deepest that keeps the most CTAs per SM
  // A fwd_pass_state CTA that shares the SMs while compute_out runs (its grid covers half of them
  // or more), or zero: the automatic ring depth then keeps the most compute_out CTAs next to it.
  CtaFootprint beside;
};
// The largest heads_per_cta compiled for a headdim.
int compute_out_max_heads_per_cta(int headdim);

// varlen layout: chunk_offsets[i] = sum_{k<i} ceil(len_k / Q) (one CTA).
void launch_chunk_offsets(const SsdParams& p, cudaStream_t stream);
// dt' and the in-chunk cumulative sum of A * dt' (times log2 e) for every chunk slot.
// early_dependent: the next kernel is launched as soon as every CTA of this one has started
// (else when they end); it pays where that kernel is fused_walk, see launch_prefix.
void launch_chunk_cumsum(const SsdParams& p, bool early_dependent, cudaStream_t stream);
// fwd_pass_state's CTAs per (walk, head) with a dstate tile of 32 or 64 (SsdParams::ready_tiles).
int fwd_pass_state_tiles(int64_t headdim, int64_t dstate, int dstate_tile);
// What one fwd_pass_state CTA of this setting occupies on an SM.
CtaFootprint fwd_pass_state_footprint(const SsdParams& p, const PassStateConfig& cfg);
// The state after every chunk (p.states) and after every walk (p.final_states); with p.ready,
// its progress per chunk for compute_out.
void launch_fwd_pass_state(const SsdParams& p, const PassStateConfig& cfg, cudaStream_t stream);
// Only fwd_pass_state's segment sums (p.nseg > 1), for fused_walk: CTAs of 64 x dstate_tile
// (32, 64, or 128 with headdim 64 and chunks of 128), the sums stored in 64 x dstate_tile tiles
// (128: in 64 x 64 tiles, as with 64). With p.sums_cumsum (dstate tile 64 or 128) they also do
// chunk_cumsum's work for every chunk, which is then not launched. With p.sum_split > 1 (dstate
// tile 64 or 128, chunks of 128) each summed segment is summed in that many parts, one sum each.
void launch_segment_sums(const SsdParams& p, int dstate_tile, cudaStream_t stream);
// out for every chunk. Launched right after fwd_pass_state (programmatic dependent launch): it
// runs alongside, waiting on p.ready before it reads a chunk state, and its CTAs of the last
// chunk wait for fwd_pass_state to complete, so that its completion implies that one's.
void launch_compute_out(const SsdParams& p, const ComputeOutConfig& cfg, cudaStream_t stream);
// fused_walk: the walk and every chunk's output in one kernel (the chunk states stay on chip;
// they are stored only where p.states is set). Takes headdim 64 with dstate <= 128 and chunk 64
// or 128, or dstate <= 512 and chunk 128 (two warpgroups per CTA; above dstate 256 two CTAs of a
// cluster per walk; fused_walk_supported); segments (p.nseg > 1) need launch_segment_sums(p, 64)
// or (p, 128) first; `variant`: see fused_walk_variant.hpp.
bool fused_walk_supported(const SsdParams& p);
// Whether FusedWalkVariant::kSpecialized takes p: headdim 64, dstate <= 512 (above 128 in
// segments of at least kSpecializedBlocksMinChunks chunks), chunks of 128, the batched layout
// without seq_idx, and a 16-bit output without z that the TMA can store.
bool fused_walk_specialized_supported(const SsdParams& p);
// Whether the specialised kernel for p's dstate and dtype scales its update by the weights as
// bf16 pairs, and so takes chunk_cumsum's pairs (p.wst_pairs) in place of fp32 wst.
bool fused_walk_specialized_reads_pairs(const SsdParams& p);
void launch_fused_walk(const SsdParams& p, FusedWalkVariant variant, cudaStream_t stream);
// Batched layout with cu_seqlens: the final state of every packed sequence (p.varlen_states).
void launch_varlen_states(const SsdParams& p, cudaStream_t stream);
// fp32 inputs: a strided (rows, inner) fp32 tensor -> contiguous bf16 copy.
// `outer` rows of `inner` elements; row r starts at src + offset_of_row(r).
void launch_convert_to_bf16(const float* src, int64_t d0, int64_t d1, int64_t d2, int64_t s0, int64_t s1,
                            int64_t s2, int64_t inner, void* dst, cudaStream_t stream);

}  // namespace mamba2_ssd::kernels
