// Shared by the kernels: the launch parameters, chunk bookkeeping, async-copy and math helpers.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include <cutlass/bfloat16.h>
#include <cutlass/half.h>

#include "mamba2_ssd/types.hpp"

namespace mamba2_ssd::kernels {

// Everything a kernel needs, by value. Strides are in elements; the innermost stride of every
// tensor read with vector loads is 1 (validate() guarantees it).
struct SsdParams {
  // ---- sizes
  int64_t batch;         // rows (1 for varlen)
  int64_t seqlen;        // tokens per row (total tokens for varlen)
  int32_t nheads, headdim, ngroups, dstate;
  int32_t heads_per_group;
  int32_t chunk;         // Q
  int64_t nchunks;       // chunks per row (varlen: upper bound on all chunks)
  int32_t nseq;          // sequences (varlen layout, or batched cu_seqlens), else 0
  bool varlen;           // Layout::kVarlen
  bool fp16;             // compute type: fp16 (else bf16)

  // ---- inputs, in the 16-bit compute type (fp32 inputs point at converted copies)
  const void* x;  int64_t x_sb, x_st, x_sh;
  const void* B;  int64_t B_sb, B_st, B_sg;
  const void* C;  int64_t C_sb, C_st, C_sg;
  const void* dt; DType dt_dtype; int64_t dt_sb, dt_st, dt_sh;
  const float* A; int64_t A_s;
  const float* dt_bias; int64_t dt_bias_s;   // nullptr: absent
  bool dt_softplus;
  float dt_min, dt_max;
  const float* D; int64_t D_sh, D_sp;        // D_sp = 0 for a per-head D
  const void* z;  int64_t z_sb, z_st, z_sh;  // nullptr: absent; dtype io_dtype
  // fp32 inputs: the original x (the D * x residual reads it in fp32)
  const float* x_f32; int64_t xf_sb, xf_st, xf_sh;
  const void* init; DType init_dtype; int64_t init_sb, init_sh, init_sp;  // [walk][h][p][n]
  const int32_t* seq_idx; int64_t seq_sb, seq_st;
  const void* cu_seqlens; bool cu_seqlens_i64;

  // ---- intermediates (workspace or caller buffers)
  float* cum;   // [row][h][chunk][Q]: running sum of A*dt' from the chunk start, times log2(e)
  float* dtp;   // [row][h][chunk][Q]: dt' (0 on padding)
  float* wst;   // [row][h][chunk][Q]: state weight exp(min(cum_last - cum, 0)) * dt', 0 for
                //                     tokens of another sequence than the chunk's last token;
                //                     nullptr where every reader takes wst_pairs instead
  float* carry; // [row][h][chunk]:    exp(cum_last), 0 when a new sequence starts in the chunk
  void* states; DType state_dtype; int64_t st_sb, st_sc, st_sh, st_sp;  // state after each chunk
  int32_t* chunk_offsets;  // varlen: [nseq + 1] first chunk of each sequence
  // [walk][head][ready_tiles]: chunks of the walk whose state fwd_pass_state's CTA `tile` has
  // stored (zeroed by chunk_cumsum). compute_out runs alongside fwd_pass_state and waits on these
  // before it reads a chunk state. ready_tiles: fwd_pass_state's CTAs per (walk, head).
  // nullptr: no overlap, compute_out is launched after fwd_pass_state.
  int32_t* ready; int32_t ready_tiles;
  // Walk segments: fwd_pass_state splits each walk into nseg runs of seg_chunks chunks, walked by
  // separate CTAs (varlen: the same length for every sequence, a short one's later runs empty);
  // the first run has seg0_chunks (fused_walk only: shorter where that balances the SMs, see
  // segment_range; else seg_chunks). A first launch sums each segment but the last from a zero
  // state (segment 0 from the initial state) into seg_sums ([walk][head][segment][tile][64 x NT]
  // in accumulator-fragment order) with the product of its carries in seg_carry
  // ([walk][head][segment]); the walking launch starts segment k from
  // T_k = seg_carry[k-1] T_{k-1} + seg_sums[k-1]. ready is then [walk][head][segment][tile], a
  // counter holding the absolute chunk count its CTA has stored up to. nseg = 1: no segments
  // (seg_chunks >= every walk's chunk count; nchunks, the varlen layout's bound on all chunks, is).
  // (sum_split in the padding after seg0_chunks, where the others' offsets stay; sum_tile and
  // sum_part_chunks: at the end)
  int32_t nseg, seg_chunks, seg0_chunks, sum_split;
  float* seg_sums; float* seg_carry;
  // The segment sums compute cum, dtp, wst and carry (chunk_decay.cuh) of their own chunks and,
  // shared among them, of the last segment's, and store them for fused_walk, instead of
  // chunk_cumsum computing them first (segments of at most kSumsCumsumMaxChunks chunks). Requires
  // ready == nullptr (chunk_cumsum zeroes it).
  bool sums_cumsum;

