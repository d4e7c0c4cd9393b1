"""Validate on the hub never queues: the queue cells of labs 01 and 04 stand down under it.

nbgrader's Validate runs the notebook inside the server's request handler under the cell timeout;
with the Slurm queue on (``PARLAB_SCHEDULER=slurm``) each queue cell would submit an 8-GPU job there.
The notebook here is the two labs' queue cells as released, then a check that the queue was on.
It is validated the way the Validate button does (``ValidateAssignmentHandler.load_config``, the
student's config found through ``JUPYTER_CONFIG_PATH``, ``Validator(config=...)``): both cells stand
down and it passes.  Without the hub's config (nbgrader's defaults) the same notebook fails: the
cells try the queue, which is the failure the config prevents.
"""
from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

pytestmark = [pytest.mark.nbgrader, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
LABS = ("01-collectives", "04-pipeline-parallel")


def _queue_cells() -> list[str]:
    cells = []
    for lab in LABS:
        nb = nbformat.read(REPO / "labs" / lab / f"{lab}.ipynb", as_version=4)
        found = [c.source for c in nb.cells if c.cell_type == "code" and "parlab.launch.offer_queue(" in c.source]
        assert len(found) == 1, (lab, len(found))
        cells.append(found[0])
    return cells


def _notebook(path: Path) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.metadata.kernelspec = {"name": "python3", "display_name": "Python 3", "language": "python"}
    sources = ["import os, parlab\nimport torch.distributed as dist", *_queue_cells(),
               "assert parlab.launch.queue_configured(), 'the queue was not on: the cells stood down for that'"]
    for i, source in enumerate(sources):
        cell = nbformat.v4.new_code_cell(source)
        cell.metadata.nbgrader = {"grade": True, "grade_id": f"cell-{i}", "points": 1, "solution": False,
                                  "locked": True, "schema_version": 3}
        nb.cells.append(cell)
    nbformat.write(nb, path)
    return path


def _validate(path: Path, monkeypatch, config_path: Path | None) -> dict:
    from nbgrader.server_extensions.validate_assignment.handlers import ValidateAssignmentHandler
    from nbgrader.validator import Validator

    if config_path is None:
        monkeypatch.delenv("JUPYTER_CONFIG_PATH", raising=False)
    else:
        monkeypatch.setenv("JUPYTER_CONFIG_PATH", str(config_path))
    monkeypatch.chdir(path.parent)
    return Validator(config=ValidateAssignmentHandler.load_config(None)).validate(str(path))


def test_validate_runs_the_queue_cells_without_queueing(tmp_path, monkeypatch):
    monkeypatch.setenv("PARLAB_SCHEDULER", "slurm")
    monkeypatch.setenv("PARLAB_SLURM_PARTITION", "no-such-partition")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no sinfo/srun of a test cluster on the way
    for name in ("PARLAB_AUTOGRADE", "PARLAB_VALIDATE"):
        monkeypatch.delenv(name, raising=False)
    path = _notebook(tmp_path / "queue-cells.ipynb")
    assert _validate(path, monkeypatch, REPO / "hub" / "student") == {}
    failed = _validate(path, monkeypatch, None).get("failed", [])
    assert [f["source"] for f in failed] == _queue_cells(), failed  # both cells went for the queue
