// Which compiled kernel variants run a shape.
#pragma once

#include <cstdint>

#include "kernels/kernels.hpp"
#include "mamba2_ssd/params.hpp"

namespace mamba2_ssd::detail {

struct KernelChoice {
  kernels::PassStateConfig pass_state;
  kernels::ComputeOutConfig compute_out;
};

// Heuristic choice: fwd_pass_state walks chunks in order, so its parallelism is only
// walks x heads x state tiles; halve the dstate tile when that leaves most SMs idle.
// compute_out serves up to 8 heads of a group per CTA (C B^T once for all of them), fewer when
// that would leave less than two CTAs per SM.
inline KernelChoice choose_kernels(const ProblemShape& s, int64_t walks, int sm_count = 132) {
  KernelChoice c;
  const int64_t p_tiles = (s.headdim + 63) / 64;
  const int64_t ctas64 = walks * s.nheads * p_tiles * ((s.dstate + 63) / 64);
  c.pass_state.dstate_tile = ctas64 < 2 * sm_count ? 32 : 64;
  const int64_t hpg = s.nheads / s.ngroups;
  const int64_t tiles = s.batch * s.nchunks * 2 * s.ngroups;  // (row, chunk, ~2 m-blocks, group)
  int64_t hb = hpg < 8 ? hpg : 8;
  while (hb > 1 && tiles * ((hpg + hb - 1) / hb) < 2 * sm_count) hb = (hb + 1) / 2;
  c.compute_out.heads_per_cta = static_cast<int>(hb);
  return c;
}

}  // namespace mamba2_ssd::detail
