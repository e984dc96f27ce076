// validate() and the small helpers of types.hpp / params.hpp.
//
// Every bad-input test starts from a valid call on small host buffers, breaks one thing and
// checks the Error: its kind, argument(), that the message starts with "<argument>: " and that
// it states the expected and the actual value. GPU-only rules are tested with
// device = Device::kCUDA on host buffers: validate() checks sizes, dtypes, alignment and strides
// before it asks the CUDA runtime where the memory lives, so these errors come first in every
// build.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include "mamba2_ssd/mamba2_ssd.hpp"

#ifdef MAMBA2_SSD_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace {

namespace m = mamba2_ssd;
using m::DType;
using m::Error;
using m::ForwardParams;
using m::TensorView;

constexpr DType kF32 = DType::kFloat32;
constexpr DType kF16 = DType::kFloat16;
constexpr DType kBF16 = DType::kBFloat16;
constexpr DType kI32 = DType::kInt32;
constexpr DType kI64 = DType::kInt64;

// ---------------------------------------------------------------- assertion helper

::testing::AssertionResult ThrowsError(const ForwardParams& p, Error::Kind kind, const std::string& arg,
                                       std::initializer_list<const char*> parts) {
  try {
    (void)m::validate(p);
  } catch (const Error& e) {
    const std::string msg = e.what();
    if (e.kind() != kind) {
      return ::testing::AssertionFailure() << "kind " << static_cast<int>(e.kind()) << ", expected "
                                           << static_cast<int>(kind) << "; message: " << msg;
    }
    if (e.argument() != arg) {
      return ::testing::AssertionFailure() << "argument() is '" << e.argument() << "', expected '" << arg
                                           << "'; message: " << msg;
    }
    if (msg.rfind(arg + ": ", 0) != 0) {
      return ::testing::AssertionFailure() << "message does not start with '" << arg << ": ': " << msg;
    }
    for (const char* part : parts) {
      if (msg.find(part) == std::string::npos) {
        return ::testing::AssertionFailure() << "message lacks \"" << part << "\": " << msg;
      }
    }
    return ::testing::AssertionSuccess() << msg;
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw a non-mamba2_ssd exception: " << e.what();
  }
  return ::testing::AssertionFailure() << "validate() did not throw";
}

#define EXPECT_INVALID(params, arg, ...) \
  EXPECT_TRUE(ThrowsError((params), Error::Kind::kInvalidArgument, (arg), {__VA_ARGS__}))
#define EXPECT_UNSUPPORTED(params, arg, ...) \
  EXPECT_TRUE(ThrowsError((params), Error::Kind::kUnsupported, (arg), {__VA_ARGS__}))

// ---------------------------------------------------------------- host problems

struct alignas(64) Block {
  unsigned char bytes[64];
};

// Sizes of a test problem. Defaults: a batched bf16 call the GPU kernels could also run.
struct Dims {
  int64_t b = 2, l = 100, h = 4, p = 64, g = 2, n = 16, chunk = 64;
  DType dtype = kBF16;
};

// Owns 64-byte aligned host buffers (64 spare bytes each, so that offset pointers stay inside).
class Storage {
 public:
  void* alloc(int64_t elems, DType t) {
    const int64_t bytes = elems * static_cast<int64_t>(m::dtype_size(t)) + 64;
    buffers_.emplace_back(static_cast<std::size_t>((bytes + 63) / 64));
    return buffers_.back().data();
  }
  TensorView view(DType t, std::initializer_list<int64_t> sizes) {
    int64_t count = 1;
    for (int64_t s : sizes) count *= s;
    return m::make_view(alloc(count, t), t, sizes);
  }

 private:
  std::vector<std::vector<Block>> buffers_;
};

// A valid batched call with every optional tensor except cu_seqlens / varlen_states /
// chunk_offsets. seq_idx packs two sequences into each row (0 then 1).
struct Batched {
  Dims d;
  Storage mem;
  ForwardParams params;

  explicit Batched(Dims dims = {}, m::Device device = m::Device::kCPU) : d(dims) {
    const int64_t c = (d.l + d.chunk - 1) / d.chunk;
    ForwardParams& p = params;
    p.layout = m::Layout::kBatched;
    p.device = device;
    p.chunk_size = d.chunk;
    p.x = mem.view(d.dtype, {d.b, d.l, d.h, d.p});
    p.dt = mem.view(kF32, {d.b, d.l, d.h});
    p.A = mem.view(kF32, {d.h});
    p.B = mem.view(d.dtype, {d.b, d.l, d.g, d.n});
    p.C = mem.view(d.dtype, {d.b, d.l, d.g, d.n});
    p.D = mem.view(kF32, {d.h});
    p.z = mem.view(d.dtype, {d.b, d.l, d.h, d.p});
    p.dt_bias = mem.view(kF32, {d.h});
    p.dt_softplus = true;
    p.initial_states = mem.view(kF32, {d.b, d.h, d.p, d.n});
    p.seq_idx = mem.view(kI32, {d.b, d.l});
    auto* s = static_cast<int32_t*>(p.seq_idx.data);
    for (int64_t i = 0; i < d.b * d.l; ++i) s[i] = (i % d.l) < d.l / 2 ? 0 : 1;
    p.out = mem.view(d.dtype, {d.b, d.l, d.h, d.p});
    p.final_states = mem.view(kF32, {d.b, d.h, d.p, d.n});
    const DType state = d.dtype;  // state_dtype unset: the dtype of C
    p.chunk_states = mem.view(state, {d.b, c, d.h, d.p, d.n});
  }

  // batch 1 with cu_seqlens + varlen_states (mamba_ssm's chunk_state_varlen path).
  void add_cu_seqlens(std::initializer_list<int32_t> cu) {
    params.cu_seqlens = mem.view(kI32, {static_cast<int64_t>(cu.size())});
    auto* q = static_cast<int32_t*>(params.cu_seqlens.data);
    for (int32_t v : cu) *q++ = v;
    params.varlen_states = mem.view(kF32, {static_cast<int64_t>(cu.size()) - 1, d.h, d.p, d.n});
  }
};

// A valid varlen call: T = 100 tokens in S = 3 sequences (30, 0, 70), every optional tensor the
// varlen layout takes.
struct Varlen {
  Dims d;
  int64_t T = 100, S = 3;
  Storage mem;
  ForwardParams params;