  // ---- outputs
  void* out; DType io_dtype; int64_t out_sb, out_st, out_sh;
  void* final_states; DType fin_dtype; int64_t fin_sb, fin_sh, fin_sp;
  void* varlen_states; DType vs_dtype; int64_t vs_sb, vs_sh, vs_sp;

  // ---- fused_walk's segment sums (sum_split: above, beside nseg, in the same constant-cache line;
  // the others added last, so that no other field moved)
  // sum_split: the sums launch splits each summed segment into sum_split parts of
  // sum_part_chunks chunks (the last may be shorter or empty), one CTA chain each, stored in
  // order ([walk][head][segment x sum_split + part]): the state entering segment k combines the
  // first k x sum_split of them the same way (fused_walk only, without sums_cumsum; else 1).
  // sum_tile: the sums launch's column tile (64 or 128; host side only); sum_part_chunks:
  // ceil(the longest summed segment / sum_split) (seg0_chunks for two segments, else seg_chunks).
  int32_t sum_tile, sum_part_chunks;
  // fused_walk's specialised kernel: heads per CTA, 2 only at dstate <= 64 with an even number of
  // heads per group (fused_walk_specialized_pairs), else 1.
  int32_t ws_heads;
  // fused_walk's specialised kernel in two segments (the first the shorter): the second
  // segment's CTAs walk the first segment's chunks themselves, state only, from the walk's
  // initial state, instead of starting from segment sums (none are launched).
  bool prewalk;
  // wst in pairs of bf16 terms (bf16 compute type, chunk_cumsum's wst): [row][h][chunk][Q/2]
  // pairs of slots, slot 2i holding hi = bf16(w) of tokens 2i, 2i + 1 (low half: token 2i) and
  // slot 2i + 1 lo = bf16(w - hi) of the same two tokens, so that x * w is one HMUL2 and one
  // HFMA2 per two tokens (scale_by_weight_pairs). chunk_cumsum writes it where it is not
  // nullptr; the sums without chunk_cumsum's work and the specialised fused_walk's forms that
  // scale by pairs (fused_walk_specialized_reads_pairs) read it in place of wst.
  float* wst_pairs;
  // For fused_walk's specialised kernel (without a pre-walk; the launch's rule for where it pays:
  // meta_for_walk_where_it_pays): chunk_cumsum stores what that kernel's state warpgroup would
  // otherwise compute at every chunk from cum and dt' (and wait for at a barrier): in dt''s
  // place e = cum - log2(dt') (cum taken as 0 where A > 0), in wst's the kernel's weights, block
  // 0's tokens weighted to the middle of the chunk, exp2(cum_63 - e), and block 1's as wst (A > 0:
  // every token as wst), as bf16 pairs where walk_pairs (the forms that scale by pairs). dt' and
  // the fp32 wst are then not stored; wst_pairs, where given, still holds the pairs of wst for the
  // segment sums. The bits of every output are those of the kernel computing them itself.
  bool walk_meta, walk_pairs;
};

constexpr float kLog2e = 1.4426950408889634f;

// ------------------------------------------------------------------ element conversions
// Kernel element types are cutlass::bfloat16_t / cutlass::half_t (what CuTe's GMMA atoms take);
// their float constructors round to nearest even.
template <class T>
__device__ __forceinline__ float to_float(T v) { return static_cast<float>(v); }
template <class T>
__device__ __forceinline__ T from_float(float v) { return T(v); }

// w as two bf16 terms per pair of tokens (SsdParams::wst_pairs): hi = bf16(w), lo = bf16(w - hi),
// for tokens (w0, w1), as the bits of two float slots.
__device__ __forceinline__ float2 weight_pair(float w0, float w1) {
  const __nv_bfloat162 hi = __floats2bfloat162_rn(w0, w1);
  const __nv_bfloat162 lo = __floats2bfloat162_rn(w0 - __low2float(hi), w1 - __high2float(hi));
  return make_float2(__uint_as_float(*reinterpret_cast<const uint32_t*>(&hi)),
                     __uint_as_float(*reinterpret_cast<const uint32_t*>(&lo)));
}

// x * w of a bf16 fragment whose 32-bit registers hold two consecutive tokens each (value 2e the
// even token tok_of(2e), 2e + 1 the next), w in weight pairs: round(x * hi + round(x * lo)) in
// two instructions per register, where x * w in fp32 takes five (two unpacks, two FMULs, a
// pack). Both round once to bf16 what differs from x * w by about 2^-15 of it at most (lo is
// within 2^-8 of hi, and rounded, as x * lo, to 2^-8 of itself), so they differ at near-ties only.
template <class Frag, class TokOf>
__device__ __forceinline__ void scale_by_weight_pairs(Frag& xw, TokOf tok_of, const float* pairs) {
  uint32_t* r = reinterpret_cast<uint32_t*>(xw.data());
#pragma unroll
  for (int e = 0; e < decltype(size(xw))::value / 2; ++e) {
    const float2 hl = *reinterpret_cast<const float2*>(pairs + tok_of(2 * e));
    const uint32_t hi_bits = __float_as_uint(hl.x), lo_bits = __float_as_uint(hl.y);
    const __nv_bfloat162 hi = *reinterpret_cast<const __nv_bfloat162*>(&hi_bits);
    const __nv_bfloat162 lo = *reinterpret_cast<const __nv_bfloat162*>(&lo_bits);
    __nv_bfloat162 v = *reinterpret_cast<const __nv_bfloat162*>(r + e);
    v = __hfma2(v, hi, __hmul2(v, lo));
    r[e] = *reinterpret_cast<const uint32_t*>(&v);
  }
}

__host__ __device__ __forceinline__ int dtype_size_dev(DType t) {
  return t == DType::kFloat32 || t == DType::kInt32 ? 4 : t == DType::kInt64 ? 8 : 2;
}

// Loads / stores one element whose dtype is only known at run time (small tensors, epilogues).
__device__ __forceinline__ float load_any(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::kFloat32: return static_cast<const float*>(p)[i];
    case DType::kBFloat16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case DType::kFloat16: return __half2float(static_cast<const __half*>(p)[i]);
    default: return 0.0f;
  }
}
__device__ __forceinline__ void store_any(void* p, DType t, int64_t i, float v) {
  switch (t) {
    case DType::kFloat32: static_cast<float*>(p)[i] = v; break;
    case DType::kBFloat16: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v); break;
    case DType::kFloat16: static_cast<__half*>(p)[i] = __float2half_rn(v); break;
    default: break;
  }
}
// Two consecutive elements (i, i+1); i is even and the row is 4/8-byte aligned.
__device__ __forceinline__ void store2_any(void* p, DType t, int64_t i, float v0, float v1) {
  switch (t) {
    case DType::kFloat32: *reinterpret_cast<float2*>(static_cast<float*>(p) + i) = make_float2(v0, v1); break;
    case DType::kBFloat16:
      *reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(p) + i) = __floats2bfloat162_rn(v0, v1);
      break;
    case DType::kFloat16:
      *reinterpret_cast<__half2*>(static_cast<__half*>(p) + i) = __floats2half2_rn(v0, v1);
      break;
    default: break;
  }
}
__device__ __forceinline__ float2 load2_any(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::kFloat32: return *reinterpret_cast<const float2*>(static_cast<const float*>(p) + i);
    case DType::kBFloat16:
      return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(static_cast<const __nv_bfloat16*>(p) + i));
    case DType::kFloat16:
      return __half22float2(*reinterpret_cast<const __half2*>(static_cast<const __half*>(p) + i));
    default: return make_float2(0.f, 0.f);
  }
}

