// compute_out: every chunk's output from its entry state.
//
// One CTA (one warpgroup) per (row, chunk, 64-token block m of the chunk, group, slice of HB
// heads of the group). With t the block's tokens and s the chunk's tokens up to the block's end,
// the steps are:
//   for every head h of the slice:  acc_h  = C_m H_prev(h)^T        (64 x P, wgmma SS)
//   for every 64-token block j <= m:
//     CB   = C_m B_j^T                    (64 x 64 fp32, wgmma SS, in registers; shared by the heads)
//     for every head h:  S = CB * exp2(min(cum_t - cum_s, 0)) * dt'_s, masked   (registers)
//                        acc_h += S X_hj                                      (wgmma RS)
//   out_h = (acc_h + D x) * silu(z)
// where acc_h was scaled by exp2(cum_t) (0 for tokens of another sequence) before the first S.
// The mask keeps lo_t <= s <= t: causality and, with seq_idx (non-decreasing), the first token
// of t's sequence in the chunk (lo_t), so no token sees another sequence.
//
// The CTA of a chunk c > 0 of a walk waits until fwd_pass_state, running alongside, has stored
// the state after chunk c - 1 (SsdParams::ready); the C_m loads are in flight meanwhile.
//
// C_m stays in shared memory for the whole CTA; H slices, B_j slices and X_hj tiles stream
// through a ring of 2-4 stages (as many as keep the most CTAs on an SM), issued one step less
// than the ring ahead. Thread 0 issues each tile as one TMA load completing on the stage's
// mbarrier (previous states in another dtype than the compute type are converted by all
// threads instead). Each step waits for its own wgmma: keeping wgmma batches in flight across
// these loops made ptxas serialize every wgmma of the kernel (C7515), so latency is hidden by
// several CTAs per SM instead (small register and shared-memory footprint; see the launch
// bounds).
//
// Rows past a chunk's last token: the TMA loads read zeros past the end of a row (batched
// layout); in the varlen layout they read the next sequence's tokens, which only meet exact
// zeros of the masked S and rows of the output that are not stored.
#include <algorithm>

#include "kernels/chunk_out.cuh"
#include "kernels/kernels.hpp"
#include "kernels/state_tile.cuh"
#include "kernels/tensor_map.hpp"
#include "kernels/tma.cuh"

namespace mamba2_ssd::kernels {

namespace {

using namespace cute;
using namespace chunk_out;
using state_tile::cp_async_4;

// The TMA loads of one tile, their coordinates innermost first (see launch_compute_out).
struct TileMaps {
  CUtensorMap C, B;    // (n, token, group, row), box 64 x 64
  CUtensorMap x;       // (p, token, head, row), box 64 x 64 (two loads for headdim 128)
  CUtensorMap states;  // (n, p, head, chunk, row), box 64 x P; when in the compute type
  CUtensorMap init;    // (n, p, head, walk), box 64 x P; when in the compute type
};

constexpr int kMaxStages = 4;

// Shared-memory plan: [C_m: nk slices][`stages` stages][masked CB: 64 x 64 fp32][cum: HB x Q]
// [dt', then log2 dt': HB x Q][D: HB x P][seq_idx: Q][mbarriers: C_m, then one per stage];
// tiles 1024-aligned.
template <class T, int P, int HB>
__host__ __device__ constexpr int smem_bytes(int nk, int q, int stages) {
  return 1024 + nk * Traits<T, P>::kSliceBytes + stages * Traits<T, P>::kStageBytes + kM * kN * 4 +
         (2 * HB + 1) * q * 4 + HB * P * 4 + 8 + 8 * (1 + kMaxStages);
}

// Rarely used path kept out of line so the main loop stays small (instruction cache): a
// previous state in another dtype than the compute type (fp32 chunk states or initial states),
// converted into the stage by all threads. Thread v = tid + 128 * it writes the 16-byte vector
// at (row v / 8, column 8 * (v % 8)); its offset advances by 2048 bytes per iteration in this
// layout (tests/cpp/test_tile_layouts.cu).
template <class T, int P>
__device__ __noinline__ void load_h_convert(char* stage, const char* hbase, DType dtype, int64_t sp, int ks,
                                            int dstate) {
  const int tid = threadIdx.x;
  const int r_k = tid / 8, c_k = (tid % 8) * 8;
  Tensor sH = make_tensor(make_smem_ptr(reinterpret_cast<T*>(stage)), typename Traits<T, P>::LayoutH{});
  const uint32_t off_k = static_cast<uint32_t>(reinterpret_cast<char*>(&sH(r_k, c_k)) - stage);
#pragma unroll 1
  for (int it = 0; it < P / 16; ++it) {
    const int r = r_k + 16 * it;
    const int n = ks * kN + c_k;
    uint4 raw;
    T* vals = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int e = 0; e < 8; ++e) vals[e] = from_float<T>(n + e < dstate ? load_any(hbase, dtype, r * sp + n + e) : 0.0f);
    *reinterpret_cast<uint4*>(stage + off_k + it * 2048) = raw;
  }
}

constexpr int kMinStages = 2;  // the stage in use and at least one being filled

template <class T, int P, int HB>
__global__ void __launch_bounds__(kThreads, (P == 64 && HB <= 2) ? 3 : 2)
    compute_out_kernel(const SsdParams p, const int stages, const __grid_constant__ TileMaps maps) {
  using Tr = Traits<T, P>;
  extern __shared__ __align__(1024) char smem_raw[];
  // 1024-byte alignment by pointer arithmetic (keeps the shared address space visible).
  char* smem = smem_raw + ((1024u - (static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) & 1023u)) & 1023u);

