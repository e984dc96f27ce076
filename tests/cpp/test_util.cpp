#include "test_util.hpp"

#include "mamba2_ssd/tuning.hpp"

#include <cmath>
#include <cstring>
#include <algorithm>
#include <atomic>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace mamba2_ssd::test {

// ------------------------------------------------------------------ Rng

namespace {
uint64_t mix64(uint64_t z) {  // splitmix64's finalizer: nearby seeds give unrelated streams
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
}  // namespace

Rng::Rng(uint64_t seed) : state_(mix64(seed ^ 0x5851f42d4c957f2dull)) {}

uint64_t Rng::next_u64() {
  return mix64(state_ += 0x9e3779b97f4a7c15ull);
}

double Rng::uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

double Rng::uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }

int64_t Rng::uniform_int(int64_t lo, int64_t hi) {
  const uint64_t span = static_cast<uint64_t>(hi - lo) + 1;
  return lo + static_cast<int64_t>(next_u64() % span);
}

double Rng::normal() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  const double u1 = 1.0 - uniform();  // (0, 1]: log stays finite
  const double u2 = uniform();
  const double r = std::sqrt(-2.0 * std::log(u1));
  const double two_pi = 6.283185307179586;
  spare_ = r * std::sin(two_pi * u2);
  has_spare_ = true;
  return r * std::cos(two_pi * u2);
}

const char* dtype_str(DType t) {
  switch (t) {
    case DType::kFloat32: return "float32";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
  }
  return "?";
}

// ------------------------------------------------------------------ HostTensor

namespace {

// Writes the poison value of `t` into slot `i` of `data`.
void poison_slot(void* data, DType t, int64_t i) {
  switch (t) {
    case DType::kFloat32: {
      const uint32_t nan = 0x7fc00000u;
      std::memcpy(static_cast<char*>(data) + 4 * i, &nan, 4);
      return;
    }
    case DType::kFloat16: static_cast<uint16_t*>(data)[i] = 0x7e00u; return;
    case DType::kBFloat16: static_cast<uint16_t*>(data)[i] = 0x7fc0u; return;
    case DType::kInt32: static_cast<int32_t*>(data)[i] = std::numeric_limits<int32_t>::max(); return;
    case DType::kInt64: static_cast<int64_t*>(data)[i] = std::numeric_limits<int64_t>::max(); return;
  }
}

bool slot_is_poison(const void* data, DType t, int64_t i) {
  const std::size_t es = host::element_size(t);
  uint64_t want = 0, have = 0;
  poison_slot(&want, t, 0);
  std::memcpy(&have, static_cast<const char*>(data) + es * i, es);
  return std::memcmp(&want, &have, es) == 0;
}

uint64_t name_hash(const char* s) {  // FNV-1a: a per-tensor seed that is stable across options
  uint64_t h = 0xcbf29ce484222325ull;
  for (; *s; ++s) h = (h ^ static_cast<unsigned char>(*s)) * 0x100000001b3ull;
  return h;
}

}  // namespace

HostTensor::HostTensor(DType dtype, const std::vector<int64_t>& sizes, bool padded) {
  if (sizes.size() > static_cast<size_t>(TensorView::kMaxRank)) throw std::invalid_argument("HostTensor: rank > 6");
  const int rank = static_cast<int>(sizes.size());
  view.dtype = dtype;
  view.rank = rank;
  int64_t stride = 1;
  int64_t extent = 1;  // elements from the first to one past the last addressable one
  bool empty = false;
  for (int d = rank - 1; d >= 0; --d) {
    view.sizes[d] = sizes[d];
    view.strides[d] = stride;
    if (sizes[d] <= 0) empty = true;
    extent += (sizes[d] - 1) * stride;
    stride = stride * sizes[d] + (padded ? kPad : 0);
  }
  const std::size_t es = host::element_size(dtype);
  bytes_ = empty ? 0 : static_cast<std::size_t>(extent) * es;
  storage_.assign((bytes_ + 7) / 8 + 1, 0);  // never empty: present even with no elements
  view.data = storage_.data();
  poison();
}

HostTensor::HostTensor(const HostTensor& o) : view(o.view), storage_(o.storage_), bytes_(o.bytes_) {
  if (o.present()) view.data = storage_.data();
}

HostTensor& HostTensor::operator=(const HostTensor& o) {
  if (this != &o) {
    storage_ = o.storage_;
    bytes_ = o.bytes_;
    view = o.view;
    if (o.present()) view.data = storage_.data();
  }
  return *this;
}