  explicit Varlen(Dims dims = {}, m::Device device = m::Device::kCPU) : d(dims) {
    ForwardParams& p = params;
    p.layout = m::Layout::kVarlen;
    p.device = device;
    p.chunk_size = d.chunk;
    p.x = mem.view(d.dtype, {T, d.h, d.p});
    p.dt = mem.view(kBF16, {T, d.h});
    p.A = mem.view(kF32, {d.h});
    p.B = mem.view(d.dtype, {T, d.g, d.n});
    p.C = mem.view(d.dtype, {T, d.g, d.n});
    p.D = mem.view(kF32, {d.h, d.p});
    p.z = mem.view(d.dtype, {T, d.h, d.p});
    p.dt_bias = mem.view(kF32, {d.h});
    p.initial_states = mem.view(kBF16, {S, d.h, d.p, d.n});
    p.cu_seqlens = mem.view(kI64, {S + 1});
    auto* cu = static_cast<int64_t*>(p.cu_seqlens.data);
    cu[0] = 0;
    cu[1] = 30;
    cu[2] = 30;
    cu[3] = 100;
    p.out = mem.view(d.dtype, {T, d.h, d.p});
    p.final_states = mem.view(kF32, {S, d.h, d.p, d.n});
    p.state_dtype = kF32;
    p.chunk_states = mem.view(kF32, {m::max_varlen_chunks(T, S, d.chunk), d.h, d.p, d.n});
    p.chunk_offsets = mem.view(kI32, {S + 1});
  }
};

void* offset_bytes(void* ptr, int64_t bytes) { return static_cast<unsigned char*>(ptr) + bytes; }

// For Device::kCUDA calls on host buffers that satisfy every other rule: a build without CUDA
// accepts them; a build with CUDA must get as far as the pointer-location check (or, with no
// usable GPU, the kCuda error of that check) and fail only there.
void expect_only_location_error(const ForwardParams& p) {
#ifdef MAMBA2_SSD_WITH_CUDA
  try {
    (void)m::validate(p);
    ADD_FAILURE() << "host memory accepted for Device::kCUDA";
  } catch (const Error& e) {
    const std::string msg = e.what();
    const bool location = e.kind() == Error::Kind::kInvalidArgument &&
                          msg.find("expected device memory, got host memory") != std::string::npos;
    EXPECT_TRUE(location || e.kind() == Error::Kind::kCuda) << msg;
  }
#else
  EXPECT_NO_THROW(m::validate(p));
#endif
}

// =============================================================================================
// Positive tests
// =============================================================================================

TEST(ValidateOk, BatchedWithEveryOptionalTensor) {
  Batched t;
  const m::ProblemShape s = m::validate(t.params);
  EXPECT_EQ(s.batch, 2);
  EXPECT_EQ(s.seqlen, 100);
  EXPECT_EQ(s.nheads, 4);
  EXPECT_EQ(s.headdim, 64);
  EXPECT_EQ(s.ngroups, 2);
  EXPECT_EQ(s.dstate, 16);
  EXPECT_EQ(s.nchunks, 2);  // ceil(100 / 64)
  EXPECT_EQ(s.nseq, 0);
  EXPECT_EQ(s.compute_dtype, kBF16);
  EXPECT_EQ(s.state_dtype, kBF16);
}

TEST(ValidateOk, BatchedRequiredTensorsOnly) {
  Batched t;
  ForwardParams& p = t.params;
  p.D = p.z = p.dt_bias = p.initial_states = p.seq_idx = p.final_states = p.chunk_states = TensorView{};
  EXPECT_NO_THROW(m::validate(p));
}

TEST(ValidateOk, NchunksRoundsUpAndExactMultiples) {
  Dims d;
  d.l = 128;
  d.chunk = 64;
  Batched t(d);
  EXPECT_EQ(m::validate(t.params).nchunks, 2);
  Dims d2;
  d2.l = 129;
  d2.chunk = 64;
  Batched t2(d2);
  EXPECT_EQ(m::validate(t2.params).nchunks, 3);
}

TEST(ValidateOk, VarlenWithEveryOptionalTensor) {
  Varlen t;
  const m::ProblemShape s = m::validate(t.params);
  EXPECT_EQ(s.batch, 1);
  EXPECT_EQ(s.seqlen, 100);
  EXPECT_EQ(s.nheads, 4);
  EXPECT_EQ(s.headdim, 64);
  EXPECT_EQ(s.ngroups, 2);
  EXPECT_EQ(s.dstate, 16);
  EXPECT_EQ(s.nseq, 3);
  EXPECT_EQ(s.nchunks, 4);  // floor((100 + 3 * 63) / 64)
  EXPECT_EQ(s.compute_dtype, kBF16);
  EXPECT_EQ(s.state_dtype, kF32);
}

TEST(ValidateOk, VarlenInt32CuSeqlens) {
  Varlen t;
  t.params.cu_seqlens = t.mem.view(kI32, {4});
  auto* cu = static_cast<int32_t*>(t.params.cu_seqlens.data);
  cu[0] = 0;
  cu[1] = 0;
  cu[2] = 99;
  cu[3] = 100;
  EXPECT_EQ(m::validate(t.params).nseq, 3);
}

TEST(ValidateOk, BatchedWithCuSeqlensAndVarlenStates) {
  Dims d;
  d.b = 1;
  Batched t(d);
  t.add_cu_seqlens({0, 10, 10, 100});
  const m::ProblemShape s = m::validate(t.params);
  EXPECT_EQ(s.batch, 1);
  EXPECT_EQ(s.nseq, 3);
  EXPECT_EQ(s.nchunks, 2);
}

TEST(ValidateOk, DRank1AndRank2) {
  Batched t;
  t.params.D = t.mem.view(kF32, {4});
  EXPECT_NO_THROW(m::validate(t.params));
  t.params.D = t.mem.view(kF32, {4, 64});
  EXPECT_NO_THROW(m::validate(t.params));
  // A strided D of rank 1 is fine (only rank 2 needs a contiguous headdim).
  t.params.D = m::make_view(t.params.D.data, kF32, {4}, {64});
  EXPECT_NO_THROW(m::validate(t.params));
}

TEST(ValidateOk, StateDtypeResolution) {
  struct Row {
    DType input;
    bool set;
    DType requested;
    DType compute, state;
  };
  const Row rows[] = {
      {kBF16, false, kF32, kBF16, kBF16}, {kBF16, true, kF32, kBF16, kF32}, {kBF16, true, kBF16, kBF16, kBF16},
      {kF16, false, kF32, kF16, kF16},    {kF16, true, kF32, kF16, kF32},   {kF16, true, kF16, kF16, kF16},
      {kF32, false, kF32, kBF16, kF32},   {kF32, true, kBF16, kBF16, kBF16}, {kF32, true, kF32, kBF16, kF32},
  };
  for (const Row& r : rows) {
    Dims d;
    d.dtype = r.input;
    Batched t(d);
    ForwardParams& p = t.params;
    if (r.set) p.state_dtype = r.requested;
    p.chunk_states.dtype = r.state;  // chunk_states must follow the resolved dtype
    SCOPED_TRACE(std::string("input ") + m::dtype_name(r.input) + ", state_dtype " +
                 (r.set ? m::dtype_name(r.requested) : "unset"));
    const m::ProblemShape s = m::validate(p);
    EXPECT_EQ(s.compute_dtype, r.compute);
    EXPECT_EQ(s.state_dtype, r.state);
  }
}

