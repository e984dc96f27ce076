// compute_out: every chunk's output from its entry state.
//
// One CTA (one warpgroup) per (row, chunk, 64-token block m of the chunk, group, slice of hb
// heads of the group). With t the block's tokens and s the chunk's tokens up to the block's end:
//   for every 64-token source block j <= m:  CB_j = C_m B_j^T    (64 x 64, wgmma SS, fp32)
//     computed once for all heads of the slice (they share C and B) and kept in shared memory
//   for every head h of the slice:
//     acc  = C_m H_prev(h)^T                (64 x P, wgmma SS; skipped without a previous state)
//     acc *= exp(cum_t) [same sequence]      (registers)
//     for j <= m:
//       S    = CB_j * exp(min(cum_t - cum_s, 0)) * dt'_s, causal and sequence masks  (registers)
//       acc += S X_j                          (64 x P, wgmma RS: S is the register A operand)
//     out  = (acc + D x) * silu(z)            (z prefetched into registers at the head's start)
// C_m stays in shared memory for the whole CTA; B_j slices, H slices and X_j stream through a
// ring of kStages cp.async stages. dstate is covered in 64-wide slices (zero padded).
#include "kernels/kernels.hpp"
#include "kernels/state_tile.cuh"

namespace mamba2_ssd::kernels {

namespace {

using namespace cute;
using state_tile::acc_col;
using state_tile::acc_row;
using state_tile::cp_async_4;

constexpr int kThreads = 128;
constexpr int kM = 64;  // output tokens per CTA
constexpr int kN = 64;  // dstate slice and source-token block

template <class T, int P>
struct Traits {
  using LayoutC = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<T>{}, Shape<Int<kM>, Int<kN>>{}));  // (t, n)
  using LayoutH = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<T>{}, Shape<Int<P>, Int<kN>>{}));   // (p, n)
  using LayoutB = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<T>{}, Shape<Int<kN>, Int<kN>>{}));  // (s, n)
  using LayoutX = decltype(tile_to_shape(GMMA::Layout_MN_SW128_Atom<T>{}, Shape<Int<P>, Int<kN>>{}));  // (p, s)
  using MmaCB = decltype(make_tiled_mma(
      GMMA::ss_op_selector<T, T, float, Shape<Int<kM>, Int<kN>, Int<kN>>, GMMA::Major::K, GMMA::Major::K>()));
  using MmaCH = decltype(make_tiled_mma(
      GMMA::ss_op_selector<T, T, float, Shape<Int<kM>, Int<P>, Int<kN>>, GMMA::Major::K, GMMA::Major::K>()));
  using MmaSX = decltype(make_tiled_mma(
      GMMA::rs_op_selector<T, T, float, Shape<Int<kM>, Int<P>, Int<kN>>, GMMA::Major::K, GMMA::Major::MN>()));
  static constexpr int kSliceBytes = kM * kN * 2;   // one 64 x 64 slice of C_m
  static constexpr int kStageBytes = P * kN * 2;    // the largest streamed tile (H slice or X_j)
};

// Shared-memory plan: [C_m: nk slices][CB: mb blocks of 64x64 fp32][kStages stages]
// [cum: hb x Q][dt': hb x Q][seq_idx: Q]; tiles 1024-aligned.
template <class T, int P, int kStages>
__host__ __device__ constexpr int smem_bytes(int nk, int q, int hb) {
  return 1024 + nk * Traits<T, P>::kSliceBytes + (q / kM) * kM * kN * 4 + kStages * Traits<T, P>::kStageBytes +
         (2 * hb + 1) * q * 4;
}

template <class Mma, class TA, class TB, class Acc>
__device__ __forceinline__ void wgmma_sync(Mma& mma, TA const& a, TB const& b, Acc& acc) {
  warpgroup_fence_operand(acc);
  warpgroup_arrive();
  gemm(mma, a, b, acc);
  warpgroup_commit_batch();
  warpgroup_wait<0>();
  warpgroup_fence_operand(acc);
}

