// The GPU forward: workspace plan, kernel parameters from the validated call, launch order,
// the choice of kernel settings for the shape, and the autotuner's timing loop.
#include "dispatch/launch.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "dispatch/tuning.hpp"
#include "kernels/kernels.hpp"
#include "mamba2_ssd/api.hpp"

namespace mamba2_ssd {
namespace kernels {

void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw Error(Error::Kind::kCuda, "",
                std::string("CUDA error in ") + what + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) +
                    ")");
  }
}

void throw_launch_error(const std::string& message) {
  throw Error(Error::Kind::kUnsupported, "", message);
}

void raise_smem_limit(const void* kernel, int bytes, bool max_carveout, const char* what) {
  int device = 0;
  check_cuda(cudaGetDevice(&device), what);
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, int> limits;  // bytes set per (kernel, device)
  std::lock_guard<std::mutex> lock(mutex);
  int& set = limits[{kernel, device}];
  if (bytes <= set) return;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), what);
  if (max_carveout) {
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                    cudaSharedmemCarveoutMaxShared),
               what);
  }
  set = bytes;
}

}  // namespace kernels

namespace detail {

namespace {

constexpr std::size_t kAlign = 256;
std::size_t align_up(std::size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

// Byte offsets of the workspace regions (0-sized regions are absent).
struct WorkspacePlan {
  std::size_t cum = 0, dtp = 0, wst = 0, wst_pairs = 0, carry = 0, ready = 0, seg_sums = 0, seg_carry = 0, states = 0, offsets = 0,
              x16 = 0, b16 = 0, c16 = 0, total = 0;
  int max_segments = 1;
  std::size_t states_bytes = 0, offsets_bytes = 0, x16_bytes = 0, bc16_bytes = 0;
};

// chunk_state_region: false leaves out the chunk states (where the caller gives no chunk_states),
// for fused_walk, which keeps them on chip (see fused_needs_chunk_states).
WorkspacePlan plan_workspace(const ForwardParams& p, const ProblemShape& s, bool chunk_state_region = true) {
  WorkspacePlan w;
  const std::size_t per_slot = static_cast<std::size_t>(s.batch) * s.nheads * s.nchunks * p.chunk_size;
  std::size_t off = 0;
  w.cum = off; off = align_up(off + per_slot * sizeof(float));
  w.dtp = off; off = align_up(off + per_slot * sizeof(float));
  w.wst = off; off = align_up(off + per_slot * sizeof(float));
  w.carry = off; off = align_up(off + per_slot / p.chunk_size * sizeof(float));
  // fwd_pass_state's progress counters: one per (walk, head, segment, CTA), for its smallest
  // dstate tile and the most segments; its segment sums (fp32 states) and carry products.
  const int64_t walks = p.layout == Layout::kVarlen ? s.nseq : s.batch;
  const std::size_t max_tiles = static_cast<std::size_t>(kernels::fwd_pass_state_tiles(s.headdim, s.dstate, 32));
  w.max_segments = max_walk_segments(s, p.layout == Layout::kVarlen);
  const std::size_t walk_heads = static_cast<std::size_t>(walks) * s.nheads;
  w.ready = off; off = align_up(off + walk_heads * w.max_segments * max_tiles * sizeof(int32_t));
  if (w.max_segments > 1) {
    // (the bf16 segment sums' weights, SsdParams::wst_pairs: see keep_weight_pairs_where_read)
    if (s.compute_dtype != DType::kFloat16) {
      w.wst_pairs = off; off = align_up(off + per_slot * sizeof(float));
    }
    // (in 64 x 64 tiles, or 64 x 32: headdim and dstate rounded up to 64)
    const std::size_t sums = walk_heads * (w.max_segments - 1);
    const std::size_t tile_area = static_cast<std::size_t>((s.headdim + 63) / 64 * 64) * ((s.dstate + 63) / 64 * 64);
    w.seg_sums = off; off = align_up(off + sums * tile_area * sizeof(float));
    w.seg_carry = off; off = align_up(off + sums * sizeof(float));
  }
  if (!p.chunk_states.present() && chunk_state_region) {
    w.states_bytes = static_cast<std::size_t>(s.batch) * s.nchunks * s.nheads * s.headdim * s.dstate *
                     dtype_size(s.state_dtype);
    w.states = off; off = align_up(off + w.states_bytes);
  }
  if (p.layout == Layout::kVarlen && !p.chunk_offsets.present()) {
    w.offsets_bytes = static_cast<std::size_t>(s.nseq + 1) * sizeof(int32_t);
    w.offsets = off; off = align_up(off + w.offsets_bytes);
  }
  if (p.x.dtype == DType::kFloat32) {
    w.x16_bytes = static_cast<std::size_t>(s.batch) * s.seqlen * s.nheads * s.headdim * 2;
    w.bc16_bytes = static_cast<std::size_t>(s.batch) * s.seqlen * s.ngroups * s.dstate * 2;
    w.x16 = off; off = align_up(off + w.x16_bytes);
    w.b16 = off; off = align_up(off + w.bc16_bytes);
    w.c16 = off; off = align_up(off + w.bc16_bytes);
  }
  w.total = off;
  return w;
}

// Strides of a token-major tensor as (batch, token, inner-index) for both layouts.
struct Tok3 {
  int64_t sb, st, s2;
};
Tok3 tok_strides(const TensorView& t, Layout l) {
  if (l == Layout::kBatched) return {t.stride(0), t.stride(1), t.stride(2)};
  return {0, t.stride(0), t.stride(1)};
}

// Strides of a (walk, head, headdim, dstate) state tensor: initial, final and varlen states.
struct StateStrides {
  int64_t s_walk, s_head, s_p;
};
StateStrides state_strides(const TensorView& t) { return {t.stride(0), t.stride(1), t.stride(2)}; }

void check_device_once() {
  static std::mutex mu;
  static int checked_device = -1;
  int dev = 0;
  kernels::check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  std::lock_guard<std::mutex> lock(mu);
  if (dev == checked_device) return;
  cudaDeviceProp prop{};
  kernels::check_cuda(cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties");
  if (prop.major != 9 || prop.minor != 0) {
    throw Error(Error::Kind::kUnsupported, "device",
                "device: the kernels are built for compute capability 9.0 (Hopper: H100/H200), the current device " +
                    std::to_string(dev) + " (" + prop.name + ") is " + std::to_string(prop.major) + "." +
                    std::to_string(prop.minor));
  }
  checked_device = dev;
}

// A validated call as its kernels run it: in chunks of kernel_chunk_size(p) tokens.
struct KernelCall {
  ForwardParams p;
  ProblemShape s;
};
KernelCall kernel_call(const ForwardParams& p, const ProblemShape& s) {
  KernelCall c{p, s};
  const int64_t q = kernel_chunk_size(p);
  if (q != p.chunk_size) {
    c.p.chunk_size = q;
    c.s.chunk_size = q;
    c.s.nchunks = p.layout == Layout::kVarlen ? max_varlen_chunks(s.seqlen, s.nseq, q) : (s.seqlen + q - 1) / q;
  }
  return c;
}

// Whether the call's layout and options let fused_walk run its specialised kernel (the heuristic
// counts segments for the kernel that runs).
bool specialized_options(const ForwardParams& p) {
  return kernels::fused_walk_specialized_options(p.layout != Layout::kVarlen, p.seq_idx.present(), p.z.present(),
                                                 p.out.dtype == DType::kFloat32);
}

// fused_walk stores chunk states in the workspace only for varlen_states in the batched layout
// (the varlen_states kernel reads them).
bool fused_needs_chunk_states(const ForwardParams& p) {
  return p.layout != Layout::kVarlen && p.varlen_states.present();
}

KernelConfig resolve_for(const KernelCall& call, std::string* source, std::string* key_out);

// Bytes of scratch the settings `cfg` (resolved from `source`) run in: fused_walk's alone where
// they pick it, else (also where a miss may tune and pick the two kernels) what all fit in.
std::size_t workspace_now(const KernelCall& c, const KernelConfig& cfg, const std::string& source) {
  const std::size_t all = plan_workspace(c.p, c.s).total;
  if (!fused_walk_applies(c.s) || fused_needs_chunk_states(c.p)) return all;
  const bool may_tune = source == "heuristic" && autotune_on_miss();
  return cfg.fused_walk == 2 && !may_tune ? plan_workspace(c.p, c.s, false).total : all;
}

}  // namespace

WorkspaceNeeds gpu_workspace_needs(const ForwardParams& call_p, const ProblemShape& call_s, bool with_now) {
  const KernelCall c = kernel_call(call_p, call_s);
  WorkspaceNeeds n;
  n.all = plan_workspace(c.p, c.s).total;
  n.least = n.now = n.all;
  if (fused_walk_applies(c.s) && !fused_needs_chunk_states(c.p)) {
    n.least = n.now = plan_workspace(c.p, c.s, false).total;
    if (!with_now) return n;
    std::string source;
    const KernelConfig cfg = resolve_for(c, &source, nullptr);
    n.now = workspace_now(c, cfg, source);
  }
  return n;
}

bool gpu_present() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    return false;
  }
  for (int d = 0; d < n; ++d) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, d) == cudaSuccess && prop.major == 9 && prop.minor == 0) return true;
  }
  cudaGetLastError();
  return false;
}

