// Host side of the tensor-memory-accelerator (TMA) loads: building the CUtensorMap of a strided
// 16-bit or fp32 tensor. The driver function is looked up at run time (no link against libcuda).
#pragma once

#include <cuda.h>

#include <cstdint>

namespace mamba2_ssd::kernels {

// A tiled load map over a tensor of `rank` (2..5) dims, dim 0 innermost and contiguous:
// dims[i] elements, strides_bytes[i] between consecutive elements of dim i + 1 (i < rank - 1),
// box[i] elements per load, with the 128-byte swizzle (box[0] = 64 elements of 2 bytes) or,
// with swizzle_bytes = 64, the 64-byte one (box[0] = 32). Loads past the end of a dim read
// zeros. A size-1 dim may have any stride. Throws mamba2_ssd::Error (kind kCuda) naming `what`
// when the driver refuses the map.
CUtensorMap make_tile_map_16bit(const void* base, int rank, const int64_t* dims, const int64_t* strides_bytes,
                                const uint32_t* box, const char* what, int swizzle_bytes = 128);
// The same over fp32 elements without swizzle (box[0] * 4 bytes a multiple of 16): the box lands
// in shared memory in the order of its dims, dim 0 innermost.
CUtensorMap make_plain_map_f32(const void* base, int rank, const int64_t* dims, const int64_t* strides_bytes,
                               const uint32_t* box, const char* what);

}  // namespace mamba2_ssd::kernels