  // ---- which tile: (chunk, row, 64-token block m, group, slice of HB heads of the group), the
  // chunk slowest: CTAs start in chunk order, behind fwd_pass_state's walks.
  // (32-bit arithmetic: the launch checks that the grid fits; 64-bit division is a long
  // subroutine call.)
  const uint32_t mb = static_cast<uint32_t>(p.chunk / kM);
  const uint32_t slices = static_cast<uint32_t>((p.heads_per_group + HB - 1) / HB);
  uint32_t idx = blockIdx.x;
  const int64_t hs = idx % slices; idx /= slices;
  const int64_t grp = idx % static_cast<uint32_t>(p.ngroups); idx /= static_cast<uint32_t>(p.ngroups);
  const int m = static_cast<int>(idx % mb); idx /= mb;
  const int64_t row = idx % static_cast<uint32_t>(p.batch);
  const int64_t g = idx / static_cast<uint32_t>(p.batch);
  // The last chunk's CTAs (started last) end only after fwd_pass_state has completed, so that
  // work after this kernel in the stream may read the states and final states.
  if (g == p.nchunks - 1) pdl_wait_primary();
  const ChunkInfo ci = chunk_info(p, row, g);
  if (ci.count <= m * kM) return;
  const int64_t h0 = grp * p.heads_per_group + hs * HB;
  const int nh = static_cast<int>(min<int64_t>(HB, (grp + 1) * p.heads_per_group - h0));

  const int tid = threadIdx.x;
  const int q = p.chunk;
  const int nk = (p.dstate + kN - 1) / kN;
  const int32_t* seq_row = p.seq_idx != nullptr ? p.seq_idx + ci.row * p.seq_sb : nullptr;

  char* s_c = smem;
  char* s_stages = s_c + nk * Tr::kSliceBytes;
  float* s_cbm = reinterpret_cast<float*>(s_stages + stages * Tr::kStageBytes);  // [64 x 64]
  float* s_cum = s_cbm + kM * kN;                                                  // [HB][q]
  float* s_dtp = s_cum + HB * q;                                                   // [HB][q]
  float* s_d = s_dtp + HB * q;                                                     // [HB][P]
  int32_t* s_seq = reinterpret_cast<int32_t*>(s_d + HB * P);                       // [q]
  uint64_t* s_bar = reinterpret_cast<uint64_t*>((reinterpret_cast<uintptr_t>(s_seq + q) + 7) & ~uintptr_t{7});
  uint64_t* bar_c = s_bar;       // C_m
  uint64_t* bar_stage = s_bar + 1;  // [stages]
  if (tid == 0) {
    for (int b = 0; b < 1 + stages; ++b) tma::mbar_init(s_bar + b, 1);  // thread 0 arrives once per phase
    tma::fence_mbar_init();
  }
  __syncthreads();
  // TMA coordinates (element indices, innermost first) of the chunk's first token.
  const int row32 = static_cast<int>(ci.row), tok32 = static_cast<int>(ci.tok0), grp32 = static_cast<int>(grp);


