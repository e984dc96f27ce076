// The host side of one forward problem for the mamba2-ssd tool: a small random generator, host
// tensors, the random inputs drawn from the command-line options, and checksums / error norms.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cli_args.hpp"
#include "mamba2_ssd/params.hpp"
#include "mamba2_ssd/types.hpp"

namespace cli {

// xoshiro256** seeded through splitmix64; normals by the Marsaglia polar method.
class Random {
 public:
  Random(uint64_t seed, const char* stream);
  uint64_t bits();
  double uniform();                              // [0, 1)
  double uniform(double lo, double hi);          // [lo, hi)
  int64_t below(int64_t n);                      // [0, n), n >= 1
  double normal();

 private:
  uint64_t s_[4];
  bool have_spare_ = false;
  double spare_ = 0.0;
};

// A contiguous row-major host tensor; absent while `storage` is empty.
struct HostTensor {
  std::string name;
  bool is_output = false;
  mamba2_ssd::DType dtype = mamba2_ssd::DType::kFloat32;
  std::vector<int64_t> sizes;
  std::vector<uint64_t> storage;  // uint64 words: 8-byte alignment for every dtype
  std::size_t bytes = 0;
  void* device = nullptr;         // a device mirror, set by the GPU code (not owned)

  void allocate(const std::string& tensor_name, mamba2_ssd::DType t, const std::vector<int64_t>& shape,
                bool output);
  bool present() const { return !storage.empty(); }
  int64_t numel() const;
  void* data() { return storage.data(); }
  const void* data() const { return storage.data(); }
  // A view of the host data (kCPU) or of the device mirror (kCUDA); absent tensors: null data.
  mamba2_ssd::TensorView view(mamba2_ssd::Device d) const;
  std::string shape_string() const;
};

// Every tensor of one forward call, inputs random, outputs poisoned with NaN.
struct Problem {
  explicit Problem(const Options& options);

  Options opt;
  bool varlen = false;
  int64_t rows = 0;         // batch rows (1 for varlen)
  int64_t tokens = 0;       // tokens per row (the total T for varlen)
  int64_t nseq = 0;         // sequences with a cu_seqlens entry (varlen, or --cu-seqlens)
  int64_t nchunks = 0;      // chunks per row (batched) | chunk_states capacity (varlen)
  int64_t used_chunks = 0;  // varlen: chunks the sequences occupy; batched: rows * nchunks
  std::vector<std::vector<int64_t>> packed;  // --seq-idx: the sequence lengths of each row

  HostTensor x, dt, A, B, C, D, z, dt_bias, initial_states, seq_idx, cu_seqlens;
  HostTensor out, final_states, varlen_states, chunk_states, chunk_offsets;

  std::vector<HostTensor*> tensors();
  mamba2_ssd::ForwardParams params(mamba2_ssd::Device d) const;
  void poison_outputs();                   // NaN in every float output, -1 in chunk_offsets
  int64_t total_tokens() const { return rows * tokens; }
  mamba2_ssd::DType dt_dtype() const { return opt.dt_dtype.value_or(opt.dtype); }
  // Elements of `t` that the call defines (chunk_states of varlen: the used chunks only).
  int64_t defined_elements(const HostTensor& t) const;
};

struct Checksum {
  double sum = 0.0;
  double abs_sum = 0.0;
  int64_t nonfinite = 0;
};
Checksum checksum(const HostTensor& t, int64_t count);

// ||got - ref|| / ||ref|| over the first ref.size() elements of `got` (+inf when `got` holds a
// NaN/Inf there; 0 when both are zero) and the largest |got - ref|.
struct Difference {
  double rel_l2 = 0.0;
  double max_abs = 0.0;
  int64_t nonfinite = 0;
};
Difference compare(const HostTensor& got, const std::vector<double>& ref);

}  // namespace cli
