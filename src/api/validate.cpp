// validate(): checks every argument of one forward call and derives the problem sizes.
//
// The rules, in the order they are checked (the first failure throws mamba2_ssd::Error whose
// message starts with the argument name and states the expected and the actual value):
//   1. layout and device are known values; chunk_size >= 1.
//   2. x, dt, A, B, C and out are present (non-null data).
//   3. Every present tensor: rank 0..6, a known dtype, sizes >= 0, strides >= 0, element count
//      and largest byte offset fit in int64, data pointer aligned to its element size.
//   4. Dtypes: x bf16/fp16/fp32; B, C, z, out the dtype of x; dt fp32/bf16/fp16; A, D, dt_bias
//      fp32; initial/final/varlen states fp32/bf16/fp16; seq_idx int32; cu_seqlens int32/int64;
//      chunk_offsets int32.
//   5. Sizes: batched x (b,l,h,p), B and C (b,l,g,n); varlen x (T,h,p), B and C (T,g,n); all >= 1;
//      nheads % ngroups == 0.
//   6. Layout combinations: varlen needs cu_seqlens and takes no seq_idx / varlen_states;
//      batched takes no chunk_offsets, and cu_seqlens comes with varlen_states (both or
//      neither) and batch == 1. cu_seqlens is rank 1 with S + 1 >= 2 entries.
//   7. Shapes of the other tensors: dt (b,l,h)|(T,h); out, z like x; A, dt_bias (h); D (h) or
//      (h,p); initial/final states (b,h,p,n)|(S,h,p,n); varlen_states (S,h,p,n); seq_idx (b,l);
//      chunk_states (b,ceil(l/Q),h,p,n)|(capacity >= max_varlen_chunks(T,S,Q),h,p,n);
//      chunk_offsets (S+1).
//   8. dt_min, dt_max not NaN, dt_min <= dt_max.
//   9. state_dtype: unset -> dtype of C; else fp32 or the 16-bit compute type (bf16 for bf16 and
//      fp32 inputs, fp16 for fp16 inputs). chunk_states has the resolved state dtype.
//  10. Innermost dimension contiguous for x, B, C, z, out, D (rank 2) and the state tensors;
//      outputs do not overlap themselves.
//  11. Device::kCUDA: chunk_size 64/128/256, headdim 64/128, dstate 16..512 step 16
//      (Kind::kUnsupported: valid inputs the kernels do not run); x, B, C, z, out and the state
//      tensors 16-byte aligned, with their outer strides (of dims of size > 1) multiples of
//      16 bytes.
//  12. Builds with CUDA: every present pointer is device/managed memory of the current device
//      for kCUDA, host (pageable, pinned) or managed memory for kCPU (not checked with
//      check_memory_locations = false).
//  13. Device::kCPU (host memory can be read): cu_seqlens starts at 0, is non-decreasing and ends
//      at l (batched) or T (varlen); seq_idx is >= 0 and non-decreasing along each row.
// Nothing is allocated on success; strings are built only to throw.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <string>

#include "mamba2_ssd/api.hpp"
#include "mamba2_ssd/error.hpp"
#include "mamba2_ssd/params.hpp"
#include "mamba2_ssd/types.hpp"

#ifdef MAMBA2_SSD_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace mamba2_ssd {

namespace {

constexpr int64_t kGpuAlignBytes = 16;

// ---------------------------------------------------------------- message helpers

[[noreturn]] void fail(const char* arg, const std::string& what) {
  throw Error(Error::Kind::kInvalidArgument, arg, std::string(arg) + ": " + what);
}

[[noreturn]] void fail_unsupported(const char* arg, const std::string& what) {
  throw Error(Error::Kind::kUnsupported, arg, std::string(arg) + ": " + what);
}

std::string str(int64_t v) { return std::to_string(v); }

std::string str_float(float v) {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%g", static_cast<double>(v));
  return buf;
}

std::string hex_address(std::uintptr_t a) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(a));
  return buf;
}

std::string tuple_string(std::initializer_list<int64_t> values) {
  std::string s = "(";
  bool first = true;
  for (int64_t v : values) {
    if (!first) s += ", ";
    s += str(v);
    first = false;
  }
  return s + ")";
}

std::string strides_string(const TensorView& v) {
  std::string s = "(";
  for (int i = 0; i < v.rank; ++i) {
    if (i > 0) s += ", ";
    s += str(v.strides[i]);
  }
  return s + ")";
}

