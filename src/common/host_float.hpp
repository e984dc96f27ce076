// Host-side element conversions: float <-> bfloat16 / float16 with round-to-nearest-even, and
// reading / writing one element of any DType as a double. Header-only, no CUDA.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "mamba2_ssd/error.hpp"
#include "mamba2_ssd/types.hpp"

namespace mamba2_ssd::host {

inline std::uint32_t float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float bits_to_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// ------------------------------------------------------------------ bfloat16

inline float bf16_to_float(std::uint16_t h) { return bits_to_float(std::uint32_t(h) << 16); }

inline std::uint16_t float_to_bf16(float f) {
  const std::uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    // NaN: keep the sign and the high payload bits, force the quiet bit so that truncating the
    // payload can never turn it into an infinity.
    return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  }
  // Round to nearest even on the 16 dropped bits; a carry out of the mantissa bumps the exponent,
  // which is right (and overflows to infinity past the largest bfloat16).
  const std::uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(rounded >> 16);
}

// ------------------------------------------------------------------ float16 (IEEE binary16)

inline float fp16_to_float(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) return bits_to_float(sign | 0x7f800000u | (man << 13));  // Inf / NaN
  if (exp == 0) {
    // Zero or subnormal: man * 2^-24, exact in float.
    const float v = std::ldexp(static_cast<float>(man), -24);
    return sign ? -v : v;
  }
  return bits_to_float(sign | ((exp + 112u) << 23) | (man << 13));  // rebias 15 -> 127
}

inline std::uint16_t float_to_fp16(float f) {
  const std::uint32_t u = float_bits(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) {
    return static_cast<std::uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));  // quiet NaN
  }
  // 65520 is the midpoint between the largest half (65504, odd mantissa) and 2^16: it and
  // everything above round to infinity.
  if (a >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);
  if (a >= 0x38800000u) {
    // Normal half (>= 2^-14): round the 13 dropped mantissa bits to nearest even, then rebias.
    const std::uint32_t rounded = a + 0x0fffu + ((a >> 13) & 1u);
    return static_cast<std::uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
  }
  // Subnormal half: the result is round(|f| * 2^24) as an integer mantissa (a carry to 0x400
  // yields the smallest normal, which is the right encoding).
  const std::uint32_t exp = a >> 23;
  if (exp < 101) return sign;  // |f| < 2^-26: below a quarter of the smallest subnormal
  const std::uint32_t man = (a & 0x7fffffu) | 0x800000u;  // |f| = man * 2^(exp - 150)
  const std::uint32_t shift = 126u - exp;                   // 14 .. 25
  std::uint32_t r = man >> shift;
  const std::uint32_t rem = man & ((1u << shift) - 1u);
  const std::uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (r & 1u))) ++r;
  return static_cast<std::uint16_t>(sign | r);
}

// ------------------------------------------------------------------ from double

// double -> float rounded to odd: the result is the float truncation of d with its lowest bit
// set when inexact. Rounding that again to a narrower type (<= 22 mantissa bits) to nearest even
// gives the correctly rounded result, which a plain double -> float -> narrow chain does not
// (it can create a false tie).
inline float double_to_float_round_odd(double d) {
  const float f = static_cast<float>(d);
  if (std::isnan(d) || static_cast<double>(f) == d) return f;
  std::uint32_t u = float_bits(f);
  if (std::fabs(static_cast<double>(f)) > std::fabs(d)) u -= 1;  // step back toward zero
  return bits_to_float(u | 1u);
}

inline std::uint16_t double_to_bf16(double d) { return float_to_bf16(double_to_float_round_odd(d)); }
inline std::uint16_t double_to_fp16(double d) { return float_to_fp16(double_to_float_round_odd(d)); }

// ------------------------------------------------------------------ typed element access

inline std::size_t element_size(DType t) {
  switch (t) {
    case DType::kFloat32: return 4;
    case DType::kFloat16: return 2;
    case DType::kBFloat16: return 2;
    case DType::kInt32: return 4;
    case DType::kInt64: return 8;
  }
  throw Error(Error::Kind::kInvalidArgument, "dtype",
              "dtype: unknown DType value " + std::to_string(static_cast<int>(t)));
}

inline bool is_float_dtype(DType t) {
  return t == DType::kFloat32 || t == DType::kFloat16 || t == DType::kBFloat16;
}

// Element `offset` (in elements, not bytes) of an array of `t` starting at `base`.
inline double load_as_double(const void* base, DType t, std::int64_t offset) {
  switch (t) {
    case DType::kFloat32: return static_cast<const float*>(base)[offset];
    case DType::kFloat16: return fp16_to_float(static_cast<const std::uint16_t*>(base)[offset]);
    case DType::kBFloat16: return bf16_to_float(static_cast<const std::uint16_t*>(base)[offset]);
    case DType::kInt32: return static_cast<const std::int32_t*>(base)[offset];
    case DType::kInt64: return static_cast<double>(static_cast<const std::int64_t*>(base)[offset]);
  }
  throw Error(Error::Kind::kInvalidArgument, "dtype",
              "dtype: unknown DType value " + std::to_string(static_cast<int>(t)));
}

// Integer element (exact for int64, truncating for float dtypes).
inline std::int64_t load_as_int64(const void* base, DType t, std::int64_t offset) {
  switch (t) {
    case DType::kInt32: return static_cast<const std::int32_t*>(base)[offset];
    case DType::kInt64: return static_cast<const std::int64_t*>(base)[offset];
    default: return static_cast<std::int64_t>(load_as_double(base, t, offset));
  }
}

// Writes `v` rounded once (to nearest even) to `t`; integer dtypes truncate toward zero.
inline void store_from_double(void* base, DType t, std::int64_t offset, double v) {
  switch (t) {
    case DType::kFloat32: static_cast<float*>(base)[offset] = static_cast<float>(v); return;
    case DType::kFloat16: static_cast<std::uint16_t*>(base)[offset] = double_to_fp16(v); return;
    case DType::kBFloat16: static_cast<std::uint16_t*>(base)[offset] = double_to_bf16(v); return;
    case DType::kInt32: static_cast<std::int32_t*>(base)[offset] = static_cast<std::int32_t>(v); return;
    case DType::kInt64: static_cast<std::int64_t*>(base)[offset] = static_cast<std::int64_t>(v); return;
  }
  throw Error(Error::Kind::kInvalidArgument, "dtype",
              "dtype: unknown DType value " + std::to_string(static_cast<int>(t)));
}

// n elements base[offset + i * stride] as doubles into dst[0..n): one dtype dispatch per run.
inline void load_strided(const void* base, DType t, std::int64_t offset, std::int64_t stride,
                         std::int64_t n, double* dst) {
  switch (t) {
    case DType::kFloat32: {
      const float* src = static_cast<const float*>(base) + offset;
      for (std::int64_t i = 0; i < n; ++i) dst[i] = src[i * stride];
      return;
    }
    case DType::kFloat16: {
      const std::uint16_t* src = static_cast<const std::uint16_t*>(base) + offset;
      for (std::int64_t i = 0; i < n; ++i) dst[i] = fp16_to_float(src[i * stride]);
      return;
    }
    case DType::kBFloat16: {
      const std::uint16_t* src = static_cast<const std::uint16_t*>(base) + offset;
      for (std::int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(src[i * stride]);
      return;
    }
    default:
      for (std::int64_t i = 0; i < n; ++i) dst[i] = load_as_double(base, t, offset + i * stride);
      return;
  }
}

}  // namespace mamba2_ssd::host