namespace {

// The longest segment that is summed (not the last): the first where it is the shorter of two.
int32_t longest_summed(const kernels::SsdParams& k) { return k.nseg > 2 ? k.seg_chunks : k.seg0_chunks; }
// Each summed segment of `k` in `split` parts (SsdParams::sum_split) of ceil(longest_summed /
// split) chunks (sum_part_chunks): set wherever the segments or the split change.
void set_sum_split(kernels::SsdParams& k, int32_t split) {
  k.sum_split = split;
  k.sum_part_chunks = (longest_summed(k) + split - 1) / split;
}

// The kernels' parameters for a validated call and its workspace.
kernels::SsdParams make_kernel_params(const ForwardParams& p, const ProblemShape& s, const WorkspacePlan& w, char* ws) {
  const bool varlen = p.layout == Layout::kVarlen;

  kernels::SsdParams k{};
  k.batch = s.batch;
  k.seqlen = s.seqlen;
  k.nheads = static_cast<int32_t>(s.nheads);
  k.headdim = static_cast<int32_t>(s.headdim);
  k.ngroups = static_cast<int32_t>(s.ngroups);
  k.dstate = static_cast<int32_t>(s.dstate);
  k.heads_per_group = static_cast<int32_t>(s.nheads / s.ngroups);
  k.chunk = static_cast<int32_t>(p.chunk_size);
  k.nchunks = s.nchunks;
  k.nseq = static_cast<int32_t>(s.nseq);
  k.varlen = varlen;
  k.fp16 = s.compute_dtype == DType::kFloat16;

  const bool io_fp32 = p.x.dtype == DType::kFloat32;
  const Tok3 xs = tok_strides(p.x, p.layout), bs = tok_strides(p.B, p.layout), cs = tok_strides(p.C, p.layout);
  if (!io_fp32) {
    k.x = p.x.data; k.x_sb = xs.sb; k.x_st = xs.st; k.x_sh = xs.s2;
    k.B = p.B.data; k.B_sb = bs.sb; k.B_st = bs.st; k.B_sg = bs.s2;
    k.C = p.C.data; k.C_sb = cs.sb; k.C_st = cs.st; k.C_sg = cs.s2;
  } else {
    // Contiguous bf16 copies: (batch, seqlen, heads|groups, inner).
    k.x = ws + w.x16; k.x_st = s.nheads * s.headdim; k.x_sb = s.seqlen * k.x_st; k.x_sh = s.headdim;
    k.B = ws + w.b16; k.B_st = s.ngroups * s.dstate; k.B_sb = s.seqlen * k.B_st; k.B_sg = s.dstate;
    k.C = ws + w.c16; k.C_st = k.B_st; k.C_sb = k.B_sb; k.C_sg = k.B_sg;
    k.x_f32 = static_cast<const float*>(p.x.data); k.xf_sb = xs.sb; k.xf_st = xs.st; k.xf_sh = xs.s2;
  }
  const Tok3 dts = varlen ? Tok3{0, p.dt.stride(0), p.dt.stride(1)} : Tok3{p.dt.stride(0), p.dt.stride(1), p.dt.stride(2)};
  k.dt = p.dt.data; k.dt_dtype = p.dt.dtype; k.dt_sb = dts.sb; k.dt_st = dts.st; k.dt_sh = dts.s2;
  k.A = static_cast<const float*>(p.A.data); k.A_s = p.A.stride(0);
  k.dt_bias = static_cast<const float*>(p.dt_bias.data);
  k.dt_bias_s = p.dt_bias.present() ? p.dt_bias.stride(0) : 0;
  k.dt_softplus = p.dt_softplus;
  k.dt_min = p.dt_min;
  k.dt_max = p.dt_max;
  if (p.D.present()) {
    k.D = static_cast<const float*>(p.D.data);
    k.D_sh = p.D.stride(0);
    k.D_sp = p.D.rank == 2 ? p.D.stride(1) : 0;
  }
  if (p.z.present()) {
    const Tok3 zs = tok_strides(p.z, p.layout);
    k.z = p.z.data; k.z_sb = zs.sb; k.z_st = zs.st; k.z_sh = zs.s2;
  }
  if (p.initial_states.present()) {
    k.init = p.initial_states.data;
    k.init_dtype = p.initial_states.dtype;
    const StateStrides st = state_strides(p.initial_states);
    k.init_sb = st.s_walk; k.init_sh = st.s_head; k.init_sp = st.s_p;
  }
  if (p.seq_idx.present()) {
    k.seq_idx = static_cast<const int32_t*>(p.seq_idx.data);
    k.seq_sb = p.seq_idx.stride(0);
    k.seq_st = p.seq_idx.stride(1);
  }
  if (p.cu_seqlens.present()) {
    k.cu_seqlens = p.cu_seqlens.data;
    k.cu_seqlens_i64 = p.cu_seqlens.dtype == DType::kInt64;
  }
  k.cum = reinterpret_cast<float*>(ws + w.cum);
  k.dtp = reinterpret_cast<float*>(ws + w.dtp);
  k.wst = reinterpret_cast<float*>(ws + w.wst);
  k.wst_pairs = w.wst_pairs != 0 ? reinterpret_cast<float*>(ws + w.wst_pairs) : nullptr;
  k.carry = reinterpret_cast<float*>(ws + w.carry);
  k.ready = reinterpret_cast<int32_t*>(ws + w.ready);
  k.ready_tiles = 0;  // set with the fwd_pass_state setting (with_pass_state), as the segments
  k.nseg = 1;
  k.seg_chunks = static_cast<int32_t>(std::max<int64_t>(s.nchunks, 1));
  k.seg0_chunks = k.seg_chunks;
  set_sum_split(k, 1);
  k.sum_tile = 64;
  k.ws_heads = 1;
  k.prewalk = false;
  if (w.max_segments > 1) {
    k.seg_sums = reinterpret_cast<float*>(ws + w.seg_sums);
    k.seg_carry = reinterpret_cast<float*>(ws + w.seg_carry);
  }
  k.state_dtype = s.state_dtype;
  if (p.chunk_states.present()) {
    const TensorView& c = p.chunk_states;
    k.states = c.data;
    if (varlen) { k.st_sb = 0; k.st_sc = c.stride(0); k.st_sh = c.stride(1); k.st_sp = c.stride(2); }
    else { k.st_sb = c.stride(0); k.st_sc = c.stride(1); k.st_sh = c.stride(2); k.st_sp = c.stride(3); }
  } else {
    k.states = w.states_bytes > 0 ? ws + w.states : nullptr;  // (absent: fused_walk, which stores none)
    k.st_sp = s.dstate;
    k.st_sh = s.headdim * k.st_sp;
    k.st_sc = s.nheads * k.st_sh;
    k.st_sb = s.nchunks * k.st_sc;
  }
  if (varlen) {
    k.chunk_offsets = p.chunk_offsets.present() ? static_cast<int32_t*>(p.chunk_offsets.data)
                                                : reinterpret_cast<int32_t*>(ws + w.offsets);
  }
  const Tok3 os = tok_strides(p.out, p.layout);
  k.out = p.out.data; k.io_dtype = p.x.dtype; k.out_sb = os.sb; k.out_st = os.st; k.out_sh = os.s2;
  if (p.final_states.present()) {
    k.final_states = p.final_states.data;
    k.fin_dtype = p.final_states.dtype;
    const StateStrides st = state_strides(p.final_states);
    k.fin_sb = st.s_walk; k.fin_sh = st.s_head; k.fin_sp = st.s_p;
  }
  if (p.varlen_states.present()) {
    k.varlen_states = p.varlen_states.data;
    k.vs_dtype = p.varlen_states.dtype;
    const StateStrides st = state_strides(p.varlen_states);
    k.vs_sb = st.s_walk; k.vs_sh = st.s_head; k.vs_sp = st.s_p;
  }

  return k;
}

int64_t walk_count(const ForwardParams& p, const ProblemShape& s) {
  return p.layout == Layout::kVarlen ? s.nseq : s.batch;
}

// MAMBA2_SSD_OVERLAP=0: compute_out starts only after fwd_pass_state has completed (for
// measuring what the overlap brings, or as a fallback).
bool overlap_enabled() {
  const char* e = std::getenv("MAMBA2_SSD_OVERLAP");
  return e == nullptr || std::string(e) != "0";
}

// chunk_cumsum's weights in bf16 pairs (SsdParams::wst_pairs) only where segment sums run that
// read them (those without chunk_cumsum's work; bf16 only: the workspace has no region for fp16).
void keep_weight_pairs_where_read(kernels::SsdParams& k) {
  if (k.nseg == 1 || k.prewalk || k.sums_cumsum) k.wst_pairs = nullptr;
}

// `k` for a fwd_pass_state setting: its CTAs per (walk, head) and segments, which compute_out
// waits on. The segment count is reduced to what the shape allows (max_walk_segments), then to
// the fewest segments of the same length.
kernels::SsdParams with_pass_state(kernels::SsdParams k, const kernels::PassStateConfig& c, const WorkspacePlan& w) {
  k.ready_tiles = kernels::fwd_pass_state_tiles(k.headdim, k.dstate, c.dstate_tile);
  const int64_t want = std::clamp<int64_t>(c.segments, 1, w.max_segments);
  if (want > 1) {
    const int64_t len = (k.nchunks + want - 1) / want;
    k.seg_chunks = static_cast<int32_t>(len);
    k.seg0_chunks = k.seg_chunks;
    set_sum_split(k, 1);
    k.nseg = static_cast<int32_t>((k.nchunks + len - 1) / len);
  }
  if (!overlap_enabled()) k.ready = nullptr;
  keep_weight_pairs_where_read(k);
  return k;
}

// compute_out's setting for a call: the fwd_pass_state CTA it shares the SMs with, when the walks
// run alongside it (overlap) on half of the SMs or more (ComputeOutConfig::beside).
kernels::ComputeOutConfig compute_out_config(const kernels::SsdParams& k, const kernels::PassStateConfig& ps,
                                             int heads_per_cta, int walks, int sm_count) {
  kernels::ComputeOutConfig co;
  co.heads_per_cta = heads_per_cta;
  // For measuring: compute_out's ring depth (2-4) instead of the automatic choice.
  if (const char* e = std::getenv("MAMBA2_SSD_COMPUTE_OUT_STAGES")) co.stages = std::atoi(e);
  const int64_t walk_ctas = static_cast<int64_t>(walks) * k.nheads * k.ready_tiles * k.nseg;
  if (k.ready != nullptr && 2 * walk_ctas >= sm_count) co.beside = kernels::fwd_pass_state_footprint(k, ps);
  return co;
}

// Everything before the walk and the output: fp32 input conversion, varlen chunk offsets, cumsum.
// fused: fused_walk runs next (else the two kernels).
void launch_prefix(const ForwardParams& p, const ProblemShape& s, const WorkspacePlan& w, char* ws,
                   const kernels::SsdParams& k, bool fused, cudaStream_t stream) {
  const bool varlen = p.layout == Layout::kVarlen;
  const int64_t walks = walk_count(p, s);
  if (walks > 65535 || s.nheads > 65535) {
    kernels::throw_launch_error("fwd_pass_state: at most 65535 rows/sequences and 65535 heads per launch, got " +
                                std::to_string(walks) + " and " + std::to_string(s.nheads));
  }
  if (p.x.dtype == DType::kFloat32) {
    const Tok3 xs = tok_strides(p.x, p.layout), bs = tok_strides(p.B, p.layout), cs = tok_strides(p.C, p.layout);
    const int64_t b4 = varlen ? 1 : s.batch;
    kernels::launch_convert_to_bf16(static_cast<const float*>(p.x.data), b4, s.seqlen, s.nheads, xs.sb, xs.st, xs.s2,
                                    s.headdim, ws + w.x16, stream);
    kernels::launch_convert_to_bf16(static_cast<const float*>(p.B.data), b4, s.seqlen, s.ngroups, bs.sb, bs.st, bs.s2,
                                    s.dstate, ws + w.b16, stream);
    kernels::launch_convert_to_bf16(static_cast<const float*>(p.C.data), b4, s.seqlen, s.ngroups, cs.sb, cs.st, cs.s2,
                                    s.dstate, ws + w.c16, stream);
  }
  if (varlen) kernels::launch_chunk_offsets(k, stream);
  // fused_walk in one segment comes right after chunk_cumsum, and launched while chunk_cumsum runs
  // it sets up under it: 2.7B layer 1 x 128 tokens 8.9 -> 8.1 us, 1 x 2K 45.3 -> 44.6. Where the
  // segment sums or fwd_pass_state come next, the same made calls 2.8-5.6% slower (anchor
  // dstate 128 16K, 124.4 -> 131.3 us; H200, 2026-11-30 v30).
  if (!k.sums_cumsum) kernels::launch_chunk_cumsum(k, fused && (k.nseg == 1 || k.prewalk), stream);
}

// Whether fused_walk runs its specialised kernel for k (MAMBA2_SSD_FUSED_WS=0: not, for measuring).
bool runs_specialized(const kernels::SsdParams& k) {
  const char* e = std::getenv("MAMBA2_SSD_FUSED_WS");
  return kernels::fused_walk_specialized_supported(k) && (e == nullptr || std::string(e) != "0");
}

// The fused_walk variant that runs k (launch_walk_and_output).
kernels::FusedWalkVariant fused_variant_of(const kernels::SsdParams& k, int sm_count) {
  const int64_t walk_heads = (k.varlen ? k.nseq : k.batch) * k.nheads;
  return fused_walk_variant(k.dstate, k.chunk, walk_heads * k.nseg, sm_count, runs_specialized(k));
}

// Where every reader of chunk_cumsum's weights takes them as bf16 pairs (the specialised kernel's
// forms that scale by pairs, kernels::fused_walk_specialized_reads_pairs, and the bf16 segment
// sums without chunk_cumsum's work), chunk_cumsum stores the pairs alone: k.wst nullptr, the
// pairs in wst's region, where the specialised kernel reads a chunk's cum, dt' and weights in one
// load (the 4 bytes per token and head that the pairs added in v48: dstate 64 calls 0.4% slower
// then).
// MAMBA2_SSD_WEIGHT_PAIRS_ALONE=0: both stored (for measuring).
void weight_pairs_alone_where_enough(kernels::SsdParams& k, int sm_count) {
  const char* e = std::getenv("MAMBA2_SSD_WEIGHT_PAIRS_ALONE");
  if ((e != nullptr && std::string(e) == "0") || k.fp16 || k.sums_cumsum ||
      fused_variant_of(k, sm_count) != kernels::FusedWalkVariant::kSpecialized ||
      !kernels::fused_walk_specialized_reads_pairs(k)) {
    return;
  }
  k.wst_pairs = k.wst;  // (in wst's region, beside cum and dt': the specialised kernel's meta map)
  k.wst = nullptr;
}

// Where fused_walk's specialised kernel runs on one rank (dstate <= 256) after chunk_cumsum and
// without a pre-walk, chunk_cumsum stores e and that kernel's weights for it (SsdParams::walk_meta):
// its state warpgroup then skips a step and a barrier per chunk. CLI A/B against computing them
// there (H200, design log v55): anchor dstate 128 at 16K / 64K 1.3 / 1.6% faster, the 2.7B layer
// 4 x 8K 2.5%, the 8-group layer 1.7%. Not where it cost as much as it saved or more: beside
// segment sums that need the weights' pairs as well as the kernel's (dstate 64 and 256, bf16: one
// more array to store, 0.3% faster to 0.1% slower), on two ranks (dstate 512 16K 0.6% slower), and
// where the sums do chunk_cumsum's work on their chain (1K tokens 1.7-2.3% slower); nor where
// another reader needs dt' or the fp32 weights (varlen_states in the batched layout, fp16 segment
// sums). MAMBA2_SSD_WALK_META=0: never (for measuring).
void meta_for_walk_where_it_pays(const ForwardParams& p, kernels::SsdParams& k, int sm_count) {
  const char* e = std::getenv("MAMBA2_SSD_WALK_META");
  if ((e != nullptr && std::string(e) == "0") || k.dstate > 256 || k.prewalk || k.sums_cumsum ||
      (p.layout != Layout::kVarlen && p.varlen_states.present()) ||
      fused_variant_of(k, sm_count) != kernels::FusedWalkVariant::kSpecialized) {
    return;
  }
  const bool sums = k.nseg > 1;  // (sums without chunk_cumsum's work: they read wst_pairs, bf16, or wst)
  const bool pairs = kernels::fused_walk_specialized_reads_pairs(k);
  if (sums && (k.wst_pairs == nullptr || pairs)) return;
  k.walk_meta = true;
  k.walk_pairs = pairs;
}

// Whether fused_walk's segment sums may split their segments (SsdParams::sum_split), and into how
// many parts at most (the workspace holds max_segments - 1 sums per walk and head).
bool sums_splittable(const kernels::SsdParams& k) {
  return k.nseg > 1 &&
         detail::sums_split_allowed(!k.varlen, k.sums_cumsum, k.headdim, k.chunk);
}
int max_sum_split(const kernels::SsdParams& k, const WorkspacePlan& w) {
  return k.nseg > 1 ? (w.max_segments - 1) / (k.nseg - 1) : 1;
}
detail::SegmentSums sums_plan(const kernels::SsdParams& k, const WorkspacePlan& w, int sm_count) {
  const int64_t walk_heads = (k.varlen ? k.nseq : k.batch) * k.nheads;
  return detail::segment_sums_plan(k.headdim, k.dstate, k.chunk, walk_heads, k.nseg, longest_summed(k), sums_splittable(k),
                                   max_sum_split(k, w), sm_count);
}

// fused_walk's parameters: its segment sums in 64-column tiles, no progress counters (nothing
// runs alongside), chunk states stored only for the caller or for varlen_states, the specialised
// kernel's heads per CTA (`heads_per_cta`, where they pair), two segments of it split unevenly
// where that balances the SMs (first_segment_chunks within a wave, multi_wave_first_segment
// beyond it; on short walks within a wave the long segment walks the short one's chunks itself
// and no sums run, prewalk_first_segment), chunk_cumsum's work done by the segment sums where
// their segments are short, and the sums' parts (sums_plan).
kernels::SsdParams fused_params(const ForwardParams& p, kernels::SsdParams k, int segments, int heads_per_cta,
                                const WorkspacePlan& w, int sm_count) {
  kernels::PassStateConfig c;
  c.dstate_tile = 64;
  c.segments = segments;
  k = with_pass_state(k, c, w);
  k.ready = nullptr;
  k.ws_heads = heads_per_cta == 2 && runs_specialized(k) &&
                       kernels::fused_walk_specialized_pairs(k.dstate, k.heads_per_group)
                   ? 2
                   : 1;
  if (k.nseg == 2 && !k.varlen && runs_specialized(k) && kernels::fused_walk_specialized_uneven(k.dstate)) {
    const int64_t cta_heads = k.batch * k.nheads / k.ws_heads;  // (CTAs per segment)
    const int64_t pre_first = k.ws_heads == 1 ? detail::prewalk_first_segment(cta_heads, k.nchunks, sm_count, true) : 0;
    int64_t first = pre_first;
    if (first == 0) first = detail::multi_wave_split(cta_heads, k.nchunks, k.dstate, k.ws_heads, true, sm_count).first;
    if (first == 0) first = detail::first_segment_chunks(cta_heads, k.nchunks, sm_count, true).first;
    bool prewalk = pre_first > 0;
    // (for measuring) MAMBA2_SSD_FIRST_SEGMENT=n: the first of two segments n chunks long;
    // MAMBA2_SSD_PREWALK=0 or 1: the long segment walks the short one's chunks itself or not
    if (const char* f = std::getenv("MAMBA2_SSD_FIRST_SEGMENT")) {
      first = std::clamp<int64_t>(std::atoll(f), 1, std::max<int64_t>(k.nchunks - 1, 1));
    }
    if (const char* e = std::getenv("MAMBA2_SSD_PREWALK")) prewalk = k.ws_heads == 1 && std::string(e) == "1";
    if (first < k.nchunks - first) {
      k.seg0_chunks = static_cast<int32_t>(first);
      k.seg_chunks = static_cast<int32_t>(k.nchunks - first);
      k.prewalk = prewalk;
    }
  }
  // MAMBA2_SSD_SUMS_CUMSUM=0: chunk_cumsum runs first whatever the segments (for measuring).
  const char* e = std::getenv("MAMBA2_SSD_SUMS_CUMSUM");
  k.sums_cumsum = detail::sums_take_cumsum(k.nseg, k.seg_chunks) && k.seg0_chunks == k.seg_chunks &&
                  (e == nullptr || std::string(e) != "0");
  const detail::SegmentSums plan = sums_plan(k, w, sm_count);
  k.sum_tile = plan.tile;
  set_sum_split(k, plan.split);
  // MAMBA2_SSD_SUMS_SPLIT=n: n parts per summed segment where they apply (for measuring).
  if (const char* s = std::getenv("MAMBA2_SSD_SUMS_SPLIT"); s != nullptr && sums_splittable(k)) {
    set_sum_split(k, std::clamp(std::atoi(s), 1, std::max(std::min<int>(max_sum_split(k, w), longest_summed(k)), 1)));
  }
  const bool batched_varlen_states = p.layout != Layout::kVarlen && p.varlen_states.present();
  if (!p.chunk_states.present() && !batched_varlen_states) k.states = nullptr;
  keep_weight_pairs_where_read(k);
  meta_for_walk_where_it_pays(p, k, sm_count);
  if (!k.walk_meta) weight_pairs_alone_where_enough(k, sm_count);
  return k;
}

// The launches of a forward call after the prefix: fused_walk (with its segment sums) when `fused`,
// else fwd_pass_state and compute_out (overlapping); then varlen_states where asked for.
void launch_walk_and_output(const ForwardParams& p, const kernels::SsdParams& k, bool fused,
                            const kernels::PassStateConfig& ps, const kernels::ComputeOutConfig& co, int sm_count,
                            cudaStream_t stream) {
  if (fused) {
    if (k.nseg > 1 && !k.prewalk) kernels::launch_segment_sums(k, k.sum_tile, stream);
    kernels::launch_fused_walk(k, fused_variant_of(k, sm_count), stream);
  } else {
    // compute_out overlaps fwd_pass_state (see kernels.hpp).
    kernels::launch_fwd_pass_state(k, ps, stream);
    kernels::launch_compute_out(k, co, stream);
  }
  if (p.layout != Layout::kVarlen && p.varlen_states.present()) kernels::launch_varlen_states(k, stream);
}

// Fills the unset fields of `c` from `from`.
KernelConfig fill_unset(KernelConfig c, const KernelConfig& from) {
  if (c.pass_state_dstate_tile == 0) c.pass_state_dstate_tile = from.pass_state_dstate_tile;
  if (c.pass_state_stages == 0) c.pass_state_stages = from.pass_state_stages;
  if (c.pass_state_segments == 0) c.pass_state_segments = from.pass_state_segments;
  if (c.compute_out_heads_per_cta == 0) c.compute_out_heads_per_cta = from.compute_out_heads_per_cta;
  if (c.fused_walk == 0) c.fused_walk = from.fused_walk;
  if (c.fused_walk_heads_per_cta == 0) c.fused_walk_heads_per_cta = from.fused_walk_heads_per_cta;
  return c;
}

bool is_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &st) != cudaSuccess) {
    (void)cudaGetLastError();
    return true;  // cannot tell: do not synchronize
  }
  return st != cudaStreamCaptureStatusNone;
}

}  // namespace

