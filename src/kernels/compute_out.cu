// compute_out: every chunk's output from its entry state.
//
// One CTA (one warpgroup) per (row, chunk, 64-token block m of the chunk, head). With t the
// block's tokens and s the chunk's tokens up to the block's end:
//   acc  = C_m H_prev^T                     (64 x P, wgmma SS; skipped without a previous state)
//   acc *= exp(cum_t) [same sequence]        (registers)
//   for every 64-token source block j <= m:
//     CB   = C_m B_j^T                        (64 x 64, wgmma SS, fp32)
//     S    = CB * exp(min(cum_t - cum_s, 0)) * dt'_s, causal and sequence masks   (registers)
//     acc += S X_j                            (64 x P, wgmma RS: S never leaves registers)
//   out  = (acc + D x) * silu(z)
// C_m stays in shared memory for the whole CTA; H slices, B_j slices and X_j stream through a
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

// Shared-memory plan: [C_m: nk slices][kStages stages][cum Q][dt' Q][seq_idx Q], tiles 1024-aligned.
template <class T, int P, int kStages>
__host__ __device__ constexpr int smem_bytes(int nk, int q) {
  return 1024 + nk * Traits<T, P>::kSliceBytes + kStages * Traits<T, P>::kStageBytes + 3 * q * 4;
}

template <class T, class Mma, class TA, class TB, class Acc>
__device__ __forceinline__ void wgmma_sync(Mma& mma, TA const& a, TB const& b, Acc& acc) {
  warpgroup_fence_operand(acc);
  warpgroup_arrive();
  gemm(mma, a, b, acc);
  warpgroup_commit_batch();
  warpgroup_wait<0>();
  warpgroup_fence_operand(acc);
}

// Previous state of a chunk: where it is and in which dtype.
struct PrevState {
  const char* base = nullptr;  // [p][n] matrix of the head, nullptr: none (zero)
  DType dtype = DType::kFloat32;
  int64_t sp = 0;
};