TEST(ValidateOk, DtDtypesAndStateDtypesAllowed) {
  for (DType t_dt : {kF32, kBF16, kF16}) {
    for (DType t_state : {kF32, kBF16, kF16}) {
      Batched t;
      t.params.dt.dtype = t_dt;
      t.params.initial_states.dtype = t_state;
      t.params.final_states.dtype = t_state;
      EXPECT_NO_THROW(m::validate(t.params)) << m::dtype_name(t_dt) << " " << m::dtype_name(t_state);
    }
  }
}

TEST(ValidateOk, CpuAcceptsAnyPositiveSizes) {
  Dims d;
  d.b = 1;
  d.l = 7;
  d.h = 3;
  d.p = 5;
  d.g = 1;
  d.n = 3;
  d.chunk = 3;
  d.dtype = kF32;
  Batched t(d);
  const m::ProblemShape s = m::validate(t.params);
  EXPECT_EQ(s.nchunks, 3);
  EXPECT_EQ(s.headdim, 5);
  EXPECT_EQ(s.dstate, 3);
}

TEST(ValidateOk, CpuIgnoresGpuAlignmentAndStrideRules) {
  Batched t;
  ForwardParams& p = t.params;
  p.x.data = offset_bytes(p.x.data, 2);  // element-aligned for bf16, not 16-byte aligned
  p.B = m::make_view(p.B.data, kBF16, {2, 100, 2, 16}, {3300, 33, 16, 1});
  EXPECT_NO_THROW(m::validate(p));
}

TEST(ValidateOk, PaddedAndBroadcastStrides) {
  Batched t;
  ForwardParams& p = t.params;
  // Padded outputs and inputs; a broadcast (stride 0) input dimension.
  p.out = m::make_view(p.out.data, kBF16, {2, 100, 4, 64}, {100 * 4 * 72, 4 * 72, 72, 1});
  p.dt = m::make_view(p.dt.data, kF32, {2, 100, 4}, {0, 4, 1});
  p.final_states = m::make_view(p.final_states.data, kF32, {2, 4, 64, 16}, {4 * 64 * 20, 64 * 20, 20, 1});
  EXPECT_NO_THROW(m::validate(p));
}

TEST(ValidateOk, DtLimits) {
  Batched t;
  t.params.dt_min = 0.25f;
  t.params.dt_max = 0.25f;
  EXPECT_NO_THROW(m::validate(t.params));
  t.params.dt_min = -std::numeric_limits<float>::infinity();
  t.params.dt_max = std::numeric_limits<float>::infinity();
  EXPECT_NO_THROW(m::validate(t.params));
}

TEST(ValidateOk, GpuSizesAndPaddedStrides) {
  for (int64_t chunk : {64, 128, 256}) {
    for (int64_t p : {64, 128}) {
      for (int64_t n : {16, 128, 512}) {
        Dims d;
        d.chunk = chunk;
        d.p = p;
        d.n = n;
        d.l = 70;
        Batched t(d, m::Device::kCUDA);
        // 16-byte multiple padding on an outer stride is fine.
        t.params.x = m::make_view(t.params.x.data, kBF16, {2, 70, 4, p}, {70 * 4 * (p + 8), 4 * (p + 8), p + 8, 1});
        SCOPED_TRACE("chunk " + std::to_string(chunk) + " headdim " + std::to_string(p) + " dstate " +
                     std::to_string(n));
        expect_only_location_error(t.params);
      }
    }
  }
}

#ifdef MAMBA2_SSD_WITH_CUDA
bool have_gpu() {
  int n = 0;
  const bool ok = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  (void)cudaGetLastError();
  return ok;
}

TEST(ValidateCudaBuild, HostMemoryRejectedForCuda) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Batched t({}, m::Device::kCUDA);
  EXPECT_INVALID(t.params, "x", "expected device memory, got host memory");
  // (the caller vouches for where the memory lives: not asked)
  t.params.check_memory_locations = false;
  EXPECT_NO_THROW(m::validate(t.params));
}

TEST(ValidateCudaBuild, DeviceMemoryAcceptedForCudaRejectedForCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Batched host({}, m::Device::kCUDA);
  ForwardParams p = host.params;
  p.seq_idx = TensorView{};  // keep the device allocations few
  TensorView* views[] = {&p.x, &p.dt, &p.A, &p.B, &p.C, &p.D, &p.z, &p.dt_bias, &p.initial_states,
                         &p.out, &p.final_states, &p.chunk_states};
  std::vector<void*> allocations;
  for (TensorView* v : views) {
    void* ptr = nullptr;
    ASSERT_EQ(cudaMalloc(&ptr, static_cast<std::size_t>(v->numel()) * m::dtype_size(v->dtype)), cudaSuccess);
    allocations.push_back(ptr);
    v->data = ptr;
  }
  EXPECT_NO_THROW(m::validate(p));
  p.device = m::Device::kCPU;
  EXPECT_INVALID(p, "x", "expected host memory", "got device memory");
  p.device = m::Device::kCUDA;
  p.dt.data = host.params.dt.data;
  EXPECT_INVALID(p, "dt", "expected device memory, got host memory");
  for (void* ptr : allocations) cudaFree(ptr);
}
#endif

// =============================================================================================
// Bad inputs: required tensors, generic view rules
// =============================================================================================

TEST(ValidateBad, MissingX) {
  Batched t;
  t.params.x.data = nullptr;
  EXPECT_INVALID(t.params, "x", "x: required input is missing (null data pointer)");
}

TEST(ValidateBad, MissingDtABC) {
  for (const char* name : {"dt", "A", "B", "C"}) {
    Batched t;
    ForwardParams& p = t.params;
    TensorView& v = std::string(name) == "dt" ? p.dt : std::string(name) == "A" ? p.A
                                                   : std::string(name) == "B" ? p.B
                                                                              : p.C;
    v.data = nullptr;
    EXPECT_INVALID(p, name, "required input is missing (null data pointer)");
  }
}

TEST(ValidateBad, MissingOut) {
  Batched t;
  t.params.out.data = nullptr;
  EXPECT_INVALID(t.params, "out", "required output is missing (null data pointer)");
}

TEST(ValidateBad, NegativeSize) {
  Batched t;
  t.params.dt.sizes[1] = -1;
  EXPECT_INVALID(t.params, "dt", "expected sizes >= 0", "got -1 for dim 1");
}