template <class T, int P, int kStages>
__global__ void __launch_bounds__(kThreads) compute_out_kernel(const SsdParams p, const int hb) {
  using Tr = Traits<T, P>;
  extern __shared__ __align__(1024) char smem_raw[];
  char* smem = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));

  // ---- which tile: (row, chunk, 64-token block m, group, slice of hb heads of the group)
  const int64_t mb = p.chunk / kM;
  const int64_t slices = (p.heads_per_group + hb - 1) / hb;
  int64_t idx = blockIdx.x;
  const int64_t hs = idx % slices; idx /= slices;
  const int64_t grp = idx % p.ngroups; idx /= p.ngroups;
  const int m = static_cast<int>(idx % mb); idx /= mb;
  const int64_t g = idx % p.nchunks;
  const int64_t row = idx / p.nchunks;
  const ChunkInfo ci = chunk_info(p, row, g);
  if (ci.count <= m * kM) return;
  const int64_t h0 = grp * p.heads_per_group + hs * hb;
  const int nh = static_cast<int>(min<int64_t>(hb, (grp + 1) * p.heads_per_group - h0));

  const int tid = threadIdx.x;
  const int q = p.chunk;
  const int nk = (p.dstate + kN - 1) / kN;
  const T* Cg = static_cast<const T*>(p.C) + ci.row * p.C_sb + ci.tok0 * p.C_st + grp * p.C_sg;
  const T* Bg = static_cast<const T*>(p.B) + ci.row * p.B_sb + ci.tok0 * p.B_st + grp * p.B_sg;
  const T* Xrow = static_cast<const T*>(p.x) + ci.row * p.x_sb + ci.tok0 * p.x_st;
  const int32_t* seq_row = p.seq_idx != nullptr ? p.seq_idx + ci.row * p.seq_sb : nullptr;

  char* s_c = smem;
  float* s_cb = reinterpret_cast<float*>(s_c + nk * Tr::kSliceBytes);
  char* s_stages = reinterpret_cast<char*>(s_cb + mb * kM * kN);
  float* s_cum = reinterpret_cast<float*>(s_stages + kStages * Tr::kStageBytes);  // [hb][q]
  float* s_dtp = s_cum + hb * q;                                                     // [hb][q]
  int32_t* s_seq = reinterpret_cast<int32_t*>(s_dtp + hb * q);                       // [q]

  // ---- prologue: C_m (all dstate slices), cum and dt' of the heads, seq_idx of the chunk
  for (int v = tid; v < nk * kM * kN / 8; v += kThreads) {
    const int ks = v / (kM * kN / 8), w = v % (kM * kN / 8);
    const int r = w / (kN / 8), c = (w % (kN / 8)) * 8;
    const int t = m * kM + r, n = ks * kN + c;
    Tensor sC = make_tensor(make_smem_ptr(reinterpret_cast<T*>(s_c + ks * Tr::kSliceBytes)), typename Tr::LayoutC{});
    const bool ok = t < ci.count && n < p.dstate;
    cp_async_16(&sC(r, c), ok ? Cg + t * p.C_st + n : Cg, ok);
  }
  for (int v = tid; v < nh * q / 4; v += kThreads) {
    const int hh = v / (q / 4), u = v % (q / 4);
    const int64_t off = cum_offset(p, ci.row, h0 + hh, g) + 4 * u;
    cp_async_16(s_cum + hh * q + 4 * u, p.cum + off, true);
    cp_async_16(s_dtp + hh * q + 4 * u, p.dtp + off, true);
  }
  if (seq_row != nullptr) {
    for (int t = tid; t < q; t += kThreads) {
      const bool ok = t < ci.count;
      cp_async_4(s_seq + t, ok ? seq_row + (ci.tok0 + t) * p.seq_st : seq_row, ok);
    }
  }
  cp_async_commit();

  // ---- the state entering this chunk (same place for every head, offset by the head)
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
  const DType compute_dtype = p.fp16 ? DType::kFloat16 : DType::kBFloat16;
  const int32_t seq_prev = (seq_row != nullptr && ci.local > 0) ? seq_row[(ci.tok0 - 1) * p.seq_st] : 0;

  // ---- steps: CB phase [B_j slice ks for j <= m, ks < nk], then per head [H slices][X_0..X_m]
  const int n_cb = (m + 1) * nk;
  const int n_a = prev_base != nullptr ? nk : 0;
  const int per_head = n_a + m + 1;
  const int nsteps = n_cb + nh * per_head;

  auto issue = [&](int i) {
    if (i < nsteps) {
      char* stage = s_stages + (i % kStages) * Tr::kStageBytes;
      if (i < n_cb) {
        const int j = i / nk, ks = i % nk;
        Tensor sB = make_tensor(make_smem_ptr(reinterpret_cast<T*>(stage)), typename Tr::LayoutB{});
        for (int v = tid; v < kN * kN / 8; v += kThreads) {
          const int r = v / (kN / 8), c = (v % (kN / 8)) * 8;
          const int s = j * kN + r, n = ks * kN + c;
          const bool ok = s < ci.count && n < p.dstate;
          cp_async_16(&sB(r, c), ok ? Bg + s * p.B_st + n : Bg, ok);
        }
      } else {
        const int rr = i - n_cb;
        const int64_t h = h0 + rr / per_head;
        const int qq = rr % per_head;
        if (qq < n_a) {
          const int ks = qq;
          Tensor sH = make_tensor(make_smem_ptr(reinterpret_cast<T*>(stage)), typename Tr::LayoutH{});
          const char* hbase = prev_base + h * prev_sh * dtype_size_dev(prev_dtype);
          if (prev_dtype == compute_dtype) {
            const T* src = reinterpret_cast<const T*>(hbase);
            for (int v = tid; v < P * kN / 8; v += kThreads) {
              const int r = v / (kN / 8), c = (v % (kN / 8)) * 8;
              const int n = ks * kN + c;
              const bool ok = n < p.dstate;
              cp_async_16(&sH(r, c), ok ? src + r * prev_sp + n : src, ok);
            }
          } else {
            // Another dtype (fp32 states): convert through registers.
            for (int v = tid; v < P * kN / 8; v += kThreads) {
              const int r = v / (kN / 8), c = (v % (kN / 8)) * 8;
              const int n = ks * kN + c;
              uint4 raw;
              T* vals = reinterpret_cast<T*>(&raw);
#pragma unroll
              for (int e = 0; e < 8; ++e) {
                vals[e] = from_float<T>(n < p.dstate ? load_any(hbase, prev_dtype, r * prev_sp + n + e) : 0.0f);
              }
              *reinterpret_cast<uint4*>(&sH(r, c)) = raw;
            }
          }
        } else {
          const int j = qq - n_a;
          const T* Xg = Xrow + h * p.x_sh;
          Tensor sX = make_tensor(make_smem_ptr(reinterpret_cast<T*>(stage)), typename Tr::LayoutX{});
          for (int v = tid; v < kN * P / 8; v += kThreads) {
            const int r = v / (P / 8), c = (v % (P / 8)) * 8;
            const int s = j * kN + r;
            const bool ok = s < ci.count;
            cp_async_16(&sX(c, r), ok ? Xg + s * p.x_st + c : Xg, ok);
          }
        }
      }
    }
    cp_async_commit();
  };

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) issue(s);

  typename Tr::MmaCB mma_cb;
  typename Tr::MmaCH mma_ch;
  typename Tr::MmaSX mma_sx;
  auto thr_cb = mma_cb.get_slice(tid);
  auto thr_ch = mma_ch.get_slice(tid);
  auto thr_sx = mma_sx.get_slice(tid);
  int i = 0;
  // Waits for step i's tiles (and the prologue), frees the previous stage, issues step i+S-1.
  auto begin_step = [&]() -> char* {
    cp_async_wait<kStages - 2>();
    fence_async_shared();
    __syncthreads();
    issue(i + kStages - 1);
    return s_stages + (i % kStages) * Tr::kStageBytes;
  };

  // ---- CB phase: C_m B_j^T for every source block, kept in shared memory in fragment order
  // (each thread later reads back exactly the values it wrote).
  {
    Tensor cb = partition_fragment_C(mma_cb, Shape<Int<kM>, Int<kN>>{});  // (64 x 64) fp32
    for (int j = 0; j <= m; ++j) {
      clear(cb);
      for (int ks = 0; ks < nk; ++ks, ++i) {
        char* stage = begin_step();
        Tensor sC = make_tensor(make_smem_ptr(reinterpret_cast<T*>(s_c + ks * Tr::kSliceBytes)), typename Tr::LayoutC{});
        Tensor sB = make_tensor(make_smem_ptr(reinterpret_cast<T*>(stage)), typename Tr::LayoutB{});
        wgmma_sync(mma_cb, thr_cb.partition_fragment_A(sC), thr_cb.partition_fragment_B(sB), cb);
      }
#pragma unroll
      for (int v = 0; v < size(cb); ++v) s_cb[(j * size(cb) + v) * kThreads + tid] = cb(v);
    }
  }

  // ---- head phase
  Tensor acc = partition_fragment_C(mma_ch, Shape<Int<kM>, Int<P>>{});  // (64 x P) fp32
  Tensor s_frag = make_tensor<T>(partition_shape_A(mma_sx, Shape<Int<kM>, Int<kN>>{}));
  static_assert(decltype(size(s_frag))::value == kM * kN / kThreads, "S fragment size");
  constexpr int kAccVals = decltype(size(acc))::value;
  const int r0 = acc_row(0), r1 = acc_row(2);
  const int t0 = m * kM + r0, t1 = m * kM + r1;
  const bool io_fp32 = p.io_dtype == DType::kFloat32;
  const bool have_seq = seq_row != nullptr;

  for (int hh = 0; hh < nh; ++hh) {
    const int64_t h = h0 + hh;
    const float* cum_h = s_cum + hh * q;
    const float* dtp_h = s_dtp + hh * q;
    // Prefetch this head's gate into registers (consumed in the epilogue).
    // (P = 128: the registers are better spent on the accumulator; z is read in the epilogue.)
    uint32_t zraw[kAccVals / 2];
    const bool have_z = P == 64 && p.z != nullptr && !io_fp32;
    if (have_z) {
      const T* zg = static_cast<const T*>(p.z) + ci.row * p.z_sb + ci.tok0 * p.z_st + h * p.z_sh;
#pragma unroll
      for (int v = 0; v < kAccVals; v += 2) {
        const int t = m * kM + acc_row(v);
        zraw[v / 2] = t < ci.count ? *reinterpret_cast<const uint32_t*>(zg + t * p.z_st + acc_col(v)) : 0u;
      }
    }
    clear(acc);
    for (int ks = 0; ks < n_a; ++ks, ++i) {
      char* stage = begin_step();
      Tensor sC = make_tensor(make_smem_ptr(reinterpret_cast<T*>(s_c + ks * Tr::kSliceBytes)), typename Tr::LayoutC{});
      Tensor sH = make_tensor(make_smem_ptr(reinterpret_cast<T*>(stage)), typename Tr::LayoutH{});
      wgmma_sync(mma_ch, thr_ch.partition_fragment_A(sC), thr_ch.partition_fragment_B(sH), acc);
    }
    if (n_a > 0) {
      // Decay from the chunk start to each token; tokens of another sequence see no state.
      float f0 = fast_exp2(fminf(cum_h[t0], 0.0f));
      float f1 = fast_exp2(fminf(cum_h[t1], 0.0f));
      if (have_seq) {
        if (s_seq[t0] != seq_prev) f0 = 0.0f;
        if (s_seq[t1] != seq_prev) f1 = 0.0f;
      }
#pragma unroll
      for (int v = 0; v < kAccVals; ++v) acc(v) *= ((v >> 1) & 1) ? f1 : f0;
    }
    const float ct0 = cum_h[t0], ct1 = cum_h[t1];
    for (int j = 0; j <= m; ++j, ++i) {
      char* stage = begin_step();
      const int32_t q0 = have_seq ? s_seq[t0] : 0;
      const int32_t q1 = have_seq ? s_seq[t1] : 0;
#pragma unroll
      for (int v = 0; v < size(s_frag); ++v) {
        const bool hi = (v >> 1) & 1;
        const int s = j * kN + acc_col(v);
        const int t = hi ? t1 : t0;
        bool keep = (j < m) || (s <= t);
        if (have_seq) keep = keep && (s_seq[s] == (hi ? q1 : q0));
        const float f = keep ? fast_exp2(fminf((hi ? ct1 : ct0) - cum_h[s], 0.0f)) * dtp_h[s] : 0.0f;
        // The fragment orders of a 64x64 fp32 accumulator and of a 64x64 16-bit A operand
        // coincide element for element (wgmma C and A register layouts), so v maps to v.
        s_frag(v) = from_float<T>(s_cb[(j * size(s_frag) + v) * kThreads + tid] * f);
      }
      Tensor sX = make_tensor(make_smem_ptr(reinterpret_cast<T*>(stage)), typename Tr::LayoutX{});
      warpgroup_fence_operand(s_frag);
      wgmma_sync(mma_sx, s_frag, thr_sx.partition_fragment_B(sX), acc);
      if (j < m) continue;

      // ---- epilogue of head h: (acc + D x) * silu(z) -> out; x_m is this stage's tile.
#pragma unroll
      for (int v = 0; v < kAccVals; v += 2) {
        const int r = acc_row(v), c = acc_col(v);
        const int t = m * kM + r;
        if (t >= ci.count) continue;
        float y0 = acc(v), y1 = acc(v + 1);
        if (p.D != nullptr) {
          const float d0 = p.D[h * p.D_sh + c * p.D_sp], d1 = p.D[h * p.D_sh + (c + 1) * p.D_sp];
          float x0, x1;
          if (io_fp32) {
            const float* xr = p.x_f32 + ci.row * p.xf_sb + (ci.tok0 + t) * p.xf_st + h * p.xf_sh + c;
            x0 = xr[0];
            x1 = xr[1];
          } else {
            x0 = to_float(sX(c, r));
            x1 = to_float(sX(c + 1, r));
          }
          y0 += d0 * x0;
          y1 += d1 * x1;
        }
        if (have_z) {
          const T* zp = reinterpret_cast<const T*>(&zraw[v / 2]);
          y0 *= silu(to_float(zp[0]));
          y1 *= silu(to_float(zp[1]));
        } else if (p.z != nullptr) {
          const float2 zv = load2_any(p.z, p.io_dtype, ci.row * p.z_sb + (ci.tok0 + t) * p.z_st + h * p.z_sh + c);
          y0 *= silu(zv.x);
          y1 *= silu(zv.y);
        }
        store2_any(p.out, p.io_dtype, ci.row * p.out_sb + (ci.tok0 + t) * p.out_st + h * p.out_sh + c, y0, y1);
      }
    }
  }
  cp_async_wait<0>();
}

