#include "kernels/tensor_map.hpp"

#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <mutex>
#include <string>

#include "mamba2_ssd/error.hpp"

namespace mamba2_ssd::kernels {

namespace {

PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  static std::once_flag once;
  static cudaError_t err = cudaSuccess;
  static cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSuccess;
  std::call_once(once, [] {
    void* f = nullptr;
    err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &found);
    fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  });
  if (err != cudaSuccess) {
    throw Error(Error::Kind::kCuda, "",
                std::string("CUDA error in cudaGetDriverEntryPointByVersion(cuTensorMapEncodeTiled): ") +
                    cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
  }
  if (fn == nullptr || found != cudaDriverEntryPointSuccess) {
    throw Error(Error::Kind::kCuda, "",
                "CUDA driver without cuTensorMapEncodeTiled (query result " + std::to_string(static_cast<int>(found)) +
                    "); a driver for CUDA 12.0 or newer is needed");
  }
  return fn;
}

// A tiled load map of `type` (elements of `elem_bytes`), as make_tile_map_16bit describes.
CUtensorMap make_map(CUtensorMapDataType type, int elem_bytes, CUtensorMapSwizzle swizzle, const void* base, int rank,
                     const int64_t* dims, const int64_t* strides_bytes, const uint32_t* box, const char* what) {
  cuuint64_t gdim[5];
  cuuint64_t gstride[4];
  cuuint32_t bdim[5];
  cuuint32_t estride[5];
  for (int i = 0; i < rank; ++i) {
    gdim[i] = static_cast<cuuint64_t>(dims[i] > 0 ? dims[i] : 1);
    bdim[i] = box[i];
    estride[i] = 1;
  }
  // A dim of size 1 is never stepped over: give it a stride the driver accepts.
  for (int i = 0; i + 1 < rank; ++i) {
    int64_t s = strides_bytes[i];
    if (gdim[i + 1] == 1) {
      s = i == 0 ? elem_bytes * static_cast<int64_t>(gdim[0])
                 : static_cast<int64_t>(gstride[i - 1]) * static_cast<int64_t>(gdim[i]);
      s = (s + 15) / 16 * 16;
    }
    gstride[i] = static_cast<cuuint64_t>(s);
  }
  CUtensorMap map{};
  const CUresult r = encode_fn()(&map, type, static_cast<cuuint32_t>(rank), const_cast<void*>(base), gdim, gstride,
                                 bdim, estride, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                                 CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::string shape, strides;
    for (int i = 0; i < rank; ++i) shape += (i ? "," : "") + std::to_string(gdim[i]);
    for (int i = 0; i + 1 < rank; ++i) strides += (i ? "," : "") + std::to_string(gstride[i]);
    throw Error(Error::Kind::kCuda, "",
                std::string("CUDA error in cuTensorMapEncodeTiled(") + what + "): error " + std::to_string(r) +
                    " for dims (" + shape + "), byte strides (" + strides + ")");
  }
  return map;
}

}  // namespace

CUtensorMap make_tile_map_16bit(const void* base, int rank, const int64_t* dims, const int64_t* strides_bytes,
                                const uint32_t* box, const char* what, int swizzle_bytes) {
  return make_map(CU_TENSOR_MAP_DATA_TYPE_UINT16, 2,
                  swizzle_bytes == 64 ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_128B, base, rank, dims,
                  strides_bytes, box, what);
}

CUtensorMap make_plain_map_f32(const void* base, int rank, const int64_t* dims, const int64_t* strides_bytes,
                               const uint32_t* box, const char* what) {
  return make_map(CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, CU_TENSOR_MAP_SWIZZLE_NONE, base, rank, dims, strides_bytes,
                  box, what);
}

}  // namespace mamba2_ssd::kernels