  // ---- prologue: C_m (all dstate slices, TMA), then cum / dt' of the heads and seq_idx (one
  // cp.async group)
  if (tid == 0) {
    tma::mbar_arrive_expect(bar_c, nk * Tr::kSliceBytes);
#pragma unroll 1
    for (int ks = 0; ks < nk; ++ks) {
      tma::load_4d(&maps.C, bar_c, s_c + ks * Tr::kSliceBytes, ks * kN, tok32 + m * kM, grp32, row32);
    }
  }
#pragma unroll 1
  for (int v = tid; v < nh * q / 4; v += kThreads) {
    const int hh = v / (q / 4), u = v % (q / 4);
    const int64_t off = cum_offset(p, ci.row, h0 + hh, g) + 4 * u;
    cp_async_16(s_cum + hh * q + 4 * u, p.cum + off, true);
    cp_async_16(s_dtp + hh * q + 4 * u, p.dtp + off, true);
  }
  if (seq_row != nullptr) {
#pragma unroll 1
    for (int t = tid; t < q; t += kThreads) {
      const bool ok = t < ci.count;
      cp_async_4(s_seq + t, ok ? seq_row + (ci.tok0 + t) * p.seq_st : seq_row, ok);
    }
  }
  cp_async_commit();
  if (p.D != nullptr) {
#pragma unroll 1
    for (int v = tid; v < nh * P; v += kThreads) {
      const int hh = v / P, c = v % P;
      s_d[v] = p.D[(h0 + hh) * p.D_sh + c * p.D_sp];
    }
  }

  // ---- the state entering this chunk: wait until fwd_pass_state has stored it (every tile of
  // every head of the slice), while the loads above are in flight.
  if (ci.local > 0 && p.ready != nullptr) {
    if (tid < nh * p.ready_tiles) {
      // The counter of the segment that walks chunk local - 1 (SsdParams::nseg).
      const int seg = p.nseg > 1 ? static_cast<int>((ci.local - 1) / p.seg_chunks) : 0;
      const int32_t* f =
          p.ready + ((ci.walk * p.nheads + h0 + tid / p.ready_tiles) * p.nseg + seg) * p.ready_tiles + tid % p.ready_tiles;
      while (load_acquire(f) < ci.local) __nanosleep(200);
    }
    __syncthreads();
  }
  // (same place for every head, offset by the head)
  const char* prev_base = nullptr;
  DType prev_dtype = DType::kFloat32;
  int64_t prev_sp = 0, prev_sh = 0;
  if (ci.local > 0) {
    prev_base = static_cast<const char*>(p.states) + (ci.row * p.st_sb + (g - 1) * p.st_sc) * dtype_size_dev(p.state_dtype);
    prev_dtype = p.state_dtype;
    prev_sp = p.st_sp;
    prev_sh = p.st_sh;
  } else if (p.init != nullptr) {
    prev_base = static_cast<const char*>(p.init) + ci.walk * p.init_sb * dtype_size_dev(p.init_dtype);
    prev_dtype = p.init_dtype;
    prev_sp = p.init_sp;
    prev_sh = p.init_sh;
  }
  const bool has_prev = prev_base != nullptr;
  const bool prev_native = prev_dtype == (p.fp16 ? DType::kFloat16 : DType::kBFloat16);
  const int prev_esz = dtype_size_dev(prev_dtype);

