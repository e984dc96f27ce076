// The GPU forward: workspace plan, kernel parameters from the validated call, launch order,
// and the choice of kernel settings for the shape.
#include "dispatch/launch.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string>

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

}  // namespace kernels

namespace detail {

namespace {

constexpr std::size_t kAlign = 256;
std::size_t align_up(std::size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

// Byte offsets of the workspace regions (0-sized regions are absent).
struct WorkspacePlan {
  std::size_t cum = 0, dtp = 0, wst = 0, carry = 0, states = 0, offsets = 0, x16 = 0, b16 = 0, c16 = 0, total = 0;
  std::size_t states_bytes = 0, offsets_bytes = 0, x16_bytes = 0, bc16_bytes = 0;
};

WorkspacePlan plan_workspace(const ForwardParams& p, const ProblemShape& s) {
  WorkspacePlan w;
  const std::size_t per_slot = static_cast<std::size_t>(s.batch) * s.nheads * s.nchunks * p.chunk_size;
  std::size_t off = 0;
  w.cum = off; off = align_up(off + per_slot * sizeof(float));
  w.dtp = off; off = align_up(off + per_slot * sizeof(float));
  w.wst = off; off = align_up(off + per_slot * sizeof(float));
  w.carry = off; off = align_up(off + per_slot / p.chunk_size * sizeof(float));
  if (!p.chunk_states.present()) {
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

}  // namespace

std::size_t gpu_workspace_size(const ForwardParams& p, const ProblemShape& s) {
  return plan_workspace(p, s).total;
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

void gpu_forward(const ForwardParams& p, const ProblemShape& s, void* workspace, std::size_t workspace_bytes,
                 CUstream_st* stream_handle) {
  (void)workspace_bytes;
  check_device_once();
  cudaStream_t stream = reinterpret_cast<cudaStream_t>(stream_handle);
  const WorkspacePlan w = plan_workspace(p, s);
  char* ws = static_cast<char*>(workspace);
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
    k.init_sb = p.initial_states.stride(0);
    k.init_sh = p.initial_states.stride(1);
    k.init_sp = p.initial_states.stride(2);
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
  k.carry = reinterpret_cast<float*>(ws + w.carry);
  k.state_dtype = s.state_dtype;
  if (p.chunk_states.present()) {
    const TensorView& c = p.chunk_states;
    k.states = c.data;
    if (varlen) { k.st_sb = 0; k.st_sc = c.stride(0); k.st_sh = c.stride(1); k.st_sp = c.stride(2); }
    else { k.st_sb = c.stride(0); k.st_sc = c.stride(1); k.st_sh = c.stride(2); k.st_sp = c.stride(3); }
  } else {
    k.states = ws + w.states;
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
    k.fin_sb = p.final_states.stride(0);
    k.fin_sh = p.final_states.stride(1);
    k.fin_sp = p.final_states.stride(2);
  }
  if (p.varlen_states.present()) {
    k.varlen_states = p.varlen_states.data;
    k.vs_dtype = p.varlen_states.dtype;
    k.vs_sb = p.varlen_states.stride(0);
    k.vs_sh = p.varlen_states.stride(1);
    k.vs_sp = p.varlen_states.stride(2);
  }

  const int64_t walks = varlen ? s.nseq : s.batch;
  if (walks > 65535 || s.nheads > 65535) {
    kernels::throw_launch_error("fwd_pass_state: at most 65535 rows/sequences and 65535 heads per launch, got " +
                                std::to_string(walks) + " and " + std::to_string(s.nheads));
  }

  // ---- launches
  if (io_fp32) {
    const int64_t b4 = varlen ? 1 : s.batch;
    kernels::launch_convert_to_bf16(static_cast<const float*>(p.x.data), b4, s.seqlen, s.nheads, xs.sb, xs.st, xs.s2,
                                    s.headdim, ws + w.x16, stream);
    kernels::launch_convert_to_bf16(static_cast<const float*>(p.B.data), b4, s.seqlen, s.ngroups, bs.sb, bs.st, bs.s2,
                                    s.dstate, ws + w.b16, stream);
    kernels::launch_convert_to_bf16(static_cast<const float*>(p.C.data), b4, s.seqlen, s.ngroups, cs.sb, cs.st, cs.s2,
                                    s.dstate, ws + w.c16, stream);
  }
  if (varlen) kernels::launch_chunk_offsets(k, stream);
  kernels::launch_chunk_cumsum(k, stream);
  KernelChoice choice = choose_kernels(s, walks);
  // Manual overrides for measuring variants (the autotuner sets the same fields).
  if (const char* e = std::getenv("MAMBA2_SSD_PASS_STATE_NT")) choice.pass_state.dstate_tile = std::atoi(e) == 32 ? 32 : 64;
  if (const char* e = std::getenv("MAMBA2_SSD_HEADS_PER_CTA")) choice.compute_out.heads_per_cta = std::max(1, std::atoi(e));
  kernels::launch_fwd_pass_state(k, choice.pass_state, stream);
  kernels::launch_compute_out(k, choice.compute_out, stream);
  if (!varlen && p.varlen_states.present()) kernels::launch_varlen_states(k, stream);
}

}  // namespace detail
}  // namespace mamba2_ssd
