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
// [cum: hb x Q][dt': hb x Q][D: hb x P][seq_idx: Q]; tiles 1024-aligned.
template <class T, int P, int kStages>
__host__ __device__ constexpr int smem_bytes(int nk, int q, int hb) {
  return 1024 + nk * Traits<T, P>::kSliceBytes + (q / kM) * kM * kN * 4 + kStages * Traits<T, P>::kStageBytes +
         (2 * hb + 1) * q * 4 + hb * P * 4;
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

// Rarely used paths kept out of line so the main loop stays small (instruction cache):
// a previous state in another dtype than the compute type (fp32 chunk states or initial states).
template <class T, int P>
__device__ __noinline__ void load_h_convert(char* stage, const char* hbase, DType dtype, int64_t sp, int ks,
                                            int dstate, uint32_t off_k, int r_k, int c_k) {
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

template <class T, int P, int kStages>
__global__ void __launch_bounds__(kThreads) compute_out_kernel(const SsdParams p, const int hb) {
  using Tr = Traits<T, P>;
  extern __shared__ __align__(1024) char smem_raw[];
  // 1024-byte alignment by pointer arithmetic (keeps the shared address space visible).
  char* smem = smem_raw + ((1024u - (static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) & 1023u)) & 1023u);

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
  float* s_d = s_dtp + hb * q;                                                       // [hb][P]
  int32_t* s_seq = reinterpret_cast<int32_t*>(s_d + hb * P);                         // [q]

  // ---- per-thread copy plans. Thread v = tid + 128 * it copies the 16-byte vector at
  // (row v / (cols / 8), column 8 * (v % (cols / 8))); its shared offset then advances by
  // 2048 bytes per iteration in every tile layout used here (tests/cpp/test_tile_layouts.cu).
  const int r_k = tid / 8, c_k = (tid % 8) * 8;  // K-major tiles with 64 columns (C, B, H slices)
  uint32_t off_k, off_x;
  {
    Tensor sC = make_tensor(make_smem_ptr(reinterpret_cast<T*>(smem)), typename Tr::LayoutC{});
    off_k = static_cast<uint32_t>(reinterpret_cast<char*>(&sC(r_k, c_k)) - smem);
  }
  constexpr int kXVec = P / 8;                             // vectors per X row (token)
  const int s_x = tid / kXVec, p_x = (tid % kXVec) * 8;    // X_j: (p, token), MN-major
  {
    Tensor sX = make_tensor(make_smem_ptr(reinterpret_cast<T*>(smem)), typename Tr::LayoutX{});
    off_x = static_cast<uint32_t>(reinterpret_cast<char*>(&sX(p_x, s_x)) - smem);
  }

  // ---- prologue: C_m (all dstate slices), cum / dt' / D of the heads, seq_idx of the chunk
#pragma unroll 1
  for (int ks = 0; ks < nk; ++ks) {
#pragma unroll
    for (int it = 0; it < kM / 16; ++it) {
      const int t = m * kM + r_k + 16 * it, n = ks * kN + c_k;
      const bool ok = t < ci.count && n < p.dstate;
      cp_async_16(s_c + ks * Tr::kSliceBytes + off_k + it * 2048, ok ? Cg + t * p.C_st + n : Cg, ok);
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
  const bool prev_native = prev_dtype == (p.fp16 ? DType::kFloat16 : DType::kBFloat16);
  const int prev_esz = dtype_size_dev(prev_dtype);
  const int32_t seq_prev = (seq_row != nullptr && ci.local > 0) ? seq_row[(ci.tok0 - 1) * p.seq_st] : 0;

  // ---- steps: CB phase [B_j slice ks for j <= m, ks < nk], then per head [H slices][X_0..X_m]
  const int n_cb = (m + 1) * nk;
  const int n_a = prev_base != nullptr ? nk : 0;
  const int per_head = n_a + m + 1;
  const int nsteps = n_cb + nh * per_head;

  // Per-thread global pointers of the copies (64-bit math once, not per copy).
  const T* b_thr = Bg + r_k * p.B_st + c_k;                   // + (j*64 + 16*it) rows, + ks*64 cols
  const T* x_thr = Xrow + s_x * p.x_st + p_x;                  // + h heads, + (j*64 + it*rows) rows
  const int64_t b_step = 16 * p.B_st;
  const int64_t x_step = (kThreads / kXVec) * p.x_st;
  auto issue = [&](int i) {
    if (i < nsteps) {
      char* stage = s_stages + (i % kStages) * Tr::kStageBytes;
      if (i < n_cb) {
        const int j = i / nk, ks = i % nk;
        const bool col_ok = ks * kN + c_k < p.dstate;
        const T* src = b_thr + j * kN * p.B_st + ks * kN;
#pragma unroll
        for (int it = 0; it < kN / 16; ++it) {
          const bool ok = col_ok && j * kN + r_k + 16 * it < ci.count;
          cp_async_16(stage + off_k + it * 2048, ok ? src + it * b_step : Bg, ok);
        }
      } else {
        const int rr = i - n_cb;
        const int64_t h = h0 + rr / per_head;
        const int qq = rr % per_head;
        if (qq < n_a) {
          const char* hbase = prev_base + h * prev_sh * prev_esz;
          if (prev_native) {
            const int n = qq * kN + c_k;
            const bool ok = n < p.dstate;
            const T* src = reinterpret_cast<const T*>(hbase) + r_k * prev_sp + n;
            const int64_t h_step = 16 * prev_sp;
#pragma unroll
            for (int it = 0; it < P / 16; ++it) {
              cp_async_16(stage + off_k + it * 2048, ok ? src + it * h_step : Bg, ok);
            }
          } else {
            load_h_convert<T, P>(stage, hbase, prev_dtype, prev_sp, qq, p.dstate, off_k, r_k, c_k);
          }
        } else {
          const int j = qq - n_a;
          const T* src = x_thr + h * p.x_sh + j * kN * p.x_st;
#pragma unroll
          for (int it = 0; it < kN * kXVec / kThreads; ++it) {
            const bool ok = j * kN + s_x + it * (kThreads / kXVec) < ci.count;
            cp_async_16(stage + off_x + it * 2048, ok ? src + it * x_step : Bg, ok);
          }
        }
      }
    }
    cp_async_commit();
  };

#pragma unroll 1
  for (int s = 0; s < kStages - 1; ++s) issue(s);

  typename Tr::MmaCB mma_cb;
  typename Tr::MmaCH mma_ch;
  typename Tr::MmaSX mma_sx;
  auto thr_cb = mma_cb.get_slice(tid);
  auto thr_ch = mma_ch.get_slice(tid);
  auto thr_sx = mma_sx.get_slice(tid);
  const bool have_seq = seq_row != nullptr;

  // One loop over all steps (a single copy of the load code): wait for step i's tiles (and the
  // prologue), free the previous stage, issue step i + kStages - 1, then work on step i.
  Tensor cb = partition_fragment_C(mma_cb, Shape<Int<kM>, Int<kN>>{});   // (64 x 64) fp32
  Tensor acc = partition_fragment_C(mma_ch, Shape<Int<kM>, Int<P>>{});   // (64 x P) fp32
  Tensor s_frag = make_tensor<T>(partition_shape_A(mma_sx, Shape<Int<kM>, Int<kN>>{}));
  static_assert(decltype(size(s_frag))::value == kM * kN / kThreads, "S fragment size");
  constexpr int kAccVals = decltype(size(acc))::value;
  const int t0 = m * kM + acc_row(0), t1 = m * kM + acc_row(2);
  constexpr bool kPrefetchZ = P == 64;  // P = 128: registers go to the accumulator instead
  uint32_t zraw[kPrefetchZ ? kAccVals / 2 : 1];
  const bool io16 = p.io_dtype != DType::kFloat32;
  int hh = 0, qq = 0;  // head-phase position

#pragma unroll 1
  for (int i = 0; i < nsteps; ++i) {
    cp_async_wait<kStages - 2>();
    fence_async_shared();
    __syncthreads();
    issue(i + kStages - 1);
    char* stage = s_stages + (i % kStages) * Tr::kStageBytes;

    if (i < n_cb) {
      // ---- C_m B_j^T, kept in shared memory in fragment order (each thread later reads back
      // exactly the values it wrote, so no barrier is needed).
      const int j = i / nk, ks = i % nk;
      if (ks == 0) clear(cb);
      Tensor sC = make_tensor(make_smem_ptr(reinterpret_cast<T*>(s_c + ks * Tr::kSliceBytes)), typename Tr::LayoutC{});
      Tensor sB = make_tensor(make_smem_ptr(reinterpret_cast<T*>(stage)), typename Tr::LayoutB{});
      wgmma_sync(mma_cb, thr_cb.partition_fragment_A(sC), thr_cb.partition_fragment_B(sB), cb);
      if (ks == nk - 1) {
#pragma unroll
        for (int v = 0; v < size(cb); ++v) s_cb[(j * size(cb) + v) * kThreads + tid] = cb(v);
      }
      continue;
    }

    const int64_t h = h0 + hh;
    const float* cum_h = s_cum + hh * q;
    if (qq == 0) {
      clear(acc);
      if constexpr (kPrefetchZ) {
        // This head's gate, into registers now, used in the epilogue.
        if (p.z != nullptr && io16) {
          const T* zg = static_cast<const T*>(p.z) + ci.row * p.z_sb + ci.tok0 * p.z_st + h * p.z_sh;
#pragma unroll
          for (int v = 0; v < kAccVals; v += 2) {
            const int t = m * kM + acc_row(v);
            zraw[v / 2] = t < ci.count ? *reinterpret_cast<const uint32_t*>(zg + t * p.z_st + acc_col(v)) : 0u;
          }
        }
      }
    }
    if (qq < n_a) {
      // ---- acc += C_m H_prev^T over one dstate slice
      Tensor sC = make_tensor(make_smem_ptr(reinterpret_cast<T*>(s_c + qq * Tr::kSliceBytes)), typename Tr::LayoutC{});
      Tensor sH = make_tensor(make_smem_ptr(reinterpret_cast<T*>(stage)), typename Tr::LayoutH{});
      wgmma_sync(mma_ch, thr_ch.partition_fragment_A(sC), thr_ch.partition_fragment_B(sH), acc);
      if (qq == n_a - 1) {
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
    } else {
      // ---- acc += S X_j with S = masked, decayed C_m B_j^T rounded to T (register A operand)
      const int j = qq - n_a;
      const float* dtp_h = s_dtp + hh * q;
      const float ct0 = cum_h[t0], ct1 = cum_h[t1];
      const int32_t q0 = have_seq ? s_seq[t0] : 0;
      const int32_t q1 = have_seq ? s_seq[t1] : 0;
#pragma unroll
      for (int v = 0; v < size(s_frag); ++v) {
        const bool hi = (v >> 1) & 1;
        const int s = j * kN + acc_col(v);
        bool keep = (j < m) || (s <= (hi ? t1 : t0));
        if (have_seq) keep = keep && (s_seq[s] == (hi ? q1 : q0));
        const float f = keep ? fast_exp2(fminf((hi ? ct1 : ct0) - cum_h[s], 0.0f)) * dtp_h[s] : 0.0f;
        // The fragment orders of a 64x64 fp32 accumulator and of a 64x64 16-bit A operand
        // coincide element for element (wgmma C and A register layouts), so v maps to v.
        s_frag(v) = from_float<T>(s_cb[(j * size(s_frag) + v) * kThreads + tid] * f);
      }
      Tensor sX = make_tensor(make_smem_ptr(reinterpret_cast<T*>(stage)), typename Tr::LayoutX{});
      warpgroup_fence_operand(s_frag);
      wgmma_sync(mma_sx, s_frag, thr_sx.partition_fragment_B(sX), acc);

      if (j == m) {
        // ---- epilogue of head h: (acc + D x) * silu(z) -> out; x_m is this stage's tile.
        const float* s_dh = s_d + hh * P;
        const int64_t tok_base = ci.row * p.out_sb + ci.tok0 * p.out_st + h * p.out_sh;
#pragma unroll
        for (int v = 0; v < kAccVals; v += 2) {
          const int r = acc_row(v), c = acc_col(v);
          const int t = m * kM + r;
          if (t >= ci.count) continue;
          float y0 = acc(v), y1 = acc(v + 1);
          if (p.D != nullptr) {
            float x0, x1;
            if (io16) {
              const uint32_t xw = *reinterpret_cast<const uint32_t*>(&sX(c, r));
              const T* xv = reinterpret_cast<const T*>(&xw);
              x0 = to_float(xv[0]);
              x1 = to_float(xv[1]);
            } else {  // fp32 inputs: the residual in fp32, from the original x
              const float2 xf = *reinterpret_cast<const float2*>(
                  p.x_f32 + ci.row * p.xf_sb + (ci.tok0 + t) * p.xf_st + h * p.xf_sh + c);
              x0 = xf.x;
              x1 = xf.y;
            }
            y0 += s_dh[c] * x0;
            y1 += s_dh[c + 1] * x1;
          }
          if (p.z != nullptr) {
            float z0, z1;
            if (io16) {
              uint32_t zw;
              if constexpr (kPrefetchZ) zw = zraw[v / 2];
              else zw = *reinterpret_cast<const uint32_t*>(static_cast<const T*>(p.z) + ci.row * p.z_sb +
                                                           (ci.tok0 + t) * p.z_st + h * p.z_sh + c);
              const T* zv = reinterpret_cast<const T*>(&zw);
              z0 = to_float(zv[0]);
              z1 = to_float(zv[1]);
            } else {
              const float2 zf = *reinterpret_cast<const float2*>(static_cast<const float*>(p.z) + ci.row * p.z_sb +
                                                                 (ci.tok0 + t) * p.z_st + h * p.z_sh + c);
              z0 = zf.x;
              z1 = zf.y;
            }
            y0 *= silu(z0);
            y1 *= silu(z1);
          }
          const int64_t o = tok_base + t * p.out_st + c;
          if (io16) {
            T pair[2] = {from_float<T>(y0), from_float<T>(y1)};
            *reinterpret_cast<uint32_t*>(static_cast<T*>(p.out) + o) = *reinterpret_cast<const uint32_t*>(pair);
          } else {
            *reinterpret_cast<float2*>(static_cast<float*>(p.out) + o) = make_float2(y0, y1);
          }
        }
      }
    }
    if (++qq == per_head) { qq = 0; ++hh; }
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
