// The heuristic kernel settings for a shape (used when the tuning cache has no entry) and the
// switch for tuning on a cache miss.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "mamba2_ssd/params.hpp"

namespace mamba2_ssd::detail {

// fwd_pass_state walks chunks in order, so its parallelism is only walks x heads x state tiles:
// halve the dstate tile when that leaves most SMs idle. Its shallow load ring leaves room on
// each SM for compute_out CTAs, which run alongside it (H200, whole-call time: anchor 64K
// 1.23 ms with the shallow ring against 1.34 ms with the deep one). compute_out: two heads per
// CTA for headdim 64 (C B^T shared by both, three CTAs per SM fit; best or within 1% on every
// anchor and model shape measured), one for headdim 128 (its accumulators fill the registers).
inline KernelConfig heuristic_config(const ProblemShape& s, int64_t walks, int sm_count) {
  KernelConfig c;
  const int64_t p_tiles = (s.headdim + 63) / 64;
  const int64_t ctas64 = walks * s.nheads * p_tiles * ((s.dstate + 63) / 64);
  c.pass_state_dstate_tile = ctas64 < 2 * sm_count ? 32 : 64;
  c.pass_state_stages = 2;
  const int64_t hpg = s.nheads / s.ngroups;
  c.compute_out_heads_per_cta = static_cast<int>(std::min<int64_t>(hpg, s.headdim <= 64 ? 2 : 1));
  return c;
}

// MAMBA2_SSD_AUTOTUNE=1: forward() tunes a shape class it has no cache entry for (1 s budget).
inline bool autotune_on_miss() {
  const char* e = std::getenv("MAMBA2_SSD_AUTOTUNE");
  return e != nullptr && std::string(e) == "1";
}

}  // namespace mamba2_ssd::detail