int64_t HostTensor::numel() const {
  if (!present()) return 0;
  int64_t n = 1;
  for (int i = 0; i < view.rank; ++i) n *= view.sizes[i];
  return n;
}

int64_t HostTensor::offset(const std::vector<int64_t>& idx) const {
  if (static_cast<int>(idx.size()) != view.rank) throw std::invalid_argument("HostTensor: index rank mismatch");
  int64_t off = 0;
  for (int i = 0; i < view.rank; ++i) {
    if (idx[i] < 0 || idx[i] >= view.sizes[i]) throw std::out_of_range("HostTensor: index out of range");
    off += idx[i] * view.strides[i];
  }
  return off;
}

double HostTensor::get(const std::vector<int64_t>& idx) const {
  return host::load_as_double(view.data, view.dtype, offset(idx));
}

void HostTensor::set(const std::vector<int64_t>& idx, double v) {
  host::store_from_double(view.data, view.dtype, offset(idx), v);
}

void HostTensor::poison() {
  if (!present()) return;
  const int64_t slots = static_cast<int64_t>(bytes_ / host::element_size(view.dtype));
  for (int64_t i = 0; i < slots; ++i) poison_slot(view.data, view.dtype, i);
}

bool HostTensor::gaps_intact() const {
  if (!present()) return true;
  const int64_t slots = static_cast<int64_t>(bytes_ / host::element_size(view.dtype));
  std::vector<char> in_view(static_cast<size_t>(slots), 0);
  for_each_offset(view, [&](int64_t off) { in_view[off] = 1; });
  for (int64_t i = 0; i < slots; ++i) {
    if (!in_view[i] && !slot_is_poison(view.data, view.dtype, i)) return false;
  }
  return true;
}

// ------------------------------------------------------------------ ProblemConfig

std::string ProblemConfig::describe() const {
  std::ostringstream o;
  auto list = [&](const std::vector<int64_t>& v) {
    o << "[";
    for (size_t i = 0; i < v.size(); ++i) o << (i ? "," : "") << v[i];
    o << "]";
  };
  o << (layout == Layout::kVarlen ? "varlen" : "batched") << " b=" << batch << " l=" << seqlen
    << " h=" << nheads << " p=" << headdim << " g=" << ngroups << " n=" << dstate << " Q=" << chunk_size
    << " dtype=" << dtype_str(dtype) << " dt=" << dtype_str(dt_dtype)
    << " D=" << (d_mode == DMode::kNone ? "none" : d_mode == DMode::kPerHead ? "h" : "hp") << " z=" << has_z
    << " dt_bias=" << has_dt_bias << " softplus=" << dt_softplus << " dt_limit=(" << dt_min << "," << dt_max
    << ") init=" << (has_initial_states ? dtype_str(initial_dtype) : "no")
    << " final=" << (want_final_states ? dtype_str(final_dtype) : "no") << " seq_starts=";
  o << "[";
  for (const auto& r : seq_starts) list(r);
  o << "] seq_idx_base=" << seq_idx_base << " seqlens=";
  list(seqlens);
  o << " cu=" << dtype_str(cu_seqlens_dtype) << " varlen_states=" << want_varlen_states
    << " chunk_states=" << want_chunk_states
    << " state_dtype=" << (state_dtype ? dtype_str(*state_dtype) : "default")
    << " chunk_offsets=" << want_chunk_offsets << " padded=" << padded_strides << " model_decay=" << model_decay
    << " positive_a=" << positive_a << " mixed_a=" << mixed_a << " seed=" << seed;
  if (kernel_config != KernelConfig{}) o << " kernels=" << to_string(kernel_config);
  return o.str();
}

std::vector<int64_t> starts_of(const std::vector<int64_t>& lengths) {
  std::vector<int64_t> starts;
  int64_t pos = 0;
  for (int64_t len : lengths) {
    starts.push_back(pos);
    pos += len;
  }
  return starts;
}

namespace {

int64_t total_tokens(const ProblemConfig& cfg) {
  if (cfg.layout == Layout::kBatched) return cfg.seqlen;
  int64_t t = 0;
  for (int64_t len : cfg.seqlens) t += len;
  return t;
}

int64_t varlen_capacity(int64_t tokens, int64_t nseq, int64_t q) { return (tokens + nseq * (q - 1)) / q; }

}  // namespace

