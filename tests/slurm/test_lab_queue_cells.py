"""Labs 01 and 04's "on 8 GPUs, through the queue" cells, run in a real kernel against the queue.

Each lab's solution notebook is cut down to what its queue cell needs (the
imports, the solution cells, the cell that defines the measurement, and the
queue cell itself) and run by nbclient with ``PARLAB_SCHEDULER=slurm``, as
a student's server on a hub with Slurm would run it.  While the queue cell
runs, a blocker job holds all 8 GPUs of partition ``gpu``, so the cell must
show that it waits; the blocker is cancelled once the cell's job has waited
a few seconds.  The cell must then show every rank's live line and the
result table.  conftest.nothing_left checks squeue and the processes after.
"""
import os
import subprocess
import threading
import time

import nbformat
import pytest
from nbclient import NotebookClient
from slurm_helpers import parlab_jobs, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BLOCKER = "parlab-blocker"


def queue_cell_notebook(lab: str, defines: str) -> nbformat.NotebookNode:
    """The lab's imports, solution cells, the cell defining ``defines`` and the queue cell."""
    nb = nbformat.read(os.path.join(ROOT, "solutions", lab, f"{lab}.ipynb"), as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    solutions = [c for c in code if c.metadata.get("nbgrader", {}).get("solution")]
    definition = [c for c in code if f"def {defines}(" in c.source]
    queue = [c for c in code if "offer_queue(" in c.source]
    assert len(definition) == 1 and len(queue) == 1, (lab, len(definition), len(queue))
    nb.cells = [code[0]] + solutions + definition + queue
    return nb


def _state(name: str) -> str:
    out = subprocess.run(["squeue", "-h", "--name", name, "-o", "%T"], capture_output=True, text=True)
    return out.stdout.strip()


def _hold_the_gpus_until_one_waits(blocker: subprocess.Popen, waited: list) -> None:
    """Cancel the blocker once another parlab job has been pending for 3 s (or after 60 s)."""
    deadline = time.monotonic() + 60
    since = None
    while time.monotonic() < deadline and blocker.poll() is None:
        pending = [j for j in parlab_jobs() if j.endswith("PENDING") and BLOCKER not in j]
        since = (since or time.monotonic()) if pending else None
        if since and time.monotonic() - since > 3:
            waited.append(pending[0])
            break
        time.sleep(0.2)
    subprocess.run(["scancel", "--name", BLOCKER], check=False)


def _stdout(cell) -> str:
    parts = []
    for out in cell.outputs:
        if out.output_type == "stream":
            parts.append(out.text)
        elif out.output_type == "error":
            parts.append(f"{out.ename}: {out.evalue}")
    return "".join(parts)


@pytest.mark.parametrize("lab,defines,results", [
    ("01-collectives", "time_all_reduces", ("busbw (from your bandwidths function), 8 ranks on gloo", "64 KiB")),
    ("04-pipeline-parallel", "timed_steps", ("p = 8", "    gpipe   8 ", "     1f1b   8 ", "real 1f1b   8 ")),
])
def test_the_queue_cell_waits_streams_each_rank_and_shows_the_result(monkeypatch, tmp_path, lab, defines,
                                                                      results):
    monkeypatch.setenv("PARLAB_SCHEDULER", "slurm")  # the kernel inherits it, as from a hub's spawner
    nb = queue_cell_notebook(lab, defines)
    blocker = subprocess.Popen(["srun", "--partition=gpu", "--gres=gpu:8", f"--job-name={BLOCKER}",
                                "sleep", "120"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    waited: list = []
    try:
        assert wait_for("blocker running", lambda: _state(BLOCKER) == "RUNNING", 30), parlab_jobs()
        client = NotebookClient(nb, timeout=240, kernel_name="python3",
                                resources={"metadata": {"path": str(tmp_path)}})
        watcher = threading.Thread(target=_hold_the_gpus_until_one_waits, args=(blocker, waited))
        with client.setup_kernel():
            for index, cell in enumerate(nb.cells[:-1]):
                client.execute_cell(cell, index)
            watcher.start()
            client.execute_cell(nb.cells[-1], len(nb.cells) - 1)
        watcher.join()
    finally:
        subprocess.run(["scancel", "--name", BLOCKER], check=False)
        blocker.wait(timeout=30)
    shown = _stdout(nb.cells[-1])
    assert waited, f"the cell's job never waited behind the blocker:\n{shown}"
    assert "goes to the Slurm queue for 8 GPUs" in shown, shown
    assert "waits, position 1 in the queue (Resources" in shown, shown  # the wait, with its reason
    for rank in range(8):  # every rank's live line, tagged by the launcher
        assert f"[rank {rank}] " in shown and f" {rank} of 8 on cpu (gloo), Slurm job " in shown, shown
    assert all(r in shown for r in results), shown  # the result table
    assert shown.index("waits, position") < shown.index("[rank 0] ") < shown.index(results[0]), shown
    assert "Error" not in shown, shown


def test_without_a_scheduler_or_while_grading_the_cell_only_says_so(monkeypatch, capsys):
    import parlab

    monkeypatch.delenv("PARLAB_SCHEDULER", raising=False)
    monkeypatch.delenv("PARLAB_AUTOGRADE", raising=False)
    assert parlab.launch.offer_queue("the sweep", gpus=8) is False
    line = capsys.readouterr().out
    assert line.count("\n") == 1 and "no scheduler is configured" in line and "PARLAB_SCHEDULER=slurm" in line
    monkeypatch.setenv("PARLAB_SCHEDULER", "slurm")
    monkeypatch.setenv("PARLAB_AUTOGRADE", "/tmp/grading")
    assert parlab.launch.offer_queue("the sweep", gpus=8) is False
    assert "not run while the notebook is graded" in capsys.readouterr().out
    monkeypatch.delenv("PARLAB_AUTOGRADE")
    assert parlab.launch.offer_queue("the sweep", gpus=8) is True
    monkeypatch.setenv("PARLAB_SCHEDULER", "slurmm")
    with pytest.raises(ValueError, match="PARLAB_SCHEDULER must be one of local, slurm, got 'slurmm'"):
        parlab.launch.offer_queue("the sweep", gpus=8)
