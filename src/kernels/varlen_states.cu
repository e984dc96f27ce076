// varlen_states (batched layout with cu_seqlens): the final state of every packed sequence, as
// mamba_ssm's chunk_state_varlen computes it. For sequence i = [start, end) whose last token
// e = end - 1 lies in chunk k:
//   H_i = [start < kQ] exp(cum_e) H_after(k-1) + X^T (B * exp(min(cum_e - cum, 0)) * dt')
// over the tokens max(start, kQ)..e of chunk k. One CTA per (64 x NT state tile, head,
// sequence); the chunk's (at most Q/64) token steps are all loaded at once.
#include "kernels/kernels.hpp"
#include "kernels/state_tile.cuh"

namespace mamba2_ssd::kernels {

namespace {

using namespace cute;
namespace st = state_tile;
constexpr int kNT = 64;
constexpr int kMaxSteps = 4;  // Q <= 256

template <class T>
__global__ void __launch_bounds__(st::kThreads) varlen_states_kernel(const SsdParams p) {
  using Tl = st::Tiles<T, kNT>;
  extern __shared__ __align__(1024) char smem_raw[];
  char* smem = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  pdl_wait_primary();  // (launched early behind the walk: see launch_kernel)

  const int n_tiles = (p.dstate + kNT - 1) / kNT;
  const int p0 = (blockIdx.x / n_tiles) * st::kP;
  const int n0 = (blockIdx.x % n_tiles) * kNT;
  const int64_t h = blockIdx.y;
  const int64_t i = blockIdx.z;
  const int64_t start = load_cu(p, i), end = load_cu(p, i + 1);
  char* dst = static_cast<char*>(p.varlen_states) + (i * p.vs_sb + h * p.vs_sh) * (int64_t)dtype_size_dev(p.vs_dtype);

  auto acc = st::make_acc<T, kNT>();
  clear(acc);
  if (end <= start) {  // empty sequence: zero state
    st::store_tile(acc, dst, p.vs_dtype, p.vs_sp, p0, n0, p);
    return;
  }
  const int64_t e = end - 1;
  const int64_t k = e / p.chunk;
  const int slot_e = static_cast<int>(e - k * p.chunk);
  const int lo = start > k * p.chunk ? static_cast<int>(start - k * p.chunk) : 0;
  const int64_t off = cum_offset(p, 0, h, k);

  ChunkInfo ci;
  ci.row = 0; ci.walk = i; ci.local = k; ci.tok0 = k * p.chunk; ci.count = slot_e + 1;
  const int first = lo / st::kK, last = slot_e / st::kK;
  for (int s = first; s <= last; ++s) {
    st::issue_step<T, kNT>(p, smem + (s - first) * Tl::kStageBytes, ci, s * st::kK, h, p0, n0, p.cum + off,
                           p.dtp + off, nullptr, slot_e);
  }
  cp_async_commit();
  if (start < k * p.chunk) {
    // The state after chunk k-1 (k >= 1 here), decayed to e.
    const char* src = static_cast<const char*>(p.states) +
                      ((k - 1) * p.st_sc + h * p.st_sh) * (int64_t)dtype_size_dev(p.state_dtype);
    st::load_tile(acc, src, p.state_dtype, p.st_sp, p0, n0, p);
    const float decay = fast_exp2(fminf(p.cum[off + slot_e], 0.0f));
#pragma unroll
    for (int v = 0; v < size(acc); ++v) acc(v) *= decay;
  }
  cp_async_wait<0>();
  __syncthreads();
  const float c_end = st::stage_meta<T, kNT>(smem).cum_last[0];
  for (int s = first; s <= last; ++s) {
    st::scale_b<T, kNT>(smem + (s - first) * Tl::kStageBytes, s * st::kK, lo, slot_e, c_end, false, 0);
  }
  fence_async_shared();
  __syncthreads();
  for (int s = first; s <= last; ++s) st::mma_step<T, kNT>(smem + (s - first) * Tl::kStageBytes, acc);
  st::store_tile(acc, dst, p.vs_dtype, p.vs_sp, p0, n0, p);
}

template <class T>
void launch_typed(const SsdParams& p, cudaStream_t stream) {
  using Tl = st::Tiles<T, kNT>;
  const int smem = kMaxSteps * Tl::kStageBytes + 1024;
  auto kernel = varlen_states_kernel<T>;
  raise_smem_limit(reinterpret_cast<const void*>(kernel), smem, false, "cudaFuncSetAttribute(varlen_states)");
  const int p_tiles = (p.headdim + st::kP - 1) / st::kP;
  const int n_tiles = (p.dstate + kNT - 1) / kNT;
  dim3 grid(p_tiles * n_tiles, p.nheads, p.nseq);
  launch_kernel(kernel, grid, dim3(st::kThreads), smem, stream, true, 1, "launch varlen_states", p);
}

}  // namespace

void launch_varlen_states(const SsdParams& p, cudaStream_t stream) {
  if (p.nseq == 0) return;
  if (p.fp16) launch_typed<cutlass::half_t>(p, stream);
  else launch_typed<cutlass::bfloat16_t>(p, stream);
}

}  // namespace mamba2_ssd::kernels
