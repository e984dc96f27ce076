// Small helpers of the public types: dtype/device/layout names, TensorView queries, make_view,
// max_varlen_chunks.
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>

#include "mamba2_ssd/error.hpp"
#include "mamba2_ssd/params.hpp"
#include "mamba2_ssd/types.hpp"

namespace mamba2_ssd {

std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::kFloat32: return 4;
    case DType::kFloat16: return 2;
    case DType::kBFloat16: return 2;
    case DType::kInt32: return 4;
    case DType::kInt64: return 8;
  }
  return 0;  // not a DType value
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kFloat32: return "float32";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
  }
  return "unknown";
}

const char* device_name(Device d) {
  switch (d) {
    case Device::kCPU: return "cpu";
    case Device::kCUDA: return "cuda";
  }
  return "unknown";
}

const char* layout_name(Layout l) {
  switch (l) {
    case Layout::kBatched: return "batched";
    case Layout::kVarlen: return "varlen";
  }
  return "unknown";
}

// Product of the sizes (1 for rank 0, like torch). Saturates at INT64_MAX instead of
// overflowing; validate() rejects such views before anything uses their element count.
int64_t TensorView::numel() const {
  const int r = rank < 0 ? 0 : (rank > kMaxRank ? kMaxRank : rank);
  int64_t n = 1;
  bool overflow = false;
  for (int i = 0; i < r; ++i) {
    if (sizes[i] == 0) return 0;
    if (!overflow && __builtin_mul_overflow(n, sizes[i], &n)) overflow = true;
  }
  return overflow ? std::numeric_limits<int64_t>::max() : n;
}

bool TensorView::last_dim_contiguous() const {
  if (rank <= 0) return true;
  return sizes[rank - 1] <= 1 || strides[rank - 1] == 1;
}

std::string TensorView::shape_string() const {
  const int r = rank < 0 ? 0 : (rank > kMaxRank ? kMaxRank : rank);
  std::string s = "(";
  for (int i = 0; i < r; ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(sizes[i]);
  }
  s += ")";
  return s;
}

namespace {

TensorView view_with_sizes(void* data, DType dtype, std::initializer_list<int64_t> sizes) {
  if (sizes.size() > static_cast<std::size_t>(TensorView::kMaxRank)) {
    throw Error(Error::Kind::kInvalidArgument, "sizes",
                "sizes: expected at most " + std::to_string(TensorView::kMaxRank) +
                    " dimensions, got " + std::to_string(sizes.size()));
  }
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.rank = static_cast<int32_t>(sizes.size());
  int i = 0;
  for (int64_t s : sizes) v.sizes[i++] = s;
  return v;
}

}  // namespace

// Row-major strides, as torch.empty(sizes).stride(): a dimension of size 0 counts as 1.
TensorView make_view(void* data, DType dtype, std::initializer_list<int64_t> sizes) {
  TensorView v = view_with_sizes(data, dtype, sizes);
  int64_t stride = 1;
  for (int i = v.rank - 1; i >= 0; --i) {
    v.strides[i] = stride;
    // Saturate instead of overflowing; validate() rejects such a view (its numel overflows).
    if (__builtin_mul_overflow(stride, v.sizes[i] > 1 ? v.sizes[i] : 1, &stride)) {
      stride = std::numeric_limits<int64_t>::max();
    }
  }
  return v;
}

TensorView make_view(void* data, DType dtype, std::initializer_list<int64_t> sizes,
                     std::initializer_list<int64_t> strides) {
  TensorView v = view_with_sizes(data, dtype, sizes);
  if (strides.size() != sizes.size()) {
    throw Error(Error::Kind::kInvalidArgument, "strides",
                "strides: expected " + std::to_string(sizes.size()) +
                    " strides (one per dimension), got " + std::to_string(strides.size()));
  }
  int i = 0;
  for (int64_t s : strides) v.strides[i++] = s;
  return v;
}

// floor((T + S * (Q - 1)) / Q) written as S + floor((T - S) / Q), which cannot overflow for
// non-negative T and S. Returns 0 for a chunk size < 1 or negative counts.
int64_t max_varlen_chunks(int64_t total_tokens, int64_t nseq, int64_t chunk_size) {
  if (chunk_size < 1 || total_tokens < 0 || nseq < 0) return 0;
  const int64_t d = total_tokens - nseq;
  int64_t q = d / chunk_size;
  if (d % chunk_size != 0 && d < 0) --q;  // floor, not truncation
  return nseq + q;
}

}  // namespace mamba2_ssd
