// The run and check subcommands of mamba2-ssd.
#include "cli_commands.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "cli_gpu.hpp"
#include "cli_problem.hpp"
#include "mamba2_ssd/api.hpp"
#include "reference/reference.hpp"

namespace cli {

using mamba2_ssd::Device;
using mamba2_ssd::DType;

namespace {

// ------------------------------------------------------------------ formatting

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string format_seconds(double s) {
  if (s < 1e-3) return fmt("%.2f us", s * 1e6);
  if (s < 1.0) return fmt("%.3f ms", s * 1e3);
  return fmt("%.3f s", s);
}

std::string format_bytes(double b) {
  if (b < 1024.0 * 1024.0) return fmt("%.1f KiB", b / 1024.0);
  if (b < 1024.0 * 1024.0 * 1024.0) return fmt("%.1f MiB", b / (1024.0 * 1024.0));
  return fmt("%.2f GiB", b / (1024.0 * 1024.0 * 1024.0));
}

std::string format_lengths(const std::vector<int64_t>& lens) {
  std::string s;
  const std::size_t shown = lens.size() <= 10 ? lens.size() : 8;
  for (std::size_t i = 0; i < shown; ++i) s += (i ? "," : "") + std::to_string(lens[i]);
  if (shown < lens.size()) s += ",... (" + std::to_string(lens.size()) + " in all)";
  return s;
}

const char* on_off(bool b) { return b ? "on" : "off"; }

int reference_threads(const Options& opt) {
  if (opt.threads > 0) return opt.threads;
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

// A rough count of the reference's multiply-adds, to decide whether to announce it.
double reference_work(const Problem& prob) {
  const Options& o = prob.opt;
  return static_cast<double>(prob.total_tokens()) * static_cast<double>(o.heads) *
         (static_cast<double>(o.chunk) * static_cast<double>(o.dstate + o.headdim) +
          2.0 * static_cast<double>(o.headdim) * static_cast<double>(o.dstate));
}

void announce_reference(const Problem& prob, const char* what) {
  if (reference_work(prob) < 1e9) return;
  std::fflush(stdout);
  std::fprintf(stderr, "%s (float64, %d threads; may take a while)...\n", what, reference_threads(prob.opt));
  std::fflush(stderr);
}

void print_problem(const char* command, const Problem& prob) {
  const Options& o = prob.opt;
  std::printf("mamba2-ssd %s %s\n", mamba2_ssd::version(), command);
  if (prob.varlen) {
    std::printf("  shape      varlen: %lld tokens in %lld sequences, heads %lld, headdim %lld, groups %lld, "
                "dstate %lld, chunk %lld (up to %lld chunks)\n",
                static_cast<long long>(prob.tokens), static_cast<long long>(prob.nseq), static_cast<long long>(o.heads),
                static_cast<long long>(o.headdim), static_cast<long long>(o.groups), static_cast<long long>(o.dstate),
                static_cast<long long>(o.chunk), static_cast<long long>(prob.nchunks));
    std::printf("  lengths    %s\n", format_lengths(o.varlen_lens).c_str());
  } else {
    std::printf("  shape      batch %lld, seqlen %lld, heads %lld, headdim %lld, groups %lld, dstate %lld, "
                "chunk %lld (%lld chunks per row)\n",
                static_cast<long long>(prob.rows), static_cast<long long>(prob.tokens), static_cast<long long>(o.heads),
                static_cast<long long>(o.headdim), static_cast<long long>(o.groups), static_cast<long long>(o.dstate),
                static_cast<long long>(o.chunk), static_cast<long long>(prob.nchunks));
  }
  const DType state = o.state_dtype.value_or(o.dtype);
  std::printf("  dtypes     x/B/C/z/out %s, dt %s, chunk states %s%s, initial states %s, final states %s\n",
              dtype_short(o.dtype), dtype_short(prob.dt_dtype()), dtype_short(state),
              o.state_dtype ? "" : " (default)", o.init ? dtype_short(o.init_dtype) : "-",
              o.final_states ? dtype_short(o.final_dtype) : "-");
  std::printf("  options    inputs %s, D %s, z %s, dt_bias %s, softplus %s, dt limit [%g, %g], initial states %s, "
              "final states %s, chunk states %s\n",
              o.model_inputs ? "model" : "tests", d_mode_name(o.d_mode), on_off(o.z), on_off(o.dt_bias),
              on_off(o.softplus), o.dt_min, o.dt_max, on_off(o.init), on_off(o.final_states), on_off(o.chunk_states));
  if (!prob.varlen) {
    if (o.seq_idx > 0) {
      std::printf("  seq_idx    %lld packed sequences per row; row 0 lengths %s\n", static_cast<long long>(o.seq_idx),
                  format_lengths(prob.packed.at(0)).c_str());
    } else {
      std::printf("  seq_idx    off\n");
    }
    std::printf("  cu_seqlens %s\n", o.cu_seqlens ? "on (varlen_states of the packed sequences)" : "off");
  }
  std::printf("  seed       %llu\n", static_cast<unsigned long long>(o.seed));
  std::fflush(stdout);
}

void print_checksums(Problem& prob) {
  bool first = true;
  for (HostTensor* t : {&prob.out, &prob.final_states, &prob.varlen_states, &prob.chunk_states}) {
    if (!t->present()) continue;
    const Checksum c = checksum(*t, prob.defined_elements(*t));
    std::printf("  %-10s %-14s sum %+.12e   sum|.| %.12e", first ? "checksum" : "", t->name.c_str(), c.sum,
                c.abs_sum);
    if (c.nonfinite > 0) std::printf("   (%lld non-finite values)", static_cast<long long>(c.nonfinite));
    std::printf("\n");
    first = false;
  }
  if (prob.chunk_offsets.present()) {
    const auto* off = static_cast<const int32_t*>(prob.chunk_offsets.data());
    std::printf("  %-10s %-14s last %d (chunks used)\n", "", "chunk_offsets", off[prob.nseq]);
  }
}

std::string no_gpu_reason() {
  if (!gpu::built_with_cuda()) return "this build of mamba2-ssd has no CUDA support (configured with MAMBA2_SSD_CUDA=OFF)";
  return "no CUDA GPU of compute capability 9.0 (Hopper) found";
}

}  // namespace

// ------------------------------------------------------------------ run

int command_run(const Options& opt) {
  const bool have_gpu = mamba2_ssd::cuda_available();
  if (opt.device == DeviceChoice::kCuda && !have_gpu) throw UsageError("--device cuda: " + no_gpu_reason());
  const bool use_gpu = opt.device == DeviceChoice::kCuda || (opt.device == DeviceChoice::kAuto && have_gpu);
  const int64_t iters = opt.iters.value_or(use_gpu ? 20 : 1);
  const int64_t warmup = opt.warmup.value_or(use_gpu ? 3 : 0);

  Problem prob(opt);
  print_problem("run", prob);

  double seconds_per_call = 0.0;
  if (use_gpu) {
    const gpu::DeviceInfo info = gpu::select_device();
    std::printf("  device     cuda: %s\n", gpu::describe(info).c_str());
    std::fflush(stdout);
    gpu::Mirror mirror(prob);
    std::printf("  memory     %s on the device (workspace %s)\n", format_bytes(static_cast<double>(mirror.device_bytes())).c_str(),
                format_bytes(static_cast<double>(mirror.workspace_bytes())).c_str());
    std::printf("  kernels    %s\n", mirror.kernel_config_description().c_str());
    seconds_per_call = mirror.time_calls(warmup, iters, opt.graph) * 1e-3;
    mirror.download_outputs();
    std::printf("  time       %s per call (cudaEvent, mean of %lld %s after %lld warmup)\n",
                format_seconds(seconds_per_call).c_str(), static_cast<long long>(iters),
                opt.graph ? "CUDA-graph replays" : "calls", static_cast<long long>(warmup));
  } else {
    const char* why = opt.device == DeviceChoice::kCpu
                          ? "cpu (requested)"
                          : (gpu::built_with_cuda() ? "cpu (float64 reference; no CUDA GPU found)"
                                                    : "cpu (float64 reference; built without CUDA)");
    std::printf("  device     %s, %d threads\n", why, reference_threads(opt));
    std::fflush(stdout);
    const mamba2_ssd::ForwardParams p = prob.params(Device::kCPU);
    const mamba2_ssd::ProblemShape s = mamba2_ssd::validate(p);
    announce_reference(prob, "running the CPU reference");
    for (int64_t i = 0; i < warmup; ++i) mamba2_ssd::reference::forward(p, s, opt.threads);
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < iters; ++i) mamba2_ssd::reference::forward(p, s, opt.threads);
    const auto t1 = std::chrono::steady_clock::now();
    seconds_per_call = std::chrono::duration<double>(t1 - t0).count() / static_cast<double>(iters);
    std::printf("  time       %s per call (wall clock, mean of %lld call(s) after %lld warmup)\n",
                format_seconds(seconds_per_call).c_str(), static_cast<long long>(iters), static_cast<long long>(warmup));
  }
  const double tokens = static_cast<double>(prob.total_tokens());
  std::printf("  tokens/s   %.4g (%lld tokens per call)\n", seconds_per_call > 0 ? tokens / seconds_per_call : 0.0,
              static_cast<long long>(prob.total_tokens()));
  print_checksums(prob);
  return kExitOk;
}

// ------------------------------------------------------------------ check

int command_check(const Options& opt) {
  if (opt.device == DeviceChoice::kCpu) {
    throw UsageError("--device cpu: check runs the GPU and compares it with the CPU reference; "
                     "use 'mamba2-ssd run --device cpu' for the CPU alone");
  }
  if (!mamba2_ssd::cuda_available()) {
    std::fflush(stdout);
    std::fprintf(stderr,
                 "mamba2-ssd check: %s; check compares the GPU kernels with the CPU reference and needs one.\n"
                 "(use 'mamba2-ssd run --device cpu' to run the CPU reference alone)\n",
                 no_gpu_reason().c_str());
    return kExitUsage;
  }

  Problem prob(opt);
  print_problem("check", prob);
  const gpu::DeviceInfo info = gpu::select_device();
  std::printf("  device     cuda: %s\n", gpu::describe(info).c_str());
  std::fflush(stdout);

  bool identical = false;
  {
    gpu::Mirror mirror(prob);  // outputs and workspace poisoned with NaN
    std::printf("  kernels    %s\n", mirror.kernel_config_description().c_str());
    mirror.run_once();
    const std::vector<unsigned char> first = mirror.output_bytes();
    mirror.download_outputs();
    mirror.poison_outputs();
    mirror.run_once();
    identical = mirror.output_bytes() == first;
  }  // device memory freed before the reference runs

  const mamba2_ssd::ForwardParams p = prob.params(Device::kCPU);
  const mamba2_ssd::ProblemShape s = mamba2_ssd::validate(p);
  announce_reference(prob, "running the CPU reference");
  const auto t0 = std::chrono::steady_clock::now();
  const mamba2_ssd::reference::F64Outputs ref = mamba2_ssd::reference::forward_f64(p, s, opt.threads);
  const double ref_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("  reference  cpu float64, %d threads, %s\n", reference_threads(opt), format_seconds(ref_s).c_str());
  std::printf("\n  %-15s %-12s %-12s %-10s %s\n", "output", "rel L2 err", "max |err|", "tolerance", "result");

  bool pass = true;
  auto row = [&](const HostTensor& t, const std::vector<double>& want, double tol) {
    if (!t.present()) return;
    const Difference d = compare(t, want);
    const bool ok = d.rel_l2 <= tol;
    pass = pass && ok;
    std::printf("  %-15s %-12s %-12s %-10s %s", t.name.c_str(), fmt("%.3e", d.rel_l2).c_str(),
                fmt("%.3e", d.max_abs).c_str(), fmt("%.1e", tol).c_str(), ok ? "ok" : "FAIL");
    if (d.nonfinite > 0) std::printf(" (%lld NaN/Inf values)", static_cast<long long>(d.nonfinite));
    std::printf("\n");
  };
  // (the bars of the GPU tests where not given: reference::error_bar)
  using mamba2_ssd::reference::Compared;
  auto bar = [&](Compared what, const HostTensor& t) {
    return mamba2_ssd::reference::error_bar(what, t.dtype, opt.dtype, prob.defined_elements(t));
  };
  auto state_tol = [&](const HostTensor& t) { return opt.tol_state.value_or(bar(Compared::kState, t)); };

  row(prob.out, ref.out, opt.tol_out.value_or(bar(Compared::kOut, prob.out)));
  row(prob.final_states, ref.final_states, state_tol(prob.final_states));
  row(prob.varlen_states, ref.varlen_states, state_tol(prob.varlen_states));
  row(prob.chunk_states, ref.chunk_states, state_tol(prob.chunk_states));
  if (prob.chunk_offsets.present()) {
    const auto* got = static_cast<const int32_t*>(prob.chunk_offsets.data());
    int64_t mismatches = 0;
    for (std::size_t i = 0; i < ref.chunk_offsets.size(); ++i) mismatches += got[i] != ref.chunk_offsets[i];
    const bool ok = mismatches == 0 && static_cast<int64_t>(ref.chunk_offsets.size()) == prob.nseq + 1;
    pass = pass && ok;
    std::printf("  %-15s %-35s %s\n", "chunk_offsets",
                ok ? "exact match" : (std::to_string(mismatches) + " of " + std::to_string(prob.nseq + 1) + " differ").c_str(),
                ok ? "ok" : "FAIL");
  }
  pass = pass && identical;
  std::printf("  %-15s %-35s %s\n", "repeat run", identical ? "bitwise identical outputs" : "outputs differ between runs",
              identical ? "ok" : "FAIL");
  std::printf("\n%s\n", pass ? "PASS" : "FAIL");
  return pass ? kExitOk : kExitFailure;
}

}  // namespace cli

