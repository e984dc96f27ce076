// The CPU reference against the token-by-token oracle (float64, <= 1e-12 relative L2), against
// closed forms on tiny problems, and its invariances; plus the host float conversions.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "common/host_float.hpp"
#include "mamba2_ssd/api.hpp"
#include "mamba2_ssd/error.hpp"
#include "oracle.hpp"
#include "reference/reference.hpp"
#include "test_util.hpp"

namespace {

using mamba2_ssd::DType;
using mamba2_ssd::ForwardParams;
using mamba2_ssd::Layout;
using mamba2_ssd::TensorView;
using mamba2_ssd::reference::F64Outputs;
using mamba2_ssd::test::DMode;
using mamba2_ssd::test::HostTensor;
using mamba2_ssd::test::OracleOutputs;
using mamba2_ssd::test::Problem;
using mamba2_ssd::test::ProblemConfig;
using mamba2_ssd::test::Rng;
namespace host = mamba2_ssd::host;
namespace ref = mamba2_ssd::reference;
namespace mt = mamba2_ssd::test;

constexpr double kTol = 1e-12;
constexpr float kInf = std::numeric_limits<float>::infinity();

// ================================================================== host float conversions

TEST(HostFloat, Bf16EveryPatternRoundTrips) {
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    const float f = host::bf16_to_float(static_cast<uint16_t>(b));
    const uint16_t back = host::float_to_bf16(f);
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(host::bf16_to_float(back))) << std::hex << b;
      ASSERT_EQ(back & 0x8000u, b & 0x8000u) << std::hex << b;
    } else {
      ASSERT_EQ(back, b) << std::hex << b;
    }
  }
}

TEST(HostFloat, Fp16EveryPatternRoundTrips) {
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    const float f = host::fp16_to_float(static_cast<uint16_t>(b));
    const uint16_t back = host::float_to_fp16(f);
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(host::fp16_to_float(back))) << std::hex << b;
    } else {
      ASSERT_EQ(back, b) << std::hex << b;
    }
  }
}

TEST(HostFloat, KnownEncodings) {
  EXPECT_EQ(host::float_to_bf16(1.0f), 0x3f80u);
  EXPECT_EQ(host::float_to_bf16(-2.0f), 0xc000u);
  EXPECT_EQ(host::float_to_bf16(host::bits_to_float(0x3f808000u)), 0x3f80u);  // tie -> even (down)
  EXPECT_EQ(host::float_to_bf16(host::bits_to_float(0x3f818000u)), 0x3f82u);  // tie -> even (up)
  EXPECT_EQ(host::float_to_bf16(host::bits_to_float(0x3f808001u)), 0x3f81u);  // above the tie
  EXPECT_EQ(host::float_to_bf16(std::numeric_limits<float>::max()), 0x7f80u);  // overflows to inf
  EXPECT_EQ(host::float_to_bf16(-kInf), 0xff80u);
  EXPECT_EQ(host::float_to_bf16(host::bits_to_float(0x7f800001u)) & 0x7fc0u, 0x7fc0u);  // sNaN stays NaN

  EXPECT_EQ(host::float_to_fp16(1.0f), 0x3c00u);
  EXPECT_EQ(host::float_to_fp16(65504.0f), 0x7bffu);
  EXPECT_EQ(host::float_to_fp16(65519.99f), 0x7bffu);
  EXPECT_EQ(host::float_to_fp16(65520.0f), 0x7c00u);
  EXPECT_EQ(host::float_to_fp16(-kInf), 0xfc00u);
  EXPECT_EQ(host::float_to_fp16(-0.0f), 0x8000u);
  EXPECT_EQ(host::float_to_fp16(std::ldexp(1.0f, -24)), 0x0001u);         // smallest subnormal
  EXPECT_EQ(host::float_to_fp16(std::ldexp(1.0f, -25)), 0x0000u);         // tie -> even (zero)
  EXPECT_EQ(host::float_to_fp16(std::ldexp(3.0f, -25)), 0x0002u);         // tie -> even (up)
  EXPECT_EQ(host::float_to_fp16(std::ldexp(1.0f, -14)), 0x0400u);         // smallest normal
  EXPECT_EQ(host::float_to_fp16(std::ldexp(1023.5f, -24)), 0x0400u);      // rounds up into normals
  EXPECT_EQ(host::float_to_fp16(1.0f + std::ldexp(1.0f, -11)), 0x3c00u);  // tie -> even
  EXPECT_FLOAT_EQ(host::fp16_to_float(0x0001u), std::ldexp(1.0f, -24));
  EXPECT_FLOAT_EQ(host::fp16_to_float(0xc000u), -2.0f);
  EXPECT_TRUE(std::isnan(host::fp16_to_float(host::float_to_fp16(std::nanf("")))));
}

// Checks that `h` is the nearest 16-bit value to f with ties to even, by comparing with its
// neighbours in double arithmetic (independent of the bit tricks of the conversion).
template <class ToFloat>
::testing::AssertionResult is_nearest_even(float f, uint16_t h, uint16_t inf_bits, ToFloat to_float) {
  const double v = to_float(h);
  const uint16_t mag = h & 0x7fffu;
  if (mag == inf_bits) {
    const double below = to_float(static_cast<uint16_t>(inf_bits - 1));
    const double ulp = below - static_cast<double>(to_float(static_cast<uint16_t>(inf_bits - 2)));
    if (std::fabs(static_cast<double>(f)) >= below + ulp / 2) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << f << " rounded to infinity";
  }
  if (mag == inf_bits - 1) {  // the largest finite value has an odd mantissa: its tie goes up
    const double ulp = v - static_cast<double>(to_float(static_cast<uint16_t>((h & 0x8000u) | (mag - 1))));
    if (std::fabs(static_cast<double>(f)) >= std::fabs(v) + std::fabs(ulp) / 2) {
      return ::testing::AssertionFailure() << f << " should have rounded to infinity";
    }
  }
  for (int dir : {-1, 1}) {
    if ((mag == 0 && dir < 0) || (mag + dir == inf_bits)) continue;
    const double other = to_float(static_cast<uint16_t>((h & 0x8000u) | (mag + dir)));
    const double dv = std::fabs(f - v), dother = std::fabs(f - other);
    if (dother < dv || (dother == dv && (h & 1u))) {
      return ::testing::AssertionFailure() << f << " -> " << v << " but " << other << " is nearer or even";
    }
  }
  return ::testing::AssertionSuccess();
}