ProblemShape shape_of(const ProblemConfig& cfg) {
  ProblemShape s;
  const bool varlen = cfg.layout == Layout::kVarlen;
  s.batch = varlen ? 1 : cfg.batch;
  s.seqlen = total_tokens(cfg);
  s.nheads = cfg.nheads;
  s.headdim = cfg.headdim;
  s.ngroups = cfg.ngroups;
  s.dstate = cfg.dstate;
  const int64_t nseq = static_cast<int64_t>(cfg.seqlens.size());
  s.nchunks = varlen ? varlen_capacity(s.seqlen, nseq, cfg.chunk_size)
                     : (s.seqlen + cfg.chunk_size - 1) / cfg.chunk_size;
  s.nseq = nseq;
  s.compute_dtype = cfg.dtype == DType::kFloat16 ? DType::kFloat16 : DType::kBFloat16;
  s.state_dtype = cfg.state_dtype.value_or(cfg.dtype);
  return s;
}

// ------------------------------------------------------------------ Problem

Problem::Problem(const ProblemConfig& c) : cfg(c), shape(shape_of(c)) {
  const bool varlen = cfg.layout == Layout::kVarlen;
  const bool pad = cfg.padded_strides;
  const int64_t b = shape.batch, L = shape.seqlen, h = cfg.nheads, p = cfg.headdim, g = cfg.ngroups,
                n = cfg.dstate;
  const int64_t nseq = shape.nseq;
  if (varlen && cfg.seqlens.empty()) throw std::invalid_argument("Problem: the varlen layout needs seqlens");
  if (!varlen && !cfg.seqlens.empty()) {
    int64_t sum = 0;
    for (int64_t len : cfg.seqlens) sum += len;
    if (sum != cfg.seqlen) throw std::invalid_argument("Problem: sum(seqlens) != seqlen");
  }
  if (cfg.ngroups <= 0 || cfg.nheads % cfg.ngroups != 0) throw std::invalid_argument("Problem: ngroups must divide nheads");

  auto tok = [&](std::vector<int64_t> inner) {
    std::vector<int64_t> r = varlen ? std::vector<int64_t>{L} : std::vector<int64_t>{b, L};
    r.insert(r.end(), inner.begin(), inner.end());
    return r;
  };
  const int64_t state_rows = varlen ? nseq : b;

  // Fills a tensor in logical order, each block of kBlock elements from its own stream: values
  // depend only on (seed, tensor name, logical index), not on padding, other tensors or the
  // number of threads filling it.
  auto fill = [&](HostTensor& t, const char* name, auto draw) {
    constexpr int64_t kBlock = int64_t{1} << 16;
    const int64_t nblocks = (t.numel() + kBlock - 1) / kBlock;
    std::atomic<int64_t> next{0};
    auto work = [&] {
      for (int64_t blk; (blk = next.fetch_add(1)) < nblocks;) {
        Rng rng(mix64(cfg.seed) ^ name_hash(name) ^ mix64(static_cast<uint64_t>(blk) + 1));
        for_each_offset(
            t.view, [&](int64_t off) { host::store_from_double(t.view.data, t.view.dtype, off, draw(rng)); },
            blk * kBlock, (blk + 1) * kBlock);
      }
    };
    const int64_t nthreads = std::min<int64_t>(nblocks, std::max(1u, std::thread::hardware_concurrency()));
    std::vector<std::thread> pool;
    for (int64_t i = 1; i < nthreads; ++i) pool.emplace_back(work);
    work();
    for (auto& th : pool) th.join();
  };
  auto silu_randn = [](Rng& r) {
    const double v = r.normal();
    return v / (1.0 + std::exp(-v));
  };
  auto randn = [](Rng& r) { return r.normal(); };

  x = HostTensor(cfg.dtype, tok({h, p}), pad);
  fill(x, "x", silu_randn);
  dt = HostTensor(cfg.dt_dtype, tok({h}), pad);
  const bool model = cfg.model_decay, pre_activation = cfg.dt_softplus;
  fill(dt, "dt", [&](Rng& r) {
    if (!model) return std::log1p(std::exp(r.normal()));
    const double v = std::exp(r.uniform(std::log(1e-3), std::log(1e-1)));
    return pre_activation ? v + std::log(-std::expm1(-v)) : v;  // (softplus gives v back)
  });
  A = HostTensor(DType::kFloat32, {h}, pad);
  fill(A, "A", [](Rng& r) { return -r.uniform(1.0, 16.0); });
  if (model) {  // (stratified: head i's log |A| in the i-th of h equal parts of [0, log 16])
    Rng r(mix64(cfg.seed) ^ name_hash("A-model"));
    for (int64_t i = 0; i < h; ++i) A.set({i}, -std::exp(std::log(16.0) * (static_cast<double>(i) + r.uniform()) / h));
  }
  if (cfg.positive_a) fill(A, "A", [](Rng& r) { return std::exp(r.uniform(std::log(0.01), std::log(0.05))); });
  if (cfg.mixed_a) {
    Rng r(mix64(cfg.seed) ^ name_hash("A-mixed"));
    for (int64_t i = 1; i < h; i += 2) A.set({i}, std::exp(r.uniform(std::log(0.01), std::log(0.05))));
  }
  B = HostTensor(cfg.dtype, tok({g, n}), pad);
  fill(B, "B", silu_randn);
  C = HostTensor(cfg.dtype, tok({g, n}), pad);
  fill(C, "C", silu_randn);
  if (cfg.d_mode != DMode::kNone) {
    D = HostTensor(DType::kFloat32, cfg.d_mode == DMode::kPerHead ? std::vector<int64_t>{h} : std::vector<int64_t>{h, p}, pad);
    fill(D, "D", randn);
  }
  if (cfg.has_z) {
    z = HostTensor(cfg.dtype, tok({h, p}), pad);
    fill(z, "z", randn);
  }
  if (cfg.has_dt_bias) {
    dt_bias = HostTensor(DType::kFloat32, {h}, pad);
    fill(dt_bias, "dt_bias", [](Rng& r) { return 0.5 * r.normal(); });
  }
  if (cfg.has_initial_states) {
    initial_states = HostTensor(cfg.initial_dtype, {state_rows, h, p, n}, pad);
    fill(initial_states, "initial_states", randn);
  }
  if (!cfg.seq_starts.empty()) {
    if (varlen) throw std::invalid_argument("Problem: seq_starts is for the batched layout");
    if (cfg.seq_starts.size() != 1 && static_cast<int64_t>(cfg.seq_starts.size()) != b) {
      throw std::invalid_argument("Problem: seq_starts needs one list or one per row");
    }
    seq_idx = HostTensor(DType::kInt32, {b, L}, pad);
    for (int64_t r = 0; r < b; ++r) {
      const auto& starts = cfg.seq_starts.size() == 1 ? cfg.seq_starts[0] : cfg.seq_starts[r];
      for (int64_t t = 0; t < L; ++t) {
        int64_t v = cfg.seq_idx_base;
        for (int64_t s : starts) v += (s > 0 && s <= t) ? 1 : 0;
        seq_idx.set({r, t}, static_cast<double>(v));
      }
    }
  }
  if (!cfg.seqlens.empty()) {
    cu_seqlens = HostTensor(cfg.cu_seqlens_dtype, {nseq + 1}, pad);
    int64_t pos = 0;
    cu_seqlens.set({0}, 0.0);
    for (int64_t i = 0; i < nseq; ++i) {
      pos += cfg.seqlens[i];
      cu_seqlens.set({i + 1}, static_cast<double>(pos));
    }
  }

  out = HostTensor(cfg.dtype, tok({h, p}), pad);
  if (cfg.want_final_states) final_states = HostTensor(cfg.final_dtype, {state_rows, h, p, n}, pad);
  if (cfg.want_varlen_states) {
    if (varlen || cfg.seqlens.empty()) throw std::invalid_argument("Problem: varlen_states needs the batched layout and seqlens");
    varlen_states = HostTensor(cfg.final_dtype, {nseq, h, p, n}, pad);
  }
  if (cfg.want_chunk_states) {
    const std::vector<int64_t> sizes =
        varlen ? std::vector<int64_t>{shape.nchunks + cfg.chunk_capacity_extra, h, p, n}
               : std::vector<int64_t>{b, shape.nchunks, h, p, n};
    chunk_states = HostTensor(shape.state_dtype, sizes, pad);
  }
  if (cfg.want_chunk_offsets) {
    if (!varlen) throw std::invalid_argument("Problem: chunk_offsets is for the varlen layout");
    chunk_offsets = HostTensor(DType::kInt32, {nseq + 1}, pad);
  }
  poison_outputs();
}

