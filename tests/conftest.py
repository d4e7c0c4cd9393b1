"""Test tiers.

Every test belongs to exactly one tier, cheapest first:

- ``unit``      pure Python, no processes started
- ``ranks``     multi-rank launches on gloo (CPU)
- ``nbgrader``  release and autograde of whole notebooks
- ``gpu``       needs CUDA; skipped here with the reason when there is none
- ``browser``   JupyterLab driven by Chromium; skipped when no browser is installed
- ``slurm``     launches through a private Slurm started for the session
                (tests/slurm); skipped when Slurm is not installed
- ``hub``       the course on a real JupyterHub (hub/) with real Unix users and
                Chromium (tests/hub); skipped without root, JupyterHub,
                configurable-http-proxy or the browser tier's needs

Each tier is a folder, ``tests/<tier>/``; the modules they share (the wrong
answers, the nbgrader and hostile-submission helpers) sit in ``tests/`` itself.
``make test`` runs every tier the machine can run; ``pytest tests/unit`` (or
``pytest -m unit``, or ``make test PYTEST_ARGS="-m unit"``) runs one.  A module
also names its tier with ``pytestmark = pytest.mark.<tier>`` (or a list holding
it, beside its timeout); collection fails for a module without one, for one whose
marker is not its folder's, and for a test module outside the tier folders, so
no test silently lands in no tier or in two.
"""
from __future__ import annotations

import os
import shutil

import pytest

TIERS = ("unit", "ranks", "nbgrader", "gpu", "browser", "slurm", "hub")


def pytest_configure(config):
    descriptions = {
        "unit": "no processes started",
        "ranks": "multi-rank launches on gloo",
        "nbgrader": "nbgrader release and autograde",
        "gpu": "needs CUDA (skipped without it)",
        "browser": "real Chromium driving JupyterLab (skipped without it)",
        "slurm": "launches through a local slurmctld and slurmd (skipped without Slurm)",
        "hub": "the course on a real JupyterHub with Unix users and Chromium (skipped without them)",
    }
    for tier in TIERS:
        config.addinivalue_line("markers", f"{tier}: {descriptions[tier]}")
    config.addinivalue_line("markers", "no_rows: a generic answer-suite test over a table the lab leaves empty")


def _cuda_reason() -> str | None:
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a hard dependency
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device visible (torch.cuda.is_available() is False)"
    return None


def browser_executable() -> str | None:
    """The Chromium binary the browser tier drives, or None."""
    for candidate in (os.environ.get("PARLAB_CHROMIUM"), "chromium", "chromium-browser",
                      "google-chrome"):
        if candidate and shutil.which(candidate):
            return shutil.which(candidate)
    return None


def _browser_reason() -> str | None:
    if browser_executable() is None:
        return "no Chromium found (apt-get install chromium, or set PARLAB_CHROMIUM)"
    try:
        import playwright  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install playwright)"
    return None


def _slurm_reason() -> str | None:
    missing = [t for t in ("munged", "slurmctld", "slurmd", "srun", "sinfo", "squeue", "scancel")
               if not (shutil.which(t) or os.path.exists(f"/usr/sbin/{t}"))]
    if missing:
        return (f"Slurm is not installed ({', '.join(missing)} missing): apt-get install slurmctld "
                "slurmd slurm-client munge")
    if os.getuid() != 0:
        return "starting slurmd with its dummy GPU devices needs root"
    return None


def _hub_reason() -> str | None:
    try:
        import jupyterhub  # noqa: F401
        import jupyterhub_idle_culler  # noqa: F401
    except ImportError:
        return "JupyterHub is not installed (pip install -c constraints/cpu.txt -e '.[hub]')"
    if not shutil.which("configurable-http-proxy"):
        return "configurable-http-proxy is not installed (npm install -g configurable-http-proxy)"
    if os.getuid() != 0:
        return "making the course's Unix users (useradd) and switching to them needs root"
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hub"))
    from course_hub import CourseHub
    blocked = CourseHub.environment_blockers()
    if blocked:
        return (f"the students' servers run {sys.executable}, but other users cannot enter "
                f"{', '.join(blocked)} (chmod o+x {' '.join(blocked)}, as .ci/run does)")
    return _browser_reason()


