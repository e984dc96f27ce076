// fused_walk: the state walk and every chunk's output in one kernel; the chunk states stay on chip.
// (At dstate <= 512, batched, without seq_idx or z: the warp-specialised kernel of fused_walk_ws.cu,
// above dstate 128 in walk segments of 4 chunks or more.)
//
// One CTA per (walk, head, walk segment) walks the segment's chunks in order, with the head's
// whole 64 x N state (headdim 64) as wgmma accumulators in registers (fp32): one warpgroup holds
// it for dstate N <= 128; for N <= 256 two warpgroups hold 128 columns each (see `Fused`); for
// N <= 512 two CTAs of a cluster hold 256 columns each and add their outputs (see kPartialBytes).
// For every chunk:
//   H_s = H rounded to T, in shared memory (the B operand of C H^T);  then H *= carry
//   for every 64-token block m of the chunk (t: its tokens):
//     acc  = (C_m H_s^T) * exp2(cum_t)                    (0 for tokens of another sequence)
//     acc += S_mj X_j  for j <= m,  S_mj = C_m B_j^T * exp2(cum_t - e_s), masked,
//            e_s = cum_s - log2(dt'_s) (per chunk, in place of dt': the decay and dt' in one
//            exponential; s <= t gives cum_t <= cum_s, 0 <= s < 64 on the diagonal block)
//     out_m = (acc + D x) * silu(z)        (chunk_out::epilogue_tma_store or epilogue_heads)
//     H   += (X_m * w)^T B_m                              (x scaled per token in registers)
// In chunks of 128 without seq_idx and with A <= 0, most variants take block 1 from the state at
// the middle of the chunk instead (H_s rewritten after block 0's update; see `mid`): no C_1 B_0^T
// and S_10 X_0.
// That is compute_out's output and fwd_pass_state's update for one head (see there for the
// mask and the weights), without the chunk states' round trip through global memory (one store
// and one load of every state) and without two kernels competing for the SMs.
// A chunk's tiles (C, B and x of each block by TMA; its cum, dt' and w by bulk copies) fill one
// buffer, refilled with the next chunk's once the chunk is done: the shared memory of a CTA is
// kept small enough for two CTAs per SM (three at dstate 64, see kCtas), whose loads and steps
// overlap: every step of the chain waits for its wgmma, and one CTA per SM with a double buffer
// made the anchor's long calls 1.4x slower (docs/PERFORMANCE.md, v12). Above dstate 128 the
// chunk's tiles take 145 KB: one CTA per SM, its two warpgroups (blocks 0 and 1 of a 128-token
// chunk) overlapping each other instead; at dstate 65-128 the same where a call's CTAs fit one per
// SM anyway (kWGs).
// (Running the two warpgroups' epilogues after the next chunk's loads were issued, x then read
// from global memory, made dstate 256 and 512 20-30% slower: v17.)
// Parallelism is walks x heads x segments. Segments work as in fwd_pass_state: its sum-only
// launch (64- or 128-column tiles, stored as 64) runs first, and segment k starts from the
// combined sums.
#include "kernels/chunk_out.cuh"
#include "kernels/fused_walk_parts.cuh"
#include "kernels/kernels.hpp"
#include "kernels/state_tile.cuh"
#include "kernels/tensor_map.hpp"
#include "kernels/tma.cuh"
#include "mamba2_ssd/error.hpp"

