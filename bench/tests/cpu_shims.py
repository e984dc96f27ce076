"""Test-only shims that let mamba_ssm's Triton forward run on the CPU under TRITON_INTERPRET=1
(never used by bench.py itself):
- torch.cuda.device(None) raises without a GPU; ssd_*.py wrap every launch in it;
- the interpreter cannot take int() of the 1-element arrays that Python's min() over two
  scalars yields (ssd_chunk_state.py: chunk_size_limit = min(...); range(0, chunk_size_limit, ...)).
Set TRITON_INTERPRET=1 (and MAMBA_DETERMINISTIC=1: one autotune config, no benchmarking)
before triton is imported."""
import contextlib


def apply():
    import torch
    torch.cuda.device = lambda *a, **k: contextlib.nullcontext()
    import triton.runtime.interpreter as TI
    orig = TI._patch_lang_tensor

    def patched(tensor, scope):
        orig(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    TI._patch_lang_tensor = patched
