"""A submission that uses CUDA, graded by ``parlab grade`` inside the operating-system boundary.

Skipped without CUDA (tests/conftest.py).  The boxes bind the GPUs' device
nodes (``/dev/nvidia*``) in, and bound memory by a cgroup only, since CUDA
cannot live with ``RLIMIT_AS`` (parlab.grading.boundary).  Lab 00's
solution, with one answer cell that runs a CUDA kernel in the student's
kernel (its box) and an answer that runs one on the rank that grades it
(the ranks' box): where either box had no GPU, that cell or that answer
fails and the exercise scores 0.  Checked: every exercise full marks, the
kernel's cell printed the device it used, nothing of the run left.
(Written where no GPU is lent: docs/instructor.md says it is untested here.)
"""
from __future__ import annotations

import time

import pytest

import hostile_submissions as hostile
from class_course import add_students, gradebook_scores, make_course, notebook, submit, tool_env
from nbgrader_harness import TOKEN_VAR, leftover_processes

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(900)]

TOKEN = "gpu-boxed-grading-test"
USES_CUDA = '''
import torch
print("cuda in the kernel's box:", torch.cuda.get_device_name(0), torch.ones(4, device="cuda").sum().item())

def weight_bytes(n_params, bytes_per_param):
    import torch
    assert torch.ones(1, device="cuda").item() == 1.0  # on the grading rank, inside the ranks' box
    return n_params * bytes_per_param
'''


def test_a_submission_using_cuda_is_graded_inside_the_boxes(tmp_path):
    root = make_course(tmp_path / "course", [hostile.LAB])
    add_students(root, ["cu"])
    nb = notebook(hostile.LAB, root)
    next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "weight_bytes").source = USES_CUDA
    submit(root, "cu", hostile.LAB, nb)
    got = hostile.grade(hostile.HostileClass(root, ["cu"], None, {}, {}), TOKEN, "--workers", "1",
                        env=tool_env(**{TOKEN_VAR: TOKEN}))
    assert got["rc"] == 0, got["out"]
    assert gradebook_scores(root, hostile.LAB)["cu"] == {cell: (float(p), float(p)) for cell, p in hostile.POINTS.items()}
    assert "cuda in the kernel's box: " in hostile.outputs(root, "cu") and "4.0" in hostile.outputs(root, "cu")
    deadline = time.monotonic() + 15
    while leftover_processes(TOKEN) and time.monotonic() < deadline:
        time.sleep(0.25)
    assert not leftover_processes(TOKEN)