namespace mamba2_ssd::kernels {

namespace {

using namespace cute;
using namespace chunk_out;
using namespace fused_walk_parts;
namespace st = state_tile;

// Above dstate 256 two CTAs of a cluster (ranks) share a head's walk: rank r holds state columns
// 256 r .. 256 r + 255 as `Fused<T, 4>` holds 0..255, and its C, B and H_s are those columns only.
// The output is linear in them (C H^T, and S = C B^T before the decay: sums over dstate), so each
// rank's warpgroup w computes block w's output over its columns and the two halves are added:
// block m is finished (with D x and z) by rank m, whose warpgroup m adds the partial that the
// other rank's warpgroup m stores into its shared memory (16 KB of fp32, fragment order).
constexpr int kPartialBytes = kM * 64 * 4;

// The epilogue's fp32 staging (64 x 64, 16 KB): in C_m's tile once block m is done with it where
// that is as large (NK >= 2; only the warpgroup of block m reads C_m), else its own.
template <int NK>
constexpr int staging_bytes() { return NK >= 2 ? 0 : kM * kN * 4; }

// Shared memory: [chunk buffer][H_s: NK slices][y staging][D: 64][seq_idx: q][mbarriers: q / 64,
// two ranks: + 2][two ranks: the other rank's partial output], after up to 1 KB of alignment.
template <class T, int NK, int kRanks, int kCtas, int kWGs>
constexpr int fused_smem_bytes(int q) {
  using F = Fused<T, NK, kWGs>;
  return 1024 + buffer_bytes<kWGs, kCtas>(F::kBlockBytes, q) + NK * F::kSlice + staging_bytes<NK>() + 64 * 4 +
         q * 4 + 8 + (q / kM + (kRanks > 1 ? 2 : 0)) * 8 + (kRanks > 1 ? 16 + kPartialBytes : 0);
}
// (228 KB of shared memory per SM, 1 KB of it reserved per CTA)
static_assert(3 * (fused_smem_bytes<cutlass::bfloat16_t, 1, 1, 3, 1>(128) + 1024) <= 228 * 1024,
              "three CTAs of dstate 64 per SM");

// kRanks: the CTAs (of one cluster) per head walk, 1 or 2 (NK = 4 only).
template <class T, int NK, int kRanks, int kCtas, int kWGs>
__global__ void __launch_bounds__(Fused<T, NK, kWGs>::kThreadsAll, kCtas)
    fused_walk_kernel(const SsdParams p, const __grid_constant__ ChunkInputMaps maps,
                      const __grid_constant__ CUtensorMap out_map, const bool out_tma) {
  using F = Fused<T, NK, kWGs>;
  using Tr = typename F::Tr;
  extern __shared__ __align__(1024) char smem_raw[];
  char* smem = smem_raw + ((1024u - (static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) & 1023u)) & 1023u);
  const int tid = threadIdx.x, lane = tid % 32;
  constexpr int kWG = F::kWarpgroups;
  const int wg = kWG == 1 ? 0 : tid / kThreads, wtid = kWG == 1 ? tid : tid % kThreads;  // warpgroup, thread
  static_assert(kRanks == 1 || NK == 4, "two ranks: two warpgroups each");
  // The CTA's rank and first state column, and the warpgroup's first column. (Read where used:
  // kept in registers across the chunk loop, they made the kernel spill.)
  auto rank_now = [&]() { return kRanks == 1 ? 0 : static_cast<int>(tma::cluster_rank()); };
  auto n_base = [&]() { return rank_now() * NK * kN; };
  auto n_own = [&]() { return n_base() + wg * F::kN_state; };
  // (two warpgroups take chunks of 128 only; as a constant, the shared-memory offsets that depend on it
  // take no registers: with two warpgroups the uniform registers spilled)
  const int q = kWG == 2 ? 128 : p.chunk, nb = q / kM;
  const int64_t h = blockIdx.y;
  const int seg = fused_segment(p, blockIdx.z);
  const Walk walk = make_walk(p, blockIdx.z / p.nseg);
  const int64_t grp = h / p.heads_per_group;
  // A > 0 (cum grows within a chunk): mamba_ssm clamps the decay between two tokens of a chunk,
  // exp(min(cum_t - cum_s, 0)), at 1 in S and in the state weights, which are then dt'_s: both
  // are computed with cum taken as 0 (A <= 0, every model: cum_t <= cum_s for s <= t, nothing to
  // clamp). The state's decay exp2(cum_t) is not clamped.
  const bool a_grows = p.A[h * p.A_s] > 0.0f;
  const SegmentRange range = segment_range(p, seg, walk.nchunks);
  const int64_t c_begin = range.begin, c_end = range.end;
  if (seg > 0 && c_begin >= walk.nchunks) return;  // a short sequence's empty segment (varlen)
  const int n_local = static_cast<int>(c_end - c_begin);

  char* s_buf = smem;                                              // the chunk buffer
  char* s_h = smem + buffer_bytes<kWG, kCtas>(F::kBlockBytes, q);   // H_s: NK slices (p, n)
  float* s_y_own = reinterpret_cast<float*>(s_h + NK * F::kSlice);  // staging (NK = 1)
  float* s_d = s_y_own + staging_bytes<NK>() / 4;                  // [64]
  int32_t* s_seq = reinterpret_cast<int32_t*>(s_d + 64);          // [q]
  uint64_t* bars = reinterpret_cast<uint64_t*>((reinterpret_cast<uintptr_t>(s_seq + q) + 7) & ~uintptr_t{7});
  // Two ranks: the partial from the other rank and its mbarriers: `full` (its 16 KB stored: one
  // arrival with their count, by the receiving warpgroup) and `free` (the partial this rank sent
  // has been read there: 128 arrivals).
  uint64_t* bar_full = bars + nb;
  uint64_t* bar_free = bars + nb + 1;
  float* s_partial = reinterpret_cast<float*>(bars + nb + 2);  // (bars: 256-byte aligned; nb: 2)
  if (tid == 0) {
    for (int b = 0; b < nb; ++b) tma::mbar_init(bars + b, 1);  // one per block
    if constexpr (kRanks > 1) {
      tma::mbar_init(bar_full, 1);
      tma::mbar_init(bar_free, kThreads);
    }
    tma::fence_mbar_init();
  }
  if (p.D != nullptr && tid < 64) s_d[tid] = p.D[h * p.D_sh + tid * p.D_sp];
  if constexpr (kRanks > 1) tma::cluster_sync();  // (the other rank's mbarriers are initialised)
  else __syncthreads();
  // Launched early (programmatic dependent launch) behind the segment sums or chunk_cumsum: what
  // they write (cum, dt', w, carry, the sums) is read from here on.
  pdl_wait_primary();

