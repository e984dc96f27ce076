// Random problems for the mamba2-ssd tool (see cli_problem.hpp).
#include "cli_problem.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/host_float.hpp"

namespace cli {

using mamba2_ssd::DType;
using mamba2_ssd::Device;
using mamba2_ssd::TensorView;

// ------------------------------------------------------------------ Random

namespace {

uint64_t rotl(uint64_t v, int k) { return (v << k) | (v >> (64 - k)); }

uint64_t splitmix_next(uint64_t& state) {
  state += 0x9e3779b97f4a7c15ull;
  uint64_t v = state;
  v = (v ^ (v >> 30)) * 0xbf58476d1ce4e5b9ull;
  v = (v ^ (v >> 27)) * 0x94d049bb133111ebull;
  return v ^ (v >> 31);
}

uint64_t fnv1a(const char* s) {
  uint64_t h = 0xcbf29ce484222325ull;
  while (*s) h = (h ^ static_cast<unsigned char>(*s++)) * 0x100000001b3ull;
  return h;
}

}  // namespace

Random::Random(uint64_t seed, const char* stream) {
  // One independent stream per (seed, tensor name): a tensor's values do not depend on which
  // other tensors the options create.
  uint64_t st = seed * 0xd1342543de82ef95ull + fnv1a(stream);
  for (uint64_t& w : s_) w = splitmix_next(st);
}

uint64_t Random::bits() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double Random::uniform() { return static_cast<double>(bits() >> 11) * (1.0 / 9007199254740992.0); }

double Random::uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }

int64_t Random::below(int64_t n) { return static_cast<int64_t>(bits() % static_cast<uint64_t>(n)); }

double Random::normal() {
  if (have_spare_) {
    have_spare_ = false;
    return spare_;
  }
  double u, v, q;
  do {
    u = 2.0 * uniform() - 1.0;
    v = 2.0 * uniform() - 1.0;
    q = u * u + v * v;
  } while (q >= 1.0 || q == 0.0);
  const double m = std::sqrt(-2.0 * std::log(q) / q);
  spare_ = v * m;
  have_spare_ = true;
  return u * m;
}

// ------------------------------------------------------------------ HostTensor

void HostTensor::allocate(const std::string& tensor_name, DType t, const std::vector<int64_t>& shape, bool output) {
  name = tensor_name;
  dtype = t;
  sizes = shape;
  is_output = output;
  int64_t n = 1;
  for (int64_t s : shape) {
    if (__builtin_mul_overflow(n, s, &n)) throw std::runtime_error(name + ": shape " + shape_string() + " is too large");
  }
  const int64_t es = static_cast<int64_t>(mamba2_ssd::host::element_size(t));
  int64_t b = 0;
  if (__builtin_mul_overflow(n, es, &b) || b > (int64_t{1} << 46)) {
    throw std::runtime_error(name + ": shape " + shape_string() + " is too large for host memory");
  }
  bytes = static_cast<std::size_t>(b);
  try {
    storage.assign(bytes / 8 + 1, 0);  // never empty: present even with no elements
  } catch (const std::bad_alloc&) {
    throw std::runtime_error("out of host memory allocating " + name + " " + shape_string() + " (" +
                             std::to_string(bytes) + " bytes)");
  }
}