  // ---- producer: a cursor over the steps [H_h slices for each head] then for j = 0..m
  // [B_j slices][X_hj for each head]. Thread 0 issues the TMA loads of a step onto the stage's
  // mbarrier; a previous state in another dtype is converted by all threads (plain stores,
  // made visible to wgmma by the fence and barrier at the start of every step) and thread 0
  // only arrives. Every thread runs the cursor (a few integer operations per step).
  enum : int { kPhaseH = 0, kPhaseB = 1, kPhaseX = 2, kPhaseDone = 3 };
  int ph = has_prev ? kPhaseH : kPhaseB, cur_h = 0, cur_ks = 0, cur_j = 0, fill = 0;  // fill: next stage
  const bool h_from_states = ci.local > 0;
  const int walk32 = static_cast<int>(ci.walk), prev_chunk32 = static_cast<int>(g - 1);
  const int h32 = static_cast<int>(h0);
  auto issue_next = [&]() {
    if (ph == kPhaseDone) return;
    char* stage = s_stages + fill * Tr::kStageBytes;
    uint64_t* bar = bar_stage + fill;
    fill = fill + 1 == stages ? 0 : fill + 1;
    if (ph == kPhaseH) {
      if (prev_native) {
        if (tid == 0) {
          tma::mbar_arrive_expect(bar, Tr::kStageBytes);
          if (h_from_states) tma::load_5d(&maps.states, bar, stage, cur_ks * kN, 0, h32 + cur_h, prev_chunk32, row32);
          else tma::load_4d(&maps.init, bar, stage, cur_ks * kN, 0, h32 + cur_h, walk32);
        }
      } else {
        load_h_convert<T, P>(stage, prev_base + (h0 + cur_h) * prev_sh * prev_esz, prev_dtype, prev_sp, cur_ks,
                             p.dstate);
        if (tid == 0) tma::mbar_arrive_expect(bar, 0);
      }
      if (++cur_ks == nk) {
        cur_ks = 0;
        if (++cur_h == nh) { cur_h = 0; ph = kPhaseB; }
      }
    } else if (ph == kPhaseB) {
      if (tid == 0) {
        tma::mbar_arrive_expect(bar, kN * kN * 2);
        tma::load_4d(&maps.B, bar, stage, cur_ks * kN, tok32 + cur_j * kN, grp32, row32);
      }
      if (++cur_ks == nk) { cur_ks = 0; ph = kPhaseX; }
    } else {
      if (tid == 0) {
        tma::mbar_arrive_expect(bar, P * kN * 2);
#pragma unroll
        for (int half = 0; half < P / 64; ++half) {
          tma::load_4d(&maps.x, bar, stage + half * 64 * kN * 2, half * 64, tok32 + cur_j * kN, h32 + cur_h, row32);
        }
      }
      if (++cur_h == nh) {
        cur_h = 0;
        ph = ++cur_j > m ? kPhaseDone : kPhaseB;
      }
    }
  };
  // The chunk states were stored by fwd_pass_state's generic stores and acquired above; order
  // that before the TMA reads of them.
  if (tid == 0) tma::fence_proxy_async_global();
#pragma unroll 1
  for (int s = 0; s < stages - 1; ++s) issue_next();

  // ---- per-thread rows and their sequence bounds (after the prologue group landed)
  cp_async_wait<0>();
  __syncthreads();
  tma::mbar_wait(bar_c, 0);
  // log2(dt') per slot (see the S step).
#pragma unroll 1
  for (int v = tid; v < nh * q; v += kThreads) s_dtp[v] = fast_log2(s_dtp[v]);
  const int ra = acc_row(0), rb = acc_row(2);                  // rows within the block
  const int t0 = m * kM + ra, t1 = m * kM + rb;                // rows within the chunk
  RowSequences rs;  // first token of each row's sequence; whether the row sees the entering state
  if (seq_row != nullptr) {
    rs = row_sequences(s_seq, ci.count, t0, t1, ci.local > 0 ? seq_row[(ci.tok0 - 1) * p.seq_st] : 0);
  }
  const int lo0 = rs.lo0, lo1 = rs.lo1;
  const bool sees0 = rs.sees0, sees1 = rs.sees1;

  typename Tr::MmaCB mma_cb;
  typename Tr::MmaCH mma_ch;
  typename Tr::MmaSX mma_sx;
  auto thr_cb = mma_cb.get_slice(tid);
  auto thr_ch = mma_ch.get_slice(tid);
  auto thr_sx = mma_sx.get_slice(tid);