TEST(ValidateBad, NegativeStride) {
  Batched t;
  t.params.B.strides[1] = -32;
  EXPECT_INVALID(t.params, "B", "expected strides >= 0", "got -32 for dim 1");
}

TEST(ValidateBad, RankAboveMax) {
  Batched t;
  t.params.z.rank = 7;
  EXPECT_INVALID(t.params, "z", "expected a rank between 0 and 6", "got 7");
}

TEST(ValidateBad, ElementCountOverflow) {
  Batched t;
  t.params.x = m::make_view(t.params.x.data, kBF16, {int64_t{1} << 31, int64_t{1} << 31, 4, 64});
  EXPECT_INVALID(t.params, "x", "element count that fits in int64", "(2147483648, 2147483648, 4, 64)");
}

TEST(ValidateBad, ExtentOverflow) {
  Batched t;
  t.params.A = m::make_view(t.params.A.data, kF32, {4}, {int64_t{1} << 62});
  EXPECT_INVALID(t.params, "A", "memory extent that fits in int64 bytes", "strides (4611686018427387904)");
}

TEST(ValidateBad, ElementMisalignedPointer) {
  Batched t;
  t.params.A.data = offset_bytes(t.params.A.data, 2);
  EXPECT_INVALID(t.params, "A", "aligned to 4 bytes (the size of float32)", "(offset 2 bytes)");
}

TEST(ValidateBad, UnknownDType) {
  Batched t;
  t.params.dt.dtype = static_cast<DType>(9);
  EXPECT_INVALID(t.params, "dt", "expected a valid DType value, got 9");
}

TEST(ValidateBad, UnknownLayout) {
  Batched t;
  t.params.layout = static_cast<m::Layout>(5);
  EXPECT_INVALID(t.params, "layout", "Layout::kBatched or Layout::kVarlen", "got value 5");
}

// =============================================================================================
// Bad inputs: dtypes
// =============================================================================================

TEST(ValidateBad, XDtype) {
  Batched t;
  t.params.x.dtype = kI32;
  EXPECT_INVALID(t.params, "x", "expected dtype bfloat16, float16 or float32, got int32");
}

TEST(ValidateBad, BDtypeNotX) {
  Batched t;
  t.params.B.dtype = kF16;
  EXPECT_INVALID(t.params, "B", "B: expected dtype bfloat16 (the dtype of x), got float16");
}

TEST(ValidateBad, CDtypeNotX) {
  Batched t;
  t.params.C.dtype = kF32;
  EXPECT_INVALID(t.params, "C", "expected dtype bfloat16 (the dtype of x), got float32");
}

TEST(ValidateBad, ZDtypeNotX) {
  Batched t;
  t.params.z.dtype = kF16;
  EXPECT_INVALID(t.params, "z", "expected dtype bfloat16 (the dtype of x), got float16");
}

TEST(ValidateBad, OutDtypeNotX) {
  Batched t;
  t.params.out.dtype = kF32;
  EXPECT_INVALID(t.params, "out", "expected dtype bfloat16 (the dtype of x), got float32");
}

TEST(ValidateBad, DtDtype) {
  Batched t;
  t.params.dt.dtype = kI64;
  EXPECT_INVALID(t.params, "dt", "expected dtype float32, bfloat16 or float16, got int64");
}

TEST(ValidateBad, ADtype) {
  Batched t;
  t.params.A.dtype = kBF16;
  EXPECT_INVALID(t.params, "A", "expected dtype float32, got bfloat16");
}

TEST(ValidateBad, DDtype) {
  Batched t;
  t.params.D.dtype = kF16;
  EXPECT_INVALID(t.params, "D", "expected dtype float32, got float16");
}

TEST(ValidateBad, DtBiasDtype) {
  Batched t;
  t.params.dt_bias.dtype = kBF16;
  EXPECT_INVALID(t.params, "dt_bias", "expected dtype float32, got bfloat16");
}

TEST(ValidateBad, StatesDtype) {
  Batched t;
  t.params.final_states.dtype = kI32;
  EXPECT_INVALID(t.params, "final_states", "expected dtype float32, bfloat16 or float16, got int32");
  Batched t2;
  t2.params.initial_states.dtype = kI64;
  EXPECT_INVALID(t2.params, "initial_states", "expected dtype float32, bfloat16 or float16, got int64");
}

TEST(ValidateBad, SeqIdxDtype) {
  Batched t;
  t.params.seq_idx.dtype = kI64;
  EXPECT_INVALID(t.params, "seq_idx", "expected dtype int32, got int64");
}

TEST(ValidateBad, CuSeqlensDtype) {
  Varlen t;
  t.params.cu_seqlens.dtype = kF32;
  t.params.cu_seqlens.data = t.mem.alloc(4, kF32);
  EXPECT_INVALID(t.params, "cu_seqlens", "expected dtype int32 or int64, got float32");
}

TEST(ValidateBad, ChunkOffsetsDtype) {
  Varlen t;
  t.params.chunk_offsets.dtype = kI64;
  EXPECT_INVALID(t.params, "chunk_offsets", "expected dtype int32, got int64");
}

// =============================================================================================
// Bad inputs: sizes and shapes
// =============================================================================================

TEST(ValidateBad, XRankBatched) {
  Batched t;
  t.params.x = m::make_view(t.params.x.data, kBF16, {2, 64, 8});
  EXPECT_INVALID(t.params, "x",
                 "x: expected rank 4 (batch, seqlen, nheads, headdim) for the batched layout, got rank 3 with "
                 "shape (2, 64, 8)");
}

TEST(ValidateBad, ZeroSeqlen) {
  Batched t;
  t.params.x = m::make_view(t.params.x.data, kBF16, {2, 0, 4, 64});
  EXPECT_INVALID(t.params, "x", "expected seqlen (dim 1) >= 1, got 0");
}

TEST(ValidateBad, ZeroHeaddim) {
  Batched t;
  t.params.x = m::make_view(t.params.x.data, kBF16, {2, 100, 4, 0});
  EXPECT_INVALID(t.params, "x", "expected headdim (dim 3) >= 1, got 0");
}

TEST(ValidateBad, ZeroDstate) {
  Batched t;
  t.params.B = m::make_view(t.params.B.data, kBF16, {2, 100, 2, 0});
  EXPECT_INVALID(t.params, "B", "expected dstate (dim 3) >= 1, got 0");
}

TEST(ValidateBad, BSeqlenNotX) {
  Batched t;
  t.params.B = m::make_view(t.params.B.data, kBF16, {2, 99, 2, 16});
  EXPECT_INVALID(t.params, "B", "expected shape (2, 100, 2, 16)", "got (2, 99, 2, 16)");
}

TEST(ValidateBad, CShapeNotB) {
  Batched t;
  t.params.C = m::make_view(t.params.C.data, kBF16, {2, 100, 2, 32});
  EXPECT_INVALID(t.params, "C", "expected shape (2, 100, 2, 16)", "like B", "got (2, 100, 2, 32)");
}