  // ---- producer (thread 0): chunk c_rel's tiles and weights into the buffer, one mbarrier per
  // block (the weights on block 0's). The weights' slot of chunk c_rel (two warpgroups: by parity):
  auto weights_at = [&](int c_rel) {
    return reinterpret_cast<float*>(s_buf + nb * F::kBlockBytes) +
           (kWG == 2 ? (c_rel & 1) * weight_arrays<kCtas> * q : 0);
  };
  const int row32 = static_cast<int>(walk.row), grp32 = static_cast<int>(grp), h32 = static_cast<int>(h);
  // Blocks m_first .. m_last of chunk c_rel (block 0 with the weights).
  auto issue_chunk = [&](int c_rel, int m_first, int m_last) {
    if (c_rel >= n_local) return;
    const ChunkInfo ci = walk_chunk(p, walk, c_begin + c_rel);
    char* buf = s_buf;
    const int tok = static_cast<int>(ci.tok0);
    const int n0 = n_base();
    for (int m = m_first; m <= m_last; ++m) {
      uint64_t* bar = bars + m;
      char* blk = buf + m * F::kBlockBytes;
      tma::mbar_arrive_expect(bar, F::kBlockBytes + (m == 0 ? weight_arrays<kCtas> * q * 4 : 0));
      auto load_slice = [&](int ks) {
        tma::load_4d(&maps.C, bar, blk + ks * F::kSlice, n0 + ks * kN, tok + m * kM, grp32, row32);
        tma::load_4d(&maps.B, bar, blk + (NK + ks) * F::kSlice, n0 + ks * kN, tok + m * kM, grp32, row32);
      };
      if constexpr (kRanks == 1) {
#pragma unroll
        for (int ks = 0; ks < NK; ++ks) load_slice(ks);
      } else {
#pragma unroll 1  // (unrolled, the column offsets were kept in registers across the chunk loop)
        for (int ks = 0; ks < NK; ++ks) load_slice(ks);
      }
      tma::load_4d(&maps.x, bar, blk + 2 * NK * F::kSlice, 0, tok + m * kM, h32, row32);
      if (m == 0) {
        const int64_t off = cum_offset(p, walk.row, h, walk.g0 + c_begin + c_rel);
        float* meta = weights_at(c_rel);
        tma::load_bulk(meta, p.cum + off, q * 4, bar);
        tma::load_bulk(meta + q, p.dtp + off, q * 4, bar);
        if constexpr (weight_arrays<kCtas> == 3) tma::load_bulk(meta + 2 * q, p.wst + off, q * 4, bar);
      }
    }
  };
  if (tid == 0) issue_chunk(0, 0, nb - 1);

  // ---- the state entering the segment
  typename F::MmaUpd mma_up;
  auto thr_up = mma_up.get_slice(wtid);
  Tensor hacc = partition_fragment_C(mma_up, Shape<_64, Int<F::kN_state>>{});
  static_assert(decltype(size(hacc))::value == F::kAccVals, "state fragment size");
  if (seg == 0 && p.init != nullptr) {
    const void* src = static_cast<const char*>(p.init) +
                      (walk.walk * p.init_sb + h * p.init_sh) * (int64_t)dtype_size_dev(p.init_dtype);
    st::load_tile<kWG>(hacc, src, p.init_dtype, p.init_sp, 0, n_own(), p);
  } else if (seg > 0) {
    // (see state_from_sums)
    const int64_t base = (walk.walk * p.nheads + h) * sums_per_walk_head(p);
    // (Two warpgroups: the second one's last tile is past dstate when dstate <= 192; no sums
    // there, and its columns stay 0.)
    state_from_sums<kWG != 1, kWG == 1 ? 2 : 1>(hacc, p, base, seg * p.sum_split, rank_now() * NK + wg * F::kStateSlices,
                                                wtid);
  } else {
    clear(hacc);
  }

