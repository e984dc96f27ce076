#!/usr/bin/env python3
"""Where the host time of one eager call goes, on a machine with a Hopper GPU and torch.

    PYTHONPATH=python python3 scripts/host-profile.py [--profile]

For anchor-like calls (4 rows, 8 heads, headdim 64, D, initial and final states) prints the
microseconds per call, back to back with a synchronisation around each batch, of: the public
call; the binding with its outputs given (`_C.forward_torch`); both with the launches skipped
(`_C._set_skip_forward`); the allocations the public call makes; the argument checks; the
binding's attribute reads of 9 tensors. A one-element `Tensor.add_` first: the host's speed,
which these times follow (it varies by up to 1.5x between runs on one machine). --profile adds a
torch.profiler table of 20 calls (kernels launched, CUDA runtime calls per call).
"""
import argparse
import statistics
import time

import torch

import mamba2_ssd
from mamba2_ssd import _C
from mamba2_ssd import torch_ops as ops

DEV = "cuda"


def per_call_us(fn, n=2000, reps=7):
    for _ in range(50):
        fn()
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(times)


def inputs(b, l, h, p, n):
    x = torch.randn(b, l, h, p, device=DEV, dtype=torch.bfloat16)
    dt = torch.rand(b, l, h, device=DEV, dtype=torch.bfloat16) * 0.1
    A = -torch.rand(h, device=DEV)
    B = torch.randn(b, l, 1, n, device=DEV, dtype=torch.bfloat16)
    C = torch.randn(b, l, 1, n, device=DEV, dtype=torch.bfloat16)
    D = torch.randn(h, device=DEV)
    s0 = torch.randn(b, h, p, n, device=DEV)
    return x, dt, A, B, C, D, s0


def report(name, us):
    print(f"  {name:34s} {us:7.2f} us")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", action="store_true", help="add a torch.profiler table of 20 calls")
    args = ap.parse_args()
    one = torch.zeros(1, device=DEV)
    report("Tensor.add_ (the host's speed)", per_call_us(lambda: one.add_(1.0)))
    fn = mamba2_ssd.mamba_chunk_scan_combined
    for b, l, n in [(4, 1024, 64), (4, 4096, 128), (4, 1024, 256)]:
        x, dt, A, B, C, D, s0 = inputs(b, l, 8, 64, n)
        out = torch.empty_like(x)
        final = torch.empty(b, 8, 64, n, device=DEV)
        index = x.get_device()
        binding_args = (x, dt, A, B, C, 128, D, None, None, s0, None, None, False, 0.0, float("inf"), False, -1,
                        out, final, None, None, None)  # fmt: skip

        def public():
            return fn(x, dt, A, B, C, 128, D=D, initial_states=s0, return_final_states=True)

        def binding():
            _C.forward_torch(*binding_args, ops._current_stream(index), index)

        print(f"batch {b}, seqlen {l}, dstate {n}:")
        report("public call", per_call_us(public))
        report("forward_torch, outputs given", per_call_us(binding))
        _C._set_skip_forward(True)
        try:
            report("public call, no launch", per_call_us(public))
            report("forward_torch, no launch", per_call_us(binding))
        finally:
            _C._set_skip_forward(False)
        report("out: empty_like", per_call_us(lambda: torch.empty_like(x, memory_format=torch.contiguous_format)))
        report("final states: new_empty", per_call_us(lambda: x.new_empty((b, 8, 64, n), dtype=torch.float32)))
        report("workspace: _alloc_workspace (1 MB)", per_call_us(lambda: ops._alloc_workspace(1 << 20, x)))
        report("checks and _eager",
               per_call_us(lambda: (ops._check_inputs((x, dt, A, B, C, D, None, None, s0), torch.is_grad_enabled()),
                                    ops._eager(True, x))))  # fmt: skip
        report("attribute reads, 9 tensors",
               per_call_us(lambda: [(t.dtype, t.is_cuda, t.get_device(), t.shape, t.stride(), t.data_ptr())
                                    for t in (x, dt, A, B, C, D, s0, out, final)]))  # fmt: skip
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        x, dt, A, B, C, D, s0 = inputs(4, 1024, 8, 64, 64)
        fn(x, dt, A, B, C, 128, D=D, initial_states=s0, return_final_states=True)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                fn(x, dt, A, B, C, 128, D=D, initial_states=s0, return_final_states=True)
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=25))


if __name__ == "__main__":
    main()
