// convert_inputs: fp32 activations -> contiguous bf16 copies in the workspace, so that fp32
// inputs run through the same bf16 tensor-core kernels (docs/SEMANTICS.md, Precision).
#include "kernels/kernels.hpp"

namespace mamba2_ssd::kernels {

namespace {

// (d0, d1, d2, inner) fp32 tensor with strides (s0, s1, s2, 1) -> row-major bf16; 4 per thread.
__global__ void convert_to_bf16_kernel(const float* __restrict__ src, int64_t d1, int64_t d2, int64_t s0,
                                       int64_t s1, int64_t s2, int64_t inner, int64_t total4,
                                       __nv_bfloat16* __restrict__ dst) {
  pdl_wait_primary();  // (launched early behind the stream's previous kernel: see launch_kernel)
  for (int64_t v = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; v < total4; v += (int64_t)gridDim.x * blockDim.x) {
    const int64_t e = v * 4;
    int64_t r = e / inner;
    const int64_t c = e - r * inner;
    const int64_t i2 = r % d2; r /= d2;
    const int64_t i1 = r % d1;
    const int64_t i0 = r / d1;
    const float4 f = *reinterpret_cast<const float4*>(src + i0 * s0 + i1 * s1 + i2 * s2 + c);
    __nv_bfloat162* out = reinterpret_cast<__nv_bfloat162*>(dst + e);
    out[0] = __floats2bfloat162_rn(f.x, f.y);
    out[1] = __floats2bfloat162_rn(f.z, f.w);
  }
}

}  // namespace

void launch_convert_to_bf16(const float* src, int64_t d0, int64_t d1, int64_t d2, int64_t s0, int64_t s1,
                            int64_t s2, int64_t inner, void* dst, cudaStream_t stream) {
  const int64_t total4 = d0 * d1 * d2 * inner / 4;
  if (total4 == 0) return;
  const int threads = 256;
  const int64_t want = (total4 + threads - 1) / threads;
  const unsigned blocks = static_cast<unsigned>(want < 132 * 16 ? want : 132 * 16);
  launch_kernel(convert_to_bf16_kernel, dim3(blocks), dim3(threads), 0, stream, true, 1, "launch convert_to_bf16", src,
                d1, d2, s0, s1, s2, inner, total4, static_cast<__nv_bfloat16*>(dst));
}

}  // namespace mamba2_ssd::kernels
