// Helpers shared by the CPU and GPU tests: a deterministic RNG, host tensors of any dtype with
// optional padded strides, random problems drawn like the published SSD tests draw them, and
// error norms.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/host_float.hpp"
#include "mamba2_ssd/params.hpp"

namespace mamba2_ssd::test {

// splitmix64 with Box-Muller normals: the same numbers on every platform and standard library.
class Rng {
 public:
  explicit Rng(uint64_t seed);
  uint64_t next_u64();
  double uniform();                          // [0, 1)
  double uniform(double lo, double hi);      // [lo, hi)
  int64_t uniform_int(int64_t lo, int64_t hi);  // [lo, hi], inclusive
  double normal();                           // standard normal
  bool coin(double p_true = 0.5) { return uniform() < p_true; }

 private:
  uint64_t state_;
  bool has_spare_ = false;
  double spare_ = 0.0;
};

const char* dtype_str(DType t);

// Visits the element offsets of a view in row-major logical order: fn(offset); with `begin`
// and `end`, only the logical elements [begin, end) (end < 0: to the last one).
template <class F>
void for_each_offset(const TensorView& v, F&& fn, int64_t begin = 0, int64_t end = -1) {
  int64_t total = 1;
  for (int i = 0; i < v.rank; ++i) {
    if (v.sizes[i] <= 0) return;
    total *= v.sizes[i];
  }
  if (end < 0 || end > total) end = total;
  if (begin >= end) return;
  int64_t idx[TensorView::kMaxRank] = {};
  int64_t off = 0;
  for (int64_t d = v.rank - 1, rest = begin; d >= 0; --d) {  // unravel `begin`
    idx[d] = rest % v.sizes[d];
    rest /= v.sizes[d];
    off += idx[d] * v.strides[d];
  }
  for (int64_t left = end - begin; left > 0; --left) {
    fn(off);
    int d = v.rank - 1;
    for (; d >= 0; --d) {
      if (++idx[d] < v.sizes[d]) {
        off += v.strides[d];
        break;
      }
      off -= (v.sizes[d] - 1) * v.strides[d];
      idx[d] = 0;
    }
    if (d < 0) return;
  }
}

// Visits two views of the same sizes in lockstep, in row-major logical order: fn(off_a, off_b).
template <class F>
void for_each_offset_pair(const TensorView& a, const TensorView& b, F&& fn) {
  for (int i = 0; i < a.rank; ++i) {
    if (a.sizes[i] <= 0) return;
  }
  int64_t idx[TensorView::kMaxRank] = {};
  int64_t oa = 0, ob = 0;
  while (true) {
    fn(oa, ob);
    int d = a.rank - 1;
    for (; d >= 0; --d) {
      if (++idx[d] < a.sizes[d]) {
        oa += a.strides[d];
        ob += b.strides[d];
        break;
      }
      oa -= (a.sizes[d] - 1) * a.strides[d];
      ob -= (a.sizes[d] - 1) * b.strides[d];
      idx[d] = 0;
    }
    if (d < 0) return;
  }
}

// A host tensor that owns its bytes; `view` points into them (data == nullptr: absent).
// With `padded`, every stride but the innermost gets kPad extra elements, so that strided
// access is exercised; the gaps are poisoned (NaN, or the integer maximum) like the outputs.
struct HostTensor {
  static constexpr int64_t kPad = 8;  // keeps 16-byte alignment of rows for 16-bit dtypes

  HostTensor() = default;
  HostTensor(DType dtype, const std::vector<int64_t>& sizes, bool padded = false);
  HostTensor(const HostTensor& o);
  HostTensor& operator=(const HostTensor& o);
  HostTensor(HostTensor&&) = default;
  HostTensor& operator=(HostTensor&&) = default;

  bool present() const { return view.present(); }
  int64_t numel() const;
  // Bytes from the first to one past the last addressable element (gaps included): what a
  // device mirror has to allocate and copy.
  std::size_t nbytes() const { return bytes_; }
  int64_t offset(const std::vector<int64_t>& idx) const;
  double get(const std::vector<int64_t>& idx) const;
  void set(const std::vector<int64_t>& idx, double v);  // rounds to the dtype
  // Every element slot of the storage, gaps included: NaN for float dtypes, the maximum for
  // integer dtypes.
  void poison();
  // True when no slot outside the view changed since poison(): nothing wrote into the gaps.
  bool gaps_intact() const;

  TensorView view;

