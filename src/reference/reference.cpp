// The float64 CPU reference: the chunked SSD forward of docs/SEMANTICS.md.
//
// One task per (row, head) for the batched layout and per (sequence, head) for the varlen
// layout; a task walks its chunks in order, carrying the state, so every task writes a disjoint
// part of every output and results do not depend on the thread count. Cost per head:
// O(L * Q * (P + N)). Decay exponents between two tokens are summed directly over the tokens
// between them rather than taken as a difference of cumulative sums, which keeps full float64
// accuracy when the cumulative sums are large (big dt).
#include "reference/reference.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "common/host_float.hpp"
#include "mamba2_ssd/error.hpp"

namespace mamba2_ssd::reference {
namespace {

[[noreturn]] void fail(const std::string& arg, const std::string& msg) {
  throw Error(Error::Kind::kInvalidArgument, arg, arg + ": " + msg);
}

std::string sizes_string(const int64_t* sizes, int rank) {
  std::string r = "(";
  for (int i = 0; i < rank; ++i) r += (i ? ", " : "") + std::to_string(sizes[i]);
  return r + (rank == 1 ? ",)" : ")");
}

// Guards the memory accesses: validate() checks all this already, but the reference must not
// read or write out of bounds when called on inconsistent arguments.
void expect_shape(const char* name, const TensorView& v, std::vector<int64_t> sizes,
                  bool dim0_at_least = false) {
  bool ok = v.rank == static_cast<int32_t>(sizes.size());
  for (int i = 0; ok && i < v.rank; ++i) {
    ok = (i == 0 && dim0_at_least) ? v.sizes[0] >= sizes[0] : v.sizes[i] == sizes[i];
  }
  if (!ok) {
    fail(name, std::string("expected shape ") + (dim0_at_least ? "(>=" : "") +
                   sizes_string(sizes.data(), static_cast<int>(sizes.size())).substr(dim0_at_least ? 1 : 0) +
                   ", got " + sizes_string(v.sizes, v.rank));
  }
}

void expect_present(const char* name, const TensorView& v) {
  if (!v.present()) fail(name, "required tensor is missing (null data pointer)");
}

void expect_float(const char* name, const TensorView& v) {
  if (v.present() && !host::is_float_dtype(v.dtype)) fail(name, "expected a floating-point dtype");
}

// One output tensor: written through its view (own dtype and strides) or, for forward_f64,
// into a contiguous float64 buffer.
struct Sink {
  bool present = false;
  void* data = nullptr;
  DType dtype = DType::kFloat32;
  double* f64 = nullptr;
  int64_t stride[TensorView::kMaxRank] = {};