  Tensor cb = partition_fragment_C(mma_cb, Shape<Int<kM>, Int<kN>>{});   // (64 x 64) fp32
  using AccFrag = decltype(partition_fragment_C(mma_ch, Shape<Int<kM>, Int<P>>{}));
  AccFrag acc[HB];                                                        // (64 x P) fp32 per head
  using SFrag = decltype(make_tensor<T>(partition_shape_A(mma_sx, Shape<Int<kM>, Int<kN>>{})));
  SFrag sfrag;                                                            // S: the A operand
  static_assert(decltype(size(sfrag))::value == kM * kN / kThreads, "S fragment size");
  static_assert(decltype(size(cb))::value == kM * kN / kThreads, "CB fragment size");
  constexpr int kCbVals = kM * kN / kThreads;
  // Masked CB of block j in shared memory, in fragment order: float4 (v/4, thread). Each thread
  // reads back only what it wrote, so no barrier is needed.
  float4* cbm4 = reinterpret_cast<float4*>(s_cbm);
  constexpr int kAccVals = decltype(size(acc[0]))::value;
  const int lane = tid % 32;

  // One pipeline step: wait for its tiles (and make converted ones visible to the async proxy)
  // and for every thread to be done with step i - 1; the step issues its wgmma, then refills the
  // stage of step i - 1 (issue_next; thread 0's TMA issue then runs under the wgmma instead of
  // delaying the warpgroup's wgmma), then waits for its wgmma.
  int use = 0;  // the stage of the current step
  uint32_t parity = 0;  // bit s: the phase of stage s to wait for
  auto step_begin = [&]() -> char* {
    tma::mbar_wait(bar_stage + use, (parity >> use) & 1u);
    parity ^= 1u << use;
    fence_async_shared();
    __syncthreads();
    char* st = s_stages + use * Tr::kStageBytes;
    use = use + 1 == stages ? 0 : use + 1;
    return st;
  };

