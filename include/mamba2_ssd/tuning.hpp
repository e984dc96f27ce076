// Kernel settings of the GPU forward and the autotuner that picks them per shape class.
//
// forward() chooses the settings of a call in this order:
//   1. ForwardParams::kernel_config, when set (checked by validate());
//   2. the tuning cache entry of the call's shape class (tune() or `mamba2-ssd tune` fill it);
//   3. with MAMBA2_SSD_AUTOTUNE=1 and the stream not capturing a CUDA graph: tuned on the spot,
//      within a 1 s budget (this synchronizes the stream once), and cached;
//   4. a heuristic.
// The cache lives in memory and in a JSON file: $MAMBA2_SSD_TUNING_CACHE when set (the values
// "", "0", "off" and "none" keep it in memory only), else $XDG_CACHE_HOME/mamba2_ssd/tuning.json,
// else $HOME/.cache/mamba2_ssd/tuning.json. Every setting computes the same result, up to where
// fp32 and 16-bit roundings happen (walk segments, fused_walk: see KernelConfig).
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "mamba2_ssd/params.hpp"

struct CUstream_st;

namespace mamba2_ssd {

// "nt=32 stages=4 segments=1 heads=2 fused=1"
std::string to_string(const KernelConfig& c);

// One measured setting of one kernel. The two tuned kernels run alongside each other, so every
// candidate is timed as a whole forward call: fwd_pass_state's candidates with compute_out at
// the heuristic's setting, then compute_out's with the best fwd_pass_state setting, then
// fused_walk's segment counts (where it applies).
struct TuneMeasurement {
  std::string kernel;   // "fwd_pass_state", "compute_out" or "fused_walk"
  std::string setting;  // e.g. "nt=32 stages=4"
  double ms = 0.0;      // median GPU time of one forward call with it
};

struct TuneOptions {
  double budget_seconds = 10.0;  // stop measuring further candidates after this wall time
  int repeats = 5;               // timed launches per candidate (the median is kept)
  bool store = true;             // put the result into the cache (memory and file)
  // Called with one line per measured candidate (progress), when set.
  std::function<void(const std::string&)> progress;
};

struct TuneResult {
  std::string key;                       // the shape class (cache key)
  KernelConfig best;                     // the fastest measured setting of each kernel
  KernelConfig heuristic;                // what the heuristic would have chosen
  double best_ms = 0.0;                  // GPU time of a forward call with `best`
  double heuristic_ms = 0.0;             // ... with `heuristic`
  std::vector<TuneMeasurement> measured;
  bool complete = true;                  // false: the budget ran out before every candidate
  double seconds = 0.0;                  // wall time of the tuning
};

// Measures the kernel settings on this call (it runs the kernels on the call's buffers, so `out`,
// final_states and chunk_states are overwritten; the call's arguments are validated first),
// stores the best in the cache (TuneOptions::store) and returns it. Synchronizes `stream`.
// A workspace of tune_workspace_size(p) bytes fits every setting; with less (at least what
// forward() accepts), only the settings that fit in it are timed.
// Throws Error (kUnsupported) for Device::kCPU, without CUDA, or while `stream` captures a graph.
TuneResult tune(const ForwardParams& p, void* workspace, std::size_t workspace_bytes, CUstream_st* stream = nullptr,
                const TuneOptions& options = {});

// Bytes of workspace that every kernel setting of `p` fits in (workspace_size(p) is what the
// settings resolved now need, which can be less).
std::size_t tune_workspace_size(const ForwardParams& p);

// The settings forward() would use for `p` now and where they come from: "explicit", "env",
// "cache" or "heuristic" (tuning on a miss is not attempted here).
KernelConfig kernel_config_for(const ForwardParams& p, std::string* source = nullptr);

// The cache key (shape class) of `p` on the current device.
std::string tuning_key(const ForwardParams& p);

// Path of the cache file ("" when it is kept in memory only).
std::string tuning_cache_path();

// Forgets the in-memory entries and reloads the file on next use (for tests and tools).
void reset_tuning_cache();

}  // namespace mamba2_ssd