// ------------------------------------------------------------------ math
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// log2 without flushing subnormals; log2(0) = -inf.
__device__ __forceinline__ float fast_log2(float x) {
  float y;
  asm("lg2.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// v * sigmoid(v) with the fast division (no IEEE slow path): exp(-v) = inf gives 0, as it should.
__device__ __forceinline__ float silu(float v) { return __fdividef(v, 1.0f + __expf(-v)); }

// ------------------------------------------------------------------ async copies (sm80+)
// 16-byte global->shared copy; `valid == false` fills the 16 bytes with zeros and reads nothing.
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }
// Orders this thread's generic-proxy shared-memory writes (cp.async included) before later
// async-proxy reads (wgmma operands); a barrier must follow.
__device__ __forceinline__ void fence_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Named barrier `id` (1-15; 0 is __syncthreads') of `count` threads, whole warps: arrive without
// waiting, or arrive and wait for the others.
__device__ __forceinline__ void named_barrier_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void named_barrier_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// ------------------------------------------------------------------ overlap of two kernels
// fwd_pass_state and compute_out overlap (programmatic dependent launch): fwd_pass_state lets
// compute_out start once all of its CTAs are resident, and publishes per-tile progress counters
// that compute_out waits on. No CTA of fwd_pass_state ever waits for compute_out, and all of
// them are resident before any compute_out CTA starts, so the waits cannot deadlock.
__device__ __forceinline__ void pdl_launch_dependents() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
// Waits until the preceding kernel of the stream has completed and its writes are visible.
__device__ __forceinline__ void pdl_wait_primary() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ int32_t load_acquire(const int32_t* f) {
  int32_t v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(f) : "memory");
  return v;
}
// Makes this thread's earlier global writes (and, after a barrier, its CTA's) visible before
// the counter reads `value`.
__device__ __forceinline__ void store_release(int32_t* f, int32_t value) {
  asm volatile("st.release.gpu.global.s32 [%0], %1;" ::"l"(f), "r"(value) : "memory");
}

// ------------------------------------------------------------------ chunks and walks
// Where one chunk's tokens are. A "walk" is a batch row (batched layout) or a sequence
// (varlen layout): the unit whose state is carried from chunk to chunk.
struct ChunkInfo {
  int64_t row;         // batch index for the input/output tensors (0 for varlen)
  int64_t tok0;        // first token of the chunk within the row
  int32_t count;       // valid tokens (1..Q); 0: this chunk index is unused
  int64_t walk;        // batch row or sequence index
  int64_t local;       // chunk index within the walk
};

__device__ __forceinline__ int64_t load_cu(const SsdParams& p, int64_t i) {
  return p.cu_seqlens_i64 ? static_cast<const int64_t*>(p.cu_seqlens)[i]
                          : static_cast<const int32_t*>(p.cu_seqlens)[i];
}

// Chunk `g` of row `row` (batched) or global chunk `g` (varlen).
__device__ __forceinline__ ChunkInfo chunk_info(const SsdParams& p, int64_t row, int64_t g) {
  ChunkInfo ci;
  if (!p.varlen) {
    ci.row = row;
    ci.walk = row;
    ci.local = g;
    ci.tok0 = g * p.chunk;
    const int64_t left = p.seqlen - ci.tok0;
    ci.count = left <= 0 ? 0 : static_cast<int32_t>(left < p.chunk ? left : p.chunk);
    return ci;
  }
  ci.row = 0;
  // Binary search: the last sequence i with chunk_offsets[i] <= g.
  int lo = 0, hi = p.nseq;  // chunk_offsets has nseq + 1 entries
  if (g >= p.chunk_offsets[p.nseq]) {
    ci.count = 0; ci.walk = 0; ci.local = 0; ci.tok0 = 0;
    return ci;
  }
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (p.chunk_offsets[mid] <= g) lo = mid; else hi = mid;
  }
  // Skip empty sequences that share the offset.
  ci.walk = lo;
  ci.local = g - p.chunk_offsets[lo];
  const int64_t start = load_cu(p, lo), end = load_cu(p, lo + 1);
  ci.tok0 = start + ci.local * p.chunk;
  const int64_t left = end - ci.tok0;
  ci.count = left <= 0 ? 0 : static_cast<int32_t>(left < p.chunk ? left : p.chunk);
  return ci;
}