int64_t HostTensor::numel() const {
  if (!present()) return 0;
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

TensorView HostTensor::view(Device d) const {
  TensorView v;
  if (!present()) return v;
  v.data = d == Device::kCUDA ? device : const_cast<void*>(static_cast<const void*>(storage.data()));
  v.dtype = dtype;
  v.rank = static_cast<int32_t>(sizes.size());
  int64_t stride = 1;
  for (int i = v.rank - 1; i >= 0; --i) {
    v.sizes[i] = sizes[i];
    v.strides[i] = stride;
    stride *= sizes[i];
  }
  return v;
}

std::string HostTensor::shape_string() const {
  std::string s = "(";
  for (std::size_t i = 0; i < sizes.size(); ++i) s += (i ? ", " : "") + std::to_string(sizes[i]);
  return s + ")";
}

// ------------------------------------------------------------------ Problem

namespace {

double silu(double v) { return v / (1.0 + std::exp(-v)); }
double softplus(double v) { return v > 20.0 ? v : std::log1p(std::exp(v)); }

// Fills `t` in row-major order: blocks of 2^20 elements, each from its own random stream
// (seed, tensor name, block index), drawn on all hardware threads. The values do not depend on
// the thread count; large shapes (a 256K-token problem has ~1.5e9 values) fill in seconds.
template <class Draw>
void fill(HostTensor& t, uint64_t seed, Draw draw) {
  constexpr int64_t kBlock = int64_t(1) << 20;
  const int64_t n = t.numel();
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  auto fill_block = [&](int64_t b) {
    const std::string stream = b == 0 ? t.name : t.name + "#" + std::to_string(b);
    Random rng(seed, stream.c_str());
    const int64_t end = std::min(n, (b + 1) * kBlock);
    for (int64_t i = b * kBlock; i < end; ++i) mamba2_ssd::host::store_from_double(t.data(), t.dtype, i, draw(rng));
  };
  const int64_t workers = std::min<int64_t>(blocks, std::max(1u, std::thread::hardware_concurrency()));
  if (workers <= 1) {
    for (int64_t b = 0; b < blocks; ++b) fill_block(b);
    return;
  }
  std::atomic<int64_t> next{0};
  std::vector<std::thread> pool;
  for (int64_t w = 0; w < workers; ++w) {
    pool.emplace_back([&] {
      for (int64_t b = next++; b < blocks; b = next++) fill_block(b);
    });
  }
  for (std::thread& th : pool) th.join();
}

// `count` sequences of >= 1 token each, of random lengths summing to `total`: count - 1
// distinct cut points drawn uniformly from [1, total - 1] (Floyd's sampling).
std::vector<int64_t> random_lengths(Random& rng, int64_t total, int64_t count) {
  std::vector<char> cut(static_cast<std::size_t>(total), 0);
  const int64_t m = total - 1;  // candidates 1..m
  for (int64_t j = m - (count - 1) + 1; j <= m; ++j) {
    const int64_t t = 1 + rng.below(j);
    if (cut[t]) cut[j] = 1;
    else cut[t] = 1;
  }
  std::vector<int64_t> lengths;
  int64_t start = 0;
  for (int64_t p = 1; p < total; ++p) {
    if (cut[p]) {
      lengths.push_back(p - start);
      start = p;
    }
  }
  lengths.push_back(total - start);
  return lengths;
}

}  // namespace

Problem::Problem(const Options& options) : opt(options) {
  varlen = opt.varlen;
  const int64_t h = opt.heads, p = opt.headdim, g = opt.groups, n = opt.dstate, q = opt.chunk;
  if (varlen) {
    rows = 1;
    tokens = 0;
    for (int64_t len : opt.varlen_lens) tokens += len;
    nseq = static_cast<int64_t>(opt.varlen_lens.size());
    nchunks = mamba2_ssd::max_varlen_chunks(tokens, nseq, q);
    used_chunks = 0;
    for (int64_t len : opt.varlen_lens) used_chunks += (len + q - 1) / q;
  } else {
    rows = opt.batch;
    tokens = opt.seqlen;
    nseq = opt.cu_seqlens ? opt.seq_idx : 0;
    nchunks = (tokens + q - 1) / q;
    used_chunks = rows * nchunks;
  }
  auto tok = [&](std::initializer_list<int64_t> inner) {
    std::vector<int64_t> s = varlen ? std::vector<int64_t>{tokens} : std::vector<int64_t>{rows, tokens};
    s.insert(s.end(), inner.begin(), inner.end());
    return s;
  };
  const int64_t state_rows = varlen ? nseq : rows;
  const uint64_t seed = opt.seed;
  auto randn = [](Random& r) { return r.normal(); };
  auto silu_randn = [](Random& r) { return silu(r.normal()); };

  x.allocate("x", opt.dtype, tok({h, p}), false);
  fill(x, seed, silu_randn);
  dt.allocate("dt", dt_dtype(), tok({h}), false);
  // (--inputs model: dt log-uniform in [1e-3, 0.1], or its pre-activation 0.5 randn with
  // softplus, where dt_bias carries the log-uniform part; bench.py's make_set and make_weights)
  const bool model = opt.model_inputs;
  const bool pre_activation = model && opt.softplus;
  fill(dt, seed, [&](Random& r) {
    if (!model) return softplus(r.normal());
    return pre_activation ? 0.5 * r.normal() : std::exp(r.uniform(std::log(1e-3), std::log(1e-1)));
  });
  A.allocate("A", DType::kFloat32, {h}, false);
  fill(A, seed, [&](Random& r) { return model ? -std::exp(r.uniform(0.0, std::log(16.0))) : -r.uniform(1.0, 16.0); });
  B.allocate("B", opt.dtype, tok({g, n}), false);
  fill(B, seed, silu_randn);
  C.allocate("C", opt.dtype, tok({g, n}), false);
  fill(C, seed, silu_randn);
  if (opt.d_mode != DMode::kNone) {
    D.allocate("D", DType::kFloat32, opt.d_mode == DMode::kPerHead ? std::vector<int64_t>{h} : std::vector<int64_t>{h, p},
               false);
    fill(D, seed, randn);
  }
  if (opt.z) {
    z.allocate("z", opt.dtype, tok({h, p}), false);
    fill(z, seed, randn);
  }
  if (opt.dt_bias) {
    dt_bias.allocate("dt_bias", DType::kFloat32, {h}, false);
    fill(dt_bias, seed, [&](Random& r) {
      if (!model) return r.normal();
      const double dt0 = std::exp(r.uniform(std::log(1e-3), std::log(1e-1)));
      return dt0 + std::log(-std::expm1(-dt0));  // (softplus(dt_bias) = dt0)
    });
  }
  if (opt.init) {
    initial_states.allocate("initial_states", opt.init_dtype, {state_rows, h, p, n}, false);
    fill(initial_states, seed, randn);
  }
  if (!varlen && opt.seq_idx > 0) {
    seq_idx.allocate("seq_idx", DType::kInt32, {rows, tokens}, false);
    Random rng(seed, "seq_idx");
    auto* ids = static_cast<int32_t*>(seq_idx.data());
    for (int64_t r = 0; r < rows; ++r) {
      packed.push_back(random_lengths(rng, tokens, opt.seq_idx));
      int64_t t = 0;
      int32_t id = 0;
      for (int64_t len : packed.back()) {
        for (int64_t i = 0; i < len; ++i) ids[r * tokens + t++] = id;
        ++id;
      }
    }
  }
  if (varlen || opt.cu_seqlens) {
    const std::vector<int64_t>& lens = varlen ? opt.varlen_lens : packed.at(0);
    cu_seqlens.allocate("cu_seqlens", DType::kInt32, {nseq + 1}, false);
    auto* cu = static_cast<int32_t*>(cu_seqlens.data());
    int64_t pos = 0;
    cu[0] = 0;
    for (int64_t i = 0; i < nseq; ++i) {
      pos += lens[i];
      if (pos > std::numeric_limits<int32_t>::max()) {
        throw UsageError(std::string(varlen ? "--varlen" : "--seqlen") + ": cu_seqlens is int32 here; " +
                         "expected at most 2147483647 tokens in all, got " + std::to_string(tokens));
      }
      cu[i + 1] = static_cast<int32_t>(pos);
    }
  }

  out.allocate("out", opt.dtype, tok({h, p}), true);
  if (opt.final_states) final_states.allocate("final_states", opt.final_dtype, {state_rows, h, p, n}, true);
  if (!varlen && opt.cu_seqlens) varlen_states.allocate("varlen_states", opt.final_dtype, {nseq, h, p, n}, true);
  if (opt.chunk_states) {
    const DType sd = opt.state_dtype.value_or(opt.dtype);
    if (varlen) {
      chunk_states.allocate("chunk_states", sd, {nchunks, h, p, n}, true);
      chunk_offsets.allocate("chunk_offsets", DType::kInt32, {nseq + 1}, true);
    } else {
      chunk_states.allocate("chunk_states", sd, {rows, nchunks, h, p, n}, true);
    }
  }
  poison_outputs();
}

std::vector<HostTensor*> Problem::tensors() {
  return {&x, &dt, &A, &B, &C, &D, &z, &dt_bias, &initial_states, &seq_idx, &cu_seqlens,
          &out, &final_states, &varlen_states, &chunk_states, &chunk_offsets};
}

mamba2_ssd::ForwardParams Problem::params(Device d) const {
  mamba2_ssd::ForwardParams p;
  p.layout = varlen ? mamba2_ssd::Layout::kVarlen : mamba2_ssd::Layout::kBatched;
  p.device = d;
  p.x = x.view(d);
  p.dt = dt.view(d);
  p.A = A.view(d);
  p.B = B.view(d);
  p.C = C.view(d);
  p.chunk_size = opt.chunk;
  p.D = D.view(d);
  p.z = z.view(d);
  p.dt_bias = dt_bias.view(d);
  p.dt_softplus = opt.softplus;
  p.dt_min = static_cast<float>(opt.dt_min);
  p.dt_max = static_cast<float>(opt.dt_max);
  p.initial_states = initial_states.view(d);
  p.seq_idx = seq_idx.view(d);
  p.cu_seqlens = cu_seqlens.view(d);
  p.out = out.view(d);
  p.final_states = final_states.view(d);
  p.varlen_states = varlen_states.view(d);
  p.chunk_states = chunk_states.view(d);
  p.chunk_offsets = chunk_offsets.view(d);
  p.state_dtype = opt.state_dtype;
  return p;
}

void Problem::poison_outputs() {
  // All-ones bytes: NaN in fp32, bf16 and fp16; -1 in int32.
  for (HostTensor* t : {&out, &final_states, &varlen_states, &chunk_states, &chunk_offsets}) {
    if (t->present()) std::memset(t->data(), 0xff, t->bytes);
  }
}

int64_t Problem::defined_elements(const HostTensor& t) const {
  if (&t == &chunk_states && varlen) return used_chunks * opt.heads * opt.headdim * opt.dstate;
  return t.numel();
}

// ------------------------------------------------------------------ checksums, errors

Checksum checksum(const HostTensor& t, int64_t count) {
  Checksum c;
  constexpr int64_t kBlock = 4096;
  std::vector<double> buf(kBlock);
  for (int64_t i = 0; i < count; i += kBlock) {
    const int64_t m = std::min(kBlock, count - i);
    mamba2_ssd::host::load_strided(t.data(), t.dtype, i, 1, m, buf.data());
    for (int64_t k = 0; k < m; ++k) {
      const double v = buf[k];
      if (!std::isfinite(v)) ++c.nonfinite;
      c.sum += v;
      c.abs_sum += std::fabs(v);
    }
  }
  return c;
}

Difference compare(const HostTensor& got, const std::vector<double>& ref) {
  Difference d;
  const int64_t count = std::min<int64_t>(static_cast<int64_t>(ref.size()), got.numel());
  constexpr int64_t kBlock = 4096;
  std::vector<double> buf(kBlock);
  double num = 0.0, den = 0.0;
  for (int64_t i = 0; i < count; i += kBlock) {
    const int64_t m = std::min(kBlock, count - i);
    mamba2_ssd::host::load_strided(got.data(), got.dtype, i, 1, m, buf.data());
    for (int64_t k = 0; k < m; ++k) {
      const double r = ref[static_cast<std::size_t>(i + k)];
      if (!std::isfinite(buf[k])) {
        ++d.nonfinite;
        continue;
      }
      const double e = buf[k] - r;
      num += e * e;
      den += r * r;
      d.max_abs = std::max(d.max_abs, std::fabs(e));
    }
  }
  const double inf = std::numeric_limits<double>::infinity();
  if (d.nonfinite > 0) {
    d.rel_l2 = inf;
    d.max_abs = inf;
  } else if (den == 0.0) {
    d.rel_l2 = num == 0.0 ? 0.0 : inf;
  } else {
    d.rel_l2 = std::sqrt(num / den);
  }
  return d;
}

}  // namespace cli