  // ---- acc_h = C_m H_prev(h)^T
  if (has_prev) {
#pragma unroll
    for (int h = 0; h < HB; ++h) {
      if (h < nh) {
#pragma unroll 1
        for (int ks = 0; ks < nk; ++ks) {
          char* stage = step_begin();
          Tensor sC = make_tensor(make_smem_ptr(reinterpret_cast<T*>(s_c + ks * Tr::kSliceBytes)), typename Tr::LayoutC{});
          Tensor sH = make_tensor(make_smem_ptr(reinterpret_cast<T*>(stage)), typename Tr::LayoutH{});
          wgmma_issue(mma_ch, thr_ch.partition_fragment_A(sC), thr_ch.partition_fragment_B(sH), acc[h], ks == 0);
          issue_next();
          warpgroup_wait<0>();
          warpgroup_fence_operand(acc[h]);
        }
      }
    }
  }

#pragma unroll 1
  for (int j = 0; j <= m; ++j) {
    // ---- CB = C_m B_j^T over the dstate slices
#pragma unroll 1
    for (int ks = 0; ks < nk; ++ks) {
      char* stage = step_begin();
      Tensor sC = make_tensor(make_smem_ptr(reinterpret_cast<T*>(s_c + ks * Tr::kSliceBytes)), typename Tr::LayoutC{});
      Tensor sB = make_tensor(make_smem_ptr(reinterpret_cast<T*>(stage)), typename Tr::LayoutB{});
      wgmma_issue(mma_cb, thr_cb.partition_fragment_A(sC), thr_cb.partition_fragment_B(sB), cb, ks == 0);
      issue_next();
      warpgroup_wait<0>();
      warpgroup_fence_operand(cb);
    }

    // ---- per head: S from CB, acc_h += S X_hj
#pragma unroll
    for (int h = 0; h < HB; ++h) {
      if (h < nh) {
        char* stage = step_begin();
        const float* cum_h = s_cum + h * q;
        const float ct0 = cum_h[t0], ct1 = cum_h[t1];
        if (h == 0) {
          // The mask lo_t <= s <= t is the same for every head: applied once, into shared
          // memory (registers stay free for the heads' accumulators).
          const int hi0 = t0 - j * kN, hi1 = t1 - j * kN;   // keep c <= hi
          const int lw0 = lo0 - j * kN, lw1 = lo1 - j * kN;  // keep c >= lw
#pragma unroll
          for (int v = 0; v < kCbVals; v += 4) {
            float4 q4;
            float* qv = reinterpret_cast<float*>(&q4);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int c = acc_col(v + e);
              const bool hi = ((v + e) >> 1) & 1;
              qv[e] = (c <= (hi ? hi1 : hi0) && c >= (hi ? lw1 : lw0)) ? cb(v + e) : 0.0f;
            }
            cbm4[(v / 4) * kThreads + tid] = q4;
          }
          if (j == 0 && has_prev) {
#pragma unroll
            for (int hh = 0; hh < HB; ++hh) {
              if (hh < nh) {
                warpgroup_fence_operand(acc[hh]);
                {
                  // Decay from the chunk start to each token (not clamped at 1: A > 0 grows the
                  // state, as in mamba_ssm); other sequences see no state.
                  const float* cum_hh = s_cum + hh * q;
                  const float f0 = sees0 ? fast_exp2(cum_hh[t0]) : 0.0f;
                  const float f1 = sees1 ? fast_exp2(cum_hh[t1]) : 0.0f;
#pragma unroll
                  for (int v = 0; v < kAccVals; ++v) acc[hh](v) *= ((v >> 1) & 1) ? f1 : f0;
                }
                warpgroup_fence_operand(acc[hh]);
              }
            }
          }
        }
        // S = CB * exp2(min(cum_t - cum_s, 0)) * dt'_s where lo_t <= s <= t, else 0; rounded to T.
        // With l_s = log2(dt'_s) (prologue) the factor is exp2(min(cum_t - cum_s, 0) + l_s): the
        // difference of the two running sums first (exact when they are close, which keeps the
        // large-dt case accurate), then the log of dt' (0 gives -inf and a zero factor).
        // The fragment orders of a 64x64 fp32 accumulator and of a 64x64 16-bit A operand
        // coincide element for element (wgmma C and A register layouts), so v maps to v.
        // Thread columns: 8k + 2 (lane % 4) + e; rows ra (v bit 1 clear) and rb (set).
        // The clamp keeps every factor finite, so masked entries (cbm = 0) stay 0.
        SFrag& sf = sfrag;
        const float* c_j = cum_h + j * kN;
        const float* l_j = s_dtp + h * q + j * kN;
#pragma unroll
        for (int k = 0; k < kN / 8; ++k) {
          const int c = 8 * k + 2 * (lane % 4);
          const float2 cs = *reinterpret_cast<const float2*>(c_j + c);
          const float2 ls = *reinterpret_cast<const float2*>(l_j + c);
          const float4 q4 = cbm4[k * kThreads + tid];  // values v = 4k .. 4k + 3
          const float qv[4] = {q4.x, q4.y, q4.z, q4.w};
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const float ct = r ? ct1 : ct0;
            const int v = 4 * k + 2 * r;
            sf(v) = from_float<T>(qv[2 * r] * fast_exp2(fminf(ct - cs.x, 0.0f) + ls.x));
            sf(v + 1) = from_float<T>(qv[2 * r + 1] * fast_exp2(fminf(ct - cs.y, 0.0f) + ls.y));
          }
        }
        Tensor sX = make_tensor(make_smem_ptr(reinterpret_cast<T*>(stage)), typename Tr::LayoutX{});
        warpgroup_fence_operand(sf);
        // Without a previous state, the first block starts the accumulator.
        wgmma_issue(mma_sx, sf, thr_sx.partition_fragment_B(sX), acc[h], j == 0 && !has_prev);
        issue_next();
        warpgroup_wait<0>();
        warpgroup_fence_operand(acc[h]);
      }
    }
  }
  // ---- epilogue, per head: out = (acc + D x) * silu(z). Each warp stages its 16 rows of the
  // accumulator, 64 columns at a time, in the (now free) masked-CB buffer as fp32, then reads
  // them back four consecutive columns per lane (a row is 16 lanes), so x, z and out move as
  // 8- or 16-byte vectors along the row. x comes from X_hm in the ring when its stage was not
  // refilled (16-bit inputs: the tiles of the last `stages` steps stay), else from global
  // memory. One copy of this code serves every head (the staging picks the head's registers):
  // the epilogue used to be unrolled per head, column and dtype, and its size made the kernel
  // stall on instruction fetch.
  __syncthreads();  // every warp is done reading the masked CB
  // X_hm stays in the ring when its stage was not refilled (the tiles of the last `stages` steps;
  // `use` is the stage after the last step, X_hm of head h was the step nh - h before it).
  auto x_tile = [&](int h) { return s_stages + ((use - nh + h + 4 * stages) % stages) * Tr::kStageBytes; };
  auto x_in_smem = [&](int h) { return nh - h <= stages; };
  epilogue_heads<T, P, HB>(p, acc, s_cbm, s_d, x_tile, x_in_smem, ci, m, h0, nh);
}

