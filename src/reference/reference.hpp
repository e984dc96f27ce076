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

// The largest relative L2 error against forward_f64 that the GPU kernels are held to (by
// `mamba2-ssd check` and the GPU tests), for an output of `elements` values stored as `stored`,
// computed from inputs of dtype `io`. The bars sit above the rounding that mamba_ssm's Triton
// kernels do too (the 16-bit operands of the tensor cores): out 2.0-2.4e-3 and final states
// 1.6-1.7e-3 on the benchmark's shapes. With strong decays (the CLI's and the tests' default
// inputs, A = -uniform(1, 16)) a state holds only its last few tokens, so its error is the
// rounding of those few tokens' products: a noisy draw, 0.8-2.2e-3 for fp32 states (design log
// v15, v33), hence 2.5e-3. 16-bit states add their own rounding; fp32 inputs their rounding to
// bf16; below kFewElements values a tensor's error averages over few roundings (1.5x wider).
// A real defect gives 1e-1 or NaN.
enum class Compared { kOut, kState };
double error_bar(Compared what, DType stored, DType io, int64_t elements);
constexpr int64_t kFewElements = 16384;

}  // namespace mamba2_ssd::reference