ForwardParams Problem::params(Device d) {
  ForwardParams p;
  p.layout = cfg.layout;
  p.device = d;
  p.x = x.view;
  p.dt = dt.view;
  p.A = A.view;
  p.B = B.view;
  p.C = C.view;
  p.chunk_size = cfg.chunk_size;
  p.D = D.view;
  p.z = z.view;
  p.dt_bias = dt_bias.view;
  p.dt_softplus = cfg.dt_softplus;
  p.dt_min = cfg.dt_min;
  p.dt_max = cfg.dt_max;
  p.initial_states = initial_states.view;
  p.seq_idx = seq_idx.view;
  p.cu_seqlens = cu_seqlens.view;
  p.out = out.view;
  p.final_states = final_states.view;
  p.varlen_states = varlen_states.view;
  p.chunk_states = chunk_states.view;
  p.chunk_offsets = chunk_offsets.view;
  p.state_dtype = cfg.state_dtype;
  p.kernel_config = cfg.kernel_config;
  return p;
}

void Problem::poison_outputs() {
  for (HostTensor* t : {&out, &final_states, &varlen_states, &chunk_states, &chunk_offsets}) t->poison();
}

std::vector<std::pair<std::string, HostTensor*>> Problem::tensors() {
  return {{"x", &x},
          {"dt", &dt},
          {"A", &A},
          {"B", &B},
          {"C", &C},
          {"D", &D},
          {"z", &z},
          {"dt_bias", &dt_bias},
          {"initial_states", &initial_states},
          {"seq_idx", &seq_idx},
          {"cu_seqlens", &cu_seqlens},
          {"out", &out},
          {"final_states", &final_states},
          {"varlen_states", &varlen_states},
          {"chunk_states", &chunk_states},
          {"chunk_offsets", &chunk_offsets}};
}