// The shared memory and registers of one SM.
struct SmBudget {
  int smem = 0, regs = 0;
};

// Ring depth: the deepest of 4, 3, 2 stages that still fits the most CTAs on an SM (by shared
// memory and registers; cta_regs: one CTA's), so that large dstates (C_m resident: 64 KB at
// dstate 512) do not drop to one CTA per SM. With a fwd_pass_state CTA beside it on the SMs, the
// deepest ring that fits the most CTAs next to it (anchor dstate 256: 2 stages fit three CTAs
// alone but two beside the walk, where 3 stages also fit two and ran 7% faster).
template <class T, int P, int HB>
int pick_stages(int nk, int q, const SmBudget& sm, int cta_regs, const CtaFootprint& beside) {
  auto deepest = [&](int from, int smem, int regs, int* ctas_out) {
    int best = from, best_ctas = 0;
    for (int st = from; st >= kMinStages; --st) {
      const int ctas = std::min(regs / cta_regs, smem / (smem_bytes<T, P, HB>(nk, q, st) + 1024));
      if (ctas > best_ctas) { best = st; best_ctas = ctas; }
    }
    *ctas_out = best_ctas;
    return best;
  };
  int ctas = 0;
  const int alone = deepest(kMaxStages, sm.smem, sm.regs, &ctas);
  if (beside.smem == 0) return alone;
  // Beside the walk: no deeper than alone, but from 3 stages down even where alone took 2 (2
  // stages only paid where they let a third CTA fit, and the walk beside it may take that room:
  // anchor dstate 256 at 64K, 1.25 -> 1.16 ms with 3); 2 only if it still fits more CTAs.
  const int next_to = deepest(std::max(alone, 3), sm.smem - beside.smem, sm.regs - beside.regs, &ctas);
  return ctas > 0 ? next_to : alone;
}

template <class T, int P, int HB>
void launch_typed(const SsdParams& p, int stages, const CtaFootprint& beside, const TileMaps& maps,
                  cudaStream_t stream) {
  const int nk = (p.dstate + kN - 1) / kN;
  auto kernel = compute_out_kernel<T, P, HB>;
  if (stages == 0) {
    static SmBudget sm;       // the device's (the same on every Hopper)
    static int cta_regs = 0;  // per instantiation
    if (sm.smem == 0) {
      int dev = 0;
      check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
      check_cuda(cudaDeviceGetAttribute(&sm.smem, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev),
                 "cudaDeviceGetAttribute(shared memory per SM)");
      check_cuda(cudaDeviceGetAttribute(&sm.regs, cudaDevAttrMaxRegistersPerMultiprocessor, dev),
                 "cudaDeviceGetAttribute(registers per SM)");
    }
    if (cta_regs == 0) {
      cudaFuncAttributes a{};
      check_cuda(cudaFuncGetAttributes(&a, kernel), "cudaFuncGetAttributes(compute_out)");
      cta_regs = (a.numRegs + 7) / 8 * 8 * kThreads;
    }
    stages = pick_stages<T, P, HB>(nk, p.chunk, sm, cta_regs, beside);
  }
  stages = std::max(kMinStages, std::min(kMaxStages, stages));
  const int smem = smem_bytes<T, P, HB>(nk, p.chunk, stages);
  raise_smem_limit(reinterpret_cast<const void*>(kernel), smem, false, "cudaFuncSetAttribute(compute_out)");
  const int64_t slices = (p.heads_per_group + HB - 1) / HB;
  const int64_t blocks = p.batch * p.nchunks * (p.chunk / kM) * p.ngroups * slices;
  if (blocks == 0) return;
  if (blocks > 0x7fffffffLL) {
    throw_launch_error("compute_out: too many chunks for one launch (grid would be " + std::to_string(blocks) +
                       " blocks)");
  }
  // Starts while fwd_pass_state still runs (see kernels.hpp); without the progress counters, or
  // where the driver refuses the early start, after it (the counters are then complete, so it
  // never waits on them).
  launch_kernel(kernel, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), smem, stream, p.ready != nullptr, 1,
                "launch compute_out", p, stages, maps);
}

