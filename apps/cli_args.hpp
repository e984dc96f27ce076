// Command-line options of the mamba2-ssd tool: the option struct, the flag table that both the
// parser and the help text are generated from, and the usage error type.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "mamba2_ssd/types.hpp"

namespace cli {

// A bad command line: printed as "error: <message>" with exit code 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class DMode { kNone, kPerHead, kPerHeadDim };
enum class DeviceChoice { kAuto, kCpu, kCuda };

// Which flag groups a subcommand accepts (bit mask).
enum FlagGroup : unsigned {
  kGroupProblem = 1u << 0,  // shape, dtypes, options, layout: every command that builds a problem
  kGroupDevice = 1u << 1,   // --device
  kGroupTiming = 1u << 2,   // --iters, --warmup, --graph
  kGroupCheck = 1u << 3,    // --tol-out, --tol-state
  kGroupTune = 1u << 4,     // --sweep, --budget
};

struct Options {
  // ---- shape
  int64_t batch = 4;
  int64_t seqlen = 4096;
  int64_t heads = 8;
  int64_t headdim = 64;
  int64_t groups = 1;
  int64_t dstate = 128;
  int64_t chunk = 128;
  bool batch_set = false;   // given on the command line
  bool seqlen_set = false;

  // ---- dtypes
  mamba2_ssd::DType dtype = mamba2_ssd::DType::kBFloat16;          // x, B, C, z, out
  std::optional<mamba2_ssd::DType> dt_dtype;                        // unset: dtype
  std::optional<mamba2_ssd::DType> state_dtype;                     // ForwardParams::state_dtype
  mamba2_ssd::DType init_dtype = mamba2_ssd::DType::kFloat32;       // initial_states
  mamba2_ssd::DType final_dtype = mamba2_ssd::DType::kFloat32;      // final_states, varlen_states

  // ---- options of the call
  DMode d_mode = DMode::kPerHead;
  bool z = false;
  bool dt_bias = false;
  bool softplus = false;
  double dt_min = 0.0;
  double dt_max = std::numeric_limits<double>::infinity();
  bool init = true;
  bool final_states = true;
  // The random dt, A and dt_bias: false: dt = softplus(randn), A = -uniform(1, 16), dt_bias =
  // randn (strong decays, as the tests draw them); true: as mamba_ssm initialises a layer
  // (dt and the dt_bias' softplus log-uniform in [1e-3, 0.1], A = -exp(uniform(0, log 16))), as
  // bench.py draws them.
  bool model_inputs = false;

  // ---- layout
  int64_t seq_idx = 0;               // packed sequences per row; 0: no seq_idx
  bool varlen = false;               // the varlen (batch-less) layout
  std::vector<int64_t> varlen_lens;  // its sequence lengths
  bool cu_seqlens = false;           // batched, batch 1: varlen_states of the seq_idx sequences
  bool chunk_states = false;         // chunk_states (+ chunk_offsets for varlen)

  // ---- run control
  uint64_t seed = 0;
  std::optional<int64_t> iters;   // unset: 20 on the GPU, 1 on the CPU
  std::optional<int64_t> warmup;  // unset: 3 on the GPU, 0 on the CPU
  bool graph = false;             // time CUDA-graph replays of one captured call
  int threads = 0;                // CPU reference threads; 0: all hardware threads
  DeviceChoice device = DeviceChoice::kAuto;

  // ---- tune
  std::vector<std::string> sweep;  // preset shape lists instead of the problem flags
  double budget = 10.0;            // seconds per shape

  // ---- check
  std::optional<double> tol_out;
  std::optional<double> tol_state;
};

// Parses argv[first..argc) for a command accepting the flag groups `groups` into `opt`.
// Returns false when --help / -h was given (nothing else is checked then). Throws UsageError.
bool parse_flags(int argc, char** argv, int first, unsigned groups, Options& opt);

// The flag reference of the flags in `groups`, one block per flag, for --help.
std::string flags_help(unsigned groups);

// "bf16" -> "bfloat16" etc. for display.
const char* dtype_short(mamba2_ssd::DType t);
const char* d_mode_name(DMode m);

}  // namespace cli