DeviceId current_device_id() {
  static std::mutex mu;
  static int cached_dev = -1;
  static DeviceId cached;
  int dev = 0;
  kernels::check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  std::lock_guard<std::mutex> lock(mu);
  if (dev != cached_dev) {
    cudaDeviceProp prop{};
    kernels::check_cuda(cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties");
    cached.name = prop.name;
    cached.sm_count = prop.multiProcessorCount;
    cached_dev = dev;
  }
  return cached;
}

namespace {

// resolve_kernel_config for a call already in the kernels' chunks (gpu_forward has it).
KernelConfig resolve_for(const KernelCall& call, std::string* source, std::string* key_out) {
  const ForwardParams& p = call.p;
  const ProblemShape& s = call.s;
  const DeviceId dev = current_device_id();
  KernelConfig c = p.kernel_config;
  std::string src = c == KernelConfig{} ? "" : "explicit";
  // Manual overrides for measuring variants (environment).
  KernelConfig env;
  if (const char* e = std::getenv("MAMBA2_SSD_PASS_STATE_NT")) env.pass_state_dstate_tile = std::atoi(e) == 32 ? 32 : 64;
  if (const char* e = std::getenv("MAMBA2_SSD_PASS_STATE_STAGES")) env.pass_state_stages = std::atoi(e) <= 2 ? 2 : 4;
  if (const char* e = std::getenv("MAMBA2_SSD_HEADS_PER_CTA")) env.compute_out_heads_per_cta = std::max(1, std::atoi(e));
  if (const char* e = std::getenv("MAMBA2_SSD_PASS_STATE_SEGMENTS")) env.pass_state_segments = std::clamp(std::atoi(e), 1, 16);
  if (const char* e = std::getenv("MAMBA2_SSD_FUSED")) env.fused_walk = std::string(e) == "0" ? 1 : 2;
  if (const char* e = std::getenv("MAMBA2_SSD_FUSED_HEADS")) env.fused_walk_heads_per_cta = std::atoi(e) == 2 ? 2 : 1;
  if (env != KernelConfig{}) {
    c = fill_unset(c, env);
    if (src.empty()) src = "env";
  }
  const std::string key = make_tuning_key(dev, p, s);
  if (key_out) *key_out = key;
  if (auto hit = TuningCache::instance().find(key)) {
    const KernelConfig before = c;
    c = fill_unset(c, hit->config);
    if (src.empty() && c != before) src = "cache";
  }
  if (src.empty()) src = "heuristic";
  // (for a mode set above, the heuristic's settings of that mode)
  c = fill_unset(c, heuristic_config(s, walk_count(p, s), specialized_options(p), dev.sm_count,
                                     max_walk_segments(s, p.layout == Layout::kVarlen), c.fused_walk));
  if (source) *source = src;
  return c;
}

}  // namespace

KernelConfig resolve_kernel_config(const ForwardParams& p, const ProblemShape& s, std::string* source,
                                   std::string* key_out) {
  return resolve_for(kernel_call(p, s), source, key_out);
}

namespace {

// The launches of one call in the kernels' chunks, its settings resolved (from `source`).
// The kernels' parameters of one call in the kernels' chunks under settings `cfg`, in a workspace
// of `workspace_bytes` at `ws`.
struct CallPlan {
  WorkspacePlan w;
  kernels::SsdParams k;
  bool fused = false;
  kernels::PassStateConfig ps;
  kernels::ComputeOutConfig co;
};
CallPlan plan_call(const KernelCall& call, const KernelConfig& cfg, char* ws, std::size_t workspace_bytes) {
  const ForwardParams& p = call.p;
  const ProblemShape& s = call.s;
  CallPlan c;
  c.ps.dstate_tile = cfg.pass_state_dstate_tile;
  c.ps.stages = cfg.pass_state_stages;
  c.ps.segments = cfg.pass_state_segments;
  // A workspace without room for the two kernels' chunk states (sized under fused_walk settings,
  // forward() checked that it holds the least): fused_walk, whatever the settings say.
  const WorkspacePlan full = plan_workspace(p, s);
  c.fused = fused_walk_applies(s) && (cfg.fused_walk == 2 || workspace_bytes < full.total);
  c.w = c.fused && !fused_needs_chunk_states(p) ? plan_workspace(p, s, false) : full;
  const kernels::SsdParams k0 = make_kernel_params(p, s, c.w, ws);
  const int sm_count = current_device_id().sm_count;
  c.k = c.fused ? fused_params(p, k0, cfg.pass_state_segments, cfg.fused_walk_heads_per_cta, c.w, sm_count)
                : with_pass_state(k0, c.ps, c.w);
  const int walks = static_cast<int>(walk_count(p, s));
  if (!c.fused) c.co = compute_out_config(c.k, c.ps, cfg.compute_out_heads_per_cta, walks, sm_count);
  return c;
}

void run_call(const KernelCall& call, KernelConfig cfg, const std::string& source, void* workspace,
              std::size_t workspace_bytes, CUstream_st* stream_handle) {
  const ForwardParams& p = call.p;
  const ProblemShape& s = call.s;
  cudaStream_t stream = reinterpret_cast<cudaStream_t>(stream_handle);
  char* ws = static_cast<char*>(workspace);
  // Tuning on a miss (opt-in): only outside graph capture, within a 1 s budget.
  if (source == "heuristic" && autotune_on_miss() && !is_capturing(stream)) {
    TuneOptions opt;
    opt.budget_seconds = 1.0;
    opt.repeats = 3;
    cfg = gpu_tune(p, s, workspace, workspace_bytes, stream_handle, opt).best;
  }
  const CallPlan c = plan_call(call, cfg, ws, workspace_bytes);
  launch_prefix(p, s, c.w, ws, c.k, c.fused, stream);
  launch_walk_and_output(p, c.k, c.fused, c.ps, c.co, current_device_id().sm_count, stream);
}

}  // namespace

bool stores_walk_meta(const ForwardParams& call_p, const ProblemShape& call_s) {
  check_device_once();
  const KernelCall call = kernel_call(call_p, call_s);
  std::string source;
  const KernelConfig cfg = resolve_for(call, &source, nullptr);
  return plan_call(call, cfg, nullptr, workspace_now(call, cfg, source)).k.walk_meta;
}

void gpu_forward(const ForwardParams& call_p, const ProblemShape& call_s, void* workspace, std::size_t workspace_bytes,
                 CUstream_st* stream) {
  check_device_once();
  const KernelCall call = kernel_call(call_p, call_s);
  std::string source;
  const KernelConfig cfg = resolve_for(call, &source, nullptr);
  run_call(call, cfg, source, workspace, workspace_bytes, stream);
}

void gpu_forward_allocating(const ForwardParams& call_p, const ProblemShape& call_s, WorkspaceAllocator allocate,
                            void* context, CUstream_st* stream) {
  check_device_once();
  const KernelCall call = kernel_call(call_p, call_s);
  std::string source;
  const KernelConfig cfg = resolve_for(call, &source, nullptr);
  const std::size_t need = workspace_now(call, cfg, source);
  void* ws = nullptr;
  if (need > 0) {
    ws = allocate(need, context);
    if (ws == nullptr || reinterpret_cast<std::uintptr_t>(ws) % kAlign != 0) {
      throw Error(Error::Kind::kInvalidArgument, "allocate",
                  "allocate: expected a " + std::to_string(kAlign) + "-byte aligned pointer to " +
                      std::to_string(need) + " bytes, got address " +
                      std::to_string(reinterpret_cast<std::uintptr_t>(ws)));
    }
  }
  run_call(call, cfg, source, ws, need, stream);
}

TuneResult gpu_tune(const ForwardParams& call_p, const ProblemShape& call_s, void* workspace,
                    std::size_t workspace_bytes, CUstream_st* stream_handle, const TuneOptions& opt) {
  check_device_once();
  const KernelCall call = kernel_call(call_p, call_s);
  const ForwardParams& p = call.p;
  const ProblemShape& s = call.s;
  using clock = std::chrono::steady_clock;
  const auto t_start = clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(clock::now() - t_start).count(); };
  cudaStream_t stream = reinterpret_cast<cudaStream_t>(stream_handle);
  if (is_capturing(stream)) {
    throw Error(Error::Kind::kUnsupported, "stream",
                "stream: tune() cannot run while the stream captures a CUDA graph (it times kernels and synchronizes)");
  }
  // The two kernels are timed only where the workspace holds their chunk states (tune() checked
  // that it holds what fused_walk needs, the least).
  const WorkspacePlan full = plan_workspace(p, s);
  const bool two_fit = workspace_bytes >= full.total;
  const WorkspacePlan w = two_fit ? full : plan_workspace(p, s, false);
  char* ws = static_cast<char*>(workspace);
  const DeviceId dev = current_device_id();
  TuneResult r;
  r.key = make_tuning_key(dev, p, s);
  r.heuristic = heuristic_config(s, walk_count(p, s), specialized_options(p), dev.sm_count, w.max_segments);
  const kernels::SsdParams k = make_kernel_params(p, s, w, ws);

  cudaEvent_t ev0 = nullptr, ev1 = nullptr;
  kernels::check_cuda(cudaEventCreate(&ev0), "cudaEventCreate");
  kernels::check_cuda(cudaEventCreate(&ev1), "cudaEventCreate");
  struct EventGuard {
    cudaEvent_t a, b;
    ~EventGuard() { cudaEventDestroy(a); cudaEventDestroy(b); }
  } guard{ev0, ev1};
  const int repeats = std::max(1, opt.repeats);
  // GPU time of `batch` launches in a row, per launch.
  auto batch_ms = [&](const std::function<void()>& launch, int batch) {
    kernels::check_cuda(cudaEventRecord(ev0, stream), "cudaEventRecord");
    for (int b = 0; b < batch; ++b) launch();
    kernels::check_cuda(cudaEventRecord(ev1, stream), "cudaEventRecord");
    kernels::check_cuda(cudaEventSynchronize(ev1), "cudaEventSynchronize");
    float ms = 0.f;
    kernels::check_cuda(cudaEventElapsedTime(&ms, ev0, ev1), "cudaEventElapsedTime");
    return static_cast<double>(ms) / batch;
  };
  // Median GPU time of `launch`, after one warm-up launch. Calls under 0.2 ms are timed in
  // batches of up to 8 launches: the host's launch time of one call is then hidden behind the
  // GPU's work on the previous one (one call at a time, a 20 us call was timed at the host's pace,
  // and the tuner picked a setting 15% slower on the GPU: anchor dstate 64 at 1K, v17).
  auto time_ms = [&](const std::function<void()>& launch) {
    const double first = batch_ms(launch, 1);
    const int batch = static_cast<int>(std::clamp(0.2 / std::max(first, 1e-3), 1.0, 8.0));
    std::vector<double> t;
    for (int i = 0; i < repeats; ++i) t.push_back(batch_ms(launch, batch));
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  };
  auto report = [&](const std::string& kernel, const std::string& setting, double ms) {
    r.measured.push_back({kernel, setting, ms});
    if (opt.progress) {
      char line[160];
      std::snprintf(line, sizeof line, "  %-15s %-18s %9.4f ms   (%.1f s)", kernel.c_str(), setting.c_str(), ms,
                    elapsed());
      opt.progress(line);
    }
  };

  // A candidate replaces the best so far only when it is faster by more than 1%: the timings of
  // one setting move by about that much between repeats, and a noisy pick can be a slower one.
  auto clearly_faster = [](double ms, double best) { return ms < 0.99 * best; };
  // Each candidate is timed as the whole forward (prefix, fwd_pass_state, compute_out): the two
  // tuned kernels run alongside each other, so neither one's time alone is what a call costs.
  auto forward_ms = [&](const kernels::PassStateConfig& ps, int heads_per_cta) {
    const kernels::SsdParams kc = with_pass_state(k, ps, w);
    const kernels::ComputeOutConfig co =
        compute_out_config(kc, ps, heads_per_cta, static_cast<int>(walk_count(p, s)), dev.sm_count);
    return time_ms([&] {
      launch_prefix(p, s, w, ws, kc, false, stream);
      launch_walk_and_output(p, kc, false, ps, co, dev.sm_count, stream);
    });
  };
  auto fused_ms = [&](int segments, int heads) {
    const kernels::SsdParams kc = fused_params(p, k, segments, heads, w, dev.sm_count);
    return time_ms([&] {
      launch_prefix(p, s, w, ws, kc, true, stream);
      launch_walk_and_output(p, kc, true, {}, {}, dev.sm_count, stream);
    });
  };
  const bool fused_ok = fused_walk_applies(s);
  const bool heuristic_fused = fused_ok && r.heuristic.fused_walk == 2;
  auto out_of_time = [&] {
    if (elapsed() <= opt.budget_seconds) return false;
    r.complete = false;
    return true;
  };
  // The heuristic's own setting first (its time is heuristic_ms). Then the two kernels: stage 1,
  // fwd_pass_state's tile and ring (compute_out and the segments at the heuristic's setting);
  // stage 2, its walk segments with the best of those; stage 3, compute_out with the best so
  // far. Then fused_walk's segments, where it applies. Segment counts the shape reduces to the
  // same split are timed once. The heuristic's mode is kept unless the other is clearly faster.
  double fused_best_ms = 0.0;
  int fused_best_segments = r.heuristic.pass_state_segments;
  int fused_best_heads = r.heuristic.fused_walk_heads_per_cta;
  std::vector<std::pair<int32_t, int32_t>> fused_splits;  // (segments, heads per CTA) as they run
  auto try_fused = [&](int segs, int heads) {
    const kernels::SsdParams kc = fused_params(p, k, segs, heads, w, dev.sm_count);
    const std::pair<int32_t, int32_t> split{kc.nseg, kc.ws_heads};
    if (std::find(fused_splits.begin(), fused_splits.end(), split) != fused_splits.end()) return;
    fused_splits.push_back(split);
    const double ms = fused_ms(segs, heads);
    report("fused_walk", "segments=" + std::to_string(kc.nseg) + (kc.ws_heads == 2 ? " heads=2" : ""), ms);
    if (fused_splits.size() == 1 || clearly_faster(ms, fused_best_ms)) {
      fused_best_ms = ms;
      fused_best_segments = segs;
      fused_best_heads = heads;
    }
  };
  if (heuristic_fused) {
    try_fused(r.heuristic.pass_state_segments, r.heuristic.fused_walk_heads_per_cta);
    r.heuristic_ms = fused_best_ms;
  }
  // (the heuristic's settings for the two kernels, when it picked fused_walk)
  const KernelConfig h2 =
      heuristic_config(s, walk_count(p, s), specialized_options(p), dev.sm_count, w.max_segments, 1);
  const int hb_heur = h2.compute_out_heads_per_cta;
  std::vector<std::pair<int, int>> ps = {{h2.pass_state_dstate_tile, h2.pass_state_stages}};
  for (int nt : {32, 64}) {
    for (int st : {4, 2}) {
      if (nt != ps[0].first || st != ps[0].second) ps.push_back({nt, st});
    }
  }
  double best_ms = 0.0;  // of the two kernels
  kernels::PassStateConfig best_ps;
  KernelConfig two = h2;
  for (size_t i = 0; i < ps.size() && two_fit; ++i) {
    if ((i > 0 || heuristic_fused) && out_of_time()) break;
    kernels::PassStateConfig c;
    c.dstate_tile = ps[i].first;
    c.stages = ps[i].second;
    c.segments = h2.pass_state_segments;
    const double ms = forward_ms(c, hb_heur);
    report("fwd_pass_state", "nt=" + std::to_string(c.dstate_tile) + " stages=" + std::to_string(c.stages), ms);
    if (i == 0 && !heuristic_fused) r.heuristic_ms = ms;
    if (i == 0 || clearly_faster(ms, best_ms)) {
      best_ms = ms;
      best_ps = c;
      two.pass_state_dstate_tile = c.dstate_tile;
      two.pass_state_stages = c.stages;
    }
  }
  std::vector<int32_t> splits_timed = {with_pass_state(k, best_ps, w).nseg};
  for (int segs : {1, 2, 4, 8, 16}) {
    if (!two_fit || !r.complete || out_of_time()) break;
    kernels::PassStateConfig c = best_ps;
    c.segments = segs;
    const int32_t nseg = with_pass_state(k, c, w).nseg;
    if (std::find(splits_timed.begin(), splits_timed.end(), nseg) != splits_timed.end()) continue;
    splits_timed.push_back(nseg);
    const double ms = forward_ms(c, hb_heur);
    report("fwd_pass_state", "segments=" + std::to_string(nseg), ms);
    if (clearly_faster(ms, best_ms)) {
      best_ms = ms;
      best_ps = c;
      two.pass_state_segments = segs;
    }
  }
  std::vector<int> hbs;
  const int max_hb = static_cast<int>(std::min<int64_t>(s.headdim <= 64 ? 4 : 2, s.nheads / s.ngroups));
  for (int hb = 1; hb <= max_hb; hb *= 2) hbs.push_back(hb);
  for (size_t i = 0; i < hbs.size(); ++i) {
    if (!two_fit || !r.complete || out_of_time()) break;
    const double ms = forward_ms(best_ps, hbs[i]);
    report("compute_out", "heads=" + std::to_string(hbs[i]), ms);
    if (clearly_faster(ms, best_ms)) {
      best_ms = ms;
      two.compute_out_heads_per_cta = hbs[i];
    }
  }
  if (fused_ok) {
    // Every count (each split timed once): the fastest is not always a power of two or the
    // heuristic's (1 row x 20 heads x 16K: 6 segments 89.3 us, the heuristic's 13 92.4, 4 or 8
    // 106 / 118; H200, design log v33).
    // Both heads per CTA where the specialised kernel pairs them (fused_params: else 1).
    for (int heads : {1, 2}) {
      for (int segs = 1; segs <= w.max_segments; ++segs) {
        if (!r.complete || out_of_time()) break;
        try_fused(segs, heads);
      }
    }
  }
  r.best = two;
  r.best_ms = best_ms;
  // (KernelConfig as timed: fused_walk's segments or the two kernels' settings)
  auto pass_state_of = [](const KernelConfig& c) {
    kernels::PassStateConfig ps;
    ps.dstate_tile = c.pass_state_dstate_tile;
    ps.stages = c.pass_state_stages;
    ps.segments = c.pass_state_segments;
    return ps;
  };
  auto config_ms = [&](const KernelConfig& c) {
    if (c.fused_walk == 2) return fused_ms(c.pass_state_segments, c.fused_walk_heads_per_cta);
    return forward_ms(pass_state_of(c), c.compute_out_heads_per_cta);
  };
  // The split of the walks that a setting runs (a count the shape reduces to another's split
  // launches the same kernels).
  auto fused_of = [&](const KernelConfig& c) {
    return fused_params(p, k, c.pass_state_segments, c.fused_walk_heads_per_cta, w, dev.sm_count);
  };
  auto nseg_of = [&](const KernelConfig& c) {
    return c.fused_walk == 2 ? fused_of(c).nseg : with_pass_state(k, pass_state_of(c), w).nseg;
  };
  const bool two_timed = best_ms > 0.0;  // (the budget may end before the first)
  const bool fused_wins = !fused_splits.empty() && (!two_timed || (heuristic_fused ? !clearly_faster(best_ms, fused_best_ms)
                                                                                   : clearly_faster(fused_best_ms, best_ms)));
  if (fused_wins) {
    r.best.fused_walk = 2;
    r.best.pass_state_segments = fused_best_segments;
    r.best.fused_walk_heads_per_cta = fused_best_heads;
    r.best_ms = fused_best_ms;
  }
  // A pick other than the heuristic's setting, timed against it once more, alternately: the
  // heuristic's was timed first, when a GPU that was idle may still be speeding up, and the
  // settings' times drift by a few percent during the search. The pick stands only if it is
  // still clearly faster.
  const bool heuristic_runs = r.heuristic.fused_walk == 2 ? fused_ok : two_fit;
  // (settings that differ only in fields their mode does not use launch the same kernels)
  auto same_launch = [&](const KernelConfig& a, const KernelConfig& b) {
    if ((a.fused_walk == 2) != (b.fused_walk == 2) || nseg_of(a) != nseg_of(b)) return false;
    if (a.fused_walk == 2) return fused_of(a).ws_heads == fused_of(b).ws_heads;
    return a.pass_state_dstate_tile == b.pass_state_dstate_tile && a.pass_state_stages == b.pass_state_stages &&
           a.compute_out_heads_per_cta == b.compute_out_heads_per_cta;
  };
  if (r.complete && heuristic_runs && !same_launch(r.best, r.heuristic) && !out_of_time()) {
    double heur = config_ms(r.heuristic), best = config_ms(r.best);
    heur = std::min(heur, config_ms(r.heuristic));
    best = std::min(best, config_ms(r.best));
    report("recheck", "heuristic", heur);
    report("recheck", "pick", best);
    r.heuristic_ms = heur;
    if (clearly_faster(best, heur)) {
      r.best_ms = best;
    } else {
      r.best = r.heuristic;
      r.best_ms = heur;
    }
  }
  r.seconds = elapsed();
  if (opt.store) TuningCache::instance().store(r.key, {r.best, r.best_ms, r.heuristic_ms}, true);
  return r;
}

}  // namespace detail
}  // namespace mamba2_ssd