template <class T, int P, int kStages>
__global__ void __launch_bounds__(kThreads) compute_out_kernel(const SsdParams p) {
  using Tr = Traits<T, P>;
  extern __shared__ __align__(1024) char smem_raw[];
  char* smem = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));

  // ---- which tile: heads fastest, so the heads of a group read the same C/B tiles together
  const int64_t mb = p.chunk / kM;
  int64_t idx = blockIdx.x;
  const int64_t h = idx % p.nheads; idx /= p.nheads;
  const int m = static_cast<int>(idx % mb); idx /= mb;
  const int64_t g = idx % p.nchunks;
  const int64_t row = idx / p.nchunks;
  const ChunkInfo ci = chunk_info(p, row, g);
  if (ci.count <= m * kM) return;

  const int tid = threadIdx.x;
  const int q = p.chunk;
  const int nk = (p.dstate + kN - 1) / kN;
  const int64_t grp = h / p.heads_per_group;
  const T* Cg = static_cast<const T*>(p.C) + ci.row * p.C_sb + ci.tok0 * p.C_st + grp * p.C_sg;
  const T* Bg = static_cast<const T*>(p.B) + ci.row * p.B_sb + ci.tok0 * p.B_st + grp * p.B_sg;
  const T* Xg = static_cast<const T*>(p.x) + ci.row * p.x_sb + ci.tok0 * p.x_st + h * p.x_sh;
  const int64_t coff = cum_offset(p, ci.row, h, g);
  const int32_t* seq_row = p.seq_idx != nullptr ? p.seq_idx + ci.row * p.seq_sb : nullptr;

  char* s_c = smem;
  char* s_stages = s_c + nk * Tr::kSliceBytes;
  float* s_cum = reinterpret_cast<float*>(s_stages + kStages * Tr::kStageBytes);
  float* s_dtp = s_cum + q;
  int32_t* s_seq = reinterpret_cast<int32_t*>(s_dtp + q);

  // ---- prologue: C_m (all dstate slices), cum, dt', seq_idx of the chunk
  for (int v = tid; v < nk * kM * kN / 8; v += kThreads) {
    const int ks = v / (kM * kN / 8), w = v % (kM * kN / 8);
    const int r = w / (kN / 8), c = (w % (kN / 8)) * 8;
    const int t = m * kM + r, n = ks * kN + c;
    Tensor sC = make_tensor(make_smem_ptr(reinterpret_cast<T*>(s_c + ks * Tr::kSliceBytes)), typename Tr::LayoutC{});
    const bool ok = t < ci.count && n < p.dstate;
    cp_async_16(&sC(r, c), ok ? Cg + t * p.C_st + n : Cg, ok);
  }
  for (int v = tid; v < q / 4; v += kThreads) {
    cp_async_16(s_cum + 4 * v, p.cum + coff + 4 * v, true);
    cp_async_16(s_dtp + 4 * v, p.dtp + coff + 4 * v, true);
  }
  if (seq_row != nullptr) {
    for (int t = tid; t < q; t += kThreads) {
      const bool ok = t < ci.count;
      cp_async_4(s_seq + t, ok ? seq_row + (ci.tok0 + t) * p.seq_st : seq_row, ok);
    }
  }
  cp_async_commit();

  // ---- the state entering this chunk
  PrevState prev;
  if (ci.local > 0) {
    const int esz = dtype_size_dev(p.state_dtype);
    prev.base = static_cast<const char*>(p.states) + (ci.row * p.st_sb + (g - 1) * p.st_sc + h * p.st_sh) * esz;
    prev.dtype = p.state_dtype;
    prev.sp = p.st_sp;
  } else if (p.init != nullptr) {
    const int esz = dtype_size_dev(p.init_dtype);
    prev.base = static_cast<const char*>(p.init) + (ci.walk * p.init_sb + h * p.init_sh) * esz;
    prev.dtype = p.init_dtype;
    prev.sp = p.init_sp;
  }
  const DType compute_dtype = p.fp16 ? DType::kFloat16 : DType::kBFloat16;
  const int32_t seq_prev = (seq_row != nullptr && ci.local > 0) ? seq_row[(ci.tok0 - 1) * p.seq_st] : 0;

  // ---- steps: [H slice 0..nk-1 if prev] then per source block j: [B_j slice 0..nk-1, X_j]
  const int n_a = prev.base != nullptr ? nk : 0;
  const int per_j = nk + 1;
  const int nsteps = n_a + (m + 1) * per_j;

  auto issue = [&](int i) {
    if (i < nsteps) {
      char* stage = s_stages + (i % kStages) * Tr::kStageBytes;
      if (i < n_a) {
        const int ks = i;
        Tensor sH = make_tensor(make_smem_ptr(reinterpret_cast<T*>(stage)), typename Tr::LayoutH{});
        if (prev.dtype == compute_dtype) {
          const T* src = reinterpret_cast<const T*>(prev.base);
          for (int v = tid; v < P * kN / 8; v += kThreads) {
            const int r = v / (kN / 8), c = (v % (kN / 8)) * 8;
            const int n = ks * kN + c;
            const bool ok = n < p.dstate;
            cp_async_16(&sH(r, c), ok ? src + r * prev.sp + n : src, ok);
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
              vals[e] = from_float<T>(n < p.dstate ? load_any(prev.base, prev.dtype, r * prev.sp + n + e) : 0.0f);
            }
            *reinterpret_cast<uint4*>(&sH(r, c)) = raw;
          }
        }
      } else {
        const int rr = i - n_a;
        const int j = rr / per_j, k = rr % per_j;
        if (k < nk) {
          Tensor sB = make_tensor(make_smem_ptr(reinterpret_cast<T*>(stage)), typename Tr::LayoutB{});
          for (int v = tid; v < kN * kN / 8; v += kThreads) {
            const int r = v / (kN / 8), c = (v % (kN / 8)) * 8;
            const int s = j * kN + r, n = k * kN + c;
            const bool ok = s < ci.count && n < p.dstate;
            cp_async_16(&sB(r, c), ok ? Bg + s * p.B_st + n : Bg, ok);
          }
        } else {
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
  Tensor acc = partition_fragment_C(mma_ch, Shape<Int<kM>, Int<P>>{});  // (64 x P) fp32
  Tensor cb = partition_fragment_C(mma_cb, Shape<Int<kM>, Int<kN>>{});   // (64 x 64) fp32
  Tensor s_frag = make_tensor<T>(partition_shape_A(mma_sx, Shape<Int<kM>, Int<kN>>{}));
  static_assert(decltype(size(cb))::value == decltype(size(s_frag))::value, "S fragment size");
  clear(acc);

  // Rows of this thread in the 64-token block.
  const int r0 = acc_row(0), r1 = acc_row(2);
  const int t0 = m * kM + r0, t1 = m * kM + r1;

  for (int i = 0; i < nsteps; ++i) {
    cp_async_wait<kStages - 2>();
    fence_async_shared();
    __syncthreads();  // step i (and the prologue) landed everywhere; stage (i-1) % kStages is free
    issue(i + kStages - 1);
    char* stage = s_stages + (i % kStages) * Tr::kStageBytes;

    if (i < n_a) {
      const int ks = i;
      Tensor sC = make_tensor(make_smem_ptr(reinterpret_cast<T*>(s_c + ks * Tr::kSliceBytes)), typename Tr::LayoutC{});
      Tensor sH = make_tensor(make_smem_ptr(reinterpret_cast<T*>(stage)), typename Tr::LayoutH{});
      wgmma_sync<T>(mma_ch, thr_ch.partition_fragment_A(sC), thr_ch.partition_fragment_B(sH), acc);
      if (ks == nk - 1) {
        // Decay from the chunk start to each token; tokens of another sequence see no state.
        float f0 = fast_exp2(fminf(s_cum[t0], 0.0f));
        float f1 = fast_exp2(fminf(s_cum[t1], 0.0f));
        if (seq_row != nullptr) {
          if (s_seq[t0] != seq_prev) f0 = 0.0f;
          if (s_seq[t1] != seq_prev) f1 = 0.0f;
        }
#pragma unroll
        for (int v = 0; v < size(acc); ++v) acc(v) *= ((v >> 1) & 1) ? f1 : f0;
      }
      continue;
    }
    const int rr = i - n_a;
    const int j = rr / per_j, k = rr % per_j;
    if (k < nk) {
      if (k == 0) clear(cb);
      Tensor sC = make_tensor(make_smem_ptr(reinterpret_cast<T*>(s_c + k * Tr::kSliceBytes)), typename Tr::LayoutC{});
      Tensor sB = make_tensor(make_smem_ptr(reinterpret_cast<T*>(stage)), typename Tr::LayoutB{});
      wgmma_sync<T>(mma_cb, thr_cb.partition_fragment_A(sC), thr_cb.partition_fragment_B(sB), cb);
      continue;
    }
    // S = masked, decayed C_m B_j^T, rounded to T: the A operand of the next product.
    const float ct0 = s_cum[t0], ct1 = s_cum[t1];
    const int32_t sq0 = seq_row != nullptr ? s_seq[t0] : 0;
    const int32_t sq1 = seq_row != nullptr ? s_seq[t1] : 0;
#pragma unroll
    for (int v = 0; v < size(cb); ++v) {
      const bool hi = (v >> 1) & 1;
      const int s = j * kN + acc_col(v);
      const int t = hi ? t1 : t0;
      bool keep = (j < m) || (s <= t);
      if (seq_row != nullptr) keep = keep && (s_seq[s] == (hi ? sq1 : sq0));
      const float f = keep ? fast_exp2(fminf((hi ? ct1 : ct0) - s_cum[s], 0.0f)) * s_dtp[s] : 0.0f;
      // The fragment orders of a 64x64 fp32 accumulator and of a 64x64 16-bit A operand
      // coincide element for element (wgmma C and A register layouts), so i maps to i.
      s_frag(v) = from_float<T>(cb(v) * f);
    }
    Tensor sX = make_tensor(make_smem_ptr(reinterpret_cast<T*>(stage)), typename Tr::LayoutX{});
    warpgroup_fence_operand(s_frag);
    wgmma_sync<T>(mma_sx, s_frag, thr_sx.partition_fragment_B(sX), acc);
  }
  cp_async_wait<0>();

  // ---- epilogue: (acc + D x) * silu(z) -> out. x comes from the X_m tile still in shared memory.
  Tensor sXm = make_tensor(make_smem_ptr(reinterpret_cast<T*>(s_stages + ((nsteps - 1) % kStages) * Tr::kStageBytes)),
                           typename Tr::LayoutX{});
  const bool io_fp32 = p.io_dtype == DType::kFloat32;
#pragma unroll
  for (int v = 0; v < size(acc); v += 2) {
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
        x0 = to_float(sXm(c, r));
        x1 = to_float(sXm(c + 1, r));
      }
      y0 += d0 * x0;
      y1 += d1 * x1;
    }
    if (p.z != nullptr) {
      const float2 zv = load2_any(p.z, p.io_dtype, ci.row * p.z_sb + (ci.tok0 + t) * p.z_st + h * p.z_sh + c);
      y0 *= silu(zv.x);
      y1 *= silu(zv.y);
    }
    store2_any(p.out, p.io_dtype, ci.row * p.out_sb + (ci.tok0 + t) * p.out_st + h * p.out_sh + c, y0, y1);
  }
}