template <class T, int P, int kStages>
void launch_typed(const SsdParams& p, int hb, cudaStream_t stream) {
  const int nk = (p.dstate + kN - 1) / kN;
  const int smem = smem_bytes<T, P, kStages>(nk, p.chunk, hb);
  auto kernel = compute_out_kernel<T, P, kStages>;
  static int attr_bytes = 0;  // per instantiation: raise the dynamic shared-memory limit when needed
  if (smem > attr_bytes) {
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
               "cudaFuncSetAttribute(compute_out)");
    attr_bytes = smem;
  }
  const int64_t slices = (p.heads_per_group + hb - 1) / hb;
  const int64_t blocks = p.batch * p.nchunks * (p.chunk / kM) * p.ngroups * slices;
  if (blocks > 0x7fffffffLL) {
    throw_launch_error("compute_out: too many chunks for one launch (grid would be " + std::to_string(blocks) +
                       " blocks)");
  }
  kernel<<<static_cast<unsigned>(blocks), kThreads, smem, stream>>>(p, hb);
  check_cuda(cudaGetLastError(), "launch compute_out");
}

}  // namespace

void launch_compute_out(const SsdParams& p, const ComputeOutConfig& cfg, cudaStream_t stream) {
  const int hb = std::max(1, std::min(cfg.heads_per_cta, p.heads_per_group));
  if (p.headdim == 64) {
    if (p.fp16) launch_typed<cutlass::half_t, 64, 4>(p, hb, stream);
    else launch_typed<cutlass::bfloat16_t, 64, 4>(p, hb, stream);
  } else {
    if (p.fp16) launch_typed<cutlass::half_t, 128, 3>(p, hb, stream);
    else launch_typed<cutlass::bfloat16_t, 128, 3>(p, hb, stream);
  }
}

}  // namespace mamba2_ssd::kernels