  void put(int64_t off, double v) const {
    if (f64 != nullptr) {
      f64[off] = v;
    } else {
      host::store_from_double(data, dtype, off, v);
    }
  }
};

Sink view_sink(const TensorView& v) {
  Sink s;
  s.present = v.present();
  s.data = v.data;
  s.dtype = v.dtype;
  std::copy(v.strides, v.strides + TensorView::kMaxRank, s.stride);
  return s;
}

Sink buffer_sink(std::vector<double>& buf, const std::vector<int64_t>& sizes) {
  Sink s;
  s.present = true;
  int64_t n = 1;
  for (int i = static_cast<int>(sizes.size()) - 1; i >= 0; --i) {
    s.stride[i] = n;
    n *= sizes[i];
  }
  buf.assign(static_cast<size_t>(n), 0.0);
  s.f64 = buf.data();
  return s;
}

// Everything a task needs, checked and derived once per call.
struct Ctx {
  const ForwardParams* p = nullptr;
  bool varlen = false;
  int64_t batch = 0, L = 0, H = 0, P = 0, G = 0, N = 0, Q = 0, nseq = 0;
  int64_t heads_per_group = 1;
  int td = 1;                          // index of the token dimension of x, dt, B, C, z, out
  std::vector<int64_t> cu;             // cu_seqlens, when present
  std::vector<int64_t> chunk_offsets;  // varlen layout: S + 1 entries
  Sink out, fin, vst, cst;
};

Ctx prepare(const ForwardParams& p, const ProblemShape& s) {
  Ctx c;
  c.p = &p;
  c.varlen = p.layout == Layout::kVarlen;
  if (!c.varlen && p.layout != Layout::kBatched) fail("layout", "unknown layout value");
  c.td = c.varlen ? 0 : 1;
  c.batch = c.varlen ? 1 : s.batch;
  c.L = s.seqlen;
  c.H = s.nheads;
  c.P = s.headdim;
  c.G = s.ngroups;
  c.N = s.dstate;
  c.Q = p.chunk_size;

  expect_present("x", p.x);
  expect_present("dt", p.dt);
  expect_present("A", p.A);
  expect_present("B", p.B);
  expect_present("C", p.C);
  expect_present("out", p.out);
  for (auto [name, v] : {std::pair<const char*, const TensorView*>{"x", &p.x}, {"dt", &p.dt}, {"A", &p.A},
                         {"B", &p.B}, {"C", &p.C}, {"D", &p.D}, {"z", &p.z}, {"dt_bias", &p.dt_bias},
                         {"initial_states", &p.initial_states}, {"out", &p.out},
                         {"final_states", &p.final_states}, {"varlen_states", &p.varlen_states},
                         {"chunk_states", &p.chunk_states}}) {
    expect_float(name, *v);
  }
  if (c.Q <= 0) fail("chunk_size", "expected a positive value, got " + std::to_string(c.Q));
  if (c.H <= 0 || c.P <= 0 || c.N <= 0 || c.G <= 0 || c.H % c.G != 0 || c.batch < 0 || c.L < 0) {
    fail("shape", "inconsistent problem shape (nheads " + std::to_string(c.H) + ", ngroups " +
                      std::to_string(c.G) + ", headdim " + std::to_string(c.P) + ", dstate " +
                      std::to_string(c.N) + ")");
  }
  c.heads_per_group = c.H / c.G;

  // Token-major tensors: (b, l, ...) batched, (T, ...) varlen.
  auto tok_shape = [&](std::vector<int64_t> inner) {
    std::vector<int64_t> r = c.varlen ? std::vector<int64_t>{c.L} : std::vector<int64_t>{c.batch, c.L};
    r.insert(r.end(), inner.begin(), inner.end());
    return r;
  };
  expect_shape("x", p.x, tok_shape({c.H, c.P}));
  expect_shape("dt", p.dt, tok_shape({c.H}));
  expect_shape("A", p.A, {c.H});
  expect_shape("B", p.B, tok_shape({c.G, c.N}));
  expect_shape("C", p.C, tok_shape({c.G, c.N}));
  expect_shape("out", p.out, tok_shape({c.H, c.P}));
  if (p.z.present()) expect_shape("z", p.z, tok_shape({c.H, c.P}));
  if (p.dt_bias.present()) expect_shape("dt_bias", p.dt_bias, {c.H});
  if (p.D.present()) {
    if (p.D.rank == 1) {
      expect_shape("D", p.D, {c.H});
    } else {
      expect_shape("D", p.D, {c.H, c.P});
    }
  }

  if (p.cu_seqlens.present()) {
    if (p.cu_seqlens.rank != 1 || p.cu_seqlens.sizes[0] < 2) {
      fail("cu_seqlens", "expected shape (S + 1,) with S >= 1, got " +
                             sizes_string(p.cu_seqlens.sizes, p.cu_seqlens.rank));
    }
    c.nseq = p.cu_seqlens.sizes[0] - 1;
    c.cu.resize(static_cast<size_t>(c.nseq + 1));
    for (int64_t i = 0; i <= c.nseq; ++i) {
      c.cu[i] = host::load_as_int64(p.cu_seqlens.data, p.cu_seqlens.dtype, i * p.cu_seqlens.strides[0]);
      if (i > 0 && c.cu[i] < c.cu[i - 1]) fail("cu_seqlens", "expected non-decreasing values");
    }
    if (c.cu[0] != 0 || c.cu[c.nseq] != c.L) {
      fail("cu_seqlens", "expected cu_seqlens[0] == 0 and cu_seqlens[S] == " + std::to_string(c.L) +
                             ", got " + std::to_string(c.cu[0]) + " and " + std::to_string(c.cu[c.nseq]));
    }
  }

  const std::vector<int64_t> hpn = {c.H, c.P, c.N};
  auto with = [&](std::vector<int64_t> head) {
    head.insert(head.end(), hpn.begin(), hpn.end());
    return head;
  };
  if (p.chunk_states.present() && p.chunk_states.dtype != s.state_dtype) {
    fail("chunk_states", "expected the dtype of state_dtype");
  }

  if (c.varlen) {
    if (!p.cu_seqlens.present()) fail("cu_seqlens", "required for the varlen layout");
    if (p.seq_idx.present()) fail("seq_idx", "not supported in the varlen layout");
    if (p.varlen_states.present()) fail("varlen_states", "batched layout only (use final_states)");
    if (p.initial_states.present()) expect_shape("initial_states", p.initial_states, with({c.nseq}));
    if (p.final_states.present()) expect_shape("final_states", p.final_states, with({c.nseq}));
    c.chunk_offsets.assign(static_cast<size_t>(c.nseq + 1), 0);
    for (int64_t i = 0; i < c.nseq; ++i) {
      c.chunk_offsets[i + 1] = c.chunk_offsets[i] + (c.cu[i + 1] - c.cu[i] + c.Q - 1) / c.Q;
    }
    if (p.chunk_states.present()) expect_shape("chunk_states", p.chunk_states, with({c.chunk_offsets[c.nseq]}), true);
    if (p.chunk_offsets.present()) {
      expect_shape("chunk_offsets", p.chunk_offsets, {c.nseq + 1});
      if (host::is_float_dtype(p.chunk_offsets.dtype)) fail("chunk_offsets", "expected an integer dtype");
    }
  } else {
    if (p.chunk_offsets.present()) fail("chunk_offsets", "varlen layout only");
    if (p.initial_states.present()) expect_shape("initial_states", p.initial_states, with({c.batch}));
    if (p.final_states.present()) expect_shape("final_states", p.final_states, with({c.batch}));
    if (p.seq_idx.present()) {
      expect_shape("seq_idx", p.seq_idx, {c.batch, c.L});
      if (host::is_float_dtype(p.seq_idx.dtype)) fail("seq_idx", "expected an integer dtype");
    }
    if (p.chunk_states.present()) {
      expect_shape("chunk_states", p.chunk_states, with({c.batch, (c.L + c.Q - 1) / c.Q}));
    }
    if (p.varlen_states.present()) {
      if (!p.cu_seqlens.present()) fail("varlen_states", "needs cu_seqlens");
      if (c.batch != 1) fail("varlen_states", "needs batch == 1, got " + std::to_string(c.batch));
      expect_shape("varlen_states", p.varlen_states, with({c.nseq}));
    }
  }
  return c;
}

// The rows of the computation: a batch row, or one sequence of the varlen layout.
struct Row {
  int64_t index = 0;   // initial/final state index: b or sequence i
  int64_t batch = 0;   // batch index of the token tensors (0 for varlen)
  int64_t tok0 = 0;    // first token along the token dimension
  int64_t len = 0;     // tokens in the row
  int64_t chunk0 = 0;  // varlen: chunk_states index of the row's first chunk
};

// Tokens whose outputs are computed together (the register blocking of the output loops,
// written out for exactly four rows).
constexpr int64_t kRows = 4;

void run_task(const Ctx& c, const Row& r, int64_t h) {
  const ForwardParams& p = *c.p;
  const int64_t P = c.P, N = c.N;
  // Chunk length, and the token capacity of the per-chunk buffers (no chunk of this row is longer).
  const int64_t Q = c.Q, QB = std::max<int64_t>(1, std::min(c.Q, r.len));
  const int64_t g = h / c.heads_per_group;
  const int td = c.td;
  // Offset of local token t's first element in a token-major tensor with strides `st`.
  auto tok = [&](const int64_t* st, int64_t t) {
    return (c.varlen ? 0 : r.batch * st[0]) + (r.tok0 + t) * st[td];
  };
  const bool has_seq = p.seq_idx.present();

  const double a_h = host::load_as_double(p.A.data, p.A.dtype, h * p.A.strides[0]);
  const double bias =
      p.dt_bias.present() ? host::load_as_double(p.dt_bias.data, p.dt_bias.dtype, h * p.dt_bias.strides[0]) : 0.0;
  const double dt_min = p.dt_min, dt_max = p.dt_max;
  std::vector<double> dvec(static_cast<size_t>(P), 0.0);
  if (p.D.present()) {
    if (p.D.rank == 1) {
      std::fill(dvec.begin(), dvec.end(), host::load_as_double(p.D.data, p.D.dtype, h * p.D.strides[0]));
    } else {
      host::load_strided(p.D.data, p.D.dtype, h * p.D.strides[0], p.D.strides[1], P, dvec.data());
    }
  }

  // The state is kept transposed, ht[n * P + p], so that the inner loops run over p with unit stride.
  std::vector<double> ht(static_cast<size_t>(N * P), 0.0), acc(static_cast<size_t>(N * P));
  std::vector<double> tmp(static_cast<size_t>(std::max(P, N)));
  auto load_state = [&](const TensorView& v, int64_t idx) {
    for (int64_t pp = 0; pp < P; ++pp) {
      host::load_strided(v.data, v.dtype, idx * v.strides[0] + h * v.strides[1] + pp * v.strides[2],
                         v.strides[3], N, tmp.data());
      for (int64_t n = 0; n < N; ++n) ht[n * P + pp] = tmp[n];
    }
  };
  // Writes a transposed state to (lead..., h, p, n) of `s`, lead given as its element offset.
  auto put_state = [&](const Sink& s, int64_t lead_off, int hdim, const std::vector<double>& st) {
    const int64_t base = lead_off + h * s.stride[hdim];
    for (int64_t pp = 0; pp < P; ++pp) {
      for (int64_t n = 0; n < N; ++n) {
        s.put(base + pp * s.stride[hdim + 1] + n * s.stride[hdim + 2], st[n * P + pp]);
      }
    }
  };
  if (p.initial_states.present()) load_state(p.initial_states, r.index);

  // varlen_states of empty packed sequences are zero; the others are written in the chunk where
  // they end (sequences are sorted by end, so one cursor suffices).
  const bool want_vst = c.vst.present && !c.varlen;
  if (want_vst) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t i = 0; i < c.nseq; ++i) {
      if (c.cu[i] == c.cu[i + 1]) put_state(c.vst, i * c.vst.stride[0], 1, acc);
    }
  }
  int64_t vcur = 0;