TEST(ValidateBad, NheadsNotMultipleOfNgroups) {
  Batched t;
  t.params.B = m::make_view(t.params.B.data, kBF16, {2, 100, 3, 16});
  t.params.C = m::make_view(t.params.C.data, kBF16, {2, 100, 3, 16});
  EXPECT_INVALID(t.params, "B", "nheads = 4", "ngroups = 3", "not a multiple");
}

TEST(ValidateBad, DtShape) {
  Batched t;
  t.params.dt = m::make_view(t.params.dt.data, kF32, {2, 100, 3});
  EXPECT_INVALID(t.params, "dt", "expected shape (2, 100, 4) (batch, seqlen, nheads)", "got (2, 100, 3)");
}

TEST(ValidateBad, OutShape) {
  Batched t;
  t.params.out = m::make_view(t.params.out.data, kBF16, {2, 100, 4, 32});
  EXPECT_INVALID(t.params, "out", "expected shape (2, 100, 4, 64) (the shape of x), got (2, 100, 4, 32)");
}

TEST(ValidateBad, ZShape) {
  Batched t;
  t.params.z = m::make_view(t.params.z.data, kBF16, {2, 100, 4});
  EXPECT_INVALID(t.params, "z", "expected shape (2, 100, 4, 64) (the shape of x), got (2, 100, 4)");
}

TEST(ValidateBad, AShape) {
  Batched t;
  t.params.A = m::make_view(t.params.A.data, kF32, {5});
  EXPECT_INVALID(t.params, "A", "expected shape (4) (nheads), got (5)");
}

TEST(ValidateBad, DtBiasShape) {
  Batched t;
  t.params.dt_bias = m::make_view(t.params.dt_bias.data, kF32, {4, 1});
  EXPECT_INVALID(t.params, "dt_bias", "expected rank 1 (nheads), got rank 2 with shape (4, 1)");
}

TEST(ValidateBad, DRank3) {
  Batched t;
  t.params.D = m::make_view(t.params.D.data, kF32, {4, 64, 1});
  EXPECT_INVALID(t.params, "D", "expected rank 1 (nheads) or 2 (nheads, headdim), got rank 3");
}

TEST(ValidateBad, DRank2Shape) {
  Batched t;
  t.params.D = m::make_view(t.params.D.data, kF32, {4, 32});
  EXPECT_INVALID(t.params, "D", "expected shape (4, 64) (nheads, headdim), got (4, 32)");
}

TEST(ValidateBad, InitialStatesShape) {
  Batched t;
  t.params.initial_states = m::make_view(t.params.initial_states.data, kF32, {2, 4, 64, 32});
  EXPECT_INVALID(t.params, "initial_states", "expected shape (2, 4, 64, 16) (batch, nheads, headdim, dstate)",
                 "got (2, 4, 64, 32)");
}

TEST(ValidateBad, FinalStatesShape) {
  Batched t;
  t.params.final_states = m::make_view(t.params.final_states.data, kF32, {1, 4, 64, 16});
  EXPECT_INVALID(t.params, "final_states", "expected shape (2, 4, 64, 16)", "got (1, 4, 64, 16)");
}

TEST(ValidateBad, SeqIdxShape) {
  Batched t;
  t.params.seq_idx = m::make_view(t.params.seq_idx.data, kI32, {2, 99});
  EXPECT_INVALID(t.params, "seq_idx", "expected shape (2, 100) (batch, seqlen)", "got (2, 99)");
}

TEST(ValidateBad, ChunkStatesBatchedNchunks) {
  Batched t;
  t.params.chunk_states = m::make_view(t.params.chunk_states.data, kBF16, {2, 1, 4, 64, 16});
  EXPECT_INVALID(t.params, "chunk_states", "expected shape (2, 2, 4, 64, 16)", "got (2, 1, 4, 64, 16)");
}

TEST(ValidateBad, ChunkSizeZero) {
  Batched t;
  t.params.chunk_size = 0;
  EXPECT_INVALID(t.params, "chunk_size", "expected chunk_size >= 1, got 0");
}

// =============================================================================================
// Bad inputs: layout combinations, cu_seqlens, seq_idx contents
// =============================================================================================

TEST(ValidateBad, BatchedCuSeqlensWithoutVarlenStates) {
  Dims d;
  d.b = 1;
  Batched t(d);
  t.add_cu_seqlens({0, 50, 100});
  t.params.varlen_states = TensorView{};
  EXPECT_INVALID(t.params, "cu_seqlens", "expected varlen_states too", "got none");
}

TEST(ValidateBad, BatchedVarlenStatesWithoutCuSeqlens) {
  Dims d;
  d.b = 1;
  Batched t(d);
  t.add_cu_seqlens({0, 50, 100});
  t.params.cu_seqlens = TensorView{};
  EXPECT_INVALID(t.params, "varlen_states", "expected cu_seqlens too", "got none");
}

TEST(ValidateBad, BatchedCuSeqlensNeedsBatch1) {
  Batched t;  // batch 2
  t.add_cu_seqlens({0, 50, 100});
  EXPECT_INVALID(t.params, "cu_seqlens", "expected batch 1", "got batch 2");
}

TEST(ValidateBad, BatchedChunkOffsets) {
  Batched t;
  t.params.chunk_offsets = t.mem.view(kI32, {3});
  EXPECT_INVALID(t.params, "chunk_offsets", "for the batched layout", "got one of shape (3)");
}

TEST(ValidateBad, VarlenStatesShape) {
  Dims d;
  d.b = 1;
  Batched t(d);
  t.add_cu_seqlens({0, 50, 100});
  t.params.varlen_states = m::make_view(t.params.varlen_states.data, kF32, {3, 4, 64, 16});
  EXPECT_INVALID(t.params, "varlen_states", "expected shape (2, 4, 64, 16)", "got (3, 4, 64, 16)");
}

TEST(ValidateBad, CuSeqlensFirstNotZero) {
  Dims d;
  d.b = 1;
  Batched t(d);
  t.add_cu_seqlens({3, 50, 100});
  EXPECT_INVALID(t.params, "cu_seqlens", "expected cu_seqlens[0] == 0, got 3");
}

TEST(ValidateBad, CuSeqlensDecreasing) {
  Varlen t;
  static_cast<int64_t*>(t.params.cu_seqlens.data)[2] = 20;  // 0, 30, 20, 100
  EXPECT_INVALID(t.params, "cu_seqlens", "non-decreasing", "cu_seqlens[2] = 20 < cu_seqlens[1] = 30");
}

