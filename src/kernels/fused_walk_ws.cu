// fused_walk's warp-specialised kernel (FusedWalkVariant::kSpecialized): see below and
// docs/ARCHITECTURE.md. The rest of fused_walk is in fused_walk.cu.
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

// ---- The warp-specialised walk (FusedWalkVariant::kSpecialized): dstate <= 128 (one or two
// 64-column slices, NK), chunks of 128, the batched layout without seq_idx, out by TMA stores.
// One CTA of three warpgroups per SM.
// Warpgroup 0 holds the state: it writes the chunk's e_s (in place of dt'), updates H with each
// 64-token block in turn and writes H_s twice per chunk, the state entering it (start) and the
// state after block 0 (mid); it stores the chunk states and issues the loads. Warpgroup 1 + m
// computes block m's output of every chunk from H_s(start) or H_s(mid): block 1 then needs no
// C_1 B_0^T and S_10 X_0 (a sixth less tensor work per chunk than from H_s(start) alone, and one
// wait fewer on its chain), and the two blocks cost the same. The chunk buffer has two slots:
// the next chunk's tiles land and the state runs up to a chunk ahead while this chunk's output is
// computed; the walk's only chain is H's update. Each output warpgroup rounds its block into a
// staging buffer of its own for the TMA stores, which are waited for a chunk later. The output
// warpgroups take the registers the state one does not need (setmaxnreg).
constexpr int kWsStateRegs = 144, kWsOutRegs = 176;  // 144 + 2 x 176 <= 3 x 168 (64K per SM)

template <class T, int NK>
struct WsLayout {
  using F = Fused<T, NK, 1>;
  static constexpr int kQ = 128;
  static constexpr int kSlotBytes = buffer_bytes<1, 2>(F::kBlockBytes, kQ);  // blocks 0, 1; cum, dt', w
  static constexpr int kHsBytes = NK * F::kSlice;
  static constexpr int kStageBytes = kM * kN * 2;  // an output block in T
  // [slot 0][slot 1][H_s 0][H_s 1][stage 0][stage 1][D: 64][mbarriers: 8]
  static constexpr int kHs = 2 * kSlotBytes;
  static constexpr int kStage = kHs + 2 * kHsBytes;
  static constexpr int kD = kStage + 2 * kStageBytes;
  static constexpr int kBars = kD + 64 * 4;
  static constexpr int kBytes = 1024 + kBars + 8 * 8;
};

template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