  // Per-chunk buffers; B is kept transposed, bt[n * QB + s].
  std::vector<double> xs(static_cast<size_t>(QB * P)), zs(p.z.present() ? static_cast<size_t>(QB * P) : 0);
  std::vector<double> bt(static_cast<size_t>(N * QB)), cs(static_cast<size_t>(QB * N));
  std::vector<double> dtp(static_cast<size_t>(QB)), ad(static_cast<size_t>(QB)), cum(static_cast<size_t>(QB));
  std::vector<double> coef(static_cast<size_t>(QB));
  std::vector<double> w(static_cast<size_t>(kRows * QB)), y(static_cast<size_t>(kRows * P));
  std::vector<int64_t> seq(static_cast<size_t>(QB), 0);
  // st[n * P + p] += sum_{s in [s0, s1)} coef[s] * B_s[n] * x_s[p], four tokens per sweep of st.
  auto add_outer = [&](double* st, const double* cf, int64_t s0, int64_t s1) {
    int64_t s = s0;
    for (; s + 4 <= s1; s += 4) {
      const double *x0 = &xs[s * P], *x1 = x0 + P, *x2 = x1 + P, *x3 = x2 + P;
      for (int64_t n = 0; n < N; ++n) {
        const double* brow = &bt[n * QB + s];
        const double f0 = cf[s] * brow[0], f1 = cf[s + 1] * brow[1], f2 = cf[s + 2] * brow[2],
                     f3 = cf[s + 3] * brow[3];
        double* srow = st + n * P;
        for (int64_t pp = 0; pp < P; ++pp) srow[pp] += f0 * x0[pp] + f1 * x1[pp] + f2 * x2[pp] + f3 * x3[pp];
      }
    }
    for (; s < s1; ++s) {
      const double* xrow = &xs[s * P];
      for (int64_t n = 0; n < N; ++n) {
        const double f = cf[s] * bt[n * QB + s];
        double* srow = st + n * P;
        for (int64_t pp = 0; pp < P; ++pp) srow[pp] += f * xrow[pp];
      }
    }
  };