TEST(ValidateBad, CuSeqlensLastNotSeqlen) {
  Dims d;
  d.b = 1;
  Batched t(d);
  t.add_cu_seqlens({0, 50, 90});
  EXPECT_INVALID(t.params, "cu_seqlens", "expected cu_seqlens[2] == 100 (seqlen), got 90");
}

TEST(ValidateBad, CuSeqlensLastNotTotalTokens) {
  Varlen t;
  static_cast<int64_t*>(t.params.cu_seqlens.data)[3] = 101;
  EXPECT_INVALID(t.params, "cu_seqlens", "expected cu_seqlens[3] == 100 (total_tokens), got 101");
}

TEST(ValidateBad, CuSeqlensTooShort) {
  Varlen t;
  t.params.cu_seqlens = m::make_view(t.params.cu_seqlens.data, kI64, {1});
  EXPECT_INVALID(t.params, "cu_seqlens", "expected at least 2 entries", "got 1");
}

TEST(ValidateBad, CuSeqlensRank) {
  Varlen t;
  t.params.cu_seqlens = m::make_view(t.params.cu_seqlens.data, kI64, {2, 2});
  EXPECT_INVALID(t.params, "cu_seqlens", "expected rank 1 (nseq + 1)", "got rank 2");
}

TEST(ValidateBad, SeqIdxNegative) {
  Batched t;
  static_cast<int32_t*>(t.params.seq_idx.data)[100 + 3] = -1;  // row 1, position 3
  EXPECT_INVALID(t.params, "seq_idx", "expected values >= 0, got seq_idx[1, 3] = -1");
}

TEST(ValidateBad, SeqIdxDecreasing) {
  Batched t;
  static_cast<int32_t*>(t.params.seq_idx.data)[100 + 51] = 0;  // row 1: ..., 1 (pos 50), 0 (pos 51)
  EXPECT_INVALID(t.params, "seq_idx", "non-decreasing", "seq_idx[1, 51] = 0 < seq_idx[1, 50] = 1");
}

TEST(ValidateBad, VarlenMissingCuSeqlens) {
  Varlen t;
  t.params.cu_seqlens = TensorView{};
  EXPECT_INVALID(t.params, "cu_seqlens", "required for the varlen layout", "got none");
}

TEST(ValidateBad, VarlenWithSeqIdx) {
  Varlen t;
  t.params.seq_idx = t.mem.view(kI32, {1, 100});
  EXPECT_INVALID(t.params, "seq_idx", "expected no tensor for the varlen layout", "got one of shape (1, 100)");
}

TEST(ValidateBad, VarlenWithVarlenStates) {
  Varlen t;
  t.params.varlen_states = t.mem.view(kF32, {3, 4, 64, 16});
  EXPECT_INVALID(t.params, "varlen_states", "expected no tensor for the varlen layout", "got one of shape");
}

TEST(ValidateBad, VarlenXRank) {
  Varlen t;
  t.params.x = m::make_view(t.params.x.data, kBF16, {1, 100, 4, 64});
  EXPECT_INVALID(t.params, "x", "expected rank 3 (total_tokens, nheads, headdim) for the varlen layout",
                 "got rank 4 with shape (1, 100, 4, 64)");
}

TEST(ValidateBad, VarlenDtShape) {
  Varlen t;
  t.params.dt = m::make_view(t.params.dt.data, kBF16, {1, 100, 4});
  EXPECT_INVALID(t.params, "dt", "expected rank 2 (total_tokens, nheads) for the varlen layout", "got rank 3");
}

TEST(ValidateBad, VarlenInitialStatesPerSequence) {
  Varlen t;
  t.params.initial_states = m::make_view(t.params.initial_states.data, kBF16, {1, 4, 64, 16});
  EXPECT_INVALID(t.params, "initial_states", "expected shape (3, 4, 64, 16) (nseq, nheads, headdim, dstate)",
                 "got (1, 4, 64, 16)");
}

TEST(ValidateBad, VarlenChunkStatesCapacity) {
  Varlen t;
  t.params.chunk_states = m::make_view(t.params.chunk_states.data, kF32, {3, 4, 64, 16});
  EXPECT_INVALID(t.params, "chunk_states", "at least 4 chunks", "got 3");
}

TEST(ValidateBad, VarlenChunkStatesInnerShape) {
  Varlen t;
  t.params.chunk_states = m::make_view(t.params.chunk_states.data, kF32, {8, 4, 32, 16});
  EXPECT_INVALID(t.params, "chunk_states", "expected shape (capacity, 4, 64, 16)", "got (8, 4, 32, 16)");
}

TEST(ValidateBad, VarlenChunkOffsetsShape) {
  Varlen t;
  t.params.chunk_offsets = m::make_view(t.params.chunk_offsets.data, kI32, {3});
  EXPECT_INVALID(t.params, "chunk_offsets", "expected shape (4) (nseq + 1)", "got (3)");
}

// =============================================================================================
// Bad inputs: scalars, state dtype, memory layout
// =============================================================================================

TEST(ValidateBad, DtMinNaN) {
  Batched t;
  t.params.dt_min = std::nanf("");
  EXPECT_INVALID(t.params, "dt_min", "expected a number, got NaN");
}

TEST(ValidateBad, DtMaxNaN) {
  Batched t;
  t.params.dt_max = std::nanf("");
  EXPECT_INVALID(t.params, "dt_max", "expected a number, got NaN");
}

TEST(ValidateBad, DtMinAboveDtMax) {
  Batched t;
  t.params.dt_min = 0.5f;
  t.params.dt_max = 0.125f;
  EXPECT_INVALID(t.params, "dt_min", "expected dt_min <= dt_max", "dt_min = 0.5 > dt_max = 0.125");
}

TEST(ValidateBad, StateDtypeWrong16BitType) {
  Batched t;  // bf16 inputs
  t.params.state_dtype = kF16;
  EXPECT_INVALID(t.params, "state_dtype", "expected float32 or bfloat16", "bfloat16 inputs", "got float16");
  Dims d;
  d.dtype = kF16;
  Batched t2(d);
  t2.params.state_dtype = kBF16;
  EXPECT_INVALID(t2.params, "state_dtype", "expected float32 or float16", "float16 inputs", "got bfloat16");
  Dims d3;
  d3.dtype = kF32;
  Batched t3(d3);
  t3.params.state_dtype = kF16;
  EXPECT_INVALID(t3.params, "state_dtype", "expected float32 or bfloat16", "float32 inputs", "got float16");
}

TEST(ValidateBad, StateDtypeInteger) {
  Batched t;
  t.params.state_dtype = kI32;
  EXPECT_INVALID(t.params, "state_dtype", "expected float32 or bfloat16", "got int32");
}