template <class T, int NK>
__global__ void __launch_bounds__(3 * kThreads, 1)
    fused_walk_ws_kernel(const SsdParams p, const __grid_constant__ ChunkInputMaps maps,
                         const __grid_constant__ CUtensorMap out_map) {
  using F = Fused<T, NK, 1>;
  using Tr = typename F::Tr;
  using L = WsLayout<T, NK>;
  constexpr int q = L::kQ;
  extern __shared__ __align__(1024) char smem_raw[];
  char* smem = smem_raw + ((1024u - (static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) & 1023u)) & 1023u);
  const int tid = threadIdx.x, lane = tid % 32, wg = tid / kThreads, wtid = tid % kThreads;
  const int64_t h = blockIdx.y;
  const int seg = fused_segment(p, blockIdx.z);
  const Walk walk = make_walk(p, blockIdx.z / p.nseg);
  const int64_t grp = h / p.heads_per_group;
  const bool a_grows = p.A[h * p.A_s] > 0.0f;  // (see fused_walk_kernel)
  const SegmentRange range = segment_range(p, seg, walk.nchunks);
  const int64_t c_begin = range.begin, c_end = range.end;
  if (seg > 0 && c_begin >= walk.nchunks) return;
  const int n_local = static_cast<int>(c_end - c_begin);

  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + L::kBars);
  // (every thread arrives where it has read or written: each one's accesses are then ordered
  // before the waiter's by the mbarrier itself)
  uint64_t* full = bars;          // [slot]: the chunk's tiles and weights landed (TMA bytes)
  uint64_t* empty = bars + 2;     // [slot]: every thread is done with the chunk
  uint64_t* hs_full = bars + 4;   // [slot]: H_s written (the state warpgroup)
  uint64_t* hs_empty = bars + 6;  // [slot]: C H^T has read it (the output warpgroups)
  float* s_d = reinterpret_cast<float*>(smem + L::kD);
  if (tid == 0) {
    for (int s = 0; s < 2; ++s) {
      tma::mbar_init(full + s, 1);
      tma::mbar_init(empty + s, 3 * kThreads);
      tma::mbar_init(hs_full + s, kThreads);
      tma::mbar_init(hs_empty + s, 2 * kThreads);
    }
    tma::fence_mbar_init();
  }
  if (p.D != nullptr && tid < 64) s_d[tid] = p.D[h * p.D_sh + tid * p.D_sp];
  __syncthreads();
  pdl_wait_primary();  // (launched early behind the segment sums or chunk_cumsum, see fused_walk_kernel)
  auto slot_of = [&](int c_rel) { return smem + (c_rel & 1) * L::kSlotBytes; };
  auto hs_of = [&](int c_rel) { return smem + L::kHs + (c_rel & 1) * L::kHsBytes; };
  auto cum_of = [&](const char* buf) { return reinterpret_cast<const float*>(buf + 2 * F::kBlockBytes); };

  if (wg == 0) {
    // ================= the state warpgroup
    setmaxnreg_dec<kWsStateRegs>();
    const int row32 = static_cast<int>(walk.row), grp32 = static_cast<int>(grp), h32 = static_cast<int>(h);
    auto issue_chunk = [&](int c_rel) {
      const ChunkInfo ci = walk_chunk(p, walk, c_begin + c_rel);
      char* buf = slot_of(c_rel);
      uint64_t* bar = full + (c_rel & 1);
      const int tok = static_cast<int>(ci.tok0);
      tma::mbar_arrive_expect(bar, 2 * F::kBlockBytes + 3 * q * 4);
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        char* blk = buf + m * F::kBlockBytes;
#pragma unroll
        for (int ks = 0; ks < NK; ++ks) {
          tma::load_4d(&maps.C, bar, blk + ks * F::kSlice, ks * kN, tok + m * kM, grp32, row32);
          tma::load_4d(&maps.B, bar, blk + (NK + ks) * F::kSlice, ks * kN, tok + m * kM, grp32, row32);
        }
        tma::load_4d(&maps.x, bar, blk + 2 * NK * F::kSlice, 0, tok + m * kM, h32, row32);
      }
      const int64_t off = cum_offset(p, walk.row, h, walk.g0 + c_begin + c_rel);
      float* meta = const_cast<float*>(cum_of(buf));
      tma::load_bulk(meta, p.cum + off, q * 4, bar);
      tma::load_bulk(meta + q, p.dtp + off, q * 4, bar);
      tma::load_bulk(meta + 2 * q, p.wst + off, q * 4, bar);
    };
    if (tid == 0) {
      if (n_local > 0) issue_chunk(0);
      if (n_local > 1) issue_chunk(1);
    }
    typename F::MmaUpd mma_up;
    auto thr_up = mma_up.get_slice(wtid);
    Tensor hacc = partition_fragment_C(mma_up, Shape<_64, Int<F::kN_state>>{});
    if (seg == 0 && p.init != nullptr) {
      const void* src = static_cast<const char*>(p.init) +
                        (walk.walk * p.init_sb + h * p.init_sh) * (int64_t)dtype_size_dev(p.init_dtype);
      st::load_tile<1>(hacc, src, p.init_dtype, p.init_sp, 0, 0, p);
    } else if (seg > 0) {
      // (not unrolled: the state warpgroup's 144 registers)
      state_from_sums<true, 1>(hacc, p, (walk.walk * p.nheads + h) * sums_per_walk_head(p), seg * p.sum_split, 0,
                               wtid);
    } else {
      clear(hacc);
    }
    using XFrag = decltype(make_tensor<T>(partition_shape_A(mma_up, Shape<_64, Int<kM>>{})));
    XFrag xw;
    Tensor x_tok = thr_up.partition_A(make_identity_tensor(Shape<_64, Int<kM>>{}));
    const float* carry_walk = p.carry + carry_offset(p, walk.row, h, walk.g0);
    float carry_next = n_local > 0 ? carry_walk[c_begin] : 0.0f;
    // The update H = H * s + (X_mu * w)^T B_mu with block mu's tokens (w: the weights' array of
    // block mu, from registers through the transposing ldmatrix; issued and waited for).
    auto update = [&](const char* buf, int mu, float s) {
      warpgroup_fence_operand(hacc);
#pragma unroll
      for (int v = 0; v < F::kAccVals; ++v) hacc(v) *= s;
      load_xt<T>(mma_up, wtid, xw, buf + mu * F::kBlockBytes + 2 * NK * F::kSlice);
      scale_xt<T>(xw, x_tok, cum_of(buf) + 2 * q + mu * kM);
      Tensor sBn = make_tensor(
          make_smem_ptr(reinterpret_cast<T*>(const_cast<char*>(buf) + mu * F::kBlockBytes + NK * F::kSlice)),
          typename F::LayoutBn{});
      issue_update_wgmma(mma_up, thr_up, xw, sBn, hacc);
      warpgroup_wait<0>();
      warpgroup_fence_operand(hacc);
    };
    // H_s slot k = H in the compute type, once both output warpgroups' C H^T have read the slot's
    // previous copy (phase: the chunk's parity).
    auto write_hs = [&](int k, uint32_t hph) {
      tma::mbar_wait(hs_empty + k, hph ^ 1u);
      store_state_copy<T, 1, true>(hacc, hs_of(k), lane);
      fence_async_shared();
    };
