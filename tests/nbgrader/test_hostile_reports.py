"""Lab 01 answers that forge what a grading rank reports, graded by ``parlab grade``.

An answer runs inside the rank process that reports its results, so it can
write that report itself.  One submission, graded by ``parlab grade``:

- exercise 1 (``all_reduce_rs_ag``) is a function that computes nothing: on
  a grading rank it writes the rank's result file into its launch folder
  (``$PARLAB_JOB_DIR``) with every task "done" and no case in it, then ends
  the rank with ``os._exit(0)``.  Bound to all four answer names, that
  scored 9/9 before the judge accounted for every case; now it scores 0,
  with a message naming the first case that never came back;
- exercise 2, a "ring" that sums with the default group's ``allreduce``
  method, and exercise 3, a "tree" that broadcasts with torch's functional
  collectives: both ways round the ``dist.<op>`` functions the rule spy used
  to patch.  Each scores 0, with the rule quoted and the call named;
- exercise 4 is the solution's: full marks, though the forged reports of
  exercise 1 ended the launches it shared.

Then the course tree is unchanged and nothing is left running.  What the
spy's record is worth against a student who sets out to deceive it is in
docs/instructor.md ("What a verdict rests on").
"""
from __future__ import annotations

import json
import subprocess
import sys
import time

import nbformat
import pytest

from class_course import add_students, gradebook_scores, make_course, notebook, submit, tool_env
from hostile_submissions import answer_cell, tree_digest
from nbgrader_harness import TOKEN_VAR, leftover_processes, source_notebook

pytestmark = [pytest.mark.nbgrader, pytest.mark.timeout(900)]

LAB = "01-collectives"
TOKEN = "hostile-reports-test"
CONFIG = "\nc.Execute.timeout = 60\n"
POINTS = {"test_ex1_rs_ag": 2, "test_ex2_ring": 3, "test_ex3_tree": 2, "test_ex4_bw": 2}
ANSWERS = {"ex1_rs_ag": "all_reduce_rs_ag", "ex2_ring": "ring_all_reduce",
           "ex3_tree": "tree_broadcast", "ex4_bw": "bandwidths"}

FORGER = '''
import os


def forged(*args, **kwargs):
    """On a grading rank: this rank's report, every task done with no case run; then exit."""
    import torch

    job, rank = os.environ.get("PARLAB_JOB_DIR"), os.environ.get("RANK")
    if job is None or rank is None:
        raise NotImplementedError
    keys = ("rs_ag", "ring", "tree", "bandwidths")
    names = ("all_reduce_rs_ag", "ring_all_reduce", "tree_broadcast", "bandwidths")
    slots = [str(i) for i in range(64)] + [f"lab01.{k}\\n{n}" for k in keys for n in names]
    report = {"__backend__": "gloo", **{slot: {"cases": []} for slot in slots}}
    torch.save(report, os.path.join(job, f".forged.{rank}"))
    os.replace(os.path.join(job, f".forged.{rank}"), os.path.join(job, f"result.{rank}"))
    os._exit(0)


{name} = forged
'''

EVADING_RING = '''
import torch.distributed as dist


def ring_all_reduce(x):
    total = x.clone()
    dist.distributed_c10d._get_default_group().allreduce([total]).wait()
    return total
'''

EVADING_TREE = '''
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol


def tree_broadcast(x, root):
    out = funcol.broadcast(x.clone(), root, dist.group.WORLD)
    return out.wait() if hasattr(out, "wait") else out
'''


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = make_course(tmp_path_factory.mktemp("reports") / "course", [LAB])
    with open(root / "nbgrader_config.py", "a") as f:
        f.write(CONFIG)
    cheat = notebook(LAB, root)
    answer_cell(cheat, "ex1_rs_ag").source = FORGER.replace("{name}", "all_reduce_rs_ag")
    answer_cell(cheat, "ex2_ring").source = EVADING_RING
    answer_cell(cheat, "ex3_tree").source = EVADING_TREE
    add_students(root, ["cheat"])
    submit(root, "cheat", LAB, cheat)
    before = tree_digest(root)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "parlab", "grade", LAB], cwd=root,
                          env=tool_env(**{TOKEN_VAR: TOKEN}), stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=850)
    print(f"\nparlab grade over 1 submission: {time.perf_counter() - start:.1f} s\n{proc.stdout}")
    return {"root": root, "rc": proc.returncode, "out": proc.stdout, "before": before,
            "scores": gradebook_scores(root, LAB), "after": tree_digest(root)}


def _messages(root, student: str) -> dict[str, str]:
    """{test cell: the text of its outputs} in the student's autograded notebook."""
    nb = nbformat.read(root / "autograded" / student / LAB / source_notebook(LAB).name, as_version=4)
    return {c.metadata["nbgrader"]["grade_id"]: json.dumps(c.get("outputs", []))
            for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") in POINTS}


def test_forged_reports_and_calls_around_dist_score_nothing_the_rest_full_marks(graded):
    assert graded["rc"] == 0, graded["out"]
    assert graded["scores"]["cheat"] == {"test_ex1_rs_ag": (0.0, 2.0), "test_ex2_ring": (0.0, 3.0),
                                         "test_ex3_tree": (0.0, 2.0), "test_ex4_bw": (2.0, 2.0)}, graded["out"]


def test_the_messages_say_what_came_back_and_which_call_broke_the_rule(graded):
    said = _messages(graded["root"], "cheat")
    assert "gave no result for" in said["test_ex1_rs_ag"], said["test_ex1_rs_ag"]
    assert "cases came back from that rank" in said["test_ex1_rs_ag"]
    assert "ProcessGroup.allreduce (what dist.all_reduce runs)" in said["test_ex2_ring"], said["test_ex2_ring"]
    assert "no collective" in said["test_ex2_ring"]
    assert "_c10d_functional.broadcast" in said["test_ex3_tree"], said["test_ex3_tree"]


def test_course_unchanged_and_nothing_left(graded):
    assert graded["after"] == graded["before"]
    deadline = time.monotonic() + 15
    while (left := leftover_processes(TOKEN)) and time.monotonic() < deadline:
        time.sleep(0.25)
    assert not left, left
