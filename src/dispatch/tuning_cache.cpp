// Tuning cache: keys, JSON text, the file next to the user's other caches.
// No iostreams here: the Python extension can end up with a second, uninitialised copy of the
// C++ stream locale machinery, and number formatting through it crashed; snprintf and stdio
// are used instead.
#include "dispatch/tuning_cache.hpp"

#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

namespace mamba2_ssd::detail {

namespace {

const char* dtype_tag(DType t) {
  switch (t) {
    case DType::kFloat32: return "f32";
    case DType::kBFloat16: return "bf16";
    case DType::kFloat16: return "f16";
    default: return "?";
  }
}

int64_t pow2_ceil(int64_t v) {
  int64_t r = 1;
  while (r < v) r <<= 1;
  return r;
}

int64_t bucket_walks(int64_t w) { return w <= 8 ? w : pow2_ceil(w); }

// Keys go into JSON strings: keep printable ASCII, drop quotes and backslashes. A device name
// also loses '|', the key's field separator.
std::string json_safe(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (std::isprint(static_cast<unsigned char>(c)) && c != '"' && c != '\\') o += c;
  }
  return o;
}
std::string clean_name(const std::string& s) {
  std::string o;
  for (char c : json_safe(s)) {
    if (c != '|') o += c;
  }
  return o;
}

// ---- a small reader for the flat JSON this file writes
struct Reader {
  explicit Reader(const std::string& text) : t(text) {}
  const std::string& t;
  size_t i = 0;
  std::string err;
  void ws() {
    while (i < t.size() && std::isspace(static_cast<unsigned char>(t[i]))) ++i;
  }
  bool eat(char c) {
    ws();
    if (i < t.size() && t[i] == c) { ++i; return true; }
    return false;
  }
  bool expect(char c) {
    if (eat(c)) return true;
    err = std::string("expected '") + c + "' at offset " + std::to_string(i);
    return false;
  }
  bool string(std::string& out) {
    ws();
    if (i >= t.size() || t[i] != '"') { err = "expected a string at offset " + std::to_string(i); return false; }
    ++i;
    out.clear();
    while (i < t.size() && t[i] != '"') {
      if (t[i] == '\\' && i + 1 < t.size()) ++i;
      out += t[i++];
    }
    if (i >= t.size()) { err = "unterminated string"; return false; }
    ++i;
    return true;
  }
  bool number(double& out) {
    ws();
    const char* start = t.c_str() + i;
    char* end = nullptr;
    out = std::strtod(start, &end);
    if (end == start) { err = "expected a number at offset " + std::to_string(i); return false; }
    i += static_cast<size_t>(end - start);
    return true;
  }
  // Skips one value of any kind (for fields this version does not know).
  bool skip() {
    ws();
    if (i >= t.size()) { err = "unexpected end"; return false; }
    if (t[i] == '"') { std::string s; return string(s); }
    if (t[i] == '{' || t[i] == '[') {
      const char open = t[i], close = open == '{' ? '}' : ']';
      ++i;
      if (eat(close)) return true;
      do {
        if (open == '{') {
          std::string k;
          if (!string(k) || !expect(':')) return false;
        }
        if (!skip()) return false;
      } while (eat(','));
      return expect(close);
    }
    if (t.compare(i, 4, "true") == 0 || t.compare(i, 4, "null") == 0) { i += 4; return true; }
    if (t.compare(i, 5, "false") == 0) { i += 5; return true; }
    double d;
    return number(d);
  }
};

bool parse_entry(Reader& r, std::map<std::string, TuningEntry>& entries) {
  if (!r.expect('{')) return false;
  std::string key;
  TuningEntry e;
  bool have_key = false;
  if (!r.eat('}')) {
    do {
      std::string name;
      if (!r.string(name) || !r.expect(':')) return false;
      if (name == "key") {
        if (!r.string(key)) return false;
        have_key = true;
      } else if (name == "pass_state_dstate_tile" || name == "pass_state_stages" ||
                 name == "compute_out_heads_per_cta" || name == "pass_state_segments" || name == "fused_walk" ||
                 name == "fused_walk_heads_per_cta" || name == "ms" || name == "heuristic_ms") {
        double v;
        if (!r.number(v)) return false;
        if (name == "pass_state_dstate_tile") e.config.pass_state_dstate_tile = static_cast<int>(v);
        else if (name == "pass_state_stages") e.config.pass_state_stages = static_cast<int>(v);
        else if (name == "compute_out_heads_per_cta") e.config.compute_out_heads_per_cta = static_cast<int>(v);
        else if (name == "pass_state_segments") e.config.pass_state_segments = static_cast<int>(v);
        else if (name == "fused_walk") e.config.fused_walk = static_cast<int>(v);
        else if (name == "fused_walk_heads_per_cta") e.config.fused_walk_heads_per_cta = static_cast<int>(v);
        else if (name == "ms") e.ms = v;
        else e.heuristic_ms = v;
      } else if (!r.skip()) {
        return false;
      }
    } while (r.eat(','));
    if (!r.expect('}')) return false;
  }
  const KernelConfig& c = e.config;
  const bool valid = (c.pass_state_dstate_tile == 32 || c.pass_state_dstate_tile == 64) &&
                     (c.pass_state_stages == 2 || c.pass_state_stages == 4) &&
                     (c.compute_out_heads_per_cta == 1 || c.compute_out_heads_per_cta == 2 ||
                      c.compute_out_heads_per_cta == 4) &&
                     c.pass_state_segments >= 0 && c.pass_state_segments <= 16 &&  // 0: an entry from before segments
                     c.fused_walk >= 0 && c.fused_walk <= 2 &&
                     c.fused_walk_heads_per_cta >= 0 && c.fused_walk_heads_per_cta <= 2;
  // An entry from before fused_walk was tuned on the two kernels.
  if (e.config.fused_walk == 0) e.config.fused_walk = 1;
  if (!have_key || !valid) {
    r.err = "an entry without a key or with invalid settings (key '" + key + "')";
    return false;
  }
  entries[key] = e;
  return true;
}

std::once_flag g_warn_once;

// The whole file, or nothing when it cannot be opened.
bool read_file(const std::string& path, std::string& text) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return false;
  char buf[65536];
  size_t n;
  text.clear();
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
  std::fclose(f);
  return true;
}

}  // namespace

