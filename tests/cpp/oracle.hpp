// The token-by-token oracle: the SSD recurrence of docs/SEMANTICS.md evaluated one token at a
// time in float64, with no chunking. Written independently of the chunked CPU reference so that
// the two check each other. Single-threaded and O(L * P * N) per head: meant for small shapes.
#pragma once

#include <cstdint>
#include <vector>

#include "mamba2_ssd/params.hpp"

namespace mamba2_ssd::test {

// Same layout rules as reference::F64Outputs: contiguous, row-major, each buffer filled only
// when the matching output of `p` is present (out always).
struct OracleOutputs {
  std::vector<double> out;             // (b, l, h, p) | (T, h, p)
  std::vector<double> final_states;    // (b, h, p, n) | (S, h, p, n)
  std::vector<double> varlen_states;   // (S, h, p, n)
  std::vector<double> chunk_states;    // (b, c, h, p, n) | (chunks used, h, p, n)
  std::vector<int32_t> chunk_offsets;  // varlen layout: S + 1 entries; empty for batched
};

// Reads the inputs of `p` (host memory, any dtypes and strides); never writes to `p`.
OracleOutputs oracle_forward(const ForwardParams& p, const ProblemShape& s);

}  // namespace mamba2_ssd::test