  typename Tr::MmaCB mma_cb;
  typename Tr::MmaCH mma_ch;
  typename Tr::MmaSX mma_sx;
  auto thr_cb = mma_cb.get_slice(wtid);
  auto thr_ch = mma_ch.get_slice(wtid);
  auto thr_sx = mma_sx.get_slice(wtid);
  Tensor cb = partition_fragment_C(mma_cb, Shape<Int<kM>, Int<kN>>{});
  using AccFrag = decltype(partition_fragment_C(mma_ch, Shape<Int<kM>, Int<64>>{}));
  AccFrag acc[1];
  using SFrag = decltype(make_tensor<T>(partition_shape_A(mma_sx, Shape<Int<kM>, Int<kN>>{})));
  SFrag sf;
  constexpr int kCbVals = kM * kN / kThreads;
  const int ra = acc_row<kWG>(0), rb = acc_row<kWG>(2);
  // The update's A operand: X_m^T (p, token) in registers, and the token of each of its values.
  using XFrag = decltype(make_tensor<T>(partition_shape_A(mma_up, Shape<_64, Int<kM>>{})));
  XFrag xw;
  Tensor x_tok = thr_up.partition_A(make_identity_tensor(Shape<_64, Int<kM>>{}));  // (p, token) of each value
  // xw = X_mu^T * w (block mu of the buffer, tokens scaled by their state weights). s_wts: the
  // chunk's cum and e, s_w_base its w (weight_arrays 3). With two arrays w_t = exp2(cum_last - e_t) =
  // exp2(cum_last - cum_t) dt'_t (0 on padding, where e is +inf), and 0 for a token of another
  // sequence than the chunk's last token (seq_count: the chunk's token count where seq_idx is
  // given, else 0), as chunk_cumsum computes it.
  // to_mid (block 0 where the walk goes through the middle of the chunk, see `mid`): weights
  // exp2(cum_63 - e_t), to token 63 instead of the chunk's last token.
  auto load_xw = [&](const char* buf_base, const float* s_wts, const float* s_w_base, int mu, int seq_count,
                     bool to_mid) {
    load_xt<T>(mma_up, wtid, xw, buf_base + mu * F::kBlockBytes + 2 * NK * F::kSlice);
    if (weight_arrays<kCtas> == 3 && !to_mid) {
      scale_xt<T>(xw, x_tok, s_w_base + mu * kM);
    } else {
      const float* e_m = s_wts + q + mu * kM;
      const float last = a_grows ? 0.0f : s_wts[to_mid ? kM - 1 : q - 1];  // (see a_grows)
      auto scale = [&](auto with_seq) {
        const int32_t* seq_m = s_seq + mu * kM;
        const int32_t seq_last = with_seq ? s_seq[seq_count - 1] : 0;
#pragma unroll
        for (int e = 0; e < decltype(size(xw))::value; ++e) {
          const int t = get<1>(x_tok(e));
          float w = fast_exp2(last - e_m[t]);
          if constexpr (decltype(with_seq)::value) w = seq_m[t] == seq_last ? w : 0.0f;
          xw(e) = from_float<T>(to_float<T>(xw(e)) * w);
        }
      };
      if (weight_arrays<kCtas> == 2 && seq_count > 0) scale(std::true_type{});
      else scale(std::false_type{});
    }
  };
  // The update H += (X_mu * w)^T B_mu over the warpgroup's slices, issued as one batch (xw is
  // read by it until it completes).
  auto update_mma = [&](const char* buf_base, int mu) {
    Tensor sBn = make_tensor(
        make_smem_ptr(reinterpret_cast<T*>(const_cast<char*>(buf_base) + mu * F::kBlockBytes +
                                           (NK + wg * F::kStateSlices) * F::kSlice)),
        typename F::LayoutBn{});
    issue_update_wgmma(mma_up, thr_up, xw, sBn, hacc);
  };
  const int32_t* seq_row = p.seq_idx != nullptr ? p.seq_idx + walk.row * p.seq_sb : nullptr;
  const float* carry_walk = p.carry + carry_offset(p, walk.row, h, walk.g0);
  uint32_t parity = 0;  // the phase of the block mbarriers (and of bar_full / bar_free) to wait for
  // Two warpgroups: the next chunk's block 0 (and weights) loads while block 1 is finished, not
  // after the chunk. Block 0's tiles are last read by S_10 X_0 (warpgroup 1) and by block 0's
  // epilogue (warpgroup 0, which issues the loads once both are past: named barrier 1); both
  // warpgroups' updates with block 0 complete before S_10 X_0 is issued. (One warpgroup: the
  // same after S_10 X_0 was within 2% either way at dstate 64 and 128, 2026-11-30.)
  constexpr bool early_refill = kWG == 2;
  // Three CTAs per SM (NK = 1): the decays once C_m B_j^T has landed, not under its wgmma (their
  // registers would overlap S's and C B^T's in flight: 168 per thread were not enough).
  constexpr bool kLateDecay = kCtas == 3;
  // Block 1 from the state at the middle of the chunk (as the specialised kernel, v25): H is
  // scaled by exp2(cum_63) and updated with block 0's tokens weighted to token 63, written over
  // H_s once C_0 H_s^T is done with it (H_s(mid)), then scaled by exp2(cum_last - cum_63) before
  // block 1's update. Block 1's output is C_1 H_s(mid)^T exp2(cum_t - cum_63) + S_11 X_1: no
  // C_1 B_0^T and S_10 X_0. Not with seq_idx (a sequence may start inside the chunk) or A > 0
  // (mamba_ssm's clamped decays), nor in chunks of 64: those take block 1 from H_s(start). Nor
  // in two CTAs of one warpgroup at dstate 64 (the 8-group layer: 337.7 -> 338.0 us) and the
  // clusters (dstate 512 16K: 460.2 -> 462.0, with seq_idx +2.1%). Three per SM at dstate 64 it
  // takes 4.3-4.7% off the anchor's 16K and 64K, at dstate 256 about 1% (H200, v28).
  constexpr bool kMidChunk = kCtas == 3 || (NK >= 2 && kRanks == 1);
  const bool mid = kMidChunk && !a_grows && seq_row == nullptr && q == 2 * kM;
  // The carry of the state into each chunk (exp2(cum_last), 0 with seq_idx where the chunk's last
  // token starts a sequence): loaded a chunk ahead, off the chain, except with three CTAs per SM,
  // where that register made the kernel spill: there exp2(cum_last) from cum, and with seq_idx the
  // carry array at the chunk's start (dstate 64 with seq_idx 0.8% slower for it and the mid-chunk
  // path's code, v28).
  constexpr bool kCarryAhead = kCtas != 3;
  float carry_next = kCarryAhead && n_local > 0 ? carry_walk[c_begin] : 0.0f;

#pragma unroll 1
  for (int c_rel = 0; c_rel < n_local; ++c_rel) {
    const int64_t c = c_begin + c_rel;
    const ChunkInfo ci = walk_chunk(p, walk, c);
    char* buf = s_buf;
    const float* s_cum = weights_at(c_rel);
    float* s_e = const_cast<float*>(s_cum) + q;  // dt' as loaded, then e_s (see the top)
    const float* s_w = s_cum + 2 * q;            // (weight_arrays 3)
    float carry_in = 0.0f;
    if constexpr (kCarryAhead) {
      carry_in = carry_next;
      if (c_rel + 1 < n_local) carry_next = carry_walk[c + 1];
    } else if (seq_row != nullptr) {
      carry_in = carry_walk[c];
    }
    int32_t seq_prev = 0;
    if (seq_row != nullptr) {
      // (one token per thread, q <= 128, and no loop: a divergent loop here made ptxas serialize
      // every wgmma of the kernel)
      const int32_t* src = seq_row + (ci.tok0 + min(tid, ci.count - 1)) * p.seq_st;
      if (tid < q) s_seq[tid] = tid < ci.count ? *src : 0;
      seq_prev = ci.local > 0 ? seq_row[(ci.tok0 - 1) * p.seq_st] : 0;
    }
    // H_s = H in the compute type (this warpgroup's slices)
    store_state_copy<T, kWG>(hacc, s_h + wg * F::kStateSlices * F::kSlice, lane);
    fence_async_shared();
    tma::mbar_wait(bars, parity);  // block 0, with the chunk's cum, dt' (and w)
    // (dt' = 0, padding: +inf, S = 0; a_grows: the decays of S are clamped at 1, as cum_t = cum_s)
    if (tid < q) s_e[tid] = (a_grows ? 0.0f : s_cum[tid]) - fast_log2(s_e[tid]);
    __syncthreads();  // H_s, s_seq and e_s written
    warpgroup_fence_operand(hacc);
    // (cum_63 read from shared memory where used: kept in a register, it spilled at dstate 64)
    const float carry_first = mid                                      ? fast_exp2(s_cum[kM - 1])
                              : kCarryAhead || seq_row != nullptr ? carry_in
                                                                  : fast_exp2(s_cum[q - 1]);
#pragma unroll
    for (int v = 0; v < F::kAccVals; ++v) hacc(v) *= carry_first;
    warpgroup_fence_operand(hacc);
    // H_s(mid) over H_s (this warpgroup's slices), once block 0's update is done and no wgmma
    // reads H_s(start) any more; then H scaled to the chunk's end.
    auto store_mid = [&]() {
      warpgroup_fence_operand(hacc);
      store_state_copy<T, kWG>(hacc, s_h + wg * F::kStateSlices * F::kSlice, lane);
      fence_async_shared();
      const float rest = fast_exp2(s_cum[q - 1] - s_cum[kM - 1]);
#pragma unroll
      for (int v = 0; v < F::kAccVals; ++v) hacc(v) *= rest;
      warpgroup_fence_operand(hacc);
    };
    // Two warpgroups: block 0's update first (it completes before the output's first wait
    // returns), block 1's after the output, as one warpgroup does each block's.
    if constexpr (F::kWarpgroups == 2) {
      load_xw(buf, s_cum, s_w, 0, seq_row != nullptr ? ci.count : 0, mid);
      update_mma(buf, 0);
    }

    // The blocks whose output this warpgroup computes (two warpgroups: one each).
    const int m_first = F::kWarpgroups == 2 ? wg : 0, m_end = F::kWarpgroups == 2 ? wg + 1 : nb;
#pragma unroll 1
    for (int m = m_first; m < m_end; ++m) {
      char* blk = buf + m * F::kBlockBytes;
      tma::mbar_wait(bars + m, parity);
      // This thread's rows t of the block and their sequence bounds (compute_out's rules).
      const int t0 = m * kM + ra, t1 = m * kM + rb;
      RowSequences rs;
      if (seq_row != nullptr) rs = row_sequences(s_seq, ci.count, t0, t1, seq_prev);
      const int lo0 = rs.lo0, lo1 = rs.lo1;
      const bool sees0 = rs.sees0, sees1 = rs.sees1;
      const bool from_mid = mid && m == 1;
      const int j_first = from_mid ? 1 : 0;
      if (from_mid) {
        // Block 0's update is done (one warpgroup: and C_0 H_s^T). Two warpgroups: warpgroup 0
        // arrives at barrier 2 once its C_0 H_s^T is done, and at barrier 3 once its slices of
        // H_s(mid) are written; one warpgroup: every warp past its waits, then the stores.
        warpgroup_wait<0>();
        if constexpr (kWG == 2) named_barrier_sync(2, 2 * kThreads);
        else named_barrier_sync(2, kThreads);
        store_mid();
        if constexpr (kWG == 2) named_barrier_sync(3, 2 * kThreads);
        else named_barrier_sync(3, kThreads);
      }

      // ---- acc = (C_m H_s^T) * exp2(cum_t), and cb = C_m B_0^T in the same wgmma batch
      auto issue_cb = [&](int j) {
        wgmma_slices<T, NK, typename Tr::LayoutC, typename Tr::LayoutB>(mma_cb, thr_cb, blk,
                                                                         buf + j * F::kBlockBytes + NK * F::kSlice, cb);
      };
      warpgroup_fence_operand(acc[0]);
      warpgroup_fence_operand(cb);
      warpgroup_arrive();
      wgmma_slices<T, NK, typename Tr::LayoutC, typename Tr::LayoutH>(mma_ch, thr_ch, blk, s_h, acc[0]);
      issue_cb(j_first);
      warpgroup_commit_batch();
      const float ct0 = s_cum[t0], ct1 = s_cum[t1], c_ref = from_mid ? s_cum[kM - 1] : 0.0f;

      // ---- acc += S_mj X_j for the blocks j <= m. S_mj = C_m B_j^T * L_mj, L_mj = exp2(cum_t -
      // e_s) where kept: lo_t <= s <= t (columns c of block j: s = 64 j + c), which blocks j < m
      // without seq_idx keep whole (`masked` false; elsewhere the selects also drop the
      // exponentials of s > t, which can overflow). L_mj is computed while the wgmma that gives
      // C_m B_j^T runs; C_m B_{j+1}^T is issued with S_mj X_j (the last j is peeled off: a wgmma
      // under a run-time condition makes ptxas serialize all of them). The fragment orders of
      // the fp32 accumulator and of the 16-bit A operand coincide (see compute_out).
      float decay[kCbVals];
      auto make_decay = [&](int j, auto masked) {
        s_decays<decltype(masked)::value, true>(decay, s_e + j * kN, a_grows, ct0, ct1, t0 - j * kN, t1 - j * kN,
                                                lo0 - j * kN, lo1 - j * kN, lane);
      };
      auto decay_for = [&](int j) {
        if (j == m || seq_row != nullptr) make_decay(j, std::true_type{});
        else make_decay(j, std::false_type{});
      };
      auto make_s = [&]() {
#pragma unroll
        for (int v = 0; v < kCbVals; ++v) sf(v) = from_float<T>(cb(v) * decay[v]);
        static_assert(decltype(size(sf))::value == kCbVals, "S fragment size");
        warpgroup_fence_operand(sf);
      };
      auto issue_sx = [&](int j) {
        Tensor sX = make_tensor(make_smem_ptr(reinterpret_cast<const T*>(buf + j * F::kBlockBytes + 2 * NK * F::kSlice)),
                                typename Tr::LayoutX{});
        wgmma_k(mma_sx, sf, thr_sx.partition_fragment_B(sX), acc[0], false);
      };
      const float f0 = sees0 ? fast_exp2(ct0 - c_ref) : 0.0f;  // (under the wgmma; not clamped: see a_grows)
      const float f1 = sees1 ? fast_exp2(ct1 - c_ref) : 0.0f;
      if constexpr (!kLateDecay) decay_for(j_first);
      warpgroup_wait<0>();  // (and the previous block's update)
      warpgroup_fence_operand(acc[0]);
      warpgroup_fence_operand(cb);
      if (kWG == 2 && mid && m == 0) {
        // (warpgroup 0, its update of block 0 done too: see from_mid above. Barrier 4: all its
        // warps are past their waits before any overwrites H_s.)
        named_barrier_sync(4, kThreads);
        named_barrier_arrive(2, 2 * kThreads);
        store_mid();
        named_barrier_arrive(3, 2 * kThreads);
      }
      if constexpr (kLateDecay) decay_for(j_first);
#pragma unroll
      for (int v = 0; v < decltype(size(acc[0]))::value; ++v) acc[0](v) *= ((v >> 1) & 1) ? f1 : f0;
#pragma unroll 1
      for (int j = j_first; j < m; ++j) {
        make_s();
        warpgroup_fence_operand(acc[0]);
        warpgroup_fence_operand(cb);
        warpgroup_arrive();
        issue_sx(j);
        issue_cb(j + 1);
        warpgroup_commit_batch();
        if constexpr (!kLateDecay) decay_for(j + 1);
        warpgroup_wait<0>();
        warpgroup_fence_operand(acc[0]);
        warpgroup_fence_operand(cb);
        if constexpr (kLateDecay) decay_for(j + 1);
      }
      if (early_refill && m == 1) {
        fence_async_shared();  // (load_xw read X_0)
        named_barrier_arrive(1, 2 * kThreads);
      }
      make_s();
      warpgroup_fence_operand(acc[0]);
      warpgroup_arrive();
      issue_sx(m);
      warpgroup_commit_batch();
      // X^T * w for the update while S_mm X_m runs: X^T into registers (transposing ldmatrix;
      // the wgmma reads the same tile), times w per token. One warpgroup: block m's; two: block
      // 1's (each warpgroup updates its columns with all of the chunk's tokens).
      const char* x_m = blk + 2 * NK * F::kSlice;
      const int m_up = F::kWarpgroups == 1 ? m : 1;  // (two warpgroups: block 1, see above)
      if (F::kWarpgroups == 2 && m == 0) tma::mbar_wait(bars + 1, parity);
      load_xw(buf, s_cum, s_w, m_up, seq_row != nullptr ? ci.count : 0, kWG == 1 && mid && m == 0);
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc[0]);

      // ---- H += (X_m * w)^T B_m, left in flight under the epilogue (which reads acc and the
      // staging, not hacc or B_m); the next block's first wait, or the chunk's end, waits for it.
      update_mma(buf, m_up);

      // ---- out_m (x for D x from X_m in the buffer; the staging in C_m's tile, now unused:
      // every wgmma that read it has completed, each needing all four warps). Where it can, each
      // warp rounds its rows into C_m's tile and stores them by TMA (epilogue_tma_store: anchor
      // dstate 128 at 64K tokens 547 -> 503 us on the H200, v22; v12's TMA store of the whole
      // block after a CTA barrier had been 3-7% slower than the per-row stores).
      if constexpr (kRanks > 1) {
        // Two ranks: the warpgroup of block m in the other rank sends its partial; this rank's
        // adds it (see at the top). The partial buffer is free once the previous one was read
        // (a fresh mbarrier passes the wait for parity 1).
        if (m != rank_now()) {
          tma::mbar_wait<true>(bar_free, parity ^ 1u);
          const uint32_t dst = tma::cluster_addr(s_partial, m), full = tma::cluster_addr(bar_full, m);
          send_partial(acc[0], dst, full, wtid);
          continue;
        }
        // (the expected bytes may post after some have landed: the count goes negative meanwhile)
        if (wtid == 0) tma::mbar_arrive_expect(bar_full, kPartialBytes);
        tma::mbar_wait<true>(bar_full, parity);
        add_partial(acc[0], s_partial, wtid);
        tma::mbar_arrive_cluster(tma::cluster_addr(bar_free, 1 - m));
      }
      // (varlen: rows past a sequence's last chunk's tokens are the next sequence's)
      if (out_tma && (!p.varlen || ci.count >= (m + 1) * kM)) {
        epilogue_tma_store<T, kWG>(acc[0], blk, x_m, s_d, p.D != nullptr, &out_map,
                                   static_cast<int>(ci.tok0) + m * kM, h32, static_cast<int>(ci.row));
        continue;
      }
      float* s_y = NK >= 2 ? reinterpret_cast<float*>(blk) : s_y_own;
      epilogue_heads<T, 64, 1, kWG, true>(
          p, acc, s_y, s_d, [&](int) { return x_m; }, [](int) { return true; }, ci, m, h, 1);
    }
    if (early_refill && wg == 0) {
      fence_async_shared();  // (block 0's epilogue read X_0 and the staging in C_0's tile)
      if (lane == 0) tma::bulk_wait_all();  // (its stores have read the staging)
      named_barrier_sync(1, 2 * kThreads);
      if (tid == 0) issue_chunk(c_rel + 1, 0, 0);
    }
    warpgroup_wait<0>();  // the last block's update
    warpgroup_fence_operand(hacc);
    parity ^= 1u;
    // The state after chunk c, where the caller wants the chunk states.
    if (p.states != nullptr) {
      char* dst = static_cast<char*>(p.states) +
                  (walk.row * p.st_sb + (walk.g0 + c) * p.st_sc + h * p.st_sh) *
                      (int64_t)dtype_size_dev(p.state_dtype);
      st::store_tile<kWG>(hacc, dst, p.state_dtype, p.st_sp, 0, n_own(), p);
    }
    // Refill the buffer with the next chunk once every thread is done reading it (generic
    // accesses ordered before the TMA writes) and the output stores have read their staging.
    fence_async_shared();
    if (lane == 0) tma::bulk_wait_all();
    __syncthreads();
    if (tid == 0) issue_chunk(c_rel + 1, early_refill ? 1 : 0, nb - 1);
  }
  if (p.final_states != nullptr && c_end == walk.nchunks) {
    char* dst = static_cast<char*>(p.final_states) +
                (walk.walk * p.fin_sb + h * p.fin_sh) * (int64_t)dtype_size_dev(p.fin_dtype);
    st::store_tile<kWG>(hacc, dst, p.fin_dtype, p.fin_sp, 0, n_own(), p);
  }
  if (lane == 0) tma::bulk_wait_all<true>();  // (the output stores are done)
  if constexpr (kRanks > 1) tma::cluster_sync();  // (the other rank's last arrivals on this rank's mbarriers)
}