// Offset of (row, head, chunk g, slot 0) in cum / dtp / wst; of (row, head, chunk g) in carry.
__device__ __forceinline__ int64_t cum_offset(const SsdParams& p, int64_t row, int64_t h, int64_t g) {
  return ((row * p.nheads + h) * p.nchunks + g) * p.chunk;
}
__device__ __forceinline__ int64_t carry_offset(const SsdParams& p, int64_t row, int64_t h, int64_t g) {
  return (row * p.nheads + h) * p.nchunks + g;
}

// The chunk range of a walk and the position of chunk `local` of it.
struct Walk {
  int64_t row, walk, g0, nchunks;
  int64_t tok_begin, tok_end;
};

__device__ __forceinline__ Walk make_walk(const SsdParams& p, int64_t w) {
  Walk k;
  k.walk = w;
  if (!p.varlen) {
    k.row = w; k.g0 = 0; k.nchunks = p.nchunks; k.tok_begin = 0; k.tok_end = p.seqlen;
  } else {
    k.row = 0;
    k.g0 = p.chunk_offsets[w];
    k.nchunks = p.chunk_offsets[w + 1] - k.g0;
    k.tok_begin = load_cu(p, w);
    k.tok_end = load_cu(p, w + 1);
  }
  return k;
}

// The chunks [begin, end) of walk segment `seg` in a walk of `nchunks` chunks: segment 0 has
// seg0_chunks, the others seg_chunks, the last up to the walk's end (begin >= nchunks: an empty
// segment of a short varlen sequence).
struct SegmentRange {
  int64_t begin, end;
};
__device__ __forceinline__ SegmentRange segment_range(const SsdParams& p, int seg, int64_t nchunks) {
  // (in 32 bits: a walk has fewer than 2^30 chunks; segment 0 has `shorter` fewer than the others)
  const int32_t shorter = p.seg_chunks - p.seg0_chunks;
  const int32_t begin = seg * p.seg_chunks - (seg > 0 ? shorter : 0);
  const int32_t end = begin + p.seg_chunks - (seg > 0 ? 0 : shorter);
  return {begin, p.nseg > 1 && end < nchunks ? end : nchunks};
}
// The segment sums stored per (walk, head) (see sum_split).
__device__ __forceinline__ int sums_per_walk_head(const SsdParams& p) { return (p.nseg - 1) * p.sum_split; }
// fused_walk's walk and segment for the CTA index `z` of `walks` x nseg: walk-major (z / nseg,
// z % nseg), but with a short first segment the long segments of every walk first and the short
// ones after them, so that the long runs start in the first wave and the short ones fill the SMs
// beside them and the tail of the last wave (tuning.hpp: first_segment_chunks,
// multi_wave_first_segment).
struct FusedCta {
  int64_t walk;
  int seg;
};
__device__ __forceinline__ FusedCta fused_cta(const SsdParams& p, unsigned z, unsigned walks) {
  if (p.seg0_chunks < p.seg_chunks) return {static_cast<int64_t>(z % walks), p.nseg - 1 - static_cast<int>(z / walks)};
  return {static_cast<int64_t>(z / static_cast<unsigned>(p.nseg)), static_cast<int>(z % static_cast<unsigned>(p.nseg))};
}
// The same segment with walk-major CTAs (walk z / nseg) for fused_walk's other kernels, which
// never run a short first segment (its long-first order there made the three-per-SM kernel spill).
__device__ __forceinline__ int fused_segment(const SsdParams& p, unsigned z) {
  const int s = static_cast<int>(z % static_cast<unsigned>(p.nseg));
  return p.seg0_chunks < p.seg_chunks ? p.nseg - 1 - s : s;
}

__device__ __forceinline__ ChunkInfo walk_chunk(const SsdParams& p, const Walk& k, int64_t local) {
  ChunkInfo ci;
  ci.row = k.row;
  ci.walk = k.walk;
  ci.local = local;
  ci.tok0 = k.tok_begin + local * p.chunk;
  const int64_t left = k.tok_end - ci.tok0;
  ci.count = static_cast<int32_t>(left < p.chunk ? left : p.chunk);
  return ci;
}

}  // namespace mamba2_ssd::kernels
