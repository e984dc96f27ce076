// The GPU side of the mamba2-ssd tool (see cli_gpu.hpp). Every CUDA call is checked; a failure
// throws mamba2_ssd::Error (Kind::kCuda) naming the call. RAII frees all device resources.
#include "cli_gpu.hpp"

#include <cstdio>
#include <string>
#include <utility>

#include "mamba2_ssd/api.hpp"
#include "mamba2_ssd/error.hpp"
#include "mamba2_ssd/tuning.hpp"

#ifdef MAMBA2_SSD_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace cli::gpu {

using mamba2_ssd::Device;
using mamba2_ssd::Error;

std::string describe(const DeviceInfo& d) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s (device %d, sm_%d%d, %d SMs, %.1f GiB)", d.name.c_str(), d.index, d.major,
                d.minor, d.sms, static_cast<double>(d.memory_bytes) / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

#ifdef MAMBA2_SSD_WITH_CUDA

namespace {

void check(cudaError_t e, const char* call) {
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    throw Error(Error::Kind::kCuda, "", std::string(call) + " failed: " + cudaGetErrorName(e) + " (" +
                                            cudaGetErrorString(e) + ")");
  }
}

#define CLI_CUDA(call) check((call), #call)

struct DeviceMemory {
  void* ptr = nullptr;
  std::size_t bytes = 0;
  DeviceMemory(std::size_t n, const std::string& what) : bytes(n) {
    const cudaError_t e = cudaMalloc(&ptr, n);
    if (e != cudaSuccess) {
      ptr = nullptr;
      (void)cudaGetLastError();
      throw Error(Error::Kind::kCuda, "",
                  "cudaMalloc of " + std::to_string(n) + " bytes for " + what + " failed: " + cudaGetErrorName(e) +
                      " (" + cudaGetErrorString(e) + ")");
    }
  }
  ~DeviceMemory() {
    if (ptr) (void)cudaFree(ptr);
  }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
};

struct Event {
  cudaEvent_t e = nullptr;
  Event() { CLI_CUDA(cudaEventCreate(&e)); }
  ~Event() {
    if (e) (void)cudaEventDestroy(e);
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
};

struct Graph {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ~Graph() {
    if (exec) (void)cudaGraphExecDestroy(exec);
    if (graph) (void)cudaGraphDestroy(graph);
  }
};

}  // namespace

bool built_with_cuda() { return true; }

DeviceInfo select_device() {
  int count = 0;
  CLI_CUDA(cudaGetDeviceCount(&count));
  int current = 0;
  CLI_CUDA(cudaGetDevice(&current));
  int chosen = -1;
  cudaDeviceProp prop{};
  CLI_CUDA(cudaGetDeviceProperties(&prop, current));
  if (prop.major == 9 && prop.minor == 0) {
    chosen = current;
  } else {
    for (int d = 0; d < count && chosen < 0; ++d) {
      CLI_CUDA(cudaGetDeviceProperties(&prop, d));
      if (prop.major == 9 && prop.minor == 0) chosen = d;
    }
  }
  if (chosen < 0) {
    throw Error(Error::Kind::kUnsupported, "device", "device: no CUDA device of compute capability 9.0 found");
  }
  CLI_CUDA(cudaSetDevice(chosen));
  DeviceInfo info;
  info.index = chosen;
  info.name = prop.name;
  info.major = prop.major;
  info.minor = prop.minor;
  info.sms = prop.multiProcessorCount;
  info.memory_bytes = prop.totalGlobalMem;
  return info;
}

struct Mirror::Impl {
  Problem& prob;
  std::vector<std::unique_ptr<DeviceMemory>> tensors;
  std::vector<std::pair<HostTensor*, DeviceMemory*>> outputs;
  std::unique_ptr<DeviceMemory> workspace;
  std::size_t ws_bytes = 0;
  std::size_t total = 0;
  cudaStream_t stream = nullptr;
  mamba2_ssd::ForwardParams params;

  explicit Impl(Problem& p) : prob(p) {}
  ~Impl() {
    for (HostTensor* t : prob.tensors()) t->device = nullptr;
    if (stream) (void)cudaStreamDestroy(stream);
  }

  void forward() {
    mamba2_ssd::forward(params, workspace ? workspace->ptr : nullptr, ws_bytes,
                        reinterpret_cast<CUstream_st*>(stream));
  }
};

Mirror::Mirror(Problem& prob) : impl_(std::make_unique<Impl>(prob)) {
  Impl& m = *impl_;
  for (HostTensor* t : prob.tensors()) {
    if (!t->present()) continue;
    // At least 16 bytes, so that an empty tensor still has a (present) pointer.
    auto mem = std::make_unique<DeviceMemory>(t->bytes < 16 ? 16 : t->bytes, t->name);
    if (!t->is_output && t->bytes > 0) {
      CLI_CUDA(cudaMemcpy(mem->ptr, t->data(), t->bytes, cudaMemcpyHostToDevice));
    }
    t->device = mem->ptr;
    m.total += mem->bytes;
    if (t->is_output) m.outputs.emplace_back(t, mem.get());
    m.tensors.push_back(std::move(mem));
  }
  m.params = prob.params(Device::kCUDA);
  // (the size every kernel setting fits in: `tune` times them all on this mirror)
  m.ws_bytes = mamba2_ssd::tune_workspace_size(m.params);
  if (m.ws_bytes > 0) {
    m.workspace = std::make_unique<DeviceMemory>(m.ws_bytes, "the workspace");
    m.total += m.ws_bytes;
  }
  CLI_CUDA(cudaStreamCreateWithFlags(&m.stream, cudaStreamNonBlocking));
  poison_outputs();
}

