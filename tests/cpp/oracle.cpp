// Token-by-token recurrence:
//   H_t = [same sequence as t-1] exp(a_t) H_{t-1} + dt'_t x_t B_t^T,   y_t = H_t C_t + D x_t,
// gated by silu(z_t). Chunk states are snapshots of H at chunk ends.
#include "oracle.hpp"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <stdexcept>

#include "common/host_float.hpp"

namespace mamba2_ssd::test {
namespace {

// Element of `v` at a logical index (no bounds checks: the tests build consistent views).
double at(const TensorView& v, std::initializer_list<int64_t> idx) {
  int64_t off = 0;
  int d = 0;
  for (int64_t i : idx) off += i * v.strides[d++];
  return host::load_as_double(v.data, v.dtype, off);
}

int64_t at_int(const TensorView& v, std::initializer_list<int64_t> idx) {
  int64_t off = 0;
  int d = 0;
  for (int64_t i : idx) off += i * v.strides[d++];
  return host::load_as_int64(v.data, v.dtype, off);
}

class Oracle {
 public:
  Oracle(const ForwardParams& p, const ProblemShape& s)
      : p_(p), varlen_(p.layout == Layout::kVarlen), L_(s.seqlen), H_(s.nheads), P_(s.headdim),
        N_(s.dstate), Q_(p.chunk_size), heads_per_group_(s.nheads / s.ngroups) {
    if (Q_ <= 0) throw std::invalid_argument("oracle: chunk_size must be positive");
    if (p.cu_seqlens.present()) {
      const int64_t n = p.cu_seqlens.sizes[0];
      for (int64_t i = 0; i < n; ++i) cu_.push_back(at_int(p.cu_seqlens, {i}));
    }
  }

  OracleOutputs run(int64_t batch) {
    OracleOutputs r;
    const int64_t hpn = H_ * P_ * N_;
    const int64_t nseq = cu_.empty() ? 0 : static_cast<int64_t>(cu_.size()) - 1;
    if (varlen_) {
      r.out.assign(L_ * H_ * P_, 0.0);
      r.chunk_offsets.assign(nseq + 1, 0);
      for (int64_t i = 0; i < nseq; ++i) {
        r.chunk_offsets[i + 1] = static_cast<int32_t>(r.chunk_offsets[i] + (cu_[i + 1] - cu_[i] + Q_ - 1) / Q_);
      }
      if (p_.final_states.present()) r.final_states.assign(nseq * hpn, 0.0);
      if (p_.chunk_states.present()) r.chunk_states.assign(r.chunk_offsets[nseq] * hpn, 0.0);
      for (int64_t i = 0; i < nseq; ++i) {
        for (int64_t h = 0; h < H_; ++h) run_sequence(r, i, h);
      }
    } else {
      const int64_t nchunks = (L_ + Q_ - 1) / Q_;
      r.out.assign(batch * L_ * H_ * P_, 0.0);
      if (p_.final_states.present()) r.final_states.assign(batch * hpn, 0.0);
      if (p_.chunk_states.present()) r.chunk_states.assign(batch * nchunks * hpn, 0.0);
      if (p_.varlen_states.present()) r.varlen_states.assign(nseq * hpn, 0.0);
      for (int64_t b = 0; b < batch; ++b) {
        for (int64_t h = 0; h < H_; ++h) run_row(r, b, h, nchunks);
      }
    }
    return r;
  }

 private:
  // Token-major accessors: batched (b, t, ...), varlen (t, ...).
  double tok(const TensorView& v, int64_t b, int64_t t, int64_t i) const {
    return varlen_ ? at(v, {t, i}) : at(v, {b, t, i});
  }
  double tok(const TensorView& v, int64_t b, int64_t t, int64_t i, int64_t j) const {
    return varlen_ ? at(v, {t, i, j}) : at(v, {b, t, i, j});
  }

  double dt_prime(int64_t b, int64_t t, int64_t h) const {
    double v = tok(p_.dt, b, t, h);
    if (p_.dt_bias.present()) v += at(p_.dt_bias, {h});
    if (p_.dt_softplus && v <= 20.0) v = std::log1p(std::exp(v));
    if (v < p_.dt_min) v = p_.dt_min;
    if (v > p_.dt_max) v = p_.dt_max;
    return v;
  }