def pytest_collection_modifyitems(config, items):
    # tests/answer_suite.py: a generic test over a table the lab leaves empty does not exist there
    empty = [item for item in items if item.get_closest_marker("no_rows")]
    if empty:
        config.hook.pytest_deselected(items=empty)
        items[:] = [item for item in items if not item.get_closest_marker("no_rows")]
    untiered = sorted({item.nodeid.split("::")[0] for item in items
                       if not any(item.get_closest_marker(t) for t in TIERS)})
    if untiered:
        raise pytest.UsageError("test modules without a tier marker (pytestmark = "
                                f"pytest.mark.<{'|'.join(TIERS)}>): {', '.join(untiered)}")
    here = os.path.dirname(os.path.abspath(__file__))
    misplaced = set()
    for item in items:
        folder = os.path.relpath(str(item.path), here).split(os.sep)[0]
        marked = [t for t in TIERS if item.get_closest_marker(t)]
        if folder not in TIERS or folder not in marked:
            misplaced.add(f"{item.nodeid.split('::')[0]} (marked {', '.join(marked)})")
    if misplaced:
        raise pytest.UsageError("test modules outside their tier's folder (tests/<tier>/, with "
                                f"pytestmark = pytest.mark.<tier>): {', '.join(sorted(misplaced))}")
    reasons = {"gpu": _cuda_reason(), "browser": _browser_reason(),
               "slurm": _slurm_reason() if any(i.get_closest_marker("slurm") for i in items) else None,
               "hub": _hub_reason() if any(i.get_closest_marker("hub") for i in items) else None}
    for item in items:
        for tier, reason in reasons.items():
            if reason and item.get_closest_marker(tier):
                item.add_marker(pytest.mark.skip(reason=f"{tier} tier: {reason}"))


@pytest.fixture(autouse=True, scope="session")
def _record_verdicts():
    """With PARLAB_VERDICT_LOG=FILE, every verdict ``harness.grade_batch`` returns is appended to
    FILE as one JSON line (test, exercise, answer, hidden, message): run the suite before and after
    a change to the checks and diff the two files to show that no verdict or message moved."""
    path = os.environ.get("PARLAB_VERDICT_LOG")
    if not path:
        yield
        return
    import json

    from parlab.grading import harness
    original = harness.grade_batch

    def recording(batch, *args, **kwargs):
        report = original(batch, *args, **kwargs)
        test = os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" ", 1)[0]
        with open(path, "a") as log:
            for (exercise, name), message in sorted(report.items()):
                log.write(json.dumps({"test": test, "exercise": exercise, "answer": name,
                                      "hidden": kwargs.get("hidden", False), "message": message}) + "\n")
        return report

    harness.grade_batch = recording
    yield
    harness.grade_batch = original


@pytest.fixture(scope="session")
def serial_lab00(tmp_path_factory):
    """One serial nbgrader grading of lab 00's good submissions (class_course.SerialLab00) for the
    session: tests/nbgrader/test_grade_class.py and tests/slurm/test_grade_array.py compare
    ``parlab grade`` (local, and as a Slurm array) with it."""
    from class_course import SerialLab00

    return SerialLab00.start(tmp_path_factory.mktemp("serial-lab00"))


# ---------------------------------------------------------------- where the suite's time goes
# pytest's --durations lists the slowest tests; a tier's or a module's whole cost (its many small
# tests, its fixtures' setup) is what decides whether CI fits its budget, so every run ends with both.
_SPENT: dict[str, float] = {}


def pytest_runtest_logreport(report):
    module = report.nodeid.split("::")[0]
    _SPENT[module] = _SPENT.get(module, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    if not _SPENT:
        return
    tiers: dict[str, float] = {}
    for module, seconds in _SPENT.items():
        tier = module.split("/")[1] if module.startswith("tests/") and module.count("/") >= 2 else "?"
        tiers[tier] = tiers.get(tier, 0.0) + seconds
    write = terminalreporter.write_line
    terminalreporter.section("time by tier and module (setup + call + teardown)")
    write("  ".join(f"{t} {s:.0f} s" for t, s in sorted(tiers.items(), key=lambda kv: -kv[1])))
    for module, seconds in sorted(_SPENT.items(), key=lambda kv: -kv[1])[:15]:
        write(f"{seconds:8.1f} s  {module}")