std::vector<TensorField> tensor_fields(ForwardParams& p) {
  return {{"x", &p.x, false},
          {"dt", &p.dt, false},
          {"A", &p.A, false},
          {"B", &p.B, false},
          {"C", &p.C, false},
          {"D", &p.D, false},
          {"z", &p.z, false},
          {"dt_bias", &p.dt_bias, false},
          {"initial_states", &p.initial_states, false},
          {"seq_idx", &p.seq_idx, false},
          {"cu_seqlens", &p.cu_seqlens, false},
          {"out", &p.out, true},
          {"final_states", &p.final_states, true},
          {"varlen_states", &p.varlen_states, true},
          {"chunk_states", &p.chunk_states, true},
          {"chunk_offsets", &p.chunk_offsets, true}};
}

// ------------------------------------------------------------------ norms

namespace {

double ratio(double diff2, double ref2) {
  if (ref2 == 0.0) return diff2 == 0.0 ? 0.0 : std::numeric_limits<double>::infinity();
  return std::sqrt(diff2 / ref2);
}

}  // namespace

double rel_l2(const TensorView& got, const TensorView& ref) {
  if (got.rank != ref.rank) throw std::invalid_argument("rel_l2: rank mismatch");
  for (int i = 0; i < got.rank; ++i) {
    if (got.sizes[i] != ref.sizes[i]) throw std::invalid_argument("rel_l2: shape mismatch");
  }
  double diff2 = 0.0, ref2 = 0.0;
  bool finite = true;
  for_each_offset_pair(got, ref, [&](int64_t og, int64_t orf) {
    const double g = host::load_as_double(got.data, got.dtype, og);
    const double r = host::load_as_double(ref.data, ref.dtype, orf);
    finite = finite && std::isfinite(g);
    diff2 += (g - r) * (g - r);
    ref2 += r * r;
  });
  if (!finite) return std::numeric_limits<double>::infinity();
  return ratio(diff2, ref2);
}

double rel_l2(const TensorView& got, const std::vector<double>& ref) {
  double diff2 = 0.0, ref2 = 0.0;
  bool finite = true;
  size_t i = 0;
  for_each_offset(got, [&](int64_t off) {
    if (i >= ref.size()) return;
    const double g = host::load_as_double(got.data, got.dtype, off);
    finite = finite && std::isfinite(g);
    diff2 += (g - ref[i]) * (g - ref[i]);
    ref2 += ref[i] * ref[i];
    ++i;
  });
  if (i != ref.size()) throw std::invalid_argument("rel_l2: reference longer than the view");
  if (!finite) return std::numeric_limits<double>::infinity();
  return ratio(diff2, ref2);
}

double rel_l2(const std::vector<double>& got, const std::vector<double>& ref) {
  if (got.size() != ref.size()) throw std::invalid_argument("rel_l2: size mismatch");
  double diff2 = 0.0, ref2 = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return std::numeric_limits<double>::infinity();
    diff2 += (got[i] - ref[i]) * (got[i] - ref[i]);
    ref2 += ref[i] * ref[i];
  }
  return ratio(diff2, ref2);
}

bool all_finite(const TensorView& v) {
  bool ok = true;
  for_each_offset(v, [&](int64_t off) { ok = ok && std::isfinite(host::load_as_double(v.data, v.dtype, off)); });
  return ok;
}

bool all_finite(const std::vector<double>& v) {
  for (double d : v) {
    if (!std::isfinite(d)) return false;
  }
  return true;
}

}  // namespace mamba2_ssd::test