template <class T, int P>
void launch_heads(const SsdParams& p, int hb, const ComputeOutConfig& cfg, const TileMaps& maps,
                  cudaStream_t stream) {
  if constexpr (P == 64) {
    if (hb >= 4) return launch_typed<T, P, 4>(p, cfg.stages, cfg.beside, maps, stream);
  }
  if (hb >= 2) return launch_typed<T, P, 2>(p, cfg.stages, cfg.beside, maps, stream);
  launch_typed<T, P, 1>(p, cfg.stages, cfg.beside, maps, stream);
}

// The TMA maps of one call (host only; the kernel receives them by value as a grid constant).
TileMaps make_tile_maps(const SsdParams& p) {
  TileMaps maps{};
  const DType compute = p.fp16 ? DType::kFloat16 : DType::kBFloat16;
  const ChunkInputMaps in = make_chunk_input_maps(p, "compute_out");
  maps.C = in.C;
  maps.B = in.B;
  maps.x = in.x;
  const uint32_t box_h[5] = {64, static_cast<uint32_t>(p.headdim), 1, 1, 1};
  if (p.states != nullptr && p.state_dtype == compute) {
    const int64_t dims[5] = {p.dstate, p.headdim, p.nheads, p.nchunks, p.batch};
    const int64_t strides[4] = {2 * p.st_sp, 2 * p.st_sh, 2 * p.st_sc, 2 * p.st_sb};
    maps.states = make_tile_map_16bit(p.states, 5, dims, strides, box_h, "compute_out chunk states");
  }
  if (p.init != nullptr && p.init_dtype == compute) {
    const int64_t dims[4] = {p.dstate, p.headdim, p.nheads, p.varlen ? p.nseq : p.batch};
    const int64_t strides[3] = {2 * p.init_sp, 2 * p.init_sh, 2 * p.init_sb};
    maps.init = make_tile_map_16bit(p.init, 4, dims, strides, box_h, "compute_out initial_states");
  }
  return maps;
}

}  // namespace

int compute_out_max_heads_per_cta(int headdim) { return headdim <= 64 ? 4 : 2; }

void launch_compute_out(const SsdParams& p, const ComputeOutConfig& cfg, cudaStream_t stream) {
  const int hb = std::max(1, std::min(cfg.heads_per_cta, p.heads_per_group));
  if (p.batch * p.nchunks == 0 || p.nheads == 0) return;
  if (p.nseg > 1 && p.seg0_chunks != p.seg_chunks) {
    throw_launch_error("compute_out: walk segments of one length, got " + std::to_string(p.seg0_chunks) +
                       " chunks in the first and " + std::to_string(p.seg_chunks) + " in the others");
  }
  const TileMaps maps = make_tile_maps(p);
  if (p.headdim == 64) {
    if (p.fp16) launch_heads<cutlass::half_t, 64>(p, hb, cfg, maps, stream);
    else launch_heads<cutlass::bfloat16_t, 64>(p, hb, cfg, maps, stream);
  } else {
    if (p.fp16) launch_heads<cutlass::half_t, 128>(p, hb, cfg, maps, stream);
    else launch_heads<cutlass::bfloat16_t, 128>(p, hb, cfg, maps, stream);
  }
}

}  // namespace mamba2_ssd::kernels