TEST(HostFloat, RandomFloatsRoundToNearestEven) {
  Rng rng(7);
  for (int i = 0; i < 400000; ++i) {
    // Random bit patterns cover every exponent; random small values hit the fp16 range.
    float f = host::bits_to_float(static_cast<uint32_t>(rng.next_u64()));
    if (!std::isfinite(f)) continue;
    ASSERT_TRUE(is_nearest_even(f, host::float_to_bf16(f), 0x7f80u, host::bf16_to_float));
    f = static_cast<float>(std::ldexp(rng.uniform(-1.0, 1.0), static_cast<int>(rng.uniform_int(-28, 17))));
    ASSERT_TRUE(is_nearest_even(f, host::float_to_fp16(f), 0x7c00u, host::fp16_to_float));
  }
}

TEST(HostFloat, StoreFromDoubleRoundsOnce) {
  // Just above the bf16 midpoint between 1 and 1 + 2^-7: a double -> float -> bf16 chain would
  // see an exact tie and round down to even; rounding once rounds up.
  const double above_tie = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40);
  uint16_t h = 0;
  host::store_from_double(&h, DType::kBFloat16, 0, above_tie);
  EXPECT_EQ(h, 0x3f81u);
  host::store_from_double(&h, DType::kBFloat16, 0, 1.0 + std::ldexp(1.0, -8));
  EXPECT_EQ(h, 0x3f80u);
  host::store_from_double(&h, DType::kFloat16, 0, 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -45));
  EXPECT_EQ(h, 0x3c01u);
  host::store_from_double(&h, DType::kFloat16, 0, std::ldexp(1.0, -25) + std::ldexp(1.0, -60));
  EXPECT_EQ(h, 0x0001u);
  host::store_from_double(&h, DType::kBFloat16, 0, 1e300);
  EXPECT_EQ(h, 0x7f80u);
  host::store_from_double(&h, DType::kBFloat16, 0, -1e-300);
  EXPECT_EQ(h, 0x8000u);
  float f = 0;
  host::store_from_double(&f, DType::kFloat32, 0, 1.0 / 3.0);
  EXPECT_EQ(f, 1.0f / 3.0f);

  // Around every midpoint of random 16-bit neighbours: below, at (ties to even) and above.
  Rng rng(11);
  for (int i = 0; i < 20000; ++i) {
    for (DType t : {DType::kBFloat16, DType::kFloat16}) {
      auto to_float = t == DType::kBFloat16 ? host::bf16_to_float : host::fp16_to_float;
      const uint16_t lo = static_cast<uint16_t>(rng.uniform_int(0, t == DType::kBFloat16 ? 0x7f7e : 0x7bfe));
      const double a = to_float(lo), b = to_float(static_cast<uint16_t>(lo + 1));
      const double mid = (a + b) / 2;  // exact in double
      const uint16_t even = (lo & 1u) ? static_cast<uint16_t>(lo + 1) : lo;
      for (auto [d, want] : {std::pair<double, uint16_t>{std::nextafter(mid, 0.0), lo},
                             {mid, even},
                             {std::nextafter(mid, 1e300), static_cast<uint16_t>(lo + 1)}}) {
        host::store_from_double(&h, t, 0, d);
        ASSERT_EQ(h, want) << "dtype " << mt::dtype_str(t) << " value " << d;
      }
    }
  }
}

TEST(HostFloat, LoadAndStoreEveryDtypeAtOffset) {
  for (DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kInt32, DType::kInt64}) {
    std::vector<uint64_t> buf(4, 0);
    host::store_from_double(buf.data(), t, 3, -6.0);
    EXPECT_EQ(host::load_as_double(buf.data(), t, 3), -6.0) << mt::dtype_str(t);
    EXPECT_EQ(host::load_as_int64(buf.data(), t, 3), -6) << mt::dtype_str(t);
    EXPECT_EQ(host::load_as_double(buf.data(), t, 2), 0.0) << mt::dtype_str(t);
    std::vector<double> out(2);
    host::load_strided(buf.data(), t, 1, 2, 2, out.data());
    EXPECT_EQ(out[1], -6.0) << mt::dtype_str(t);
  }
}

// ================================================================== test utilities

TEST(TestUtil, RelL2AndFinite) {
  HostTensor a(DType::kFloat32, {2, 3}, true), b(DType::kBFloat16, {2, 3});
  EXPECT_FALSE(mt::all_finite(a.view));  // poisoned at creation
  for (int64_t i = 0; i < 2; ++i) {
    for (int64_t j = 0; j < 3; ++j) {
      a.set({i, j}, static_cast<double>(1 + i + j));
      b.set({i, j}, static_cast<double>(1 + i + j));
    }
  }
  EXPECT_TRUE(mt::all_finite(a.view));
  EXPECT_TRUE(a.gaps_intact());
  EXPECT_EQ(mt::rel_l2(a.view, b.view), 0.0);
  a.set({1, 2}, 4.0 + 3.0);  // ref is [1 2 3; 2 3 4]: ||diff|| = 3, ||ref|| = sqrt(43)
  EXPECT_NEAR(mt::rel_l2(a.view, b.view), 3.0 / std::sqrt(43.0), 1e-15);
  a.set({0, 0}, std::nan(""));
  EXPECT_EQ(mt::rel_l2(a.view, b.view), std::numeric_limits<double>::infinity());
  EXPECT_FALSE(mt::all_finite(a.view));
  host::store_from_double(a.view.data, a.view.dtype, 3, 0.0);  // slot 3 is a gap (row stride 11)
  EXPECT_FALSE(a.gaps_intact());
  EXPECT_EQ(mt::rel_l2(std::vector<double>{0, 0}, std::vector<double>{0, 0}), 0.0);
  EXPECT_EQ(mt::rel_l2(std::vector<double>{1, 0}, std::vector<double>{0, 0}),
            std::numeric_limits<double>::infinity());
}

TEST(TestUtil, ProblemIsDeterministicAndPaddingDoesNotChangeValues) {
  ProblemConfig c;
  c.seed = 5;
  c.has_z = true;
  Problem p1(c);
  c.padded_strides = true;
  Problem p2(c);
  EXPECT_GT(p2.x.view.strides[0], p1.x.view.strides[0]);
  EXPECT_EQ(p2.x.view.strides[3], 1);
  EXPECT_EQ(mt::rel_l2(p1.x.view, p2.x.view), 0.0);
  EXPECT_EQ(mt::rel_l2(p1.z.view, p2.z.view), 0.0);
  c.seed = 6;
  Problem p3(c);
  EXPECT_GT(mt::rel_l2(p3.x.view, p1.x.view), 0.1);
  // Distributions: A in [-16, -1), raw dt = softplus(randn) > 0.
  for (int64_t h = 0; h < c.nheads; ++h) {
    EXPECT_LE(p1.A.get({h}), -1.0);
    EXPECT_GE(p1.A.get({h}), -16.0);
  }
  EXPECT_GT(p1.dt.get({0, 0, 0}), 0.0);
  ForwardParams fp = p1.params();
  EXPECT_EQ(mt::tensor_fields(fp).size(), 16u);
}

