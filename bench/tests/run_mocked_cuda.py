"""Runs bench.main on the CPU with torch.cuda's timing/graph API replaced by host stand-ins, so
that the GPU-only code paths of bench.py (graph timing, ceilings, event timing of the Triton
stages, the profiler call, the CUDA branch of collect_meta) execute once (test only: the numbers
mean nothing). Arguments as bench.py's; --device cpu is implied."""
import contextlib
import os
import sys
import time
import types

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("MAMBA_DETERMINISTIC", "1")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import cpu_shims  # noqa: E402

cpu_shims.apply()
import torch  # noqa: E402

import bench  # noqa: E402

CALLS = {"capture": 0, "replay": 0, "events": 0}


class FakeEvent:
    def __init__(self, enable_timing=False):
        self.t = None
        CALLS["events"] += 1

    def record(self, stream=None):
        self.t = time.perf_counter()

    def elapsed_time(self, other):
        return max((other.t - self.t) * 1e3, 1e-3)


class FakeStream:
    def wait_stream(self, s):
        pass


class FakeGraph:
    def replay(self):
        CALLS["replay"] += 1


@contextlib.contextmanager
def fake_graph(g, **kw):
    CALLS["capture"] += 1
    yield


torch.cuda.Event = FakeEvent
torch.cuda.Stream = lambda *a, **k: FakeStream()
torch.cuda.current_stream = lambda *a, **k: FakeStream()
torch.cuda.stream = lambda s: contextlib.nullcontext()
torch.cuda.CUDAGraph = FakeGraph
torch.cuda.graph = fake_graph
torch.cuda.synchronize = lambda *a, **k: None
torch.cuda.empty_cache = lambda: None
torch.cuda.get_device_properties = lambda d: types.SimpleNamespace(
    name="FakeGPU", multi_processor_count=132, total_memory=141 * 2 ** 30, L2_cache_size=60 * 2 ** 20, major=9,
    minor=0)
bench.COPY_BYTES = 1 << 20
bench.GEMM_N = 256

_orig_init = bench.Ctx.__init__


def _init(self, args, torch_):
    _orig_init(self, args, torch_)
    self.cuda = True   # take the GPU branches; tensors stay on the CPU


bench.Ctx.__init__ = _init

if __name__ == "__main__":
    rc = bench.main(["--device", "cpu"] + sys.argv[1:])
    print("MOCK_CALLS", CALLS)
    sys.exit(rc)
