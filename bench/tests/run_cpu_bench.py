"""Runs bench.main on the CPU with mamba_ssm's Triton kernels interpreted (test only):
python3 bench/tests/run_cpu_bench.py [bench.py arguments]"""
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("MAMBA_DETERMINISTIC", "1")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import cpu_shims  # noqa: E402

cpu_shims.apply()
import bench  # noqa: E402

if __name__ == "__main__":
    sys.exit(bench.main(sys.argv[1:]))