namespace cli {

// ------------------------------------------------------------------ tune

namespace {

// The shapes of bench/bench.py's sweeps (same key fields: batch, heads, groups, headdim, dstate,
// chunk, options), so that `tune --sweep` fills exactly the cache entries the benchmark uses.
std::vector<Options> sweep_shapes(const Options& base, const std::string& name) {
  std::vector<Options> out;
  if (name == "anchor") {
    for (int64_t n : {64, 128, 256, 512}) {
      for (int64_t l : {1024, 4096, 16384, 65536, 262144}) {
        Options o = base;
        o.batch = 4; o.seqlen = l; o.heads = 8; o.groups = 1; o.headdim = 64; o.dstate = n; o.chunk = 128;
        o.d_mode = DMode::kPerHead; o.z = false; o.dt_bias = false; o.softplus = false;
        o.init = true; o.final_states = true;
        out.push_back(o);
      }
    }
  } else {
    struct M { int64_t b, l, h, g, n; };
    const std::vector<M> models = {M{1, 2048, 80, 1, 128}, M{1, 8192, 80, 1, 128}, M{4, 8192, 80, 1, 128},
                                   M{1, 65536, 80, 1, 128}, M{8, 4096, 80, 1, 128}, M{8, 4096, 64, 8, 64}};
    // tp: the 2.7B layer's heads split over 8 or 4 GPUs, one sequence.
    const std::vector<M> tp = {M{1, 16384, 10, 1, 128}, M{1, 65536, 10, 1, 128}, M{1, 16384, 20, 1, 128},
                               M{1, 65536, 20, 1, 128}};
    for (const M& m : name == "tp" ? tp : models) {
      Options o = base;
      o.batch = m.b; o.seqlen = m.l; o.heads = m.h; o.groups = m.g; o.headdim = 64; o.dstate = m.n; o.chunk = 256;
      o.d_mode = DMode::kPerHead; o.z = false; o.dt_bias = true; o.softplus = true;
      o.init = false; o.final_states = false;
      out.push_back(o);
    }
  }
  for (Options& o : out) { o.batch_set = true; o.seqlen_set = true; }
  return out;
}

}  // namespace

int command_tune(const Options& opt) {
  if (opt.device == DeviceChoice::kCpu) throw UsageError("--device cpu: tune measures the GPU kernels");
  if (!mamba2_ssd::cuda_available()) {
    std::fflush(stdout);
    std::fprintf(stderr, "mamba2-ssd tune: %s; tuning measures the GPU kernels and needs one.\n",
                 no_gpu_reason().c_str());
    return kExitUsage;
  }
  std::vector<Options> shapes;
  for (const std::string& s : opt.sweep) {
    for (const Options& o : sweep_shapes(opt, s)) shapes.push_back(o);
  }
  if (shapes.empty()) shapes.push_back(opt);
  const gpu::DeviceInfo info = gpu::select_device();
  const std::string path = mamba2_ssd::tuning_cache_path();
  std::printf("mamba2-ssd tune: %zu shape(s) on %s\n  cache      %s\n", shapes.size(), gpu::describe(info).c_str(),
              path.empty() ? "(in memory only: MAMBA2_SSD_TUNING_CACHE is off)" : path.c_str());
  std::fflush(stdout);
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < shapes.size(); ++i) {
    Problem prob(shapes[i]);
    std::printf("\n[%zu/%zu] ", i + 1, shapes.size());
    print_problem("tune", prob);
    std::fflush(stdout);
    gpu::Mirror mirror(prob);
    mamba2_ssd::TuneOptions to;
    to.budget_seconds = opt.budget;
    to.progress = [](const std::string& line) {
      std::printf("%s\n", line.c_str());
      std::fflush(stdout);
    };
    const mamba2_ssd::TuneResult r = mirror.tune(to);
    std::printf("  best       %s: %.4f ms (heuristic %s: %.4f ms, %.2fx)%s\n", mamba2_ssd::to_string(r.best).c_str(),
                r.best_ms, mamba2_ssd::to_string(r.heuristic).c_str(), r.heuristic_ms,
                r.best_ms > 0 ? r.heuristic_ms / r.best_ms : 0.0,
                r.complete ? "" : "  [budget spent: not every candidate was measured]");
    std::printf("  key        %s\n  took       %.2f s\n", r.key.c_str(), r.seconds);
    std::printf("  now used   %s\n", mirror.kernel_config_description().c_str());
    std::fflush(stdout);
  }
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("\ntuned %zu shape(s) in %.1f s%s\n", shapes.size(), total,
              path.empty() ? " (not saved)" : (" -> " + path).c_str());
  return kExitOk;
}

}  // namespace cli