// "float32", "float32 or bfloat16", "float32, bfloat16 or float16"
std::string dtype_list(std::initializer_list<DType> dtypes) {
  std::string s;
  std::size_t i = 0;
  for (DType d : dtypes) {
    if (i > 0) s += (i + 1 == dtypes.size()) ? " or " : ", ";
    s += dtype_name(d);
    ++i;
  }
  return s;
}

const char* layout_suffix(Layout l) {
  return l == Layout::kBatched ? " for the batched layout" : " for the varlen layout";
}

// ---------------------------------------------------------------- check helpers

void expect_present(const char* arg, const TensorView& v, const char* what) {
  if (!v.present()) fail(arg, std::string("required ") + what + " is missing (null data pointer)");
}

void expect_absent(const char* arg, const TensorView& v, const char* why) {
  if (v.present()) fail(arg, std::string("expected no tensor ") + why + ", got one of shape " + v.shape_string());
}

// Checks that hold for any tensor, whatever its role (rule 3).
void check_view(const char* arg, const TensorView& v) {
  if (v.rank < 0 || v.rank > TensorView::kMaxRank) {
    fail(arg, "expected a rank between 0 and " + str(TensorView::kMaxRank) + ", got " + str(v.rank));
  }
  const int64_t esize = static_cast<int64_t>(dtype_size(v.dtype));
  if (esize == 0) fail(arg, "expected a valid DType value, got " + str(static_cast<int32_t>(v.dtype)));
  for (int i = 0; i < v.rank; ++i) {
    if (v.sizes[i] < 0) {
      fail(arg, "expected sizes >= 0, got " + str(v.sizes[i]) + " for dim " + str(i) + " of shape " + v.shape_string());
    }
    if (v.strides[i] < 0) {
      fail(arg, "expected strides >= 0, got " + str(v.strides[i]) + " for dim " + str(i) + " (strides " +
                    strides_string(v) + ")");
    }
  }
  int64_t count = 1;
  bool empty = false;
  for (int i = 0; i < v.rank; ++i) {
    if (v.sizes[i] == 0) empty = true;
    if (__builtin_mul_overflow(count, v.sizes[i], &count)) {
      fail(arg, "expected an element count that fits in int64, got shape " + v.shape_string() + " (overflow)");
    }
  }
  if (!empty) {
    // Largest byte offset touched: (sum (size - 1) * stride + 1) * element size.
    int64_t last = 0;
    bool overflow = false;
    for (int i = 0; i < v.rank && !overflow; ++i) {
      int64_t step = 0;
      overflow = __builtin_mul_overflow(v.sizes[i] - 1, v.strides[i], &step) ||
                 __builtin_add_overflow(last, step, &last);
    }
    int64_t bytes = 0;
    overflow = overflow || __builtin_add_overflow(last, int64_t{1}, &last) ||
               __builtin_mul_overflow(last, esize, &bytes);
    if (overflow) {
      fail(arg, "expected a memory extent that fits in int64 bytes, got shape " + v.shape_string() + " with strides " +
                    strides_string(v) + " (overflow)");
    }
  }
  if (v.present()) {
    const auto addr = reinterpret_cast<std::uintptr_t>(v.data);
    if (addr % static_cast<std::uintptr_t>(esize) != 0) {
      fail(arg, "expected a data pointer aligned to " + str(esize) + " bytes (the size of " + dtype_name(v.dtype) +
                    "), got address " + hex_address(addr) + " (offset " +
                    str(static_cast<int64_t>(addr % static_cast<std::uintptr_t>(esize))) + " bytes)");
    }
  }
}

void expect_dtype(const char* arg, const TensorView& v, DType want, const char* why) {
  if (v.dtype != want) {
    fail(arg, std::string("expected dtype ") + dtype_name(want) + why + ", got " + dtype_name(v.dtype));
  }
}

void expect_dtype_in(const char* arg, const TensorView& v, std::initializer_list<DType> allowed) {
  for (DType d : allowed) {
    if (v.dtype == d) return;
  }
  fail(arg, "expected dtype " + dtype_list(allowed) + ", got " + dtype_name(v.dtype));
}

