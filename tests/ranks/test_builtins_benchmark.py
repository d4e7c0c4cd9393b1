"""benchmarks/builtins.py's correctness half: each lab's reference solution (exec'd from its
solution notebook) gives the same numbers as torch's built-in that it is timed against.

One 2-rank launch at the smallest sizes, no timing (``--quick --check-only``): about 15 s.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(200)]

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "builtins.py"
PAIRS = ("ring_all_reduce", "BucketedDP", "ParallelMLP", "one_f_one_b_step", "ZeRO3")


def test_hand_written_and_builtins_agree():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--check-only"], capture_output=True,
                          text=True, timeout=180, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    for name in PAIRS:
        assert name in proc.stdout, f"no {name} row:\n{proc.stdout}"
    assert proc.stdout.count(": agree") == 6, proc.stdout
    assert "DIFFER" not in proc.stdout, proc.stdout