template <class T, int NK, int kRanks, int kCtas, int kWGs = (NK == 4 ? 2 : 1)>
void launch_typed(const SsdParams& p, const ChunkInputMaps& maps, const CUtensorMap& out_map, bool out_tma,
                  int64_t walks, cudaStream_t stream) {
  if (weight_arrays<kCtas> == 3 && p.wst == nullptr) {
    throw_launch_error("fused_walk: reads chunk_cumsum's fp32 weights (SsdParams::wst), got none");
  }
  auto kernel = fused_walk_kernel<T, NK, kRanks, kCtas, kWGs>;
  const int smem = fused_smem_bytes<T, NK, kRanks, kCtas, kWGs>(kWGs == 2 ? 128 : p.chunk);
  // (three CTAs take all 228 KB of the SM's shared memory: the largest carveout)
  raise_smem_limit(reinterpret_cast<const void*>(kernel), smem, kCtas == 3, "cudaFuncSetAttribute(fused_walk)");
  const dim3 grid(kRanks, static_cast<unsigned>(p.nheads), static_cast<unsigned>(walks * p.nseg));
  launch_kernel(kernel, grid, dim3(Fused<T, NK, kWGs>::kThreadsAll), smem, stream, true, kRanks,
                kRanks == 1 ? "launch fused_walk" : "launch fused_walk (clusters of two)", p, maps, out_map, out_tma);
}

