"""Loads the Triton forward of mamba_ssm (the reference we compare against) without its CUDA
extensions.

mamba_ssm/__init__.py imports selective_scan_cuda and the model classes, which need compiled
extensions that are not built on the benchmark machine. The Triton path needs none of them, so
this module registers empty package modules for `mamba_ssm`, `mamba_ssm.ops`,
`mamba_ssm.ops.triton` and `mamba_ssm.utils` in sys.modules, each with `__path__` pointing into
the source tree, and then imports `mamba_ssm.ops.triton.ssd_combined` through the ordinary
path-based import system: it and what it imports (ssd_*.py, softplus, layernorm_gated,
k_activations, utils/torch.py, utils/determinism.py) load from the tree's files. The package
__init__.py files themselves never run. causal_conv1d is optional in ssd_combined.py.

The tree is, in order of preference: the path given, .deps/mamba_ssm-2.3.2.post1 (what
`scripts/fetch-deps.sh --bench` unpacks), or an installed mamba_ssm (located with
importlib.util.find_spec, which does not run its __init__).
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys
import types

EXPECTED_VERSION = "2.3.2.post1"
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_SRC = os.path.join(REPO_ROOT, ".deps", "mamba_ssm-" + EXPECTED_VERSION)

_SYNTHETIC = ("mamba_ssm", "mamba_ssm.ops", "mamba_ssm.ops.triton", "mamba_ssm.utils")


class LoaderError(RuntimeError):
    pass


def _package_dir(src: str) -> str:
    """Accepts either the sdist root (holding mamba_ssm/) or the mamba_ssm/ folder itself."""
    src = os.path.abspath(src)
    if os.path.isfile(os.path.join(src, "mamba_ssm", "ops", "triton", "ssd_combined.py")):
        return os.path.join(src, "mamba_ssm")
    if os.path.isfile(os.path.join(src, "ops", "triton", "ssd_combined.py")):
        return src
    raise LoaderError(f"no mamba_ssm/ops/triton/ssd_combined.py under {src}")


def _tree_version(pkg_dir: str) -> str | None:
    """The version the tree declares (mamba_ssm/__init__.py's __version__, else PKG-INFO)."""
    init = os.path.join(pkg_dir, "__init__.py")
    try:
        with open(init, encoding="utf-8") as f:
            m = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", f.read(), re.M)
        if m:
            return m.group(1)
    except OSError:
        pass
    pkg_info = os.path.join(os.path.dirname(pkg_dir), "PKG-INFO")
    try:
        with open(pkg_info, encoding="utf-8") as f:
            m = re.search(r"^Version:\s*(\S+)", f.read(), re.M)
        if m:
            return m.group(1)
    except OSError:
        pass
    return None


def find_source(src: str | None = None) -> tuple[str, str]:
    """Returns (mamba_ssm package dir, how it was found)."""
    if src:
        return _package_dir(src), "--mamba-src"
    if os.path.isdir(DEFAULT_SRC):
        return _package_dir(DEFAULT_SRC), ".deps"
    mod = sys.modules.get("mamba_ssm")
    if mod is not None and getattr(mod, "__path__", None):
        return _package_dir(list(mod.__path__)[0]), "already imported"
    spec = importlib.util.find_spec("mamba_ssm")
    if spec is not None and spec.submodule_search_locations:
        return _package_dir(list(spec.submodule_search_locations)[0]), "installed"
    raise LoaderError(
        "mamba_ssm not found: pass --mamba-src PATH, run scripts/fetch-deps.sh --bench, "
        "or install mamba_ssm")


def _register_packages(pkg_dir: str) -> None:
    for name in _SYNTHETIC:
        rel = name.split(".")[1:]
        path = os.path.join(pkg_dir, *rel)
        mod = types.ModuleType(name, f"synthetic package for {path} (bench/mamba_ref_loader.py)")
        mod.__path__ = [path]
        mod.__package__ = name
        mod.__file__ = os.path.join(path, "__init__.py")
        mod.__mamba2_ssd_bench_synthetic__ = True
        sys.modules[name] = mod
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, mod)


def _clear(prefix: str = "mamba_ssm") -> None:
    for name in [n for n in sys.modules if n == prefix or n.startswith(prefix + ".")]:
        del sys.modules[name]


def load(src: str | None = None, expect_version: str | None = EXPECTED_VERSION):
    """Imports mamba_ssm.ops.triton.ssd_combined from the tree and returns (module, info).

    info: dict with the tree's path, how it was found, its version and whether it matched.
    Raises LoaderError when no tree is found; an ImportError from torch/triton/einops propagates.
    """
    pkg_dir, how = find_source(src)
    version = _tree_version(pkg_dir)
    info = {
        "path": pkg_dir,
        "found_by": how,
        "version": version,
        "version_ok": expect_version is None or version == expect_version,
    }
    existing = sys.modules.get("mamba_ssm")
    if existing is not None:
        same = list(getattr(existing, "__path__", []) or [])[:1] == [pkg_dir]
        if not (same and getattr(existing, "__mamba2_ssd_bench_synthetic__", False)):
            _clear()
    if "mamba_ssm" not in sys.modules:
        _register_packages(pkg_dir)
    try:
        mod = importlib.import_module("mamba_ssm.ops.triton.ssd_combined")
    except BaseException:
        # Leave no half-imported modules behind, so that a retry starts clean.
        _clear()
        raise
    loaded_from = os.path.realpath(getattr(mod, "__file__", "") or "")
    if not loaded_from.startswith(os.path.realpath(pkg_dir) + os.sep):
        raise LoaderError(f"ssd_combined loaded from {loaded_from}, not from {pkg_dir}")
    info["module_file"] = loaded_from
    return mod, info


def triton_stages(mod):
    """The five forward stages of the combined Triton call, by the names mamba_ssm uses."""
    return {
        "_chunk_cumsum_fwd": mod._chunk_cumsum_fwd,
        "_chunk_state_fwd": mod._chunk_state_fwd,
        "_state_passing_fwd": mod._state_passing_fwd,
        "_bmm_chunk_fwd": mod._bmm_chunk_fwd,
        "_chunk_scan_fwd": mod._chunk_scan_fwd,
    }


if __name__ == "__main__":
    m, i = load(sys.argv[1] if len(sys.argv) > 1 else None)
    print(i)
    print(sorted(triton_stages(m)))
