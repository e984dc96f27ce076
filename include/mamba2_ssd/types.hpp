// Element types and the tensor descriptor used by the public API.
// No CUDA, no torch: a TensorView is a pointer plus sizes and int64 strides.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

namespace mamba2_ssd {

enum class DType : int32_t {
  kFloat32 = 0,
  kFloat16 = 1,
  kBFloat16 = 2,
  kInt32 = 3,
  kInt64 = 4,
};

// Bytes per element of `t`.
std::size_t dtype_size(DType t);
// "float32", "float16", "bfloat16", "int32", "int64".
const char* dtype_name(DType t);

// Where the memory behind every pointer of one call lives.
enum class Device : int32_t {
  kCPU = 0,   // host memory: forward() runs the float64 CPU reference
  kCUDA = 1,  // device memory of the current CUDA device: forward() runs the kernels
};

const char* device_name(Device d);

// A strided view of memory. `data == nullptr` means "absent" for optional arguments.
// Strides are in elements (not bytes), like torch.Tensor.stride().
struct TensorView {
  static constexpr int kMaxRank = 6;

  void* data = nullptr;
  DType dtype = DType::kFloat32;
  int32_t rank = 0;
  int64_t sizes[kMaxRank] = {0, 0, 0, 0, 0, 0};
  int64_t strides[kMaxRank] = {0, 0, 0, 0, 0, 0};

  bool present() const { return data != nullptr; }
  int64_t size(int i) const { return sizes[i < 0 ? i + rank : i]; }
  int64_t stride(int i) const { return strides[i < 0 ? i + rank : i]; }
  int64_t numel() const;
  // True when the innermost dimension has stride 1 (or size 1).
  bool last_dim_contiguous() const;
  // "(4, 1024, 8, 64)"
  std::string shape_string() const;
};

// A view with the given sizes and row-major (contiguous) strides.
TensorView make_view(void* data, DType dtype, std::initializer_list<int64_t> sizes);
// A view with explicit strides (in elements).
TensorView make_view(void* data, DType dtype, std::initializer_list<int64_t> sizes,
                     std::initializer_list<int64_t> strides);

}  // namespace mamba2_ssd