#pragma unroll 1
    for (int c_rel = 0; c_rel < n_local; ++c_rel) {
      const int64_t c = c_begin + c_rel;
      const uint32_t ph = (c_rel >> 1) & 1u, hph = c_rel & 1u;
      const float carry = carry_next;
      if (c_rel + 1 < n_local) carry_next = carry_walk[c + 1];
      const char* buf = slot_of(c_rel);
      float* meta = const_cast<float*>(cum_of(buf));
      // ---- H_s(start): the state entering the chunk, for block 0's output
      write_hs(0, hph);
      // e_s = cum_s - log2(dt'_s) in place of dt' (a_grows: cum taken as 0) for the output
      // warpgroups (0.7-0.9% faster than each output warpgroup computing its own copy, v24), and
      // block 0's weights to the middle of the chunk, w'_s = exp2(cum_63 - e_s), in place of w
      // (a_grows: w = dt' stays, see below)
      tma::mbar_wait(full + (c_rel & 1), ph);
      {
        const float e = (a_grows ? 0.0f : meta[wtid]) - fast_log2(meta[q + wtid]);
        meta[q + wtid] = e;
        if (!a_grows && wtid < kM) meta[2 * q + wtid] = fast_exp2(meta[kM - 1] - e);
      }
      tma::mbar_arrive(hs_full);
      named_barrier_sync(1, kThreads);  // (block 0's weights written)
      // ---- H at the middle of the chunk: H * exp2(cum_63) + block 0's tokens. a_grows: the
      // decays within a chunk are clamped at 1 (mamba_ssm), which the split cannot express: H *
      // carry + every token with w = dt', and block 1's output works from H_s(start) (see below).
      const float cum_mid = meta[kM - 1];
      update(buf, 0, a_grows ? carry : fast_exp2(cum_mid));
      // ---- H_s(mid), for block 1's output
      write_hs(1, hph);
      tma::mbar_arrive(hs_full + 1);
      // Chunk c + 1 into the slot of chunk c - 1 once every warp is done with that one. (Here,
      // not before block 0's update: block 1's output warpgroup waits for H_s(mid), and its
      // last chunk's release is what this waits for.)
      if (tid == 0 && c_rel >= 1 && c_rel + 1 < n_local) {
        tma::mbar_wait(empty + ((c_rel + 1) & 1), ((c_rel - 1) >> 1) & 1u);
        issue_chunk(c_rel + 1);
      }
      __syncwarp();
      update(buf, 1, a_grows ? 1.0f : fast_exp2(meta[q - 1] - cum_mid));
      fence_async_shared();
      tma::mbar_arrive(empty + (c_rel & 1));
      if (p.states != nullptr) {
        char* dst = static_cast<char*>(p.states) +
                    (walk.row * p.st_sb + (walk.g0 + c) * p.st_sc + h * p.st_sh) * (int64_t)dtype_size_dev(p.state_dtype);
        st::store_tile<1>(hacc, dst, p.state_dtype, p.st_sp, 0, 0, p);
      }
    }
    if (p.final_states != nullptr && c_end == walk.nchunks) {
      char* dst = static_cast<char*>(p.final_states) +
                  (walk.walk * p.fin_sb + h * p.fin_sh) * (int64_t)dtype_size_dev(p.fin_dtype);
      st::store_tile<1>(hacc, dst, p.fin_dtype, p.fin_sp, 0, 0, p);
    }
    return;
  }

  // ================= the output warpgroups
  setmaxnreg_inc<kWsOutRegs>();
  const int ow = wg - 1;
  typename Tr::MmaCB mma_cb;
  typename Tr::MmaCH mma_ch;
  typename Tr::MmaSX mma_sx;
  auto thr_cb = mma_cb.get_slice(wtid);
  auto thr_ch = mma_ch.get_slice(wtid);
  auto thr_sx = mma_sx.get_slice(wtid);
  Tensor cb = partition_fragment_C(mma_cb, Shape<Int<kM>, Int<kN>>{});
  Tensor acc = partition_fragment_C(mma_ch, Shape<Int<kM>, Int<64>>{});
  using SFrag = decltype(make_tensor<T>(partition_shape_A(mma_sx, Shape<Int<kM>, Int<kN>>{})));
  SFrag sf;
  constexpr int kCbVals = kM * kN / kThreads;
  const int ra = acc_row<3>(0), rb = acc_row<3>(2);
  const int row32 = static_cast<int>(walk.row), h32 = static_cast<int>(h);
  // Block m = ow of every chunk, from H_s(start) (block 0) or H_s(mid) (block 1): S_mm X_m is the
  // only term within the chunk. a_grows: block 1 from H_s(start), with S_10 X_0 (j_first 0).
  const int m = ow;
  const bool from_mid = m == 1 && !a_grows;
  const int j_first = m == 1 && a_grows ? 0 : m;
  char* stage = smem + L::kStage + ow * L::kStageBytes;
