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
inline KernelChoice choose_kernels(const ProblemShape& s, int64_t walks) {
  KernelChoice c;
  const int64_t p_tiles = (s.headdim + 63) / 64;
  const int64_t ctas64 = walks * s.nheads * p_tiles * ((s.dstate + 63) / 64);
  c.pass_state.dstate_tile = ctas64 < 2 * 132 ? 32 : 64;
  return c;
}

}  // namespace mamba2_ssd::detail