// The kernels' revision (the design log's version) in every key: raised when a kernel change makes
// settings tuned before it stale, so that a cache filled by an earlier build is not applied to the
// new kernels (v24: the specialised fused_walk runs one CTA per SM and pays at other segment counts;
// v31: two segments of it may split unevenly, first_segment_chunks; v32: the segment sums split
// their segments into parts, segment_sums_plan, which moves the best segment counts; v33: the
// specialised fused_walk takes dstate <= 64 too, one CTA per SM where three ran; v34: there it
// may walk two heads per CTA, KernelConfig::fused_walk_heads_per_cta, which moves the best
// segment counts; v36: two segments of it beyond a wave may split unevenly too, the long segments
// of every walk launched first, multi_wave_first_segment; the segment sums of a short first
// segment split into parts, which moves the best lengths and counts; v38: the specialised
// fused_walk takes dstate 129-256 too, in block slots, which moves the best segment counts
// there; v39: and dstate 257-512, on two ranks of a cluster).
constexpr int kKernelRevision = 39;

std::string make_tuning_key(const DeviceId& dev, const ForwardParams& p, const ProblemShape& s) {
  const bool varlen = p.layout == Layout::kVarlen;
  const int64_t walks = varlen ? s.nseq : s.batch;
  const int64_t tokens_per_walk = walks > 0 ? (s.batch * s.seqlen + walks - 1) / walks : 0;
  auto n = [](int64_t v) { return std::to_string(v); };
  std::string k = "k" + n(kKernelRevision) + "|" + clean_name(dev.name) + "|sm" + n(dev.sm_count) + "|" +
                  dtype_tag(s.compute_dtype) +
                  "|st=" + dtype_tag(s.state_dtype) + "|p" + n(s.headdim) + "|n" + n(s.dstate) + "|q" +
                  n(p.chunk_size) + "|g" + n(s.ngroups) + "|h" + n(s.nheads) + "|w" + n(bucket_walks(walks)) +
                  "|l" + n(pow2_ceil(std::max<int64_t>(tokens_per_walk, 1)));
  if (varlen) k += "|varlen";
  if (p.initial_states.present()) k += "|init";
  if (p.z.present()) k += "|z";
  if (p.seq_idx.present()) k += "|seq";
  return k;
}

std::string to_tuning_json(const std::map<std::string, TuningEntry>& entries) {
  std::string o = "{\n  \"format\": \"mamba2_ssd tuning cache\",\n  \"version\": 1,\n  \"entries\": [";
  bool first = true;
  for (const auto& [key, e] : entries) {
    char nums[320];
    std::snprintf(nums, sizeof nums,
                  "\"pass_state_dstate_tile\": %d, \"pass_state_stages\": %d, \"pass_state_segments\": %d, "
                  "\"compute_out_heads_per_cta\": %d, \"fused_walk\": %d, \"fused_walk_heads_per_cta\": %d, "
                  "\"ms\": %.6g, \"heuristic_ms\": %.6g}",
                  e.config.pass_state_dstate_tile, e.config.pass_state_stages, e.config.pass_state_segments,
                  e.config.compute_out_heads_per_cta, e.config.fused_walk, e.config.fused_walk_heads_per_cta, e.ms,
                  e.heuristic_ms);
    o += first ? "\n" : ",\n";
    o += "    {\"key\": \"" + json_safe(key) + "\", " + nums;
    first = false;
  }
  o += "\n  ]\n}\n";
  return o;
}

