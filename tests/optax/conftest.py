"""The JAX tests' setting: XLA on one thread (the machine is small and shared), and the float64
spec oracle of tests/optim importable here."""

import os
import sys
from pathlib import Path

# Before jax starts its CPU backend: one thread for Eigen's kernels.
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false "
                                   "intra_op_parallelism_threads=1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "optim"))
