// fwd_pass_state: the state after every chunk.
//
// One CTA per (walk, head, 64-row headdim tile, NT-column dstate tile). It walks the walk's
// chunks in order, keeping its state slice in wgmma accumulator registers (fp32):
//   H = carry * exp(cum_last) * H + X^T (B * exp(min(cum_last - cum, 0)) * dt')
// and stores H after each chunk (the chunk states that compute_out reads) and after the last
// chunk (final_states). Tiles of 64 tokens stream through a ring of kStages cp.async stages, so
// the loads of the next steps are in flight while the current one is multiplied.
#include "kernels/kernels.hpp"
#include "kernels/state_tile.cuh"

namespace mamba2_ssd::kernels {

namespace {

using namespace cute;
namespace st = state_tile;

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

template <class T, int NT, int kStages>
__global__ void __launch_bounds__(st::kThreads) fwd_pass_state_kernel(const SsdParams p) {
  using Tl = st::Tiles<T, NT>;
  extern __shared__ __align__(1024) char smem_raw[];
  char* smem = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));

  const int n_tiles = (p.dstate + NT - 1) / NT;
  const int p0 = (blockIdx.x / n_tiles) * st::kP;
  const int n0 = (blockIdx.x % n_tiles) * NT;
  const int64_t h = blockIdx.y;
  const Walk walk = make_walk(p, blockIdx.z);
  const int steps_per_chunk = p.chunk / st::kK;

  auto acc = st::make_acc<T, NT>();
  if (p.init != nullptr) {
    const void* src = static_cast<const char*>(p.init) +
                      (walk.walk * p.init_sb + h * p.init_sh) * (int64_t)dtype_size_dev(p.init_dtype);
    st::load_tile(acc, src, p.init_dtype, p.init_sp, p0, n0, p);
  } else {
    clear(acc);
  }

  // Steps of the walk: chunk c, 64-token step k of it. The last chunk may have fewer steps.
  auto steps_of = [&](int64_t c) -> int {
    const ChunkInfo ci = walk_chunk(p, walk, c);
    return (ci.count + st::kK - 1) / st::kK;
  };
  const int32_t* seq_row = p.seq_idx != nullptr ? p.seq_idx + walk.row * p.seq_sb : nullptr;

  // Producer cursor.
  int64_t ld_c = 0;
  int ld_k = 0;
  auto issue_next = [&](int stage_idx) {
    if (ld_c < walk.nchunks) {
      const ChunkInfo ci = walk_chunk(p, walk, ld_c);
      const int64_t g = walk.g0 + ld_c;
      const int64_t off = cum_offset(p, walk.row, h, g);
      const int32_t* seq = seq_row != nullptr ? seq_row + ci.tok0 * p.seq_st : nullptr;
      st::issue_step<T, NT>(p, smem + stage_idx * Tl::kStageBytes, ci, ld_k * st::kK, h, p0, n0, p.cum + off,
                            p.dtp + off, seq, p.chunk - 1);
      if (++ld_k == steps_of(ld_c)) { ld_k = 0; ++ld_c; }
    }
    cp_async_commit();
  };

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) issue_next(s);

  int32_t seq_prev = 0;  // seq_idx of the previous chunk's last token (0 before the first)
  int stage = 0;
  const DType sd = p.state_dtype;
  const int64_t esz = dtype_size_dev(sd);
  for (int64_t c = 0; c < walk.nchunks; ++c) {
    const ChunkInfo ci = walk_chunk(p, walk, c);
    const int nsteps = (ci.count + st::kK - 1) / st::kK;
    (void)steps_per_chunk;
    for (int k = 0; k < nsteps; ++k) {
      cp_async_wait<kStages - 2>();
      __syncthreads();  // stage `stage` landed for all threads; the previous stage is free
      issue_next((stage + kStages - 1) % kStages);
      char* sp = smem + stage * Tl::kStageBytes;
      const st::StageMeta m = st::stage_meta<T, NT>(sp);
      const float c_last = *m.cum_last;
      const bool use_seq = seq_row != nullptr;
      const int32_t seq_last = use_seq ? *m.seq_last : 0;
      st::scale_b<T, NT>(sp, k * st::kK, 0, ci.count - 1, c_last, use_seq, seq_last);
      fence_async_shared();
      __syncthreads();
      if (k == 0) {
        // Decay of the carried state over this chunk (zero when a new sequence starts in it).
        const float carry = (!use_seq || seq_last == seq_prev) ? fast_exp2(fminf(c_last, 0.0f)) : 0.0f;
        seq_prev = seq_last;
#pragma unroll
        for (int v = 0; v < size(acc); ++v) acc(v) *= carry;
      }
      st::mma_step<T, NT>(sp, acc);
      stage = (stage + 1) % kStages;
    }
    // The state after chunk c.
    if (p.states != nullptr) {
      const int64_t g = walk.g0 + c;
      char* dst = static_cast<char*>(p.states) + (walk.row * p.st_sb + g * p.st_sc + h * p.st_sh) * esz;
      st::store_tile(acc, dst, sd, p.st_sp, p0, n0, p);
    }
  }
  cp_async_wait<0>();
  if (p.final_states != nullptr) {
    char* dst = static_cast<char*>(p.final_states) +
                (walk.walk * p.fin_sb + h * p.fin_sh) * (int64_t)dtype_size_dev(p.fin_dtype);
    st::store_tile(acc, dst, p.fin_dtype, p.fin_sp, p0, n0, p);
  }
}

template <class T, int NT, int kStages>
void launch_typed(const SsdParams& p, int64_t walks, cudaStream_t stream) {
  using Tl = st::Tiles<T, NT>;
  const int smem = kStages * Tl::kStageBytes + 1024;
  auto kernel = fwd_pass_state_kernel<T, NT, kStages>;
  static bool attr_set = false;  // per instantiation; cudaFuncSetAttribute is not a stream op
  if (!attr_set) {
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
               "cudaFuncSetAttribute(fwd_pass_state)");
    attr_set = true;
  }
  const int p_tiles = (p.headdim + st::kP - 1) / st::kP;
  const int n_tiles = (p.dstate + NT - 1) / NT;
  dim3 grid(p_tiles * n_tiles, p.nheads, static_cast<unsigned>(walks));
  kernel<<<grid, st::kThreads, smem, stream>>>(p);
  check_cuda(cudaGetLastError(), "launch fwd_pass_state");
}

}  // namespace

void launch_fwd_pass_state(const SsdParams& p, const PassStateConfig& cfg, cudaStream_t stream) {
  const int64_t walks = p.varlen ? p.nseq : p.batch;
  if (walks == 0) return;
  const bool fp16 = p.fp16;
  if (cfg.dstate_tile == 32) {
    if (fp16) launch_typed<cutlass::half_t, 32, 4>(p, walks, stream);
    else launch_typed<cutlass::bfloat16_t, 32, 4>(p, walks, stream);
  } else {
    if (fp16) launch_typed<cutlass::half_t, 64, 4>(p, walks, stream);
    else launch_typed<cutlass::bfloat16_t, 64, 4>(p, walks, stream);
  }
}

}  // namespace mamba2_ssd::kernels