// Whether the output goes out by TMA stores (epilogue_tma_store): 16-bit, no z, and a layout the
// TMA takes (16-byte aligned base and strides; MAMBA2_SSD_OUT_TMA=0 turns it off, for measuring).
bool out_store_by_tma(const SsdParams& p) {
  const char* e = std::getenv("MAMBA2_SSD_OUT_TMA");
  if (e != nullptr && std::string(e) == "0") return false;
  auto aligned = [](int64_t elements) { return (2 * elements) % 16 == 0; };
  return p.io_dtype != DType::kFloat32 && p.z == nullptr && reinterpret_cast<uintptr_t>(p.out) % 16 == 0 &&
         aligned(p.out_st) && aligned(p.out_sh) && (p.batch == 1 || aligned(p.out_sb));
}

}  // namespace

bool fused_walk_specialized_supported(const SsdParams& p) {
  return fused_walk_specialized_shape(p.headdim, p.dstate, p.chunk) &&
         fused_walk_specialized_options(!p.varlen, p.seq_idx != nullptr, p.z != nullptr,
                                        p.io_dtype == DType::kFloat32) &&
         fused_walk_specialized_segment(p.dstate, p.seg_chunks) && out_store_by_tma(p);
}

bool fused_walk_supported(const SsdParams& p) {
  return p.headdim == 64 && ((p.dstate <= 128 && (p.chunk == 64 || p.chunk == 128)) ||
                             (p.dstate <= 512 && p.chunk == 128));
}

