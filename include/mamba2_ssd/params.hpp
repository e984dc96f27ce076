// Arguments of one SSD forward call: what mamba_ssm 2.3.2.post1's
// mamba_chunk_scan_combined takes, plus the serving-style variable-length form.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>

#include "mamba2_ssd/types.hpp"

namespace mamba2_ssd {

enum class Layout : int32_t {
  // mamba_chunk_scan_combined's form. Tokens are (batch, seqlen); several sequences may be
  // packed into one row with seq_idx; cu_seqlens (batch must be 1) asks for the final state of
  // every packed sequence in varlen_states.
  kBatched = 0,
  // The serving form: tokens (total, ...) with no batch dimension, sequence i owning tokens
  // [cu_seqlens[i], cu_seqlens[i+1]). Every sequence starts on a fresh chunk, has its own
  // initial state (or zero) and its own final state.
  kVarlen = 1,
};

const char* layout_name(Layout l);

// Sizes below: b = batch, l = seqlen, T = total tokens (varlen), S = number of sequences,
// h = nheads, p = headdim, g = ngroups, n = dstate, c = number of chunks.
// Optional tensors are absent when their data pointer is null.
// Settings of the compiled GPU kernel variants (include/mamba2_ssd/tuning.hpp says how
// forward() picks them). 0 means "not set". Every valid setting computes the same result, except
// that a different walk segment count adds the chunk states in another order (fp32 rounding) and
// fused_walk weights x instead of B per token before rounding to 16 bits for the state update
// (another rounding of the same product).
struct KernelConfig {
  int pass_state_dstate_tile = 0;     // fwd_pass_state: dstate columns per CTA, 32 or 64
  int pass_state_stages = 0;          // fwd_pass_state: load-ring depth, 2 or 4
  int compute_out_heads_per_cta = 0;  // compute_out: 1, 2 or 4 (headdim 64), 1 or 2 (headdim 128)
  // fwd_pass_state: segments each walk (row or varlen sequence) is split into, 1-16; at most the
  // mean chunks per walk (segments of one chunk), so a larger count is reduced to what the shape
  // allows. Two segments of fused_walk's specialised kernel split unevenly where its walks x heads
  // fill more than half of the SMs but not all (a short first segment beside a long one).
  int pass_state_segments = 0;
  // 1: the walk and the output as two kernels running side by side (fwd_pass_state, compute_out);
  // 2: as one kernel (fused_walk: the chunk states stay on chip; the segments above apply, the
  // other settings do not) where it applies (headdim 64; dstate <= 128 with chunks of 64 or 128
  // tokens, or dstate <= 512 with chunks of 128, as the kernels run them, see chunk_size), else 1.
  int fused_walk = 0;
  // fused_walk's specialised kernel at dstate <= 64 (chunks of 128; see fused_walk): heads of one
  // group per CTA, 1 or 2 (2 where the heads per group are even, else 1). Two share each chunk's
  // C and B tiles and C B^T, each CTA's chunk taking longer: they pay with long segments or many
  // walks x heads.
  int fused_walk_heads_per_cta = 0;

  bool operator==(const KernelConfig& o) const {
    return pass_state_dstate_tile == o.pass_state_dstate_tile && pass_state_stages == o.pass_state_stages &&
           compute_out_heads_per_cta == o.compute_out_heads_per_cta && pass_state_segments == o.pass_state_segments &&
           fused_walk == o.fused_walk && fused_walk_heads_per_cta == o.fused_walk_heads_per_cta;
  }
  bool operator!=(const KernelConfig& o) const { return !(*this == o); }
};

struct ForwardParams {
  Layout layout = Layout::kBatched;
  Device device = Device::kCUDA;

  // ---- inputs ----
  TensorView x;       // (b, l, h, p) | (T, h, p)            bf16, fp16 or fp32
  TensorView dt;      // (b, l, h)    | (T, h)               bf16, fp16 or fp32
  TensorView A;       // (h)                                 fp32; expected <= 0
  TensorView B;       // (b, l, g, n) | (T, g, n)            dtype of x
  TensorView C;       // (b, l, g, n) | (T, g, n)            dtype of x
  // Tokens per chunk; the GPU runs 64, 128 and 256. It runs 256 as two chunks of 128 when no
  // output depends on where chunks end (no chunk_states, chunk_offsets or batched varlen_states):
  // the same result up to rounding (the chunk states are rounded at one more point).
  int64_t chunk_size = 0;

