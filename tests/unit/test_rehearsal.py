"""``make rehearsal``'s verdicts and report (``parlab.preflight.rehearsal``), on outputs of the three steps.

The steps themselves (the GPU tier, preflight, 30 students) run only on the course's host; here each
verdict rule is checked on the lines those commands print: the GPU tier fails when nothing ran on a
GPU, preflight on its FAIL verdict, the load when a result was lost or the run was refused.
"""
from __future__ import annotations

import pytest

from parlab.preflight import rehearsal
from parlab.preflight.rehearsal import Step

pytestmark = pytest.mark.unit

GPU_OK = "tests/gpu/test_nccl.py ....s\n===== 14 passed, 2 skipped in 212.40s (0:03:32) =====\n"
GPU_NONE = ("SKIPPED [16] tests/gpu/conftest.py:20: gpu tier: CUDA is not available\n"
            "===== 16 skipped, 1520 deselected in 31.02s =====\n")
PREFLIGHT_OK = "--   preflight    http://127.0.0.1:8000, ...\nok   gpus   ...\n--   preflight    all ok\n"
PREFLIGHT_BAD = ("--   preflight    http://127.0.0.1:8000, ...\n"
                 "FAIL gpu-queue    8 GPUs (H100): busbw 40 GB/s ...\n--   preflight    1 FAILED: gpu-queue\n")
LOAD = "30 students at once, 2-rank launch each: {got} of 30 results right\n  all 30 kernels up after 80.1 s\n"


def step(name: str, rc: int, output: str) -> Step:
    return Step(name, ["cmd"], rc, output, 10.0)


@pytest.mark.parametrize("name, rc, output, want", [
    ("gpu-tier", 0, GPU_OK, ("ok", "14 passed, 2 skipped")),
    ("gpu-tier", 0, GPU_NONE, ("FAIL", "nothing ran on a GPU (16 skipped, 1520 deselected): see the skip reasons "
                                       "(pytest -rs) in the output")),
    ("gpu-tier", 1, "===== 1 failed, 13 passed in 200.00s =====\n", ("FAIL", "1 failed, 13 passed")),
    ("gpu-tier", 2, "ImportError while loading conftest\n", ("FAIL", "no pytest summary (exit 2)")),
    ("preflight", 0, PREFLIGHT_OK, ("ok", "all ok")),
    ("preflight", 1, PREFLIGHT_BAD, ("FAIL", "1 FAILED: gpu-queue")),
    ("preflight", 127, "could not start /opt/conda/envs/parlab/bin/parlab: No such file\n",
     ("FAIL", "no verdict line (exit 127)")),
    ("load", 0, LOAD.format(got=30), ("ok", "30 of 30 results right")),
    ("load", 0, LOAD.format(got=20), ("FAIL", "20 of 30 results right")),
    ("load", 1, "refused: 30 students need about 45.0 GB idle ...\n",
     ("FAIL", "refused: 30 students need about 45.0 GB idle ...")),
])
def test_each_steps_verdict(name, rc, output, want):
    assert rehearsal.verdict(step(name, rc, output), students=30) == want


def test_fewer_students_than_asked_is_a_failure():
    assert rehearsal.verdict(step("load", 0, LOAD.format(got=30)), students=40)[0] == "FAIL"


def test_the_report_puts_the_verdicts_first_then_every_output():
    steps = [step("gpu-tier", 0, GPU_OK), step("preflight", 1, PREFLIGHT_BAD), step("load", 0, LOAD.format(got=30))]
    text, failed = rehearsal.report_text(steps, 30, "2026-12-06T09:00:00Z", ["host dgx: 112 usable cores"])
    head = text.split("\n\n====", 1)[0].splitlines()
    assert head[:2] == ["parlab rehearsal 2026-12-06T09:00:00Z", "host dgx: 112 usable cores"]
    assert head[3:] == ["ok   gpu-tier   14 passed, 2 skipped (10 s)",
                        "FAIL preflight  1 FAILED: gpu-queue (10 s)",
                        "ok   load       30 of 30 results right (10 s)",
                        "--   rehearsal  1 FAILED: preflight"]
    assert failed == ["preflight"]
    assert all(f"==== {s.name}: cmd (exit {s.rc}, 10 s)\n{s.output}" in text for s in steps)