void launch_fused_walk(const SsdParams& p, FusedWalkVariant variant, cudaStream_t stream) {
  if (!fused_walk_supported(p)) {
    throw_launch_error("fused_walk: takes headdim 64 with dstate <= 128 and chunk 64 or 128, or dstate <= 512 and "
                       "chunk 128, got headdim " +
                       std::to_string(p.headdim) + ", dstate " + std::to_string(p.dstate) + ", chunk " +
                       std::to_string(p.chunk));
  }
  const int64_t walks = p.varlen ? p.nseq : p.batch;
  if (walks == 0 || p.nheads == 0) return;
  if (walks * p.nseg > 65535) {
    throw_launch_error("fused_walk: at most 65535 walks x segments per launch, got " + std::to_string(walks * p.nseg));
  }
  if (p.nseg > 1 && p.ready_tiles != (p.dstate + 63) / 64) {
    throw_launch_error("fused_walk: the segment sums must be in 64-column tiles (SsdParams::ready_tiles " +
                       std::to_string(p.ready_tiles) + ")");
  }
  const bool two_wgs = variant == FusedWalkVariant::kTwoWarpgroups;
  if (two_wgs && (p.dstate > 128 || p.chunk != 128)) {
    throw_launch_error("fused_walk: two warpgroups at dstate <= 128 take chunks of 128, got dstate " +
                       std::to_string(p.dstate) + ", chunk " + std::to_string(p.chunk));
  }
  if (p.walk_meta && variant != FusedWalkVariant::kSpecialized) {
    throw_launch_error("fused_walk: chunk_cumsum's walk meta (SsdParams::walk_meta) is for the specialised variant, "
                       "which does not run here (dstate " + std::to_string(p.dstate) + ")");
  }
  const ChunkInputMaps maps = make_chunk_input_maps(p, "fused_walk");
  CUtensorMap out_map{};
  bool out_tma = out_store_by_tma(p);
  if (out_tma) {
    const uint32_t box[4] = {64, 16, 1, 1};  // (one warp's rows)
    const int64_t dims[4] = {p.headdim, p.seqlen, p.nheads, p.batch};
    const int64_t strides[3] = {2 * p.out_st, 2 * p.out_sh, 2 * p.out_sb};
    try {
      out_map = make_tile_map_16bit(p.out, 4, dims, strides, box, "fused_walk out");
    } catch (const Error&) {
      out_tma = false;  // (a layout the driver refuses: the per-row stores take any)
    }
  }
  if (variant == FusedWalkVariant::kSpecialized) {
    if (!out_tma || !fused_walk_specialized_supported(p)) {
      throw_launch_error("fused_walk: the specialised variant takes dstate <= 512 (above 128: segments of at least " +
                         std::to_string(kSpecializedBlocksMinChunks) +
                         " chunks), chunks of 128, the batched layout without seq_idx and a 16-bit output without z "
                         "that the TMA can store, got dstate " +
                         std::to_string(p.dstate) + ", chunk " + std::to_string(p.chunk) + ", segments of " +
                         std::to_string(p.seg_chunks) + " chunks");
    }
    if (p.ws_heads != 1 && !(p.ws_heads == 2 && fused_walk_specialized_pairs(p.dstate, p.heads_per_group))) {
      throw_launch_error("fused_walk: the specialised variant walks 1 head per CTA, or 2 at dstate <= 64 with an even "
                         "number of heads per group, got " +
                         std::to_string(p.ws_heads) + " heads per CTA at dstate " + std::to_string(p.dstate) +
                         " with " + std::to_string(p.heads_per_group) + " heads per group");
    }
    launch_fused_walk_specialized(p, maps, out_map, walks, stream);
    return;
  }
  if (two_wgs) {  // (dstate <= 64 too: the second warpgroup's columns are past dstate, zeros)
    if (p.fp16) launch_typed<cutlass::half_t, 2, 1, 1, 2>(p, maps, out_map, out_tma, walks, stream);
    else launch_typed<cutlass::bfloat16_t, 2, 1, 1, 2>(p, maps, out_map, out_tma, walks, stream);
  } else if (p.dstate <= 64 && variant == FusedWalkVariant::kThreePerSm) {
    if (p.fp16) launch_typed<cutlass::half_t, 1, 1, 3>(p, maps, out_map, out_tma, walks, stream);
    else launch_typed<cutlass::bfloat16_t, 1, 1, 3>(p, maps, out_map, out_tma, walks, stream);
  } else if (p.dstate <= 64) {
    if (p.fp16) launch_typed<cutlass::half_t, 1, 1, 2>(p, maps, out_map, out_tma, walks, stream);
    else launch_typed<cutlass::bfloat16_t, 1, 1, 2>(p, maps, out_map, out_tma, walks, stream);
  } else if (p.dstate <= 128) {
    if (p.fp16) launch_typed<cutlass::half_t, 2, 1, 2>(p, maps, out_map, out_tma, walks, stream);
    else launch_typed<cutlass::bfloat16_t, 2, 1, 2>(p, maps, out_map, out_tma, walks, stream);
  } else if (p.dstate <= 256) {
    if (p.fp16) launch_typed<cutlass::half_t, 4, 1, 1>(p, maps, out_map, out_tma, walks, stream);
    else launch_typed<cutlass::bfloat16_t, 4, 1, 1>(p, maps, out_map, out_tma, walks, stream);
  } else {
    if (p.fp16) launch_typed<cutlass::half_t, 4, 2, 1>(p, maps, out_map, out_tma, walks, stream);
    else launch_typed<cutlass::bfloat16_t, 4, 2, 1>(p, maps, out_map, out_tma, walks, stream);
  }
}

}  // namespace mamba2_ssd::kernels