  // One token: H <- exp(A dt') H + dt' x_t B_t^T, or H <- dt' x_t B_t^T when the state is not
  // carried (a new sequence starts at t).
  void step(std::vector<double>& st, int64_t b, int64_t t, int64_t h, bool carry) const {
    const double d = dt_prime(b, t, h);
    const double keep = carry ? std::exp(at(p_.A, {h}) * d) : 0.0;
    const int64_t g = h / heads_per_group_;
    for (int64_t pp = 0; pp < P_; ++pp) {
      const double dx = d * tok(p_.x, b, t, h, pp);
      for (int64_t n = 0; n < N_; ++n) {
        const double prev = carry ? keep * st[pp * N_ + n] : 0.0;
        st[pp * N_ + n] = prev + dx * tok(p_.B, b, t, g, n);
      }
    }
  }

  void emit_out(OracleOutputs& r, const std::vector<double>& st, int64_t b, int64_t t, int64_t h) const {
    const int64_t g = h / heads_per_group_;
    for (int64_t pp = 0; pp < P_; ++pp) {
      double y = 0.0;
      for (int64_t n = 0; n < N_; ++n) y += st[pp * N_ + n] * tok(p_.C, b, t, g, n);
      if (p_.D.present()) y += (p_.D.rank == 1 ? at(p_.D, {h}) : at(p_.D, {h, pp})) * tok(p_.x, b, t, h, pp);
      if (p_.z.present()) {
        const double z = tok(p_.z, b, t, h, pp);
        y *= z / (1.0 + std::exp(-z));
      }
      r.out[((b * L_ + t) * H_ + h) * P_ + pp] = y;
    }
  }

  void save(std::vector<double>& dst, int64_t index, int64_t h, const std::vector<double>& st) const {
    for (int64_t j = 0; j < P_ * N_; ++j) dst[(index * H_ + h) * P_ * N_ + j] = st[j];
  }

  std::vector<double> initial(int64_t index, int64_t h) const {
    std::vector<double> st(P_ * N_, 0.0);
    if (p_.initial_states.present()) {
      for (int64_t pp = 0; pp < P_; ++pp) {
        for (int64_t n = 0; n < N_; ++n) st[pp * N_ + n] = at(p_.initial_states, {index, h, pp, n});
      }
    }
    return st;
  }

  void run_row(OracleOutputs& r, int64_t b, int64_t h, int64_t nchunks) const {
    std::vector<double> st = initial(b, h);
    std::vector<std::vector<double>> entering;  // state entering each chunk, for varlen_states
    int64_t prev_seq = 0;                        // the sequence "before" token 0 is 0
    for (int64_t t = 0; t < L_; ++t) {
      if (p_.varlen_states.present() && t % Q_ == 0) entering.push_back(st);
      const int64_t cur = p_.seq_idx.present() ? at_int(p_.seq_idx, {b, t}) : 0;
      step(st, b, t, h, cur == prev_seq);
      prev_seq = cur;
      emit_out(r, st, b, t, h);
      if (p_.chunk_states.present() && (t % Q_ == Q_ - 1 || t == L_ - 1)) save(r.chunk_states, b * nchunks + t / Q_, h, st);
    }
    if (p_.final_states.present()) save(r.final_states, b, h, st);

    // mamba_ssm's chunk_state_varlen: restart from the state entering the chunk of the
    // sequence's last token, kept only when the sequence began before that chunk.
    if (p_.varlen_states.present() && b == 0) {
      for (size_t i = 0; i + 1 < cu_.size(); ++i) {
        const int64_t start = cu_[i], end = cu_[i + 1];
        std::vector<double> v(P_ * N_, 0.0);
        if (start < end) {
          const int64_t k = (end - 1) / Q_;
          if (start < k * Q_) v = entering[k];
          for (int64_t t = std::max(start, k * Q_); t < end; ++t) step(v, b, t, h, true);
        }
        save(r.varlen_states, static_cast<int64_t>(i), h, v);
      }
    }
  }

  void run_sequence(OracleOutputs& r, int64_t i, int64_t h) const {
    std::vector<double> st = initial(i, h);
    const int64_t start = cu_[i], len = cu_[i + 1] - cu_[i];
    for (int64_t j = 0; j < len; ++j) {
      step(st, 0, start + j, h, true);
      emit_out(r, st, 0, start + j, h);
      if (p_.chunk_states.present() && (j % Q_ == Q_ - 1 || j == len - 1)) {
        save(r.chunk_states, r.chunk_offsets[i] + j / Q_, h, st);
      }
    }
    if (p_.final_states.present()) save(r.final_states, i, h, st);
  }

  const ForwardParams& p_;
  bool varlen_;
  int64_t L_, H_, P_, N_, Q_, heads_per_group_;
  std::vector<int64_t> cu_;
};

}  // namespace

OracleOutputs oracle_forward(const ForwardParams& p, const ProblemShape& s) {
  return Oracle(p, s).run(p.layout == Layout::kVarlen ? 1 : s.batch);
}

}  // namespace mamba2_ssd::test
