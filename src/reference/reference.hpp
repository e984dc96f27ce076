// The CPU reference: the chunked algorithm of docs/SEMANTICS.md with float64 accumulation.
// Runs on host pointers; used by forward() for Device::kCPU and as the oracle of the GPU tests.
#pragma once

#include <cstdint>
#include <vector>

#include "mamba2_ssd/params.hpp"

namespace mamba2_ssd::reference {

// Computes every output present in `p` (out, final_states, varlen_states, chunk_states,
// chunk_offsets). `s` is what validate(p) returned. Uses up to `threads` host threads
// (0: std::thread::hardware_concurrency()).
void forward(const ForwardParams& p, const ProblemShape& s, int threads = 0);

// The same computation with the results kept in float64 (no rounding to the output dtypes),
// for tests. Each buffer is contiguous, row-major, and filled only when the matching output
// tensor is present in `p` (out always); the output tensors of `p` are not written.
struct F64Outputs {
  std::vector<double> out;             // (b, l, h, p) | (T, h, p)
  std::vector<double> final_states;    // (b, h, p, n) | (S, h, p, n)
  std::vector<double> varlen_states;   // (S, h, p, n)
  std::vector<double> chunk_states;    // (b, c, h, p, n) | (chunks used, h, p, n)
  std::vector<int32_t> chunk_offsets;  // varlen layout: S + 1 entries; empty for batched
};
F64Outputs forward_f64(const ForwardParams& p, const ProblemShape& s, int threads = 0);

}  // namespace mamba2_ssd::reference