  const int64_t nchunks = (r.len + Q - 1) / Q;
  int64_t prev = 0;  // seq_idx of the previous chunk's last token (0 before the first chunk)
  for (int64_t k = 0; k < nchunks; ++k) {
    const int64_t t0 = k * Q;
    const int64_t len = std::min(Q, r.len - t0);

    // ---- load the chunk and compute dt' and the in-chunk cumulative sum of A * dt'
    for (int64_t i = 0; i < len; ++i) {
      const int64_t t = t0 + i;
      double v = host::load_as_double(p.dt.data, p.dt.dtype, tok(p.dt.strides, t) + h * p.dt.strides[td + 1]) + bias;
      if (p.dt_softplus && v <= 20.0) v = std::log1p(std::exp(v));
      v = std::min(std::max(v, dt_min), dt_max);
      dtp[i] = v;
      ad[i] = a_h * v;
      cum[i] = (i > 0 ? cum[i - 1] : 0.0) + ad[i];
      if (has_seq) {
        seq[i] = host::load_as_int64(p.seq_idx.data, p.seq_idx.dtype,
                                     r.batch * p.seq_idx.strides[0] + t * p.seq_idx.strides[1]);
      }
      host::load_strided(p.x.data, p.x.dtype, tok(p.x.strides, t) + h * p.x.strides[td + 1],
                         p.x.strides[td + 2], P, &xs[i * P]);
      if (p.z.present()) {
        host::load_strided(p.z.data, p.z.dtype, tok(p.z.strides, t) + h * p.z.strides[td + 1],
                           p.z.strides[td + 2], P, &zs[i * P]);
      }
      host::load_strided(p.C.data, p.C.dtype, tok(p.C.strides, t) + g * p.C.strides[td + 1],
                         p.C.strides[td + 2], N, &cs[i * N]);
      host::load_strided(p.B.data, p.B.dtype, tok(p.B.strides, t) + g * p.B.strides[td + 1],
                         p.B.strides[td + 2], N, tmp.data());
      for (int64_t n = 0; n < N; ++n) bt[n * QB + i] = tmp[n];
    }

    // ---- outputs of the chunk, kRows tokens at a time (each B_s, x_s and state row loaded once
    // per block): intra-chunk sum, contribution of the carried state, D, gate
    for (int64_t tb = 0; tb < len; tb += kRows) {
      const int64_t rows = std::min(kRows, len - tb);
      const int64_t send = tb + rows;  // tokens s < send feed some row of the block
      double* wr[kRows];
      double* yr[kRows];
      double crow[kRows];
      for (int64_t j = 0; j < kRows; ++j) {
        wr[j] = &w[j * QB];
        yr[j] = &y[j * P];
        std::fill(wr[j], wr[j] + send, 0.0);
        std::fill(yr[j], yr[j] + P, 0.0);
      }
      for (int64_t n = 0; n < N; ++n) {  // wr[j][s] = C_{tb+j} . B_s (rows past the block: C = 0)
        for (int64_t j = 0; j < kRows; ++j) crow[j] = j < rows ? cs[(tb + j) * N + n] : 0.0;
        const double* brow = &bt[n * QB];
        for (int64_t s = 0; s < send; ++s) {
          const double b = brow[s];
          wr[0][s] += crow[0] * b;
          wr[1][s] += crow[1] * b;
          wr[2][s] += crow[2] * b;
          wr[3][s] += crow[3] * b;
        }
      }
      for (int64_t j = 0; j < rows; ++j) {  // scale by decay and dt', masking s > t and other sequences
        const int64_t t = tb + j;
        std::fill(wr[j] + t + 1, wr[j] + send, 0.0);
        double seg = 0.0;  // cum[t] - cum[s], summed directly: no cancellation of large cumsums
        for (int64_t s = t; s >= 0; seg += ad[s], --s) {
          wr[j][s] = seq[s] == seq[t] ? wr[j][s] * std::exp(std::min(seg, 0.0)) * dtp[s] : 0.0;
        }
      }
      for (int64_t s = 0; s < send; ++s) {
        const double* xrow = &xs[s * P];
        const double m0 = wr[0][s], m1 = wr[1][s], m2 = wr[2][s], m3 = wr[3][s];
        for (int64_t pp = 0; pp < P; ++pp) {
          const double xv = xrow[pp];
          yr[0][pp] += m0 * xv;
          yr[1][pp] += m1 * xv;
          yr[2][pp] += m2 * xv;
          yr[3][pp] += m3 * xv;
        }
      }
      double decay[kRows] = {0.0, 0.0, 0.0, 0.0};
      bool carried = false;
      for (int64_t j = 0; j < rows; ++j) {
        if (seq[tb + j] == prev) {
          decay[j] = std::exp(cum[tb + j]);
          carried = true;
        }
      }
      if (carried) {
        for (int64_t n = 0; n < N; ++n) {
          for (int64_t j = 0; j < kRows; ++j) crow[j] = j < rows ? decay[j] * cs[(tb + j) * N + n] : 0.0;
          const double* hrow = &ht[n * P];
          for (int64_t pp = 0; pp < P; ++pp) {
            const double hv = hrow[pp];
            yr[0][pp] += crow[0] * hv;
            yr[1][pp] += crow[1] * hv;
            yr[2][pp] += crow[2] * hv;
            yr[3][pp] += crow[3] * hv;
          }
        }
      }
      for (int64_t j = 0; j < rows; ++j) {
        const int64_t t = tb + j;
        const int64_t obase = tok(c.out.stride, t0 + t) + h * c.out.stride[td + 1];
        const int64_t ostride = c.out.stride[td + 2];
        for (int64_t pp = 0; pp < P; ++pp) {
          double v = yr[j][pp] + dvec[pp] * xs[t * P + pp];
          if (p.z.present()) {
            const double zv = zs[t * P + pp];
            v *= zv / (1.0 + std::exp(-zv));
          }
          c.out.put(obase + pp * ostride, v);
        }
      }
    }

    // ---- varlen_states of the packed sequences ending in this chunk (ht is still H_prev(k))
    while (want_vst && vcur < c.nseq) {
      const int64_t start = c.cu[vcur], end = c.cu[vcur + 1];
      if (start == end) {
        ++vcur;
        continue;
      }
      if ((end - 1) / Q != k) break;
      const int64_t e = end - 1 - t0;
      if (start < t0) {
        const double decay = std::exp(cum[e]);
        for (int64_t j = 0; j < N * P; ++j) acc[j] = decay * ht[j];
      } else {
        std::fill(acc.begin(), acc.end(), 0.0);
      }
      const int64_t first = std::max<int64_t>(start - t0, 0);
      double seg = 0.0;  // cum[e] - cum[s]
      for (int64_t s = e; s >= first; seg += ad[s], --s) coef[s] = std::exp(std::min(seg, 0.0)) * dtp[s];
      add_outer(acc.data(), coef.data(), first, e + 1);
      put_state(c.vst, vcur * c.vst.stride[0], 1, acc);
      ++vcur;
    }

    // ---- state after the chunk
    const int64_t last = len - 1;
    if (seq[last] == prev) {
      const double decay = std::exp(cum[last]);
      for (double& v : ht) v *= decay;
    } else {
      std::fill(ht.begin(), ht.end(), 0.0);
    }
    double seg = 0.0;  // cum[last] - cum[s]
    for (int64_t s = last; s >= 0; seg += ad[s], --s) {
      coef[s] = seq[s] == seq[last] ? std::exp(std::min(seg, 0.0)) * dtp[s] : 0.0;
    }
    add_outer(ht.data(), coef.data(), 0, len);
    if (c.cst.present) {
      if (c.varlen) {
        put_state(c.cst, (r.chunk0 + k) * c.cst.stride[0], 1, ht);
      } else {
        put_state(c.cst, r.batch * c.cst.stride[0] + k * c.cst.stride[1], 2, ht);
      }
    }
    prev = seq[last];
  }
  if (c.fin.present) put_state(c.fin, r.index * c.fin.stride[0], 1, ht);
}