TEST(ValidateBad, ChunkStatesDtypeNotStateDtype) {
  Batched t;  // bf16 inputs, state_dtype unset: bf16
  t.params.chunk_states.dtype = kF32;
  EXPECT_INVALID(t.params, "chunk_states", "expected dtype bfloat16 (the state dtype), got float32");
  Batched t2;
  t2.params.state_dtype = kF32;  // chunk_states stays bf16
  EXPECT_INVALID(t2.params, "chunk_states", "expected dtype float32 (the state dtype), got bfloat16");
}

TEST(ValidateBad, XInnermostNotContiguous) {
  Batched t;
  t.params.x = m::make_view(t.params.x.data, kBF16, {2, 100, 4, 64}, {51200, 512, 128, 2});
  EXPECT_INVALID(t.params, "x", "expected a contiguous innermost dimension (stride 1)", "got stride 2 for dim 3");
}

TEST(ValidateBad, StatesInnermostNotContiguous) {
  Batched t;
  t.params.initial_states = m::make_view(t.params.initial_states.data, kF32, {2, 4, 64, 16}, {1, 2, 128, 8192});
  EXPECT_INVALID(t.params, "initial_states", "contiguous innermost dimension", "got stride 8192 for dim 3");
}

TEST(ValidateBad, D2InnermostNotContiguous) {
  Batched t;
  t.params.D = m::make_view(t.params.D.data, kF32, {4, 64}, {1, 4});
  EXPECT_INVALID(t.params, "D", "contiguous innermost dimension", "got stride 4 for dim 1");
}

TEST(ValidateBad, OutputOverlapsItself) {
  Batched t;
  t.params.out = m::make_view(t.params.out.data, kBF16, {2, 100, 4, 64}, {25600, 256, 0, 1});
  EXPECT_INVALID(t.params, "out", "expected non-overlapping memory", "strides (25600, 256, 0, 1)");
  Batched t2;
  t2.params.final_states = m::make_view(t2.params.final_states.data, kF32, {2, 4, 64, 16}, {1024, 256, 8, 1});
  EXPECT_INVALID(t2.params, "final_states", "expected non-overlapping memory", "strides (1024, 256, 8, 1)");
}

// =============================================================================================
// Bad inputs: GPU-only rules (Device::kCUDA; these precede the pointer-location check)
// =============================================================================================

TEST(ValidateGpuBad, ChunkSizeUnsupported) {
  Dims d;
  d.chunk = 32;
  Batched t(d, m::Device::kCUDA);
  EXPECT_UNSUPPORTED(t.params, "chunk_size", "64, 128 or 256", "got 32");
  Batched cpu(d);
  EXPECT_NO_THROW(m::validate(cpu.params));  // the CPU reference runs any chunk size
}

TEST(ValidateGpuBad, HeaddimUnsupported) {
  Dims d;
  d.p = 96;
  Batched t(d, m::Device::kCUDA);
  EXPECT_UNSUPPORTED(t.params, "x", "headdim 64 or 128", "got 96");
  Batched cpu(d);
  EXPECT_NO_THROW(m::validate(cpu.params));
}

TEST(ValidateGpuBad, DstateUnsupported) {
  for (int64_t n : {8, 24, 528}) {
    Dims d;
    d.n = n;
    Batched t(d, m::Device::kCUDA);
    EXPECT_UNSUPPORTED(t.params, "B", "dstate 16 to 512 in multiples of 16", ("got " + std::to_string(n)).c_str());
  }
}

TEST(ValidateGpuBad, VarlenHeaddimUnsupported) {
  Dims d;
  d.p = 32;
  Varlen t(d, m::Device::kCUDA);
  EXPECT_UNSUPPORTED(t.params, "x", "headdim 64 or 128", "got 32");
}

TEST(ValidateGpuBad, MisalignedX) {
  Batched t({}, m::Device::kCUDA);
  t.params.x.data = offset_bytes(t.params.x.data, 2);  // bf16: element-aligned, not 16-byte aligned
  EXPECT_INVALID(t.params, "x", "x: expected a 16-byte aligned data pointer for the GPU kernels, got address 0x",
                 "(offset 2 bytes)");
}

TEST(ValidateGpuBad, MisalignedChunkStates) {
  Batched t({}, m::Device::kCUDA);
  t.params.chunk_states.data = offset_bytes(t.params.chunk_states.data, 8);
  EXPECT_INVALID(t.params, "chunk_states", "16-byte aligned data pointer", "(offset 8 bytes)");
}

TEST(ValidateGpuBad, MisalignedVarlenOut) {
  Varlen t({}, m::Device::kCUDA);
  t.params.out.data = offset_bytes(t.params.out.data, 4);
  EXPECT_INVALID(t.params, "out", "16-byte aligned data pointer", "(offset 4 bytes)");
}

TEST(ValidateGpuBad, XStrideNotMultipleOf16Bytes) {
  Batched t({}, m::Device::kCUDA);
  // bf16: outer strides must be multiples of 8 elements; dim 2 has stride 68.
  t.params.x = m::make_view(t.params.x.data, kBF16, {2, 100, 4, 64}, {100 * 4 * 68, 4 * 68, 68, 1});
  EXPECT_INVALID(t.params, "x", "x: stride of dim 2 must be a multiple of 8 elements (16 bytes) for the GPU kernels, got 68");
}

TEST(ValidateGpuBad, Fp32StatesStrideNotMultipleOf16Bytes) {
  Batched t({}, m::Device::kCUDA);
  // fp32: multiples of 4 elements; dim 2 (headdim) has stride 18.
  t.params.final_states = m::make_view(t.params.final_states.data, kF32, {2, 4, 64, 16}, {4 * 64 * 18, 64 * 18, 18, 1});
  EXPECT_INVALID(t.params, "final_states", "stride of dim 2 must be a multiple of 4 elements (16 bytes)", "got 18");
}

TEST(ValidateGpuBad, BStrideOnCpuIsFine) {
  // The same stride that the GPU rejects is accepted on the CPU.
  for (m::Device dev : {m::Device::kCPU, m::Device::kCUDA}) {
    Batched t({}, dev);
    t.params.B = m::make_view(t.params.B.data, kBF16, {2, 100, 2, 16}, {2 * 100 * 20, 2 * 20, 20, 1});
    if (dev == m::Device::kCPU) {
      EXPECT_NO_THROW(m::validate(t.params));
    } else {
      EXPECT_INVALID(t.params, "B", "stride of dim 2 must be a multiple of 8 elements (16 bytes)", "got 20");
    }
  }
}

TEST(ValidateGpuBad, ContentsNotReadOnGpu) {
  // Device memory is never read on the host: an unsorted seq_idx is not detected for kCUDA, so
  // the call proceeds to the next check (none in a CPU-only build, the location check with CUDA).
  Batched t({}, m::Device::kCUDA);
  static_cast<int32_t*>(t.params.seq_idx.data)[5] = 7;  // row 0: 0, ..., 7, 0, ...
  expect_only_location_error(t.params);
  t.params.device = m::Device::kCPU;
  EXPECT_INVALID(t.params, "seq_idx", "non-decreasing", "seq_idx[0, 6] = 0 < seq_idx[0, 5] = 7");
}

