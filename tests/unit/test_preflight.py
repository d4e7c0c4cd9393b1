"""``parlab preflight``'s parts that need no hub: the solutions' fingerprints, the search, and the verdicts.

The whole command runs in the hub tier (tests/hub/test_hub_preflight.py): it passes on the kit's hub
and flags each broken deployment.  Here: what counts as solution text, that a file holding it is
found and the student edition holds none, and that each check's verdict names its remedy.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from parlab import preflight
from parlab.preflight import probe

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def secret():
    return preflight.secret_lines(REPO)


def test_the_fingerprints_are_solution_lines_nothing_public_shows(secret):
    assert len(secret) > 100
    released = "\n".join("".join(c["source"]) for nb in sorted((REPO / "labs").glob("*/*.ipynb"))
                         for c in json.loads(nb.read_text())["cells"])
    assert not [line for line in secret if line in released.splitlines() or len(line) < probe.MIN_LINE]


def test_the_search_finds_a_copied_solution_and_skips_one_common_line(secret, tmp_path, monkeypatch):
    fingerprints = {probe.fingerprint(line) for line in secret}
    lines = sorted(secret)
    (tmp_path / "copied.py").write_text("\n".join("    " + line for line in lines[:3]) + "\n")
    (tmp_path / "one_line.py").write_text(lines[5] + "\n")  # one such line alone: common code may write it
    (tmp_path / "notes.ipynb").write_text(json.dumps({"cells": [{"source": [lines[7] + "\n", lines[9]]}]}))
    found = probe.search(fingerprints, [str(tmp_path)])
    assert found["hits"] == {str(tmp_path / "copied.py"): 3, str(tmp_path / "notes.ipynb"): 2}, found
    assert found["single"] == 1 and found["files"] == 3 and not found["incomplete"]
    # the searching student's own home holds their own answers: left out
    monkeypatch.setenv("HOME", str(tmp_path))
    assert probe.search(fingerprints, [str(tmp_path)])["hits"] == {}
    # every lab's source notebook is found, and the docs (shipped to students in part) hold none
    labs = sorted(p.name for p in (REPO / "solutions").iterdir() if p.is_dir())
    found = probe.search(fingerprints, [str(REPO / "solutions"), str(REPO / "docs")])
    assert sorted(Path(p).parent.name for p in found["hits"]) == labs, found


def _verdicts(check, *args) -> dict:
    report = preflight.Report()
    check(report, *args)
    return {line.split()[1]: line for line in report.lines}


def test_each_verdict_fails_with_its_remedy():
    limits = {"cpus": [0, 1], "host_cpus": 2, "cpus_after_widening": [0, 1], "cpuset": "0-1",
              "memory": "9223372036854771712", "memory_write": "EACCES", "pids": None, "pids_write": "absent"}
    got = _verdicts(preflight.check_limits, {"limits": limits}, 31)
    assert got["cpus"].startswith("FAIL") and "all 2 cores of the host (a class of 31)" in got["cpus"]
    assert got["memory"].startswith("FAIL") and "PARLAB_HUB_MEM_LIMIT" in got["memory"]
    assert got["pids"].startswith("FAIL") and "TasksMax" in got["pids"]
    widened = dict(limits, cpus=[0], cpus_after_widening=[0, 1], memory="3221225472", memory_write="written",
                   pids="2048", pids_write="EACCES")
    got = _verdicts(preflight.check_limits, {"limits": widened}, 31)
    assert "widened their CPU set from 1 to 2 cores" in got["cpus"] and "raised their own memory" in got["memory"]
    assert got["pids"].startswith("ok")
    got = _verdicts(preflight.check_gpus, {"gpus": {"/dev/nvidia0": "ENXIO", "/dev/nvidiactl": "EPERM"}})
    assert got["gpus"].startswith("FAIL") and "opens /dev/nvidia0." in got["gpus"] and "DevicePolicy" in got["gpus"]
    got = _verdicts(preflight.check_kernel, {"kernel": {"python": "/usr/bin/python3", "parlab": None,
                                                        "parlab_error": "ModuleNotFoundError"}})
    assert got["kernel"].startswith("FAIL") and "kernelspec named python3" in got["kernel"]
    got = _verdicts(preflight.check_kernel, {"kernel": {"python": "/e/bin/python", "server_python": "/e/bin/python",
                                                        "parlab": "/repo/src/parlab/__init__.py",
                                                        "parlab_repository": "/repo"}})
    assert "editable install" in got["kernel"] and "make student-dist" in got["kernel"]
    got = _verdicts(preflight.check_validate, {"validate": {"timeout": 30, "failed": ["VALIDATE WOULD QUEUE"]}}, 300)
    assert "30 s, the course's 300 s" in got["validate"] and "went for the queue" in got["validate"]


def test_the_report_file_and_the_exit_status(tmp_path):
    report = preflight.Report()
    report.ok("hub", "answers")
    assert preflight._finish(report, tmp_path / "r.txt") == 0
    report.fail("homes", "open", "chmod 700")
    assert preflight._finish(report, tmp_path / "r.txt") == 1
    text = (tmp_path / "r.txt").read_text()
    assert "FAIL homes" in text and "Remedy: chmod 700" in text and "1 FAILED: homes" in text


def test_it_refuses_to_run_without_root(monkeypatch, capsys):
    monkeypatch.setattr(preflight.os, "geteuid", lambda: 1000)
    assert preflight.main([]) == 2 and "as root" in capsys.readouterr().err


def test_the_grading_verdict():
    escape = "/tmp/parlab-preflight-escaped-x"
    boxed = '"PREFLIGHT-HOSTILE-GOT [\'/tmp/parlab-preflight-escaped-x\']\\n"'  # wrote only the box's own /tmp
    full = {"pf-solution": (7.0, 7.0), "pf-hostile": (6.0, 7.0)}
    assert preflight.grading_problems(full, boxed, escape, escaped=False) == []
    assert preflight.grading_problems(full, '"PREFLIGHT-HOSTILE-GOT []\\n"', escape, escaped=False) == []
    breach = "\"PREFLIGHT-HOSTILE-GOT ['/course/gradebook.db', '/tmp/parlab-preflight-escaped-x']\\n\""
    assert preflight.grading_problems(full, breach, escape, escaped=True) == [
        "the hostile submission reached ['/course/gradebook.db']"]
    assert preflight.grading_problems(full, boxed, escape, escaped=True) == [
        "the hostile submission reached /tmp/parlab-preflight-escaped-x on the host"]
    short = {"pf-solution": (6.0, 7.0)}
    assert preflight.grading_problems(short, "no output", escape, escaped=False) == [
        "lab 00's solution scored 6.0 of 7.0", "the hostile cell's output is missing from its autograded notebook"]