bool parse_tuning_json(const std::string& text, std::map<std::string, TuningEntry>& entries, std::string* error) {
  Reader r(text);
  auto fail = [&](const std::string& why) {
    if (error) *error = why.empty() ? r.err : why;
    return false;
  };
  if (!r.expect('{')) return fail("");
  bool version_ok = false;
  if (!r.eat('}')) {
    do {
      std::string name;
      if (!r.string(name) || !r.expect(':')) return fail("");
      if (name == "version") {
        double v;
        if (!r.number(v)) return fail("");
        if (v != 1) return fail("unknown version " + std::to_string(v));
        version_ok = true;
      } else if (name == "entries") {
        if (!r.expect('[')) return fail("");
        if (!r.eat(']')) {
          do {
            if (!parse_entry(r, entries)) return fail("");
          } while (r.eat(','));
          if (!r.expect(']')) return fail("");
        }
      } else if (!r.skip()) {
        return fail("");
      }
    } while (r.eat(','));
    if (!r.expect('}')) return fail("");
  }
  if (!version_ok) return fail("no \"version\" field");
  return true;
}

std::string tuning_cache_file_from_env() {
  if (const char* e = std::getenv("MAMBA2_SSD_TUNING_CACHE")) {
    const std::string v = e;
    if (v.empty() || v == "0" || v == "off" || v == "none") return "";
    return v;
  }
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && x[0] != '\0') {
    return std::string(x) + "/mamba2_ssd/tuning.json";
  }
  if (const char* h = std::getenv("HOME"); h != nullptr && h[0] != '\0') {
    return std::string(h) + "/.cache/mamba2_ssd/tuning.json";
  }
  return "";
}

TuningCache& TuningCache::instance() {
  static TuningCache* cache = new TuningCache();  // never destroyed: usable during exit
  return *cache;
}

void TuningCache::load_locked() {
  if (loaded_) return;
  loaded_ = true;
  path_ = tuning_cache_file_from_env();
  if (path_.empty()) return;
  std::string text;
  if (!read_file(path_, text)) return;  // no file yet
  std::string why;
  if (!parse_tuning_json(text, entries_, &why)) {
    const std::string path = path_;
    std::call_once(g_warn_once, [&] {
      std::fprintf(stderr,
                   "mamba2_ssd: ignoring the unreadable part of the tuning cache %s: %s (delete the file, or set "
                   "MAMBA2_SSD_TUNING_CACHE to another path)\n",
                   path.c_str(), why.c_str());
    });
  }
}

std::optional<TuningEntry> TuningCache::find(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  load_locked();
  auto it = entries_.find(key);
  if (it == entries_.end()) return std::nullopt;
  return it->second;
}

void TuningCache::store(const std::string& key, const TuningEntry& e, bool persist) {
  std::lock_guard<std::mutex> lock(mu_);
  load_locked();
  entries_[key] = e;
  if (!persist || path_.empty()) return;
  // Merge with what other processes wrote since we loaded, then replace the file atomically.
  std::map<std::string, TuningEntry> merged;
  {
    std::string text;
    if (read_file(path_, text)) parse_tuning_json(text, merged, nullptr);
  }
  for (const auto& [k, v] : entries_) merged[k] = v;
  std::error_code ec;
  const std::filesystem::path file(path_);
  if (file.has_parent_path()) std::filesystem::create_directories(file.parent_path(), ec);
  const std::string tmp = path_ + ".tmp." + std::to_string(static_cast<long>(::getpid()));
  const std::string text = to_tuning_json(merged);
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  const bool ok = f != nullptr && std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (f != nullptr && std::fclose(f) != 0) std::remove(tmp.c_str());
  if (!ok) {
    std::remove(tmp.c_str());
    std::call_once(g_warn_once, [&] {
      std::fprintf(stderr,
                   "mamba2_ssd: cannot write the tuning cache %s (kept in memory; set MAMBA2_SSD_TUNING_CACHE to "
                   "another path)\n",
                   path_.c_str());
    });
    return;
  }
  std::filesystem::rename(tmp, file, ec);
  if (ec) std::filesystem::remove(tmp, ec);
}

std::string TuningCache::path() {
  std::lock_guard<std::mutex> lock(mu_);
  load_locked();
  return path_;
}

void TuningCache::reset() {
  std::lock_guard<std::mutex> lock(mu_);
  loaded_ = false;
  entries_.clear();
  path_.clear();
}

}  // namespace mamba2_ssd::detail