// "x: expected rank 4 (batch, seqlen, nheads, headdim) for the batched layout, got rank 3 with
// shape (2, 64, 8)"
void expect_rank(const char* arg, const TensorView& v, int rank, const char* dims, const char* where) {
  if (v.rank != rank) {
    fail(arg, "expected rank " + str(rank) + " " + dims + where + ", got rank " + str(v.rank) + " with shape " +
                  v.shape_string());
  }
}

// Rank, then every size.
void expect_shape(const char* arg, const TensorView& v, std::initializer_list<int64_t> want, const char* dims,
                  const char* where) {
  expect_rank(arg, v, static_cast<int>(want.size()), dims, where);
  int i = 0;
  for (int64_t w : want) {
    if (v.sizes[i] != w) {
      fail(arg, "expected shape " + tuple_string(want) + " " + dims + where + ", got " + v.shape_string());
    }
    ++i;
  }
}

void expect_same_shape(const char* arg, const TensorView& v, const char* ref_name, const TensorView& ref) {
  bool same = v.rank == ref.rank;
  for (int i = 0; same && i < v.rank; ++i) same = v.sizes[i] == ref.sizes[i];
  if (!same) {
    fail(arg, "expected shape " + ref.shape_string() + " (the shape of " + ref_name + "), got " + v.shape_string());
  }
}

// Sizes the problem is built from must be >= 1.
void expect_positive(const char* arg, const TensorView& v, int dim, const char* what) {
  if (v.sizes[dim] < 1) {
    fail(arg, std::string("expected ") + what + " (dim " + str(dim) + ") >= 1, got " + str(v.sizes[dim]) +
                  " in shape " + v.shape_string());
  }
}

void expect_inner_contiguous(const char* arg, const TensorView& v) {
  if (v.present() && !v.last_dim_contiguous()) {
    fail(arg, "expected a contiguous innermost dimension (stride 1), got stride " + str(v.strides[v.rank - 1]) +
                  " for dim " + str(v.rank - 1) + " of shape " + v.shape_string());
  }
}

// An output must not map two elements to one address. Sufficient test: with the dimensions of
// size > 1 sorted by stride, each stride exceeds the extent of all smaller ones.
void expect_no_self_overlap(const char* arg, const TensorView& v) {
  if (!v.present() || v.numel() <= 1) return;
  int64_t sizes[TensorView::kMaxRank];
  int64_t strides[TensorView::kMaxRank];
  int n = 0;
  for (int i = 0; i < v.rank; ++i) {
    if (v.sizes[i] <= 1) continue;
    int j = n++;
    while (j > 0 && strides[j - 1] > v.strides[i]) {  // insertion sort by stride
      sizes[j] = sizes[j - 1];
      strides[j] = strides[j - 1];
      --j;
    }
    sizes[j] = v.sizes[i];
    strides[j] = v.strides[i];
  }
  int64_t extent = 0;  // largest offset reachable with the dims so far (no overflow: rule 3)
  for (int i = 0; i < n; ++i) {
    if (strides[i] <= extent) {
      fail(arg, "expected non-overlapping memory (an output needs a distinct address per element), got shape " +
                    v.shape_string() + " with strides " + strides_string(v));
    }
    extent += (sizes[i] - 1) * strides[i];
  }
}

// Rule 11: the GPU kernels load x, B, C, z, out and the states with 16-byte vectors.
void expect_gpu_aligned(const char* arg, const TensorView& v) {
  if (!v.present()) return;
  const auto addr = reinterpret_cast<std::uintptr_t>(v.data);
  if (addr % kGpuAlignBytes != 0) {
    fail(arg, "expected a " + str(kGpuAlignBytes) + "-byte aligned data pointer for the GPU kernels, got address " +
                  hex_address(addr) + " (offset " + str(static_cast<int64_t>(addr % kGpuAlignBytes)) + " bytes)");
  }
  const int64_t elems = kGpuAlignBytes / static_cast<int64_t>(dtype_size(v.dtype));
  for (int i = 0; i + 1 < v.rank; ++i) {
    if (v.sizes[i] > 1 && v.strides[i] % elems != 0) {  // a size-1 dim never uses its stride
      fail(arg, "stride of dim " + str(i) + " must be a multiple of " + str(elems) + " elements (" +
                    str(kGpuAlignBytes) + " bytes) for the GPU kernels, got " + str(v.strides[i]));
    }
  }
}