// ================================================================== reference vs oracle

::testing::AssertionResult close(const char* what, const std::vector<double>& got, const std::vector<double>& want,
                                 double tol) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << what << ": size " << got.size() << " vs " << want.size();
  }
  if (got.empty()) return ::testing::AssertionSuccess();
  const double e = mt::rel_l2(got, want);
  if (e <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": relative L2 error " << e << " > " << tol;
}

// The output tensor holds exactly the float64 result rounded once to its dtype, in its
// strided layout; `want` may cover only a leading part of the view (varlen chunk_states).
::testing::AssertionResult written_exactly(const char* what, const TensorView& v, const std::vector<double>& want) {
  size_t i = 0;
  int64_t bad = -1;
  double got_bad = 0, want_bad = 0;
  mt::for_each_offset(v, [&](int64_t off) {
    const double got = host::load_as_double(v.data, v.dtype, off);
    if (i < want.size()) {
      uint64_t tmp = 0;
      host::store_from_double(&tmp, v.dtype, 0, want[i]);
      const double rounded = host::load_as_double(&tmp, v.dtype, 0);
      if (bad < 0 && !(got == rounded)) {
        bad = static_cast<int64_t>(i);
        got_bad = got;
        want_bad = rounded;
      }
    } else if (bad < 0 && !std::isnan(got)) {  // beyond the used part: must be untouched
      bad = static_cast<int64_t>(i);
      got_bad = got;
      want_bad = std::nan("");
    }
    ++i;
  });
  if (bad < 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": element " << bad << " is " << got_bad << ", expected " << want_bad;
}

// Runs the reference in float64 and through forward(), the oracle, and checks them all.
void check_problem(Problem& pr, double tol = kTol) {
  SCOPED_TRACE(pr.cfg.describe());
  ForwardParams p = pr.params();
  const F64Outputs r = ref::forward_f64(p, pr.shape);
  const OracleOutputs o = mt::oracle_forward(p, pr.shape);

  EXPECT_EQ(r.final_states.empty(), !p.final_states.present());
  EXPECT_EQ(r.varlen_states.empty(), !p.varlen_states.present() || pr.shape.nseq == 0);
  EXPECT_TRUE(close("out", r.out, o.out, tol));
  EXPECT_TRUE(close("final_states", r.final_states, o.final_states, tol));
  EXPECT_TRUE(close("varlen_states", r.varlen_states, o.varlen_states, tol));
  EXPECT_TRUE(close("chunk_states", r.chunk_states, o.chunk_states, tol));
  EXPECT_EQ(r.chunk_offsets, o.chunk_offsets);
  EXPECT_TRUE(mt::all_finite(r.out));
  EXPECT_TRUE(mt::all_finite(r.final_states));
  EXPECT_TRUE(mt::all_finite(r.varlen_states));
  EXPECT_TRUE(mt::all_finite(r.chunk_states));

  // forward() writes every output element (they were NaN) in its dtype and strides, and
  // nothing else.
  pr.poison_outputs();
  ref::forward(p, pr.shape, 3);
  EXPECT_TRUE(written_exactly("out", p.out, r.out));
  if (p.final_states.present()) {
    EXPECT_TRUE(written_exactly("final_states", p.final_states, r.final_states));
  }
  if (p.varlen_states.present()) {
    EXPECT_TRUE(written_exactly("varlen_states", p.varlen_states, r.varlen_states));
  }
  if (p.chunk_states.present()) {
    EXPECT_TRUE(written_exactly("chunk_states", p.chunk_states, r.chunk_states));
  }
  if (p.chunk_offsets.present()) {
    for (size_t i = 0; i < r.chunk_offsets.size(); ++i) {
      EXPECT_EQ(pr.chunk_offsets.get({static_cast<int64_t>(i)}), r.chunk_offsets[i]) << "chunk_offsets " << i;
    }
  }
  for (auto& [name, t] : pr.tensors()) EXPECT_TRUE(t->gaps_intact()) << name << " written outside its view";
}

struct Case {
  std::string name;
  ProblemConfig cfg;
  std::function<void(Problem&)> tweak;  // edits inputs after the random fill
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

ProblemConfig base() {
  ProblemConfig c;
  c.batch = 2;
  c.seqlen = 50;
  c.nheads = 4;
  c.headdim = 6;
  c.ngroups = 2;
  c.dstate = 5;
  c.chunk_size = 16;
  c.has_initial_states = true;
  c.want_final_states = true;
  c.want_chunk_states = true;
  return c;
}

ProblemConfig with(ProblemConfig c, const std::function<void(ProblemConfig&)>& f) {
  f(c);
  return c;
}

// Sets raw dt of every (row, token, head) from a cycle of values.
std::function<void(Problem&)> dt_cycle(std::vector<double> values) {
  return [values](Problem& pr) {
    int64_t i = 0;
    const TensorView& v = pr.dt.view;
    mt::for_each_offset(v, [&](int64_t off) {
      host::store_from_double(v.data, v.dtype, off, values[i++ % values.size()]);
    });
  };
}

std::vector<Case> named_cases() {
  const std::vector<int64_t> packed = {5, 11, 16, 0, 30, 2, 17, 1};  // 82 tokens, Q = 16
  std::vector<Case> v = {
      {"seqlen_1", with(base(), [](auto& c) { c.seqlen = 1; c.d_mode = DMode::kPerHead; c.has_z = true; }), {}},
      {"seqlen_not_multiple_of_chunk", with(base(), [](auto& c) { c.seqlen = 77; }), {}},
      {"chunk_size_1", with(base(), [](auto& c) { c.seqlen = 9; c.chunk_size = 1; c.seq_starts = {{3, 4}}; }), {}},
      {"chunk_size_3", with(base(), [](auto& c) { c.seqlen = 31; c.chunk_size = 3; c.seq_starts = {{4, 9}}; }), {}},
      {"chunk_larger_than_seqlen", with(base(), [](auto& c) { c.seqlen = 20; c.chunk_size = 64; }), {}},
      {"chunk_size_huge", with(base(), [](auto& c) { c.seqlen = 20; c.chunk_size = int64_t{1} << 40; }), {}},
      {"seq_idx_inside_chunks", with(base(), [](auto& c) { c.seqlen = 70; c.seq_starts = {{5, 21, 40, 41}}; }), {}},
      {"seq_idx_on_chunk_edges", with(base(), [](auto& c) { c.seqlen = 64; c.seq_starts = {{16, 32, 48}}; }), {}},
      {"seq_idx_last_token_alone", with(base(), [](auto& c) { c.seqlen = 33; c.seq_starts = {{31, 32}}; }), {}},
      {"seq_idx_per_row",
       with(base(), [](auto& c) { c.batch = 3; c.seqlen = 45; c.seq_starts = {{}, {16}, {3, 30, 31}}; }), {}},
      {"seq_idx_not_starting_at_0", with(base(), [](auto& c) { c.seq_starts = {{10, 40}}; c.seq_idx_base = 1; }), {}},
      {"seq_idx_base_3_per_row",
       with(base(), [](auto& c) { c.seq_starts = {{0}, {20}}; c.seq_idx_base = 3; c.has_z = true; }), {}},
      {"packed_varlen_states_with_seq_idx", with(base(), [&](auto& c) {
         c.batch = 1; c.seqlen = 82; c.seqlens = packed; c.seq_starts = {mt::starts_of(packed)};
         c.want_varlen_states = true; }), {}},
      {"packed_varlen_states_without_seq_idx", with(base(), [&](auto& c) {
         c.batch = 1; c.seqlen = 82; c.seqlens = packed; c.want_varlen_states = true; c.d_mode = DMode::kPerHeadDim; }), {}},
      {"packed_one_sequence_int64", with(base(), [](auto& c) {
         c.batch = 1; c.seqlen = 40; c.seqlens = {40}; c.cu_seqlens_dtype = DType::kInt64; c.want_varlen_states = true; }), {}},
      {"packed_one_short_sequence", with(base(), [](auto& c) {  // initial state unused by varlen_states
         c.batch = 1; c.seqlen = 10; c.seqlens = {10}; c.want_varlen_states = true; }), {}},
      {"packed_bf16_states", with(base(), [&](auto& c) {
         c.batch = 1; c.seqlen = 82; c.seqlens = packed; c.seq_starts = {mt::starts_of(packed)};
         c.want_varlen_states = true; c.final_dtype = DType::kBFloat16; c.initial_dtype = DType::kFloat16; }), {}},
      {"varlen_layout", with(base(), [](auto& c) {
         c.layout = Layout::kVarlen; c.seqlens = {17, 0, 33, 1, 64, 5}; c.want_chunk_offsets = true;
         c.chunk_capacity_extra = 3; c.d_mode = DMode::kPerHeadDim; c.has_z = true; c.has_dt_bias = true; }), {}},
      {"varlen_layout_no_initial_states", with(base(), [](auto& c) {
         c.layout = Layout::kVarlen; c.seqlens = {0, 0, 7, 0}; c.has_initial_states = false; c.want_chunk_offsets = true; }), {}},
      {"varlen_layout_first_empty_with_init", with(base(), [](auto& c) {
         c.layout = Layout::kVarlen; c.seqlens = {0, 16, 32, 15}; c.chunk_size = 16; }), {}},
      {"varlen_layout_bf16", with(base(), [](auto& c) {
         c.layout = Layout::kVarlen; c.seqlens = {9, 40, 3}; c.dtype = DType::kBFloat16; c.dt_dtype = DType::kBFloat16;
         c.initial_dtype = DType::kBFloat16; c.final_dtype = DType::kBFloat16; c.want_chunk_offsets = true; }), {}},
      {"ngroups_1", with(base(), [](auto& c) { c.ngroups = 1; }), {}},
      {"ngroups_2_of_8", with(base(), [](auto& c) { c.nheads = 8; c.ngroups = 2; }), {}},
      {"ngroups_4", with(base(), [](auto& c) { c.nheads = 4; c.ngroups = 4; }), {}},
      {"odd_sizes", with(base(), [](auto& c) { c.nheads = 3; c.ngroups = 3; c.headdim = 1; c.dstate = 7; }), {}},
      {"D_per_head", with(base(), [](auto& c) { c.d_mode = DMode::kPerHead; }), {}},
      {"D_per_headdim_z_dt_bias",
       with(base(), [](auto& c) { c.d_mode = DMode::kPerHeadDim; c.has_z = true; c.has_dt_bias = true; }), {}},
      {"softplus_around_threshold", with(base(), [](auto& c) { c.dt_softplus = true; }),
       dt_cycle({-3.0, 0.5, 19.5, 20.0, 20.5, 25.0, -0.25})},
      {"softplus_with_bias", with(base(), [](auto& c) { c.dt_softplus = true; c.has_dt_bias = true; }),
       dt_cycle({-2.0, 19.9, 20.1, 0.1, 21.0})},
      {"dt_limit", with(base(), [](auto& c) {
         c.dt_softplus = true; c.has_dt_bias = true; c.dt_min = 0.3f; c.dt_max = 1.1f; }), {}},
      {"dt_limit_without_softplus", with(base(), [](auto& c) { c.dt_min = 0.05f; c.dt_max = 0.5f; }),
       dt_cycle({-1.0, 0.01, 0.2, 3.0})},
      {"huge_dt_softplus", with(base(), [](auto& c) {
         c.dt_softplus = true; c.seq_starts = {{7, 33}}; c.d_mode = DMode::kPerHead; c.has_z = true; }),
       dt_cycle({1e4, 0.3, 1e4, 1e4, 2.0})},
      {"huge_dt_everywhere", with(base(), [](auto& c) { c.seqlen = 40; }), dt_cycle({1e4})},
      {"zero_A", with(base(), [](auto& c) { c.seq_starts = {{20}}; }), [](Problem& pr) { pr.A.set({1}, 0.0); }},
      {"state_dtype_bf16", with(base(), [](auto& c) { c.state_dtype = DType::kBFloat16; }), {}},
      {"state_dtype_fp16_fp16_inputs", with(base(), [](auto& c) {
         c.dtype = DType::kFloat16; c.dt_dtype = DType::kFloat16; c.state_dtype = DType::kFloat16;
         c.initial_dtype = DType::kFloat16; c.final_dtype = DType::kFloat16; }), {}},
      {"bf16_inputs", with(base(), [](auto& c) {
         c.dtype = DType::kBFloat16; c.dt_dtype = DType::kBFloat16; c.initial_dtype = DType::kBFloat16;
         c.final_dtype = DType::kBFloat16; c.has_z = true; c.d_mode = DMode::kPerHeadDim; c.seq_starts = {{13}}; }), {}},
      {"fp16_inputs_fp32_states", with(base(), [](auto& c) {
         c.dtype = DType::kFloat16; c.dt_dtype = DType::kFloat16; c.state_dtype = DType::kFloat32; c.has_z = true; }), {}},
      {"padded_batched", with(base(), [&](auto& c) {
         c.batch = 1; c.seqlen = 82; c.seqlens = packed; c.seq_starts = {mt::starts_of(packed)};
         c.want_varlen_states = true; c.padded_strides = true; c.d_mode = DMode::kPerHeadDim; c.has_z = true;
         c.has_dt_bias = true; }), {}},
      {"padded_varlen", with(base(), [](auto& c) {
         c.layout = Layout::kVarlen; c.seqlens = {20, 0, 3, 50}; c.padded_strides = true; c.want_chunk_offsets = true;
         c.chunk_capacity_extra = 2; c.d_mode = DMode::kPerHead; }), {}},
  };
  for (size_t i = 0; i < v.size(); ++i) v[i].cfg.seed = 100 + i;
  return v;
}

class NamedCase : public ::testing::TestWithParam<Case> {};

TEST_P(NamedCase, ReferenceMatchesOracle) {
  Problem pr(GetParam().cfg);
  if (GetParam().tweak) GetParam().tweak(pr);
  check_problem(pr);
}

INSTANTIATE_TEST_SUITE_P(Reference, NamedCase, ::testing::ValuesIn(named_cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

// A random problem of small size with every option drawn at random.
ProblemConfig random_config(uint64_t seed) {
  Rng r(seed * 7919 + 1);
  ProblemConfig c;
  c.seed = seed;
  const int64_t heads[] = {1, 2, 3, 4, 8};
  c.nheads = heads[r.uniform_int(0, 4)];
  do {
    c.ngroups = r.uniform_int(1, c.nheads);
  } while (c.nheads % c.ngroups != 0);
  c.headdim = r.uniform_int(1, 12);
  c.dstate = r.uniform_int(1, 12);
  const int64_t chunks[] = {1, 2, 5, 8, 16, 32};
  c.chunk_size = chunks[r.uniform_int(0, 5)];
  const DType floats[] = {DType::kFloat32, DType::kFloat32, DType::kBFloat16, DType::kFloat16};
  c.dtype = floats[r.uniform_int(0, 3)];
  c.dt_dtype = floats[r.uniform_int(0, 3)];
  c.initial_dtype = floats[r.uniform_int(0, 3)];
  c.final_dtype = floats[r.uniform_int(0, 3)];
  if (r.coin(0.3)) c.state_dtype = r.coin() ? DType::kFloat32 : (c.dtype == DType::kFloat16 ? DType::kFloat16 : DType::kBFloat16);
  c.d_mode = static_cast<DMode>(r.uniform_int(0, 2));
  c.has_z = r.coin();
  c.has_dt_bias = r.coin();
  c.dt_softplus = r.coin();
  if (r.coin(0.3)) {
    c.dt_min = static_cast<float>(r.uniform(0.0, 0.3));
    c.dt_max = r.coin() ? static_cast<float>(r.uniform(0.5, 3.0)) : kInf;
  }
  c.has_initial_states = r.coin();
  c.want_final_states = r.coin(0.8);
  c.want_chunk_states = r.coin(0.6);
  c.padded_strides = r.coin(0.3);
  auto random_lengths = [&](int64_t total_max) {
    std::vector<int64_t> lens(static_cast<size_t>(r.uniform_int(1, 6)));
    for (auto& len : lens) len = r.coin(0.15) ? 0 : r.uniform_int(1, total_max);
    return lens;
  };
  if (r.coin(0.3)) {
    c.layout = Layout::kVarlen;
    c.seqlens = random_lengths(40);
    int64_t total = 0;
    for (int64_t len : c.seqlens) total += len;
    if (total == 0) c.seqlens.back() = 3;
    c.want_chunk_offsets = r.coin(0.7);
    c.chunk_capacity_extra = r.uniform_int(0, 2);
  } else if (r.coin(0.3)) {  // packed sequences in one row, with varlen_states
    c.batch = 1;
    c.seqlens = random_lengths(40);
    c.seqlen = 0;
    for (int64_t len : c.seqlens) c.seqlen += len;
    if (c.seqlen == 0) c.seqlens.back() = c.seqlen = 5;
    c.want_varlen_states = true;
    if (r.coin(0.7)) c.seq_starts = {mt::starts_of(c.seqlens)};
  } else {
    c.batch = r.uniform_int(1, 3);
    c.seqlen = r.uniform_int(1, 100);
    if (r.coin(0.6)) {
      const bool per_row = r.coin();
      for (int64_t b = 0; b < (per_row ? c.batch : 1); ++b) {
        std::vector<int64_t> starts(static_cast<size_t>(r.uniform_int(0, 4)));
        for (auto& s : starts) s = r.uniform_int(0, c.seqlen - 1);
        std::sort(starts.begin(), starts.end());
        c.seq_starts.push_back(starts);
      }
      if (r.coin(0.2)) c.seq_idx_base = 1;
    }
  }
  return c;
}

class RandomCase : public ::testing::TestWithParam<int> {};

TEST_P(RandomCase, ReferenceMatchesOracle) {
  Problem pr(random_config(static_cast<uint64_t>(GetParam())));
  check_problem(pr);
}

INSTANTIATE_TEST_SUITE_P(Reference, RandomCase, ::testing::Range(0, 80));

// ================================================================== closed forms

double softplus(double v) { return v <= 20.0 ? std::log1p(std::exp(v)) : v; }
double silu(double v) { return v / (1.0 + std::exp(-v)); }

// A one-channel problem (h = p = n = 1) with every input set by hand.
struct Scalar {
  Problem pr;
  explicit Scalar(ProblemConfig c) : pr(c) {}
  void set_tokens(HostTensor& t, const std::vector<double>& v) {
    for (size_t i = 0; i < v.size(); ++i) {
      if (t.view.rank == 3) {  // dt (b, l, h)
        t.set({0, static_cast<int64_t>(i), 0}, v[i]);
      } else {
        t.set({0, static_cast<int64_t>(i), 0, 0}, v[i]);
      }
    }
  }
};

ProblemConfig scalar_config(int64_t seqlen, int64_t chunk) {
  ProblemConfig c;
  c.seqlen = seqlen;
  c.nheads = c.headdim = c.ngroups = c.dstate = 1;
  c.chunk_size = chunk;
  return c;
}

TEST(ReferenceClosedForm, ScalarRecurrenceWithEveryOption) {
  ProblemConfig c = scalar_config(3, 2);
  c.dt_softplus = true;
  c.dt_max = 24.0f;
  c.d_mode = DMode::kPerHead;
  c.has_z = true;
  c.has_initial_states = true;
  c.want_final_states = true;
  c.want_chunk_states = true;
  c.seq_starts = {{2}};  // token 2 begins a new sequence
  Scalar s(c);
  const double x[] = {1.0, 2.0, 3.0}, B[] = {1.0, 0.5, 2.0}, C[] = {0.5, 1.0, 1.5}, z[] = {1.0, -0.5, 2.0};
  const double dt_raw[] = {0.5, 25.0, -1.0};
  const double A = -0.25, D = 0.75, init = 2.0;
  s.set_tokens(s.pr.x, {x[0], x[1], x[2]});
  s.set_tokens(s.pr.B, {B[0], B[1], B[2]});
  s.set_tokens(s.pr.C, {C[0], C[1], C[2]});
  s.set_tokens(s.pr.z, {z[0], z[1], z[2]});
  s.pr.dt.set({0, 0, 0}, dt_raw[0]);
  s.pr.dt.set({0, 1, 0}, dt_raw[1]);
  s.pr.dt.set({0, 2, 0}, dt_raw[2]);
  s.pr.A.set({0}, A);
  s.pr.D.set({0}, D);
  s.pr.initial_states.set({0, 0, 0, 0}, init);

  // dt' = softplus (identity above 20), then the dt_max clamp.
  const double d[] = {softplus(dt_raw[0]), 24.0, softplus(dt_raw[2])};
  const double h0 = std::exp(A * d[0]) * init + d[0] * x[0] * B[0];
  const double h1 = std::exp(A * d[1]) * h0 + d[1] * x[1] * B[1];
  const double h2 = d[2] * x[2] * B[2];  // new sequence: nothing carried
  const double want_out[] = {(h0 * C[0] + D * x[0]) * silu(z[0]), (h1 * C[1] + D * x[1]) * silu(z[1]),
                             (h2 * C[2] + D * x[2]) * silu(z[2])};

  ForwardParams p = s.pr.params();
  const F64Outputs r = ref::forward_f64(p, s.pr.shape);
  const OracleOutputs o = mt::oracle_forward(p, s.pr.shape);
  for (int t = 0; t < 3; ++t) {
    EXPECT_NEAR(r.out[t], want_out[t], 1e-14 * std::fabs(want_out[t])) << "t=" << t;
    EXPECT_NEAR(o.out[t], want_out[t], 1e-14 * std::fabs(want_out[t])) << "t=" << t;
  }
  ASSERT_EQ(r.chunk_states.size(), 2u);
  EXPECT_NEAR(r.chunk_states[0], h1, 1e-14 * std::fabs(h1));
  EXPECT_NEAR(r.chunk_states[1], h2, 1e-14 * std::fabs(h2));
  EXPECT_NEAR(r.final_states[0], h2, 1e-14 * std::fabs(h2));
}

TEST(ReferenceClosedForm, PackedVarlenStatesQuirk) {
  // Sequences [0,1), [1,3), [3,4) in chunks of 2, no seq_idx, initial state 2.
  ProblemConfig c = scalar_config(4, 2);
  c.seqlens = {1, 2, 1};
  c.want_varlen_states = true;
  c.want_final_states = true;
  c.has_initial_states = true;
  Scalar s(c);
  const double x[] = {1.0, -2.0, 0.5, 3.0}, B[] = {1.5, 0.5, 2.0, -1.0}, dt[] = {0.25, 0.5, 0.125, 1.0};
  const double A = -0.5, init = 2.0;
  s.set_tokens(s.pr.x, {x[0], x[1], x[2], x[3]});
  s.set_tokens(s.pr.B, {B[0], B[1], B[2], B[3]});
  s.set_tokens(s.pr.dt, {dt[0], dt[1], dt[2], dt[3]});
  s.pr.A.set({0}, A);
  s.pr.initial_states.set({0, 0, 0, 0}, init);
  auto u = [&](int t) { return dt[t] * x[t] * B[t]; };

  const double h1 = std::exp(A * (dt[0] + dt[1])) * init + std::exp(A * dt[1]) * u(0) + u(1);  // after chunk 0
  const double want[] = {
      u(0),                                    // ends in chunk 0: the initial state is not used
      std::exp(A * dt[2]) * h1 + u(2),         // started before chunk 1: carries the chunk state
      u(3),                                    // starts inside chunk 1: its own tokens only
  };
  ForwardParams p = s.pr.params();
  const F64Outputs r = ref::forward_f64(p, s.pr.shape);
  const OracleOutputs o = mt::oracle_forward(p, s.pr.shape);
  ASSERT_EQ(r.varlen_states.size(), 3u);
  ASSERT_EQ(o.varlen_states.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_NEAR(r.varlen_states[i], want[i], 1e-14 * std::fabs(want[i])) << "sequence " << i;
    EXPECT_NEAR(o.varlen_states[i], want[i], 1e-14 * std::fabs(want[i])) << "sequence " << i;
  }
  const double final = std::exp(A * (dt[2] + dt[3])) * h1 + std::exp(A * dt[3]) * u(2) + u(3);
  EXPECT_NEAR(r.final_states[0], final, 1e-14 * std::fabs(final));
}

// ================================================================== invariances

ProblemConfig rich_batched(int64_t chunk) {
  ProblemConfig c;
  c.batch = 2;
  c.seqlen = 300;
  c.nheads = 4;
  c.ngroups = 2;
  c.headdim = 8;
  c.dstate = 6;
  c.chunk_size = chunk;
  c.seq_starts = {{37, 128, 129, 250}, {64}};
  c.has_initial_states = true;
  c.want_final_states = true;
  c.d_mode = DMode::kPerHeadDim;
  c.has_z = true;
  c.has_dt_bias = true;
  c.dt_softplus = true;
  c.seed = 42;
  return c;
}

TEST(ReferenceInvariance, ChunkSizeDoesNotChangeOutOrFinalStates) {
  Problem p16(rich_batched(16));
  const F64Outputs r16 = ref::forward_f64(p16.params(), p16.shape);
  for (int64_t q : {1, 7, 64, 128, 512}) {
    Problem pq(rich_batched(q));
    const F64Outputs rq = ref::forward_f64(pq.params(), pq.shape);
    EXPECT_TRUE(close("out", rq.out, r16.out, kTol)) << "chunk " << q;
    EXPECT_TRUE(close("final_states", rq.final_states, r16.final_states, kTol)) << "chunk " << q;
  }
}

TEST(ReferenceInvariance, PaddedStridesGiveIdenticalResults) {
  ProblemConfig c = rich_batched(16);
  c.want_chunk_states = true;
  Problem a(c);
  c.padded_strides = true;
  Problem b(c);
  ref::forward(a.params(), a.shape);
  ref::forward(b.params(), b.shape);
  for (auto [name, ta, tb] : {std::tuple<const char*, HostTensor*, HostTensor*>{"out", &a.out, &b.out},
                              {"final_states", &a.final_states, &b.final_states},
                              {"chunk_states", &a.chunk_states, &b.chunk_states}}) {
    EXPECT_TRUE(mt::all_finite(ta->view)) << name;
    EXPECT_EQ(mt::rel_l2(tb->view, ta->view), 0.0) << name;
  }
}

// The public entries on the CPU: forward() and forward_with_allocator() write the same bits over
// NaN-poisoned outputs (the allocator is never asked: the CPU needs no workspace); a null
// allocator is refused by name.
TEST(ReferenceEntry, ForwardWithAllocatorEqualsForward) {
  ProblemConfig c = rich_batched(16);
  Problem a(c), b(c);
  a.poison_outputs();
  b.poison_outputs();
  mamba2_ssd::forward(a.params(), nullptr, 0);
  int calls = 0;
  auto allocate = [](std::size_t, void* context) -> void* {
    ++*static_cast<int*>(context);
    return nullptr;
  };
  mamba2_ssd::forward_with_allocator(b.params(), allocate, &calls);
  EXPECT_EQ(calls, 0);
  for (auto [name, ta, tb] : {std::tuple<const char*, HostTensor*, HostTensor*>{"out", &a.out, &b.out},
                              {"final_states", &a.final_states, &b.final_states}}) {
    EXPECT_TRUE(mt::all_finite(ta->view)) << name;
    EXPECT_EQ(std::memcmp(ta->view.data, tb->view.data, ta->nbytes()), 0) << name;
  }
  try {
    mamba2_ssd::forward_with_allocator(b.params(), nullptr, nullptr);
    ADD_FAILURE() << "no error for a null allocator";
  } catch (const mamba2_ssd::Error& e) {
    EXPECT_EQ(e.argument(), "allocate");
  }
}

// Views whose innermost stride is not 1 (every other element of a wider buffer).
TEST(ReferenceInvariance, NonUnitInnermostStridesAreHonoured) {
  ProblemConfig c = rich_batched(16);
  c.seqlen = 40;
  Problem pr(c);
  ref::forward(pr.params(), pr.shape);
  // x, C and out, final_states through views of stride 2 along p / n.
  auto widen = [](const HostTensor& t) {
    std::vector<int64_t> sizes(t.view.sizes, t.view.sizes + t.view.rank);
    sizes.back() *= 2;
    HostTensor wide(t.view.dtype, sizes);
    wide.view.sizes[t.view.rank - 1] /= 2;
    for (int d = 0; d < t.view.rank; ++d) wide.view.strides[d] *= d + 1 == t.view.rank ? 2 : 1;
    std::vector<double> vals;
    mt::for_each_offset(t.view, [&](int64_t off) { vals.push_back(host::load_as_double(t.view.data, t.view.dtype, off)); });
    size_t i = 0;
    mt::for_each_offset(wide.view, [&](int64_t off) { host::store_from_double(wide.view.data, wide.view.dtype, off, vals[i++]); });
    return wide;
  };
  HostTensor x2 = widen(pr.x), c2 = widen(pr.C), out2 = widen(pr.out), fin2 = widen(pr.final_states);
  out2.poison();
  fin2.poison();
  ForwardParams p = pr.params();
  p.x = x2.view;
  p.C = c2.view;
  p.out = out2.view;
  p.final_states = fin2.view;
  ref::forward(p, pr.shape);
  EXPECT_EQ(mt::rel_l2(out2.view, pr.out.view), 0.0);
  EXPECT_EQ(mt::rel_l2(fin2.view, pr.final_states.view), 0.0);
  EXPECT_TRUE(out2.gaps_intact());
}

TEST(ReferenceInvariance, ThreadCountDoesNotChangeResults) {
  ProblemConfig c = rich_batched(32);
  c.want_chunk_states = true;
  Problem pr(c);
  const F64Outputs one = ref::forward_f64(pr.params(), pr.shape, 1);
  for (int threads : {2, 5, 64, 0}) {
    const F64Outputs many = ref::forward_f64(pr.params(), pr.shape, threads);
    EXPECT_EQ(many.out, one.out) << threads;  // bitwise: each task is sequential
    EXPECT_EQ(many.final_states, one.final_states) << threads;
    EXPECT_EQ(many.chunk_states, one.chunk_states) << threads;
  }
}

TEST(ReferenceInvariance, InitialStateReachesOnlySeqIdxZero) {
  ProblemConfig c = rich_batched(16);
  c.seq_starts = {{100}};
  Problem with_init(c);
  c.has_initial_states = false;
  Problem no_init(c);
  const F64Outputs a = ref::forward_f64(with_init.params(), with_init.shape);
  const F64Outputs b = ref::forward_f64(no_init.params(), no_init.shape);
  const int64_t per_token = c.nheads * c.headdim;
  // The initial state decays quickly (A <= -1), so only the first tokens visibly differ.
  for (int64_t row = 0; row < c.batch; ++row) {
    for (int64_t t = 0; t < c.seqlen; ++t) {
      const int64_t i = (row * c.seqlen + t) * per_token;
      if (t < 2) {
        EXPECT_NE(a.out[i], b.out[i]) << "row " << row << " token " << t;
      } else if (t >= 100) {
        EXPECT_EQ(a.out[i], b.out[i]) << "row " << row << " token " << t;
      }
    }
  }
  EXPECT_EQ(a.final_states, b.final_states);  // the last sequence never saw the initial state

  c.seq_idx_base = 1;  // no token has seq_idx 0: the initial state is not used at all
  c.has_initial_states = true;
  Problem base1_init(c);
  c.has_initial_states = false;
  Problem base1(c);
  EXPECT_EQ(ref::forward_f64(base1_init.params(), base1_init.shape).out,
            ref::forward_f64(base1.params(), base1.shape).out);
}

TEST(ReferenceInvariance, VarlenLayoutEqualsOneBatchRowPerSequence) {
  ProblemConfig c;
  c.layout = Layout::kVarlen;
  c.seqlens = {23, 0, 40, 5};
  c.nheads = 2;
  c.headdim = 4;
  c.dstate = 3;
  c.chunk_size = 8;
  c.has_initial_states = true;
  c.want_final_states = true;
  c.want_chunk_states = true;
  c.d_mode = DMode::kPerHead;
  c.has_z = true;
  c.seed = 3;
  Problem vl(c);
  const F64Outputs rv = ref::forward_f64(vl.params(), vl.shape);
  const int64_t hp = c.nheads * c.headdim, hpn = hp * c.dstate;
  int64_t start = 0;
  for (size_t i = 0; i < c.seqlens.size(); ++i) {
    const int64_t len = c.seqlens[i];
    ProblemConfig bc = c;
    bc.layout = Layout::kBatched;
    bc.seqlens.clear();
    bc.seqlen = std::max<int64_t>(len, 1);
    Problem row(bc);
    // Copy sequence i's inputs into the single batch row.
    for (int64_t t = 0; t < len; ++t) {
      for (int64_t h = 0; h < c.nheads; ++h) {
        row.dt.set({0, t, h}, vl.dt.get({start + t, h}));
        for (int64_t q = 0; q < c.headdim; ++q) {
          row.x.set({0, t, h, q}, vl.x.get({start + t, h, q}));
          row.z.set({0, t, h, q}, vl.z.get({start + t, h, q}));
        }
      }
      for (int64_t n = 0; n < c.dstate; ++n) {
        row.B.set({0, t, 0, n}, vl.B.get({start + t, 0, n}));
        row.C.set({0, t, 0, n}, vl.C.get({start + t, 0, n}));
      }
    }
    for (int64_t h = 0; h < c.nheads; ++h) {
      for (int64_t q = 0; q < c.headdim; ++q) {
        for (int64_t n = 0; n < c.dstate; ++n) row.initial_states.set({0, h, q, n}, vl.initial_states.get({int64_t(i), h, q, n}));
      }
    }
    if (len == 0) {  // no tokens: the final state is the initial state
      for (int64_t j = 0; j < hpn; ++j) {
        const int64_t h = j / (c.headdim * c.dstate), q = (j / c.dstate) % c.headdim, n = j % c.dstate;
        EXPECT_EQ(rv.final_states[i * hpn + j], vl.initial_states.get({static_cast<int64_t>(i), h, q, n}));
      }
      EXPECT_EQ(rv.chunk_offsets[i + 1], rv.chunk_offsets[i]);
      continue;
    }
    const F64Outputs rb = ref::forward_f64(row.params(), row.shape);
    EXPECT_EQ(std::vector<double>(rv.out.begin() + start * hp, rv.out.begin() + (start + len) * hp), rb.out) << i;
    EXPECT_EQ(std::vector<double>(rv.final_states.begin() + i * hpn, rv.final_states.begin() + (i + 1) * hpn),
              rb.final_states) << i;
    EXPECT_EQ(std::vector<double>(rv.chunk_states.begin() + rv.chunk_offsets[i] * hpn,
                                  rv.chunk_states.begin() + rv.chunk_offsets[i + 1] * hpn),
              rb.chunk_states) << i;
    start += len;
  }
}

// ================================================================== argument errors

TEST(ReferenceErrors, InconsistentArgumentsThrowError) {
  ProblemConfig c = base();
  Problem pr(c);
  {
    ForwardParams p = pr.params();
    p.x.data = nullptr;
    EXPECT_THROW(ref::forward(p, pr.shape), mamba2_ssd::Error);
  }
  {
    ForwardParams p = pr.params();
    p.layout = Layout::kVarlen;  // no cu_seqlens, and batched shapes
    EXPECT_THROW(ref::forward(p, pr.shape), mamba2_ssd::Error);
  }
  {
    ForwardParams p = pr.params();
    p.chunk_size = 0;
    EXPECT_THROW(ref::forward(p, pr.shape), mamba2_ssd::Error);
  }
  {
    ForwardParams p = pr.params();
    p.chunk_states.sizes[1] += 1;
    try {
      ref::forward(p, pr.shape);
      ADD_FAILURE() << "no exception";
    } catch (const mamba2_ssd::Error& e) {
      EXPECT_EQ(e.argument(), "chunk_states");
      EXPECT_EQ(e.kind(), mamba2_ssd::Error::Kind::kInvalidArgument);
    }
  }
  ProblemConfig v = c;
  v.layout = Layout::kVarlen;
  v.seqlens = {4, 9};
  Problem pv(v);
  {
    ForwardParams p = pv.params();
    pv.cu_seqlens.set({1}, 14.0);  // [0, 14, 13]: decreasing
    EXPECT_THROW(ref::forward(p, pv.shape), mamba2_ssd::Error);
  }
}

// The error bars that `mamba2-ssd check` and the GPU tests share.
TEST(ReferenceErrorBars, ByOutputStoredDtypeInputsAndSize) {
  using mamba2_ssd::DType;
  using ref::Compared;
  const int64_t many = ref::kFewElements;
  EXPECT_DOUBLE_EQ(ref::error_bar(Compared::kOut, DType::kBFloat16, DType::kBFloat16, many), 3e-3);
  EXPECT_DOUBLE_EQ(ref::error_bar(Compared::kState, DType::kFloat32, DType::kBFloat16, many), 2.5e-3);
  EXPECT_DOUBLE_EQ(ref::error_bar(Compared::kState, DType::kBFloat16, DType::kBFloat16, many), 4e-3);
  EXPECT_DOUBLE_EQ(ref::error_bar(Compared::kState, DType::kFloat16, DType::kFloat16, many), 4e-3);
  EXPECT_DOUBLE_EQ(ref::error_bar(Compared::kOut, DType::kFloat32, DType::kFloat32, many), 4e-3);
  EXPECT_DOUBLE_EQ(ref::error_bar(Compared::kState, DType::kFloat32, DType::kFloat32, many), 4e-3);
  EXPECT_DOUBLE_EQ(ref::error_bar(Compared::kState, DType::kFloat32, DType::kBFloat16, many - 1), 1.5 * 2.5e-3);
}

}  // namespace