Mirror::~Mirror() = default;

std::size_t Mirror::workspace_bytes() const { return impl_->ws_bytes; }
std::size_t Mirror::device_bytes() const { return impl_->total; }

void Mirror::poison_outputs() {
  Impl& m = *impl_;
  for (auto& o : m.outputs) CLI_CUDA(cudaMemsetAsync(o.second->ptr, 0xff, o.second->bytes, m.stream));
  if (m.workspace) CLI_CUDA(cudaMemsetAsync(m.workspace->ptr, 0xff, m.ws_bytes, m.stream));
  CLI_CUDA(cudaStreamSynchronize(m.stream));
}

mamba2_ssd::TuneResult Mirror::tune(const mamba2_ssd::TuneOptions& options) {
  Impl& m = *impl_;
  return mamba2_ssd::tune(m.params, m.workspace ? m.workspace->ptr : nullptr, m.ws_bytes, m.stream, options);
}

std::string Mirror::kernel_config_description() {
  std::string source;
  const mamba2_ssd::KernelConfig c = mamba2_ssd::kernel_config_for(impl_->params, &source);
  return mamba2_ssd::to_string(c) + " (" + source + ")";
}

void Mirror::run_once() {
  Impl& m = *impl_;
  m.forward();
  CLI_CUDA(cudaStreamSynchronize(m.stream));
  CLI_CUDA(cudaGetLastError());
}

double Mirror::time_calls(int64_t warmup, int64_t iters, bool graph) {
  Impl& m = *impl_;
  Event start, stop;
  Graph g;
  if (graph) {
    // One eager call first: module loading and the library's one-time device checks happen
    // outside the capture.
    m.forward();
    CLI_CUDA(cudaStreamSynchronize(m.stream));
    // Relaxed mode: forward() validates its arguments (cudaPointerGetAttributes) while capturing.
    CLI_CUDA(cudaStreamBeginCapture(m.stream, cudaStreamCaptureModeRelaxed));
    try {
      m.forward();
    } catch (...) {
      cudaGraph_t partial = nullptr;
      (void)cudaStreamEndCapture(m.stream, &partial);
      if (partial) (void)cudaGraphDestroy(partial);
      (void)cudaGetLastError();
      throw;
    }
    CLI_CUDA(cudaStreamEndCapture(m.stream, &g.graph));
    CLI_CUDA(cudaGraphInstantiateWithFlags(&g.exec, g.graph, 0));
  }
  auto call = [&] {
    if (graph) CLI_CUDA(cudaGraphLaunch(g.exec, m.stream));
    else m.forward();
  };
  for (int64_t i = 0; i < warmup; ++i) call();
  CLI_CUDA(cudaStreamSynchronize(m.stream));
  CLI_CUDA(cudaGetLastError());
  CLI_CUDA(cudaEventRecord(start.e, m.stream));
  for (int64_t i = 0; i < iters; ++i) call();
  CLI_CUDA(cudaEventRecord(stop.e, m.stream));
  CLI_CUDA(cudaEventSynchronize(stop.e));
  CLI_CUDA(cudaGetLastError());
  float ms = 0.0f;
  CLI_CUDA(cudaEventElapsedTime(&ms, start.e, stop.e));
  return static_cast<double>(ms) / static_cast<double>(iters);
}

void Mirror::download_outputs() {
  Impl& m = *impl_;
  CLI_CUDA(cudaStreamSynchronize(m.stream));
  for (auto& o : m.outputs) {
    if (o.first->bytes > 0) CLI_CUDA(cudaMemcpy(o.first->data(), o.second->ptr, o.first->bytes, cudaMemcpyDeviceToHost));
  }
}

std::vector<unsigned char> Mirror::output_bytes() {
  Impl& m = *impl_;
  CLI_CUDA(cudaStreamSynchronize(m.stream));
  std::size_t n = 0;
  for (auto& o : m.outputs) n += o.first->bytes;
  std::vector<unsigned char> all(n);
  std::size_t at = 0;
  for (auto& o : m.outputs) {
    if (o.first->bytes > 0) {
      CLI_CUDA(cudaMemcpy(all.data() + at, o.second->ptr, o.first->bytes, cudaMemcpyDeviceToHost));
    }
    at += o.first->bytes;
  }
  return all;
}

#else  // no CUDA in this build

namespace {
[[noreturn]] void no_cuda() {
  throw Error(Error::Kind::kUnsupported, "device",
              "device: this build of mamba2-ssd has no CUDA support (configured with MAMBA2_SSD_CUDA=OFF)");
}
}  // namespace

bool built_with_cuda() { return false; }
DeviceInfo select_device() { no_cuda(); }

struct Mirror::Impl {};
Mirror::Mirror(Problem&) { no_cuda(); }
Mirror::~Mirror() = default;
std::size_t Mirror::workspace_bytes() const { return 0; }
std::size_t Mirror::device_bytes() const { return 0; }
void Mirror::poison_outputs() { no_cuda(); }
void Mirror::run_once() { no_cuda(); }
mamba2_ssd::TuneResult Mirror::tune(const mamba2_ssd::TuneOptions&) { no_cuda(); }
std::string Mirror::kernel_config_description() { no_cuda(); }
double Mirror::time_calls(int64_t, int64_t, bool) { no_cuda(); }
void Mirror::download_outputs() { no_cuda(); }
std::vector<unsigned char> Mirror::output_bytes() { no_cuda(); }

#endif

}  // namespace cli::gpu