#ifdef MAMBA2_SSD_WITH_CUDA
// Rule 12. cudaPointerGetAttributes reports plain host memory as cudaMemoryTypeUnregistered
// (CUDA >= 11; older versions failed with cudaErrorInvalidValue, treated the same way).
void expect_location(const char* arg, const void* ptr, Device device, int current_device) {
  cudaPointerAttributes attr{};
  const cudaError_t e = cudaPointerGetAttributes(&attr, ptr);
  cudaMemoryType type = cudaMemoryTypeUnregistered;
  if (e == cudaSuccess) {
    type = attr.type;
  } else {
    (void)cudaGetLastError();  // clear the error state
    if (e != cudaErrorInvalidValue && device == Device::kCUDA) {
      throw Error(Error::Kind::kCuda, arg,
                  std::string(arg) + ": cannot tell where the data pointer lives: cudaPointerGetAttributes failed with " +
                      cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
    }
  }
  if (device == Device::kCUDA) {
    if (type == cudaMemoryTypeUnregistered) fail(arg, "expected device memory, got host memory");
    if (type == cudaMemoryTypeHost) fail(arg, "expected device memory, got pinned host memory");
    if (type == cudaMemoryTypeDevice && attr.device != current_device) {
      fail(arg, "expected device memory of the current CUDA device " + str(current_device) +
                    ", got memory of CUDA device " + str(attr.device));
    }
  } else if (type == cudaMemoryTypeDevice) {
    fail(arg, "expected host memory (Device::kCPU), got device memory of CUDA device " + str(attr.device));
  }
}
#endif

// ---------------------------------------------------------------- host-side content checks

int64_t load_index(const TensorView& v, int64_t i) {
  const char* base = static_cast<const char*>(v.data);
  const int64_t off = i * v.strides[0];
  if (v.dtype == DType::kInt64) return reinterpret_cast<const int64_t*>(base)[off];
  return reinterpret_cast<const int32_t*>(base)[off];
}

void check_cu_seqlens_values(const TensorView& cu, int64_t nseq, int64_t total, const char* total_name) {
  const int64_t first = load_index(cu, 0);
  if (first != 0) fail("cu_seqlens", "expected cu_seqlens[0] == 0, got " + str(first));
  int64_t prev = first;
  for (int64_t i = 1; i <= nseq; ++i) {
    const int64_t cur = load_index(cu, i);
    if (cur < prev) {
      fail("cu_seqlens", "expected non-decreasing values, got cu_seqlens[" + str(i) + "] = " + str(cur) +
                             " < cu_seqlens[" + str(i - 1) + "] = " + str(prev));
    }
    prev = cur;
  }
  if (prev != total) {
    fail("cu_seqlens", "expected cu_seqlens[" + str(nseq) + "] == " + str(total) + " (" + total_name + "), got " +
                           str(prev));
  }
}

void check_seq_idx_values(const TensorView& s) {
  const auto* base = static_cast<const int32_t*>(s.data);
  for (int64_t b = 0; b < s.sizes[0]; ++b) {
    const int32_t* row = base + b * s.strides[0];
    int32_t prev = 0;
    for (int64_t t = 0; t < s.sizes[1]; ++t) {
      const int32_t cur = row[t * s.strides[1]];
      if (cur < 0) {
        fail("seq_idx", "expected values >= 0, got seq_idx[" + str(b) + ", " + str(t) + "] = " + str(cur));
      }
      if (t > 0 && cur < prev) {
        fail("seq_idx", "expected non-decreasing values along each row, got seq_idx[" + str(b) + ", " + str(t) +
                            "] = " + str(cur) + " < seq_idx[" + str(b) + ", " + str(t - 1) + "] = " + str(prev));
      }
      prev = cur;
    }
  }
}

}  // namespace