template <class T, int P, int kStages>
void launch_typed(const SsdParams& p, cudaStream_t stream) {
  const int nk = (p.dstate + kN - 1) / kN;
  const int smem = smem_bytes<T, P, kStages>(nk, p.chunk);
  auto kernel = compute_out_kernel<T, P, kStages>;
  static int attr_bytes = 0;  // per instantiation: raise the dynamic shared-memory limit once
  if (smem > attr_bytes) {
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    smem_bytes<T, P, kStages>(8, 256)),
               "cudaFuncSetAttribute(compute_out)");
    attr_bytes = smem_bytes<T, P, kStages>(8, 256);
  }
  const int64_t blocks = p.batch * p.nchunks * (p.chunk / kM) * p.nheads;
  if (blocks > 0x7fffffffLL) {
    throw_launch_error("compute_out: too many chunks for one launch (grid would be " + std::to_string(blocks) +
                       " blocks)");
  }
  kernel<<<static_cast<unsigned>(blocks), kThreads, smem, stream>>>(p);
  check_cuda(cudaGetLastError(), "launch compute_out");
}

}  // namespace

void launch_compute_out(const SsdParams& p, const ComputeOutConfig& cfg, cudaStream_t stream) {
  (void)cfg;
  if (p.headdim == 64) {
    if (p.fp16) launch_typed<cutlass::half_t, 64, 3>(p, stream);
    else launch_typed<cutlass::bfloat16_t, 64, 3>(p, stream);
  } else {
    if (p.fp16) launch_typed<cutlass::half_t, 128, 3>(p, stream);
    else launch_typed<cutlass::bfloat16_t, 128, 3>(p, stream);
  }
}

}  // namespace mamba2_ssd::kernels