// Runs fn(0..n-1) on up to `threads` threads (0: all hardware threads); rethrows the first
// exception a task threw, after all threads have stopped.
void parallel_for(int64_t n, int threads, const std::function<void(int64_t)>& fn) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int64_t nthreads = std::min<int64_t>(threads, n);
  if (nthreads <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<int64_t> next{0};
  std::atomic<bool> stop{false};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto worker = [&] {
    while (!stop.load(std::memory_order_relaxed)) {
      const int64_t i = next.fetch_add(1);
      if (i >= n) break;
      try {
        fn(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
        stop = true;
      }
    }
  };
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < nthreads; ++t) {
    try {
      pool.emplace_back(worker);
    } catch (const std::system_error&) {
      break;  // fewer threads than asked: the remaining ones share the work
    }
  }
  worker();
  for (std::thread& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

void run(const Ctx& c, int threads) {
  std::vector<Row> rows;
  if (c.varlen) {
    for (int64_t i = 0; i < c.nseq; ++i) {
      rows.push_back(Row{i, 0, c.cu[i], c.cu[i + 1] - c.cu[i], c.chunk_offsets[i]});
    }
    // Longest sequences first, for a better balance between threads.
    std::stable_sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.len > b.len; });
  } else {
    for (int64_t b = 0; b < c.batch; ++b) rows.push_back(Row{b, b, 0, c.L, 0});
  }
  const int64_t ntasks = static_cast<int64_t>(rows.size()) * c.H;
  parallel_for(ntasks, threads, [&](int64_t task) { run_task(c, rows[task / c.H], task % c.H); });
}

}  // namespace

