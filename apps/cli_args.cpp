// The flag table of mamba2-ssd: parsing and help text come from the same entries.
#include "cli_args.hpp"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

namespace cli {

using mamba2_ssd::DType;

const char* dtype_short(DType t) {
  switch (t) {
    case DType::kFloat32: return "fp32";
    case DType::kFloat16: return "fp16";
    case DType::kBFloat16: return "bf16";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
  }
  return "?";
}

const char* d_mode_name(DMode m) {
  switch (m) {
    case DMode::kNone: return "none";
    case DMode::kPerHead: return "head";
    case DMode::kPerHeadDim: return "headdim";
  }
  return "?";
}

namespace {

[[noreturn]] void bad(const std::string& flag, const std::string& what) { throw UsageError(flag + ": " + what); }

std::string quoted(const std::string& v) { return "'" + v + "'"; }

int64_t parse_int(const std::string& flag, const std::string& v, int64_t lo, int64_t hi) {
  const std::string range = hi == std::numeric_limits<int64_t>::max()
                                ? "an integer >= " + std::to_string(lo)
                                : "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  if (v.empty()) bad(flag, "expected " + range + ", got an empty value");
  errno = 0;
  char* end = nullptr;
  const long long r = std::strtoll(v.c_str(), &end, 10);
  if (end == v.c_str() || *end != '\0') bad(flag, "expected " + range + ", got " + quoted(v));
  if (errno == ERANGE || r < lo || r > hi) bad(flag, "expected " + range + ", got " + v);
  return r;
}

uint64_t parse_u64(const std::string& flag, const std::string& v) {
  errno = 0;
  char* end = nullptr;
  if (v.empty() || v[0] == '-') bad(flag, "expected a non-negative integer, got " + quoted(v));
  const unsigned long long r = std::strtoull(v.c_str(), &end, 0);
  if (end == v.c_str() || *end != '\0' || errno == ERANGE) {
    bad(flag, "expected a non-negative integer (< 2^64), got " + quoted(v));
  }
  return r;
}

double parse_double(const std::string& flag, const std::string& v) {
  errno = 0;
  char* end = nullptr;
  const double r = std::strtod(v.c_str(), &end);
  if (v.empty() || end == v.c_str() || *end != '\0') bad(flag, "expected a number, got " + quoted(v));
  if (std::isnan(r)) bad(flag, "expected a number, got NaN");
  return r;
}

DType parse_float_dtype(const std::string& flag, const std::string& v) {
  if (v == "bf16" || v == "bfloat16") return DType::kBFloat16;
  if (v == "fp16" || v == "float16" || v == "half") return DType::kFloat16;
  if (v == "fp32" || v == "float32" || v == "float") return DType::kFloat32;
  bad(flag, "expected bf16, fp16 or fp32, got " + quoted(v));
}

bool parse_bool(const std::string& flag, const std::string& v) {
  if (v == "1" || v == "true" || v == "yes" || v == "on") return true;
  if (v == "0" || v == "false" || v == "no" || v == "off") return false;
  bad(flag, "expected no value, or one of true/false, yes/no, on/off, 1/0, got " + quoted(v));
}

// "100,200,0,50" -> lengths >= 0 with a positive sum.
std::vector<int64_t> parse_lengths(const std::string& flag, const std::string& v) {
  std::vector<int64_t> out;
  std::string item;
  std::stringstream ss(v);
  int64_t total = 0;
  while (std::getline(ss, item, ',')) {
    std::size_t b = item.find_first_not_of(" \t");
    std::size_t e = item.find_last_not_of(" \t");
    item = b == std::string::npos ? "" : item.substr(b, e - b + 1);
    const int64_t len = parse_int(flag + " (item " + std::to_string(out.size() + 1) + ")", item, 0,
                                  int64_t{1} << 40);
    total += len;
    out.push_back(len);
  }
  if (!v.empty() && v.back() == ',') bad(flag, "expected a comma-separated list of lengths, got a trailing comma");
  if (out.empty()) bad(flag, "expected a comma-separated list of sequence lengths such as 100,37,512, got " + quoted(v));
  if (total < 1) bad(flag, "expected at least one token in all (the lengths sum to 0)");
  return out;
}

struct Flag {
  const char* name;     // "--batch"
  const char* metavar;  // nullptr: a boolean switch (also --no-NAME and --NAME=BOOL)
  unsigned group;
  const char* help;     // may hold '\n' for more lines
  std::function<void(Options&, const std::string&)> set;  // value flags
  bool Options::*toggle;                                  // switches
};

constexpr int64_t kMaxDim = (int64_t{1} << 31) - 1;

Flag value_flag(const char* name, const char* metavar, unsigned group, const char* help,
                std::function<void(Options&, const std::string&)> set) {
  return Flag{name, metavar, group, help, std::move(set), nullptr};
}

Flag switch_flag(const char* name, unsigned group, const char* help, bool Options::*member) {
  return Flag{name, nullptr, group, help, nullptr, member};
}

const std::vector<Flag>& flag_table() {
  static const std::vector<Flag> table = {
      // ---- shape
      value_flag("--batch", "N", kGroupProblem, "batch rows (default 4; 1 with --cu-seqlens)",
                 [](Options& o, const std::string& v) {
                   o.batch = parse_int("--batch", v, 1, kMaxDim);
                   o.batch_set = true;
                 }),
      value_flag("--seqlen", "L", kGroupProblem, "tokens per row (default 4096)",
                 [](Options& o, const std::string& v) {
                   o.seqlen = parse_int("--seqlen", v, 1, int64_t{1} << 40);
                   o.seqlen_set = true;
                 }),
      value_flag("--heads", "H", kGroupProblem, "number of heads (default 8)",
                 [](Options& o, const std::string& v) { o.heads = parse_int("--heads", v, 1, kMaxDim); }),
      value_flag("--headdim", "P", kGroupProblem, "head dimension (default 64; the GPU runs 64 and 128)",
                 [](Options& o, const std::string& v) { o.headdim = parse_int("--headdim", v, 1, kMaxDim); }),
      value_flag("--groups", "G", kGroupProblem, "number of B/C groups, must divide --heads (default 1)",
                 [](Options& o, const std::string& v) { o.groups = parse_int("--groups", v, 1, kMaxDim); }),
      value_flag("--dstate", "N", kGroupProblem,
                 "state dimension (default 128; the GPU runs 16 to 512, step 16)",
                 [](Options& o, const std::string& v) { o.dstate = parse_int("--dstate", v, 1, kMaxDim); }),
      value_flag("--chunk", "Q", kGroupProblem, "chunk size (default 128; the GPU runs 64, 128 and 256)",
                 [](Options& o, const std::string& v) { o.chunk = parse_int("--chunk", v, 1, kMaxDim); }),
      // ---- dtypes
      value_flag("--dtype", "T", kGroupProblem, "dtype of x, B, C, z and out: bf16, fp16 or fp32 (default bf16)",
                 [](Options& o, const std::string& v) { o.dtype = parse_float_dtype("--dtype", v); }),
      value_flag("--dt-dtype", "T", kGroupProblem, "dtype of dt: bf16, fp16 or fp32 (default: the --dtype value)",
                 [](Options& o, const std::string& v) { o.dt_dtype = parse_float_dtype("--dt-dtype", v); }),
      value_flag("--state-dtype", "T", kGroupProblem,
                 "dtype of the chunk states kept between the kernels and of\n"
                 "--chunk-states: fp32, or the 16-bit compute type (bf16 for bf16\n"
                 "and fp32 inputs, fp16 for fp16 inputs) (default: the --dtype\n"
                 "value, as mamba_ssm does)",
                 [](Options& o, const std::string& v) { o.state_dtype = parse_float_dtype("--state-dtype", v); }),
      value_flag("--init-dtype", "T", kGroupProblem, "dtype of the initial states: fp32, bf16 or fp16 (default fp32)",
                 [](Options& o, const std::string& v) { o.init_dtype = parse_float_dtype("--init-dtype", v); }),
      value_flag("--final-dtype", "T", kGroupProblem,
                 "dtype of the final and varlen states: fp32, bf16 or fp16\n(default fp32)",
                 [](Options& o, const std::string& v) { o.final_dtype = parse_float_dtype("--final-dtype", v); }),
      // ---- options
      value_flag("--D", "MODE", kGroupProblem, "skip term D: none, head (shape (h)) or headdim (shape (h, p))\n(default head)",
                 [](Options& o, const std::string& v) {
                   if (v == "none") o.d_mode = DMode::kNone;
                   else if (v == "head" || v == "h") o.d_mode = DMode::kPerHead;
                   else if (v == "headdim" || v == "hp") o.d_mode = DMode::kPerHeadDim;
                   else bad("--D", "expected none, head or headdim, got " + quoted(v));
                 }),
      switch_flag("--z", kGroupProblem, "gate: out *= silu(z) with a random z (default off)", &Options::z),
      switch_flag("--dt-bias", kGroupProblem, "add a random dt_bias (h) to dt (default off)", &Options::dt_bias),
      switch_flag("--softplus", kGroupProblem, "dt = softplus(dt + dt_bias) (default off)", &Options::softplus),
      value_flag("--dt-min", "F", kGroupProblem, "lower dt limit (default 0)",
                 [](Options& o, const std::string& v) { o.dt_min = parse_double("--dt-min", v); }),
      value_flag("--dt-max", "F", kGroupProblem, "upper dt limit, 'inf' allowed (default inf)",
                 [](Options& o, const std::string& v) { o.dt_max = parse_double("--dt-max", v); }),
      value_flag("--inputs", "KIND", kGroupProblem,
                 "random dt, A and dt_bias: tests (dt = softplus(randn), A =\n"
                 "-uniform(1, 16): strong decays) or model (mamba_ssm's\n"
                 "initialisation, as bench.py: dt in [1e-3, 0.1]) (default tests)",
                 [](Options& o, const std::string& v) {
                   if (v == "tests") o.model_inputs = false;
                   else if (v == "model") o.model_inputs = true;
                   else bad("--inputs", "expected tests or model, got " + quoted(v));
                 }),
      switch_flag("--init", kGroupProblem, "random initial states (default on; --no-init: none)", &Options::init),
      switch_flag("--final", kGroupProblem, "compute the final states (default on; --no-final: skip them)",
                  &Options::final_states),
      // ---- layout
      value_flag("--seq-idx", "N", kGroupProblem,
                 "pack N sequences of random lengths (>= 1 token each) into\n"
                 "every row and pass their seq_idx (default: no seq_idx)",
                 [](Options& o, const std::string& v) { o.seq_idx = parse_int("--seq-idx", v, 1, int64_t{1} << 40); }),
      value_flag("--varlen", "LENS", kGroupProblem,
                 "the batch-less varlen layout with these sequence lengths, e.g.\n"
                 "\"1000,37,0,4096\" (zeros allowed); replaces --batch/--seqlen",
                 [](Options& o, const std::string& v) {
                   o.varlen_lens = parse_lengths("--varlen", v);
                   o.varlen = true;
                 }),
      switch_flag("--cu-seqlens", kGroupProblem,
                  "batched layout with batch 1: also compute varlen_states, the\n"
                  "state after each packed sequence of --seq-idx (needs it)",
                  &Options::cu_seqlens),
      switch_flag("--chunk-states", kGroupProblem,
                  "also output the per-chunk states (and chunk_offsets with --varlen)", &Options::chunk_states),
      value_flag("--seed", "S", kGroupProblem, "seed of the random inputs (default 0)",
                 [](Options& o, const std::string& v) { o.seed = parse_u64("--seed", v); }),
      value_flag("--threads", "N", kGroupProblem, "threads of the CPU reference (default 0: all hardware threads)",
                 [](Options& o, const std::string& v) {
                   o.threads = static_cast<int>(parse_int("--threads", v, 0, 4096));
                 }),
      // ---- device / timing
      value_flag("--device", "D", kGroupDevice,
                 "auto (the GPU when present, else the CPU reference), cpu or\ncuda (default auto)",
                 [](Options& o, const std::string& v) {
                   if (v == "auto") o.device = DeviceChoice::kAuto;
                   else if (v == "cpu") o.device = DeviceChoice::kCpu;
                   else if (v == "cuda" || v == "gpu") o.device = DeviceChoice::kCuda;
                   else bad("--device", "expected auto, cpu or cuda, got " + quoted(v));
                 }),
      value_flag("--iters", "N", kGroupTiming, "timed calls (default 20 on the GPU, 1 on the CPU)",
                 [](Options& o, const std::string& v) { o.iters = parse_int("--iters", v, 1, 1000000); }),
      value_flag("--warmup", "N", kGroupTiming, "untimed calls before them (default 3 on the GPU, 0 on the CPU)",
                 [](Options& o, const std::string& v) { o.warmup = parse_int("--warmup", v, 0, 1000000); }),
      switch_flag("--graph", kGroupTiming,
                  "GPU: capture one call in a CUDA graph and time its replays,\n"
                  "which leaves out the host-side cost of forward() (default off)",
                  &Options::graph),
      // ---- tune
      value_flag("--sweep", "LIST", kGroupTune,
                 "tune the benchmark's shape lists instead of the problem flags:\n"
                 "anchor (batch 4, 8 heads, dstate 64-512, 1K-256K tokens), models\n"
                 "(Mamba-2 2.7B layers and an 8-group layer), tp (the 2.7B layer's\n"
                 "heads split over 8 or 4 GPUs), comma-separated: anchor,models,tp",
                 [](Options& o, const std::string& v) {
                   o.sweep.clear();
                   size_t start = 0;
                   while (start <= v.size()) {
                     const size_t end = v.find(',', start);
                     const std::string item = v.substr(start, end == std::string::npos ? std::string::npos : end - start);
                     if (item != "anchor" && item != "models" && item != "tp") {
                       bad("--sweep", "expected a comma-separated list of anchor, models, tp, got " + quoted(v));
                     }
                     o.sweep.push_back(item);
                     if (end == std::string::npos) break;
                     start = end + 1;
                   }
                 }),
      value_flag("--budget", "S", kGroupTune, "seconds of measuring per shape; the rest of the candidates\nare skipped once it is spent (default 10)",
                 [](Options& o, const std::string& v) {
                   o.budget = parse_double("--budget", v);
                   if (!(o.budget > 0)) bad("--budget", "expected seconds > 0, got " + v);
                 }),
      // ---- check
      value_flag("--tol-out", "F", kGroupCheck, "largest relative L2 error of out (default 3e-3; 4e-3 for fp32\n"
                 "inputs; 1.5x either below 16384 values)",
                 [](Options& o, const std::string& v) {
                   o.tol_out = parse_double("--tol-out", v);
                   if (!(*o.tol_out >= 0)) bad("--tol-out", "expected a tolerance >= 0, got " + v);
                 }),
      value_flag("--tol-state", "F", kGroupCheck,
                 "largest relative L2 error of every state output (default 2.5e-3\n"
                 "for fp32 states, 4e-3 for states stored in a 16-bit dtype or\n"
                 "from fp32 inputs; 1.5x either below 16384 values)",
                 [](Options& o, const std::string& v) {
                   o.tol_state = parse_double("--tol-state", v);
                   if (!(*o.tol_state >= 0)) bad("--tol-state", "expected a tolerance >= 0, got " + v);
                 }),
  };
  return table;
}

const char* group_title(unsigned g) {
  switch (g) {
    case kGroupProblem: return "Problem (shape, dtypes, options, layout, inputs):";
    case kGroupDevice: return "Device:";
    case kGroupTiming: return "Timing (run only):";
    case kGroupCheck: return "Check tolerances (check only):";
    case kGroupTune: return "Tuning (tune only):";
  }
  return "";
}

// Rules between flags, once all are read.
void check_consistency(const Options& o, unsigned groups) {
  if (!(groups & kGroupProblem)) return;
  if (o.heads % o.groups != 0) {
    bad("--groups", "expected a divisor of --heads " + std::to_string(o.heads) + ", got " + std::to_string(o.groups));
  }
  if (o.dt_min > o.dt_max) {
    std::ostringstream s;
    s << "expected --dt-min <= --dt-max, got --dt-min " << o.dt_min << " and --dt-max " << o.dt_max;
    bad("--dt-min", s.str());
  }
  if (o.state_dtype && *o.state_dtype != DType::kFloat32) {
    const DType compute = o.dtype == DType::kFloat16 ? DType::kFloat16 : DType::kBFloat16;
    if (*o.state_dtype != compute) {
      bad("--state-dtype", std::string("expected fp32 or ") + dtype_short(compute) + " for --dtype " +
                               dtype_short(o.dtype) + " inputs, got " + dtype_short(*o.state_dtype));
    }
  }
  if (o.varlen) {
    if (o.batch_set) bad("--batch", "not used with --varlen (the varlen layout has no batch dimension)");
    if (o.seqlen_set) bad("--seqlen", "not used with --varlen (the token count is the sum of the lengths)");
    if (o.seq_idx > 0) bad("--seq-idx", "is for the batched layout, not with --varlen");
    if (o.cu_seqlens) bad("--cu-seqlens", "is for the batched layout (--varlen always has cu_seqlens)");
  } else {
    if (o.seq_idx > o.seqlen) {
      bad("--seq-idx", "expected at most --seqlen " + std::to_string(o.seqlen) + " sequences of >= 1 token, got " +
                           std::to_string(o.seq_idx));
    }
    if (o.cu_seqlens) {
      if (o.seq_idx == 0) bad("--cu-seqlens", "needs --seq-idx N (the packed sequences whose states it computes)");
      if (o.batch != 1) bad("--cu-seqlens", "needs --batch 1, got --batch " + std::to_string(o.batch));
    }
  }
}

}  // namespace

bool parse_flags(int argc, char** argv, int first, unsigned groups, Options& opt) {
  for (int i = first; i < argc; ++i) {
    if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") return false;
  }
  for (int i = first; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.size() < 3 || arg.compare(0, 2, "--") != 0) {
      throw UsageError("unexpected argument " + quoted(arg) + " (flags start with --)");
    }
    std::string name = arg;
    std::string value;
    bool has_value = false;
    const std::size_t eq = arg.find('=');
    if (eq != std::string::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
      has_value = true;
    }
    bool negated = false;
    const Flag* flag = nullptr;
    for (const Flag& f : flag_table()) {
      if (name == f.name) {
        flag = &f;
        break;
      }
      if (!f.metavar && name == std::string("--no-") + (f.name + 2)) {
        flag = &f;
        negated = true;
        break;
      }
    }
    if (!flag) throw UsageError(name + ": unknown flag");
    if (!(flag->group & groups)) throw UsageError(name + ": not a flag of this command");
    if (flag->metavar) {
      if (!has_value) {
        if (i + 1 >= argc) bad(name, std::string("expected a value (") + flag->name + " " + flag->metavar + ")");
        value = argv[++i];
      }
      flag->set(opt, value);
    } else {
      if (negated && has_value) bad(name, "takes no value");
      opt.*(flag->toggle) = negated ? false : (has_value ? parse_bool(name, value) : true);
    }
  }
  // --cu-seqlens implies batch 1 unless --batch says otherwise.
  if (opt.cu_seqlens && !opt.batch_set) opt.batch = 1;
  check_consistency(opt, groups);
  return true;
}

std::string flags_help(unsigned groups) {
  std::ostringstream o;
  for (unsigned g : {kGroupProblem, kGroupDevice, kGroupTiming, kGroupTune, kGroupCheck}) {
    if (!(groups & g)) continue;
    o << "\n" << group_title(g) << "\n";
    for (const Flag& f : flag_table()) {
      if (f.group != g) continue;
      std::string head = std::string("  ") + f.name;
      if (f.metavar) head += std::string(" ") + f.metavar;
      else head += std::string(", --no-") + (f.name + 2);
      const int col = 28;
      std::string text = f.help;
      std::size_t start = 0;
      bool first_line = true;
      while (start <= text.size()) {
        std::size_t nl = text.find('\n', start);
        const std::string line = text.substr(start, nl == std::string::npos ? std::string::npos : nl - start);
        if (first_line) {
          if (static_cast<int>(head.size()) >= col - 1) {
            o << head << "\n" << std::string(col, ' ');
          } else {
            o << head << std::string(col - head.size(), ' ');
          }
          first_line = false;
        } else {
          o << std::string(col, ' ');
        }
        o << line << "\n";
        if (nl == std::string::npos) break;
        start = nl + 1;
      }
    }
  }
  return o.str();
}

}  // namespace cli