#pragma unroll 1
  for (int c_rel = 0; c_rel < n_local; ++c_rel) {
    const ChunkInfo ci = walk_chunk(p, walk, c_begin + c_rel);
    const uint32_t ph = (c_rel >> 1) & 1u, hph = c_rel & 1u;
    char* buf = slot_of(c_rel);
    char* blk = buf + m * F::kBlockBytes;
    const float* s_cum = cum_of(buf);
    const float* s_e = s_cum + q;  // (e_s, written by the state warpgroup before H_s is signalled)
    tma::mbar_wait(full + (c_rel & 1), ph);
    // Block m waits for H_s slot m, block 1 with a_grows too, where it reads H_s(start) (written
    // before H_s(mid), whose signal releases both): its release of H_s(mid) below must follow the
    // state warpgroup's write of this chunk's. (Released earlier, the releases of two chunks could
    // complete H_s(mid)'s phases before the state warpgroup waits for the first, and its parity
    // wait would never return: scripts/ws_barrier_model.py.)
    tma::mbar_wait(hs_full + m, hph);
    const char* s_h = hs_of(from_mid ? 1 : 0);
    const int t0 = m * kM + ra, t1 = m * kM + rb;
    auto issue_cb = [&](int j) {
      wgmma_slices<T, NK, typename Tr::LayoutC, typename Tr::LayoutB>(mma_cb, thr_cb, blk,
                                                                       buf + j * F::kBlockBytes + NK * F::kSlice, cb);
    };
    warpgroup_fence_operand(acc);
    warpgroup_fence_operand(cb);
    warpgroup_arrive();
    wgmma_slices<T, NK, typename Tr::LayoutC, typename Tr::LayoutH>(mma_ch, thr_ch, blk, s_h, acc);
    issue_cb(j_first);
    warpgroup_commit_batch();
    const float ct0 = s_cum[t0], ct1 = s_cum[t1], c_ref = from_mid ? s_cum[kM - 1] : 0.0f;
    // S_mj = C_m B_j^T * exp2(cum_t - e_s), s <= t on the diagonal block (as fused_walk_kernel)
    float decay[kCbVals];
    auto make_decay = [&](int j, auto masked) {
      s_decays<decltype(masked)::value, false>(decay, s_e + j * kN, a_grows, ct0, ct1, t0 - j * kN, t1 - j * kN, 0, 0,
                                               lane);
    };
    auto decay_for = [&](int j) {
      if (j == m) make_decay(j, std::true_type{});
      else make_decay(j, std::false_type{});
    };
    auto make_s = [&]() {
#pragma unroll
      for (int v = 0; v < kCbVals; ++v) sf(v) = from_float<T>(cb(v) * decay[v]);
      warpgroup_fence_operand(sf);
    };
    auto issue_sx = [&](int j) {
      Tensor sX = make_tensor(make_smem_ptr(reinterpret_cast<const T*>(buf + j * F::kBlockBytes + 2 * NK * F::kSlice)),
                              typename Tr::LayoutX{});
      wgmma_k(mma_sx, sf, thr_sx.partition_fragment_B(sX), acc, false);
    };
    const float f0 = fast_exp2(ct0 - c_ref), f1 = fast_exp2(ct1 - c_ref);
    decay_for(j_first);
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc);
    warpgroup_fence_operand(cb);
    // C H^T has read H_s: both warpgroups release both slots (so a_grows needs no other count),
    // H_s(mid) first: the state warpgroup writes H_s(start) of the next chunk once every thread
    // has released this one's, and the other warpgroup's next release of H_s(mid) must not
    // precede this warpgroup's.
    tma::mbar_arrive(hs_empty + 1);
    tma::mbar_arrive(hs_empty + 0);