// =============================================================================================
// types.hpp / params.hpp helpers
// =============================================================================================

TEST(Types, DtypeSizesAndNames) {
  EXPECT_EQ(m::dtype_size(kF32), 4u);
  EXPECT_EQ(m::dtype_size(kF16), 2u);
  EXPECT_EQ(m::dtype_size(kBF16), 2u);
  EXPECT_EQ(m::dtype_size(kI32), 4u);
  EXPECT_EQ(m::dtype_size(kI64), 8u);
  EXPECT_STREQ(m::dtype_name(kF32), "float32");
  EXPECT_STREQ(m::dtype_name(kF16), "float16");
  EXPECT_STREQ(m::dtype_name(kBF16), "bfloat16");
  EXPECT_STREQ(m::dtype_name(kI32), "int32");
  EXPECT_STREQ(m::dtype_name(kI64), "int64");
  EXPECT_STREQ(m::device_name(m::Device::kCPU), "cpu");
  EXPECT_STREQ(m::device_name(m::Device::kCUDA), "cuda");
  EXPECT_STREQ(m::layout_name(m::Layout::kBatched), "batched");
  EXPECT_STREQ(m::layout_name(m::Layout::kVarlen), "varlen");
}

TEST(Types, MakeViewRowMajorStrides) {
  int dummy = 0;
  const TensorView v = m::make_view(&dummy, kF32, {2, 3, 4});
  EXPECT_EQ(v.data, &dummy);
  EXPECT_EQ(v.dtype, kF32);
  EXPECT_EQ(v.rank, 3);
  EXPECT_EQ(v.sizes[0], 2);
  EXPECT_EQ(v.sizes[2], 4);
  EXPECT_EQ(v.strides[0], 12);
  EXPECT_EQ(v.strides[1], 4);
  EXPECT_EQ(v.strides[2], 1);
  EXPECT_EQ(v.size(-1), 4);
  EXPECT_EQ(v.stride(-3), 12);
  // A size-0 dimension counts as 1, as torch does.
  const TensorView e = m::make_view(nullptr, kBF16, {2, 0, 3});
  EXPECT_EQ(e.strides[0], 3);
  EXPECT_EQ(e.strides[1], 3);
  EXPECT_EQ(e.strides[2], 1);
  EXPECT_FALSE(e.present());
}

TEST(Types, MakeViewExplicitStrides) {
  const TensorView v = m::make_view(nullptr, kBF16, {2, 3}, {8, 2});
  EXPECT_EQ(v.rank, 2);
  EXPECT_EQ(v.strides[0], 8);
  EXPECT_EQ(v.strides[1], 2);
  EXPECT_FALSE(v.last_dim_contiguous());
  EXPECT_THROW(m::make_view(nullptr, kBF16, {2, 3}, {1}), Error);
  EXPECT_THROW(m::make_view(nullptr, kBF16, {1, 1, 1, 1, 1, 1, 1}), Error);
  EXPECT_NO_THROW(m::make_view(nullptr, kBF16, {1, 1, 1, 1, 1, 1}));
}

TEST(Types, NumelShapeStringContiguity) {
  EXPECT_EQ(m::make_view(nullptr, kF32, {4, 1024, 8, 64}).numel(), 4 * 1024 * 8 * 64);
  EXPECT_EQ(m::make_view(nullptr, kF32, {4, 1024, 8, 64}).shape_string(), "(4, 1024, 8, 64)");
  EXPECT_EQ(m::make_view(nullptr, kF32, {7}).shape_string(), "(7)");
  EXPECT_EQ(m::make_view(nullptr, kF32, {3, 0}).numel(), 0);
  TensorView scalar;
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_EQ(scalar.shape_string(), "()");
  EXPECT_TRUE(scalar.last_dim_contiguous());
  EXPECT_EQ(m::make_view(nullptr, kF32, {int64_t{1} << 40, int64_t{1} << 40}).numel(),
            std::numeric_limits<int64_t>::max());  // saturates
  EXPECT_TRUE(m::make_view(nullptr, kF32, {3, 1}, {5, 9}).last_dim_contiguous());  // size 1
  EXPECT_TRUE(m::make_view(nullptr, kF32, {3, 2}, {5, 1}).last_dim_contiguous());
  EXPECT_FALSE(m::make_view(nullptr, kF32, {3, 2}, {1, 3}).last_dim_contiguous());
}

TEST(Types, MaxVarlenChunksFormula) {
  EXPECT_EQ(m::max_varlen_chunks(100, 3, 64), 4);  // floor(289 / 64)
  EXPECT_EQ(m::max_varlen_chunks(64, 1, 64), 1);
  EXPECT_EQ(m::max_varlen_chunks(65, 1, 64), 2);
  EXPECT_EQ(m::max_varlen_chunks(2, 3, 4), 2);  // floor(11 / 4): fewer tokens than sequences
  EXPECT_EQ(m::max_varlen_chunks(0, 0, 64), 0);
  EXPECT_EQ(m::max_varlen_chunks(10, 2, 0), 0);  // invalid chunk size
  const int64_t big = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(m::max_varlen_chunks(big, 1, 1), big);  // no overflow in T + S * (Q - 1)
  EXPECT_EQ(m::max_varlen_chunks(big, 4, 256), 4 + (big - 4) / 256);
}

// Sum of ceil(len_i / q) over every split of `total` tokens into `nseq` sequences (each starting
// a fresh chunk); returns the largest.
int64_t most_chunks(int64_t total, int64_t nseq, int64_t q) {
  if (nseq == 1) return (total + q - 1) / q;
  int64_t best = 0;
  for (int64_t len = 0; len <= total; ++len) {
    const int64_t c = (len + q - 1) / q + most_chunks(total - len, nseq - 1, q);
    best = c > best ? c : best;
  }
  return best;
}

TEST(Types, MaxVarlenChunksIsUpperBound) {
  for (int64_t q : {1, 2, 3, 5, 8}) {
    for (int64_t s = 1; s <= 4; ++s) {
      for (int64_t total = 0; total <= 20; ++total) {
        const int64_t worst = most_chunks(total, s, q);
        const int64_t bound = m::max_varlen_chunks(total, s, q);
        EXPECT_LE(worst, bound) << "T " << total << " S " << s << " Q " << q;
        if (total >= s) {  // tight once every sequence can hold a token
          EXPECT_EQ(worst, bound) << "T " << total << " S " << s << " Q " << q;
        }
      }
    }
  }
}

}  // namespace