 private:
  std::vector<uint64_t> storage_;  // uint64 for 8-byte alignment
  std::size_t bytes_ = 0;
};

enum class DMode { kNone, kPerHead, kPerHeadDim };

struct ProblemConfig {
  Layout layout = Layout::kBatched;
  int64_t batch = 1;
  int64_t seqlen = 64;  // batched only: the varlen layout has sum(seqlens) tokens
  int64_t nheads = 2;
  int64_t headdim = 8;
  int64_t ngroups = 1;
  int64_t dstate = 8;
  int64_t chunk_size = 16;
  DType dtype = DType::kFloat32;     // x, B, C, z, out
  DType dt_dtype = DType::kFloat32;  // dt
  DMode d_mode = DMode::kNone;
  bool has_z = false;
  bool has_dt_bias = false;
  bool dt_softplus = false;
  float dt_min = 0.0f;
  float dt_max = std::numeric_limits<float>::infinity();
  bool has_initial_states = false;
  DType initial_dtype = DType::kFloat32;
  bool want_final_states = false;
  DType final_dtype = DType::kFloat32;  // final_states and varlen_states
  // Batched: token positions where a new packed sequence starts, one list for all rows or one
  // per row; seq_idx[t] = seq_idx_base + #{starts s : 0 < s <= t}. Empty: no seq_idx.
  std::vector<std::vector<int64_t>> seq_starts;
  int32_t seq_idx_base = 0;
  // Batched: packed sequence lengths (sum == seqlen) giving cu_seqlens, for varlen_states.
  // Varlen layout: the sequence lengths (zeros allowed; required). Empty: no cu_seqlens.
  std::vector<int64_t> seqlens;
  DType cu_seqlens_dtype = DType::kInt32;
  bool want_varlen_states = false;  // batched layout with seqlens
  bool want_chunk_states = false;
  std::optional<DType> state_dtype;  // unset: the dtype of C
  KernelConfig kernel_config;        // GPU kernel settings (0 fields: cache or heuristic)
  bool want_chunk_offsets = false;   // varlen layout
  int64_t chunk_capacity_extra = 0;  // varlen: chunk_states rows beyond max_varlen_chunks
  bool padded_strides = false;
  // dt as mamba_ssm initialises it, log-uniform in [1e-3, 0.1] (with softplus: its inverse,
  // before dt_bias), and log |A| spread over [0, log 16] (head i in the i-th of nheads parts),
  // instead of dt = softplus(randn) and A = -uniform(1, 16), whose states forget a chunk within
  // a few tokens: here the heads of small |A| carry their states over several chunks
  // (Gpu.ModelDecays).
  bool model_decay = false;
  // A = +exp(uniform(log 0.01, log 0.05)) (growth instead of decay; mamba_ssm clamps the decay
  // factors between two tokens of a chunk at 1, not the state's): Gpu.PositiveA.
  bool positive_a = false;
  // A as positive_a for the odd heads only (heads that decay and grow side by side, as in the
  // pairs of heads of fused_walk's specialised kernel).
  bool mixed_a = false;
  uint64_t seed = 0;

  // One line naming every setting, for test failure messages.
  std::string describe() const;
};

// Starts of packed sequences of the given lengths (for ProblemConfig::seq_starts).
std::vector<int64_t> starts_of(const std::vector<int64_t>& lengths);

// The sizes validate() derives for the problem `cfg` builds.
ProblemShape shape_of(const ProblemConfig& cfg);

// All tensors of one call on the host, inputs random, outputs poisoned.
struct Problem {
  explicit Problem(const ProblemConfig& cfg);

  // Params pointing at the host tensors (with `d` as the device: a GPU test swaps the data
  // pointers for device mirrors, see tensor_fields()).
  ForwardParams params(Device d = Device::kCPU);
  void poison_outputs();
  // Every tensor by its ForwardParams name, present or not.
  std::vector<std::pair<std::string, HostTensor*>> tensors();

  ProblemConfig cfg;
  ProblemShape shape;
  HostTensor x, dt, A, B, C, D, z, dt_bias, initial_states, seq_idx, cu_seqlens;
  HostTensor out, final_states, varlen_states, chunk_states, chunk_offsets;
};

// Every TensorView field of a ForwardParams, by name, so that tests can mirror all of them.
struct TensorField {
  std::string name;
  TensorView* view;
  bool is_output;
};
std::vector<TensorField> tensor_fields(ForwardParams& p);

// ||got - ref|| / ||ref|| over the logical elements of two host views of the same shape (any
// float dtypes). +inf if got holds a NaN or Inf; 0 when both are all zero.
double rel_l2(const TensorView& got, const TensorView& ref);
// Same against a contiguous row-major float64 buffer; when `ref` is shorter than the view, only
// the leading ref.size() elements are compared (e.g. a varlen chunk_states with spare capacity).
double rel_l2(const TensorView& got, const std::vector<double>& ref);
double rel_l2(const std::vector<double>& got, const std::vector<double>& ref);

bool all_finite(const TensorView& v);
bool all_finite(const std::vector<double>& v);

}  // namespace mamba2_ssd::test