#pragma unroll
    for (int v = 0; v < decltype(size(acc))::value; ++v) acc(v) *= ((v >> 1) & 1) ? f1 : f0;
#pragma unroll 1
    for (int j = j_first; j < m; ++j) {
      make_s();
      warpgroup_fence_operand(acc);
      warpgroup_fence_operand(cb);
      warpgroup_arrive();
      issue_sx(j);
      issue_cb(j + 1);
      warpgroup_commit_batch();
      decay_for(j + 1);
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc);
      warpgroup_fence_operand(cb);
    }
    make_s();
    warpgroup_fence_operand(acc);
    warpgroup_arrive();
    issue_sx(m);
    warpgroup_commit_batch();
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc);
    // (staged in C_m's tile instead, the stores' reads were waited for here, before the slot's
    // release: 0.6-1.2% slower, v26)
    if (lane == 0) tma::bulk_wait_all();  // (this warp's stores of the last chunk have read its rows)
    __syncwarp();
    epilogue_tma_store<T, 3>(acc, stage, blk + 2 * NK * F::kSlice, s_d, p.D != nullptr, &out_map,
                             static_cast<int>(ci.tok0) + m * kM, h32, row32);
    tma::mbar_arrive(empty + (c_rel & 1));
  }
  if (lane == 0) tma::bulk_wait_all<true>();  // (the output stores are done)
}

template <class T, int NK>
void launch_ws_typed(const SsdParams& p, const ChunkInputMaps& maps, const CUtensorMap& out_map, int64_t walks,
                     cudaStream_t stream) {
  auto kernel = fused_walk_ws_kernel<T, NK>;
  constexpr int smem = WsLayout<T, NK>::kBytes;
  static_assert(smem <= 227 * 1024, "shared memory of the specialised walk");
  raise_smem_limit(reinterpret_cast<const void*>(kernel), smem, false, "cudaFuncSetAttribute(fused_walk specialised)");
  const dim3 grid(1, static_cast<unsigned>(p.nheads), static_cast<unsigned>(walks * p.nseg));
  launch_kernel(kernel, grid, dim3(3 * kThreads), smem, stream, true, 1, "launch fused_walk (specialised)", p, maps,
                out_map);
}

}  // namespace

namespace fused_walk_parts {

void launch_fused_walk_specialized(const SsdParams& p, const ChunkInputMaps& maps, const CUtensorMap& out_map,
                                   int64_t walks, cudaStream_t stream) {
  if (p.dstate <= 64) {  // (one slice; dstate below 64: zero columns past it, as the TMA fills)
    if (p.fp16) launch_ws_typed<cutlass::half_t, 1>(p, maps, out_map, walks, stream);
    else launch_ws_typed<cutlass::bfloat16_t, 1>(p, maps, out_map, walks, stream);
    return;
  }
  if (p.fp16) launch_ws_typed<cutlass::half_t, 2>(p, maps, out_map, walks, stream);
  else launch_ws_typed<cutlass::bfloat16_t, 2>(p, maps, out_map, walks, stream);
}

}  // namespace fused_walk_parts

}  // namespace mamba2_ssd::kernels
