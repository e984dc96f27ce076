// chunk_offsets (varlen layout): chunk_offsets[i] = sum_{k<i} ceil(len_k / Q), the index of
// sequence i's first chunk; chunk_offsets[S] = chunks used. One CTA scans all sequences in
// blocks of its size, carrying the running total.
#include <cub/block/block_scan.cuh>

#include "kernels/kernels.hpp"

namespace mamba2_ssd::kernels {

namespace {

constexpr int kThreads = 512;

__global__ void __launch_bounds__(kThreads) chunk_offsets_kernel(const SsdParams p) {
  using Scan = cub::BlockScan<int32_t, kThreads>;
  __shared__ typename Scan::TempStorage tmp;
  __shared__ int32_t carry;
  pdl_wait_primary();  // (launched early behind the stream's previous kernel: see launch_kernel)
  if (threadIdx.x == 0) carry = 0;
  __syncthreads();
  for (int base = 0; base < p.nseq; base += kThreads) {
    const int i = base + threadIdx.x;
    int32_t n = 0;
    if (i < p.nseq) {
      const int64_t len = load_cu(p, i + 1) - load_cu(p, i);
      n = len > 0 ? static_cast<int32_t>((len + p.chunk - 1) / p.chunk) : 0;
    }
    int32_t excl, total;
    Scan(tmp).ExclusiveSum(n, excl, total);
    const int32_t c = carry;
    if (i < p.nseq) p.chunk_offsets[i] = c + excl;
    __syncthreads();
    if (threadIdx.x == 0) carry = c + total;
    __syncthreads();
  }
  if (threadIdx.x == 0) p.chunk_offsets[p.nseq] = carry;
}

}  // namespace

void launch_chunk_offsets(const SsdParams& p, cudaStream_t stream) {
  launch_kernel(chunk_offsets_kernel, dim3(1), dim3(kThreads), 0, stream, true, 1, "launch chunk_offsets", p);
}

}  // namespace mamba2_ssd::kernels