  TensorView D;        // optional (h) or (h, p)             fp32: out += D * x
  TensorView z;        // optional like x, dtype of x:        out *= silu(z)
  TensorView dt_bias;  // optional (h)                        fp32: dt += dt_bias
  bool dt_softplus = false;  // dt = softplus(dt) where dt <= 20 (identity above)
  float dt_min = 0.0f;       // dt_limit: dt = clamp(dt, dt_min, dt_max), always applied
  float dt_max = std::numeric_limits<float>::infinity();

  // optional (b, h, p, n) | (S, h, p, n), fp32 or a 16-bit float type.
  // Batched with seq_idx: it reaches only the tokens whose seq_idx is 0 (mamba_ssm's rule).
  TensorView initial_states;
  // optional (b, l) int32, non-decreasing along l, >= 0: packed sequences in one row.
  // Batched layout only.
  TensorView seq_idx;
  // (S + 1) int32 or int64, non-decreasing, cu_seqlens[0] == 0, cu_seqlens[S] == l (batched,
  // with batch == 1) or T (varlen). Required for the varlen layout; in the batched layout it is
  // used only to fill varlen_states.
  TensorView cu_seqlens;

  // ---- outputs ----
  TensorView out;           // required, shape of x, dtype of x
  // optional (b, h, p, n) | (S, h, p, n), fp32 or a 16-bit float type: the state after the last
  // token of each row (batched) or of each sequence (varlen).
  TensorView final_states;
  // optional, batched layout with cu_seqlens only: (S, h, p, n), fp32 or a 16-bit float type.
  // The state after the last token of every packed sequence, computed as mamba_ssm's
  // chunk_state_varlen does: from the chunk state entering the chunk where the sequence ends
  // (only when the sequence starts before that chunk) plus the sequence's tokens in that chunk.
  TensorView varlen_states;
  // optional, per-chunk states: the state after the last token of every chunk, in state_dtype.
  // Batched: (b, c, h, p, n) with c = ceil(l / chunk_size).
  // Varlen: (capacity, h, p, n) with capacity >= max_varlen_chunks(T, S, chunk_size); sequence
  // i's chunk j is at index chunk_offsets[i] + j (see chunk_offsets).
  TensorView chunk_states;
  // optional, varlen layout only: (S + 1) int32, filled with the index of each sequence's first
  // chunk in chunk_states (chunk_offsets[S] = chunks used). Computed on the device.
  TensorView chunk_offsets;

  // dtype of the chunk states kept between the kernels (and of chunk_states):
  // fp32, or the 16-bit compute type (bf16 for bf16/fp32 inputs, fp16 for fp16 inputs).
  // Unset: the dtype of C, as mamba_ssm does (fp32 inputs: fp32).
  std::optional<DType> state_dtype;

  // GPU kernel settings for this call; fields left 0 come from the tuning cache or the heuristic.
  KernelConfig kernel_config;

  // validate() asks the CUDA runtime where every data pointer lives (host, pinned host, which
  // device): one cudaPointerGetAttributes per tensor, 0.3-0.7 us each on the H200 machine. A
  // caller whose tensors already say that (a framework's device tensors, checked to be on the
  // current device) may set false to skip it; a pointer elsewhere is then not reported.
  bool check_memory_locations = true;
};

// Derived sizes of a call, filled by validate().
struct ProblemShape {
  int64_t batch = 0;      // b (1 for varlen)
  int64_t seqlen = 0;     // l (T for varlen)
  int64_t nheads = 0;     // h
  int64_t headdim = 0;    // p
  int64_t ngroups = 0;    // g
  int64_t dstate = 0;     // n
  int64_t chunk_size = 0; // Q
  int64_t nchunks = 0;    // c per row (batched) | upper bound on chunks (varlen)
  int64_t nseq = 0;       // S (cu_seqlens given), else 0
  DType compute_dtype = DType::kBFloat16;  // 16-bit type of the tensor-core products
  DType state_dtype = DType::kFloat32;     // resolved state dtype
};

// An upper bound on the chunks that S sequences of T tokens in all can occupy when each one
// starts on a fresh chunk: floor((T + S * (chunk_size - 1)) / chunk_size).
int64_t max_varlen_chunks(int64_t total_tokens, int64_t nseq, int64_t chunk_size);

}  // namespace mamba2_ssd
