// The tuning cache: shape-class keys, the in-memory table and its JSON file. Plain C++ (no CUDA),
// so the CPU tests cover it.
#pragma once

#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "mamba2_ssd/params.hpp"

namespace mamba2_ssd::detail {

// What identifies a device in a key.
struct DeviceId {
  std::string name;  // cudaDeviceProp::name
  int sm_count = 0;
};

// The shape class of a validated call: everything that changes which kernel setting is fastest
// (sizes that set the grids, dtypes, the options that add work), with the walk count bucketed
// (exact up to 8, then powers of two) and the tokens per walk rounded up to a power of two.
std::string make_tuning_key(const DeviceId& dev, const ForwardParams& p, const ProblemShape& s);

struct TuningEntry {
  KernelConfig config;
  double ms = 0.0;            // fwd_pass_state + compute_out with `config`
  double heuristic_ms = 0.0;  // the same with the heuristic's setting
};

// JSON text of a table, and back. parse_tuning_json returns false (and says why in `error`)
// on anything it does not understand; entries parsed so far are kept.
std::string to_tuning_json(const std::map<std::string, TuningEntry>& entries);
bool parse_tuning_json(const std::string& text, std::map<std::string, TuningEntry>& entries, std::string* error);

// The cache file chosen by the environment (see include/mamba2_ssd/tuning.hpp); "" = none.
std::string tuning_cache_file_from_env();

class TuningCache {
 public:
  static TuningCache& instance();
  std::optional<TuningEntry> find(const std::string& key);
  // Adds or replaces an entry; with `persist`, merges it into the file (written atomically).
  void store(const std::string& key, const TuningEntry& e, bool persist);
  std::string path();
  void reset();

 private:
  void load_locked();
  std::mutex mu_;
  bool loaded_ = false;
  std::string path_;
  std::map<std::string, TuningEntry> entries_;
};

}  // namespace mamba2_ssd::detail