ProblemShape validate(const ForwardParams& p) {
  // ---- 1. scalars that everything else depends on
  if (p.layout != Layout::kBatched && p.layout != Layout::kVarlen) {
    fail("layout", "expected Layout::kBatched or Layout::kVarlen, got value " + str(static_cast<int32_t>(p.layout)));
  }
  if (p.device != Device::kCPU && p.device != Device::kCUDA) {
    fail("device", "expected Device::kCPU or Device::kCUDA, got value " + str(static_cast<int32_t>(p.device)));
  }
  if (p.chunk_size < 1) fail("chunk_size", "expected chunk_size >= 1, got " + str(p.chunk_size));
  const bool batched = p.layout == Layout::kBatched;
  const bool on_gpu = p.device == Device::kCUDA;
  const char* where = layout_suffix(p.layout);

  // ---- 2. required tensors
  expect_present("x", p.x, "input");
  expect_present("dt", p.dt, "input");
  expect_present("A", p.A, "input");
  expect_present("B", p.B, "input");
  expect_present("C", p.C, "input");
  expect_present("out", p.out, "output");

  // ---- 3. generic view checks
  struct Named {
    const char* name;
    const TensorView* view;
  };
  const Named all[] = {
      {"x", &p.x},
      {"dt", &p.dt},
      {"A", &p.A},
      {"B", &p.B},
      {"C", &p.C},
      {"D", &p.D},
      {"z", &p.z},
      {"dt_bias", &p.dt_bias},
      {"initial_states", &p.initial_states},
      {"seq_idx", &p.seq_idx},
      {"cu_seqlens", &p.cu_seqlens},
      {"out", &p.out},
      {"final_states", &p.final_states},
      {"varlen_states", &p.varlen_states},
      {"chunk_states", &p.chunk_states},
      {"chunk_offsets", &p.chunk_offsets},
  };
  for (const Named& t : all) {
    if (t.view->present()) check_view(t.name, *t.view);
  }

  // ---- 4. dtypes (chunk_states: rule 9)
  constexpr DType f32 = DType::kFloat32, f16 = DType::kFloat16, bf16 = DType::kBFloat16;
  expect_dtype_in("x", p.x, {bf16, f16, f32});
  const DType xt = p.x.dtype;
  expect_dtype("B", p.B, xt, " (the dtype of x)");
  expect_dtype("C", p.C, xt, " (the dtype of x)");
  expect_dtype("out", p.out, xt, " (the dtype of x)");
  if (p.z.present()) expect_dtype("z", p.z, xt, " (the dtype of x)");
  expect_dtype_in("dt", p.dt, {f32, bf16, f16});
  expect_dtype("A", p.A, f32, "");
  if (p.D.present()) expect_dtype("D", p.D, f32, "");
  if (p.dt_bias.present()) expect_dtype("dt_bias", p.dt_bias, f32, "");
  if (p.initial_states.present()) expect_dtype_in("initial_states", p.initial_states, {f32, bf16, f16});
  if (p.final_states.present()) expect_dtype_in("final_states", p.final_states, {f32, bf16, f16});
  if (p.varlen_states.present()) expect_dtype_in("varlen_states", p.varlen_states, {f32, bf16, f16});
  if (p.seq_idx.present()) expect_dtype("seq_idx", p.seq_idx, DType::kInt32, "");
  if (p.cu_seqlens.present()) expect_dtype_in("cu_seqlens", p.cu_seqlens, {DType::kInt32, DType::kInt64});
  if (p.chunk_offsets.present()) expect_dtype("chunk_offsets", p.chunk_offsets, DType::kInt32, "");

  // ---- 5. problem sizes from x and B
  int64_t b = 1, l = 0, h = 0, hp = 0;
  if (batched) {
    expect_rank("x", p.x, 4, "(batch, seqlen, nheads, headdim)", where);
    expect_positive("x", p.x, 0, "batch");
    expect_positive("x", p.x, 1, "seqlen");
    expect_positive("x", p.x, 2, "nheads");
    expect_positive("x", p.x, 3, "headdim");
    b = p.x.sizes[0];
    l = p.x.sizes[1];
    h = p.x.sizes[2];
    hp = p.x.sizes[3];
    expect_rank("B", p.B, 4, "(batch, seqlen, ngroups, dstate)", where);
    expect_positive("B", p.B, 2, "ngroups");
    expect_positive("B", p.B, 3, "dstate");
  } else {
    expect_rank("x", p.x, 3, "(total_tokens, nheads, headdim)", where);
    expect_positive("x", p.x, 0, "total_tokens");
    expect_positive("x", p.x, 1, "nheads");
    expect_positive("x", p.x, 2, "headdim");
    l = p.x.sizes[0];
    h = p.x.sizes[1];
    hp = p.x.sizes[2];
    expect_rank("B", p.B, 3, "(total_tokens, ngroups, dstate)", where);
    expect_positive("B", p.B, 1, "ngroups");
    expect_positive("B", p.B, 2, "dstate");
  }
  const int64_t g = p.B.size(-2);
  const int64_t n = p.B.size(-1);
  if (batched) {
    expect_shape("B", p.B, {b, l, g, n}, "(batch, seqlen, ngroups, dstate)", where);
    expect_shape("C", p.C, {b, l, g, n}, "(batch, seqlen, ngroups, dstate) like B", where);
  } else {
    expect_shape("B", p.B, {l, g, n}, "(total_tokens, ngroups, dstate)", where);
    expect_shape("C", p.C, {l, g, n}, "(total_tokens, ngroups, dstate) like B", where);
  }
  if (h % g != 0) {
    fail("B", "expected ngroups to divide nheads: nheads = " + str(h) + " (dim " + str(batched ? 2 : 1) +
                  " of x) is not a multiple of ngroups = " + str(g) + " (dim " + str(batched ? 2 : 1) + " of B)");
  }

  // ---- 6. layout combinations and cu_seqlens
  if (batched) {
    expect_absent("chunk_offsets", p.chunk_offsets, "for the batched layout (varlen layout only)");
    if (p.cu_seqlens.present() && !p.varlen_states.present()) {
      fail("cu_seqlens", "in the batched layout cu_seqlens only fills varlen_states: expected varlen_states too, "
                         "got none (null data pointer)");
    }
    if (p.varlen_states.present() && !p.cu_seqlens.present()) {
      fail("varlen_states", "expected cu_seqlens too (it delimits the packed sequences), got none "
                            "(null data pointer)");
    }
    if (p.cu_seqlens.present() && b != 1) {
      fail("cu_seqlens", "expected batch 1 with cu_seqlens in the batched layout (as mamba_ssm), got batch " + str(b));
    }
  } else {
    if (!p.cu_seqlens.present()) fail("cu_seqlens", "required for the varlen layout, got none (null data pointer)");
    expect_absent("seq_idx", p.seq_idx, "for the varlen layout (cu_seqlens delimits the sequences)");
    expect_absent("varlen_states", p.varlen_states,
                  "for the varlen layout (final_states holds the state of every sequence)");
  }
  int64_t nseq = 0;
  if (p.cu_seqlens.present()) {
    expect_rank("cu_seqlens", p.cu_seqlens, 1, "(nseq + 1)", "");
    if (p.cu_seqlens.sizes[0] < 2) {
      fail("cu_seqlens", "expected at least 2 entries (nseq + 1 with nseq >= 1), got " + str(p.cu_seqlens.sizes[0]));
    }
    nseq = p.cu_seqlens.sizes[0] - 1;
  }

  // ---- 7. shapes of the other tensors
  int64_t nchunks = 0;
  if (batched) {
    nchunks = l / p.chunk_size + (l % p.chunk_size != 0 ? 1 : 0);
    expect_shape("dt", p.dt, {b, l, h}, "(batch, seqlen, nheads)", where);
  } else {
    nchunks = max_varlen_chunks(l, nseq, p.chunk_size);
    expect_shape("dt", p.dt, {l, h}, "(total_tokens, nheads)", where);
  }
  expect_same_shape("out", p.out, "x", p.x);
  if (p.z.present()) expect_same_shape("z", p.z, "x", p.x);
  expect_shape("A", p.A, {h}, "(nheads)", "");
  if (p.dt_bias.present()) expect_shape("dt_bias", p.dt_bias, {h}, "(nheads)", "");
  if (p.D.present()) {
    if (p.D.rank == 1) {
      expect_shape("D", p.D, {h}, "(nheads)", "");
    } else if (p.D.rank == 2) {
      expect_shape("D", p.D, {h, hp}, "(nheads, headdim)", "");
    } else {
      fail("D", "expected rank 1 (nheads) or 2 (nheads, headdim), got rank " + str(p.D.rank) + " with shape " +
                    p.D.shape_string());
    }
  }
  const char* state_dims = batched ? "(batch, nheads, headdim, dstate)" : "(nseq, nheads, headdim, dstate)";
  const int64_t nstates = batched ? b : nseq;
  if (p.initial_states.present()) expect_shape("initial_states", p.initial_states, {nstates, h, hp, n}, state_dims, where);
  if (p.final_states.present()) expect_shape("final_states", p.final_states, {nstates, h, hp, n}, state_dims, where);
  if (p.varlen_states.present()) {
    expect_shape("varlen_states", p.varlen_states, {nseq, h, hp, n}, "(nseq, nheads, headdim, dstate)", where);
  }
  if (p.seq_idx.present()) expect_shape("seq_idx", p.seq_idx, {b, l}, "(batch, seqlen)", where);
  if (p.chunk_states.present()) {
    if (batched) {
      expect_shape("chunk_states", p.chunk_states, {b, nchunks, h, hp, n},
                   "(batch, nchunks = ceil(seqlen / chunk_size), nheads, headdim, dstate)", where);
    } else {
      const TensorView& cs = p.chunk_states;
      expect_rank("chunk_states", cs, 4, "(capacity, nheads, headdim, dstate)", where);
      if (cs.sizes[1] != h || cs.sizes[2] != hp || cs.sizes[3] != n) {
        fail("chunk_states", "expected shape (capacity, " + str(h) + ", " + str(hp) + ", " + str(n) +
                                 ") (capacity, nheads, headdim, dstate)" + where + ", got " + cs.shape_string());
      }
      if (cs.sizes[0] < nchunks) {
        fail("chunk_states", "expected a capacity (dim 0) of at least " + str(nchunks) +
                                 " chunks = max_varlen_chunks(total_tokens = " + str(l) + ", nseq = " + str(nseq) +
                                 ", chunk_size = " + str(p.chunk_size) + "), got " + str(cs.sizes[0]));
      }
    }
  }
  if (p.chunk_offsets.present()) expect_shape("chunk_offsets", p.chunk_offsets, {nseq + 1}, "(nseq + 1)", where);

  // ---- 8. dt limits
  if (std::isnan(p.dt_min)) fail("dt_min", "expected a number, got NaN");
  if (std::isnan(p.dt_max)) fail("dt_max", "expected a number, got NaN");
  if (p.dt_min > p.dt_max) {
    fail("dt_min", "expected dt_min <= dt_max, got dt_min = " + str_float(p.dt_min) + " > dt_max = " +
                       str_float(p.dt_max));
  }

  // ---- 9. state dtype
  const DType compute = xt == f16 ? f16 : bf16;
  DType state = p.C.dtype;
  if (p.state_dtype.has_value()) {
    state = *p.state_dtype;
    if (state != f32 && state != compute) {
      fail("state_dtype", std::string("expected float32 or ") + dtype_name(compute) + " (the 16-bit compute type for " +
                              dtype_name(xt) + " inputs), got " +
                              (dtype_size(state) == 0 ? "value " + str(static_cast<int32_t>(state))
                                                      : std::string(dtype_name(state))));
    }
  }
  if (p.chunk_states.present()) expect_dtype("chunk_states", p.chunk_states, state, " (the state dtype)");

  // ---- 10. memory layout
  expect_inner_contiguous("x", p.x);
  expect_inner_contiguous("B", p.B);
  expect_inner_contiguous("C", p.C);
  expect_inner_contiguous("z", p.z);
  expect_inner_contiguous("out", p.out);
  if (p.D.rank == 2) expect_inner_contiguous("D", p.D);
  expect_inner_contiguous("initial_states", p.initial_states);
  expect_inner_contiguous("final_states", p.final_states);
  expect_inner_contiguous("varlen_states", p.varlen_states);
  expect_inner_contiguous("chunk_states", p.chunk_states);
  expect_no_self_overlap("out", p.out);
  expect_no_self_overlap("final_states", p.final_states);
  expect_no_self_overlap("varlen_states", p.varlen_states);
  expect_no_self_overlap("chunk_states", p.chunk_states);
  expect_no_self_overlap("chunk_offsets", p.chunk_offsets);

  // ---- 11. what the GPU kernels run
  if (on_gpu) {
    if (p.chunk_size != 64 && p.chunk_size != 128 && p.chunk_size != 256) {
      fail_unsupported("chunk_size", "the GPU kernels support chunk_size 64, 128 or 256, got " + str(p.chunk_size));
    }
    if (hp != 64 && hp != 128) {
      fail_unsupported("x", "the GPU kernels support headdim 64 or 128, got " + str(hp));
    }
    if (n < 16 || n > 512 || n % 16 != 0) {
      fail_unsupported("B", "the GPU kernels support dstate 16 to 512 in multiples of 16, got " + str(n));
    }
    expect_gpu_aligned("x", p.x);
    expect_gpu_aligned("B", p.B);
    expect_gpu_aligned("C", p.C);
    expect_gpu_aligned("z", p.z);
    expect_gpu_aligned("out", p.out);
    expect_gpu_aligned("initial_states", p.initial_states);
    expect_gpu_aligned("final_states", p.final_states);
    expect_gpu_aligned("varlen_states", p.varlen_states);
    expect_gpu_aligned("chunk_states", p.chunk_states);
  }

  // ---- 11b. explicit kernel settings (0: unset)
  {
    const KernelConfig& kc = p.kernel_config;
    if (kc.pass_state_dstate_tile != 0 && kc.pass_state_dstate_tile != 32 && kc.pass_state_dstate_tile != 64) {
      fail("kernel_config.pass_state_dstate_tile",
           "expected 0 (unset), 32 or 64, got " + str(kc.pass_state_dstate_tile));
    }
    if (kc.pass_state_stages != 0 && kc.pass_state_stages != 2 && kc.pass_state_stages != 4) {
      fail("kernel_config.pass_state_stages", "expected 0 (unset), 2 or 4, got " + str(kc.pass_state_stages));
    }
    if (kc.pass_state_segments < 0 || kc.pass_state_segments > 16) {
      fail("kernel_config.pass_state_segments", "expected 0 (unset) or 1 to 16, got " + str(kc.pass_state_segments));
    }
    if (kc.fused_walk < 0 || kc.fused_walk > 2) {
      fail("kernel_config.fused_walk", "expected 0 (unset), 1 (two kernels) or 2 (fused), got " + str(kc.fused_walk));
    }
    if (kc.fused_walk_heads_per_cta < 0 || kc.fused_walk_heads_per_cta > 2) {
      fail("kernel_config.fused_walk_heads_per_cta",
           "expected 0 (unset), 1 or 2 (heads per CTA of fused_walk's specialised kernel), got " +
               str(kc.fused_walk_heads_per_cta));
    }
    const int max_heads = hp <= 64 ? 4 : 2;
    const int hc = kc.compute_out_heads_per_cta;
    if (hc != 0 && (hc < 1 || hc > max_heads || (hc & (hc - 1)) != 0)) {
      fail("kernel_config.compute_out_heads_per_cta",
           std::string("expected 0 (unset), ") + (max_heads == 4 ? "1, 2 or 4" : "1 or 2") + " for headdim " +
               str(hp) + ", got " + str(hc));
    }
  }

  // ---- 12. where the memory lives
#ifdef MAMBA2_SSD_WITH_CUDA
  {
    int ndev = 0;
    const cudaError_t ce = cudaGetDeviceCount(&ndev);
    if (ce != cudaSuccess || ndev == 0) {
      (void)cudaGetLastError();
      // No device: host memory is all there is. kCUDA cannot run; say so here.
      if (on_gpu) {
        throw Error(Error::Kind::kCuda, "device",
                    std::string("device: Device::kCUDA requested, but no CUDA device is usable: cudaGetDeviceCount "
                                "returned ") +
                        (ce != cudaSuccess ? cudaGetErrorName(ce) : "0 devices"));
      }
    } else if (p.check_memory_locations) {
      int current = 0;
      if (on_gpu && cudaGetDevice(&current) != cudaSuccess) (void)cudaGetLastError();
      for (const Named& t : all) {
        if (t.view->present()) expect_location(t.name, t.view->data, p.device, current);
      }
    }
  }
#endif

  // ---- 13. contents, readable on the host only
  if (!on_gpu) {
    if (p.cu_seqlens.present()) {
      check_cu_seqlens_values(p.cu_seqlens, nseq, l, batched ? "seqlen" : "total_tokens");
    }
    if (p.seq_idx.present()) check_seq_idx_values(p.seq_idx);
  }

  ProblemShape s;
  s.batch = b;
  s.seqlen = l;
  s.nheads = h;
  s.headdim = hp;
  s.ngroups = g;
  s.dstate = n;
  s.chunk_size = p.chunk_size;
  s.nchunks = nchunks;
  s.nseq = nseq;
  s.compute_dtype = compute;
  s.state_dtype = state;
  return s;
}

}  // namespace mamba2_ssd