void forward(const ForwardParams& p, const ProblemShape& s, int threads) {
  Ctx c = prepare(p, s);
  c.out = view_sink(p.out);
  c.fin = view_sink(p.final_states);
  c.vst = view_sink(p.varlen_states);
  c.cst = view_sink(p.chunk_states);
  run(c, threads);
  if (c.varlen && p.chunk_offsets.present()) {
    for (int64_t i = 0; i <= c.nseq; ++i) {
      host::store_from_double(p.chunk_offsets.data, p.chunk_offsets.dtype, i * p.chunk_offsets.strides[0],
                              static_cast<double>(c.chunk_offsets[i]));
    }
  }
}

F64Outputs forward_f64(const ForwardParams& p, const ProblemShape& s, int threads) {
  Ctx c = prepare(p, s);
  F64Outputs r;
  const std::vector<int64_t> hpn = {c.H, c.P, c.N};
  auto states = [&](std::vector<int64_t> lead) {
    lead.insert(lead.end(), hpn.begin(), hpn.end());
    return lead;
  };
  c.out = buffer_sink(r.out, c.varlen ? std::vector<int64_t>{c.L, c.H, c.P}
                                      : std::vector<int64_t>{c.batch, c.L, c.H, c.P});
  const int64_t rows = c.varlen ? c.nseq : c.batch;
  if (p.final_states.present()) c.fin = buffer_sink(r.final_states, states({rows}));
  if (p.varlen_states.present()) c.vst = buffer_sink(r.varlen_states, states({c.nseq}));
  if (p.chunk_states.present()) {
    c.cst = buffer_sink(r.chunk_states, c.varlen ? states({c.chunk_offsets[c.nseq]})
                                                 : states({c.batch, (c.L + c.Q - 1) / c.Q}));
  }
  run(c, threads);
  if (c.varlen) r.chunk_offsets.assign(c.chunk_offsets.begin(), c.chunk_offsets.end());
  return r;
}

double error_bar(Compared what, DType stored, DType io, int64_t elements) {
  const bool stored16 = stored == DType::kBFloat16 || stored == DType::kFloat16;
  double bar = what == Compared::kOut ? 3e-3 : stored16 ? 4e-3 : 2.5e-3;
  if (io == DType::kFloat32) bar = std::max(bar, 4e-3);
  return elements < kFewElements ? 1.5 * bar : bar;
}

}  // namespace mamba2_ssd::reference
