// The kernels of fused_walk for one problem (kernels::launch_fused_walk; chosen by
// detail::fused_walk_variant in dispatch/tuning.hpp). Kept apart from kernels.hpp, which needs the
// CUDA headers, so that the host-only tuning code and its tests can name them.
#pragma once

#include <cstdint>

namespace mamba2_ssd::kernels {

// kOneWarpgroup: two CTAs of one warpgroup per SM. kThreePerSm (dstate <= 64): three such CTAs per
// SM, each slower. kTwoWarpgroups (dstate <= 128, chunks of 128): one CTA of two warpgroups per SM,
// one per 64-token block and 64 state columns each, as above dstate 128 (at dstate <= 64 the
// second warpgroup's columns are past dstate: zeros). kSpecialized (dstate <= 512, chunks of 128,
// the batched layout without seq_idx, out by TMA stores; kernels::fused_walk_specialized_supported):
// one CTA of three warpgroups per SM, one for the state and two for the output (one per 64-token
// block); at dstate <= 128 two chunk buffers, at 129-256 a buffer of the chunk's two 64-token
// blocks, at 257-512 the same on each of two CTAs of a cluster, 256 state columns each
// (fused_walk_ws.cu).
enum class FusedWalkVariant { kOneWarpgroup, kThreePerSm, kTwoWarpgroups, kSpecialized };

// kSpecialized's condition, for the tuning model and the launch (fused_walk_specialized_supported,
// which adds the output's alignment, a property of the pointer): its shape, and the call's layout
// and options (batched, no seq_idx, and an output the TMA stores: 16-bit, no z).
constexpr bool fused_walk_specialized_shape(int64_t headdim, int64_t dstate, int64_t chunk) {
  return headdim == 64 && dstate <= 512 && chunk == 128;
}
constexpr bool fused_walk_specialized_options(bool batched, bool seq_idx, bool z, bool out_fp32) {
  return batched && !seq_idx && !z && !out_fp32;
}
// The shortest walk segments that kSpecialized runs at dstate 129-512 (its block-slot form, whose
// start costs more: anchor dstate 256 in segments of 2 chunks 26.0 -> 28.1 us against the
// two-warpgroup kernel, of 8 chunks 67.9 -> 62.6; H200, design log v38; dstate 512 in segments of
// 4 chunks 43.0 -> 42.8 against the cluster kernel, v39). Shorter ones run the two-warpgroup
// kernel or its clusters (kOneWarpgroup's launch there).
constexpr int64_t kSpecializedBlocksMinChunks = 4;
constexpr bool fused_walk_specialized_segment(int64_t dstate, int64_t seg_chunks) {
  return dstate <= 128 || seg_chunks >= kSpecializedBlocksMinChunks;
}
// Where two segments of kSpecialized may split unevenly (SsdParams::seg0_chunks, prewalk; the
// tuning model's first_segment_chunks, multi_wave_split): dstate <= 128, where their rules were
// fitted. (The block-slot form of dstate 129-512 would run an uneven split, not measured; it has
// no pre-walk.)
constexpr bool fused_walk_specialized_uneven(int64_t dstate) { return dstate <= 128; }
// Where kSpecialized may walk two heads per CTA (SsdParams::ws_heads): one 64-column slice, and
// heads that pair within their group.
constexpr bool fused_walk_specialized_pairs(int64_t dstate, int64_t heads_per_group) {
  return dstate <= 64 && heads_per_group % 2 == 0;
}

// The longest segments whose sums also compute chunk_cumsum's outputs (SsdParams::sums_cumsum):
// each of a sum CTA's four warps computes one of its chunks and at most one of the last
// segment's, before its walk. (Two or three chunks per warp made the sums longer than
// chunk_cumsum: design log v21.)
constexpr int kSumsCumsumMaxChunks = 4;

}  // namespace mamba2_ssd::kernels
