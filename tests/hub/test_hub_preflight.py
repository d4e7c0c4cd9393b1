"""``parlab preflight`` on the tier's hub: it passes on the kit as deployed, and flags each broken deployment.

Two runs of the command an admin runs (as root, the deployed environment's ``parlab preflight``,
the course-admin token, the hub's config folder), on the tier's session hub after the course's story:

1. The kit as ``CourseHub.deploy`` and ``prepare_course`` set it up, after the course's story
   (test_hub_course.py), with two NVIDIA device nodes made for the run (``/dev/nvidia0``,
   ``/dev/nvidiactl``: major 195, mode 0666, as the driver makes them; no driver behind them
   here, so an open that passes every permission check fails with ENXIO): every check ok, no
   solution text readable by the student anywhere, the GPUs refused by the server's devices
   cgroup (EPERM), the throw-away student gone afterwards.  The boxed grading check is left out
   (``--skip grading``, CI's time: about 90 s here): the story has graded as root outside any
   server, and ``make hub-preflight`` runs it (docs/jupyterhub.md, "What was tested").
2. One hub restart into a deployment broken every way the issue lists at once: the servers
   started by plain ``LocalProcessSpawner`` (no CPU set, memory, process or devices cgroup)
   with no memory limit, a ``python3`` kernelspec that runs a Python without parlab (the wrong
   kernel), the instructor's home opened (solutions readable), the exchange's course folder
   owned by a student, and no bwrap on the PATH.  Each is flagged, with its remedy.
"""
from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hub_tier import INSTRUCTOR, REPO, STATE, STUDENTS

pytestmark = [pytest.mark.hub, pytest.mark.timeout(1500)]

FAKE_DEVICES = {"/dev/nvidia0": 0, "/dev/nvidiactl": 255}
LINE = re.compile(r"^(ok|FAIL|skip|--)\s+(\S+)\s+(.*)$")


def preflight(hub, name: str, *extra: str, path: str | None = None) -> tuple[int, dict, str]:
    """Run ``parlab preflight`` as the admin would; returns (exit status, {check: (status, text)}, report)."""
    report = STATE / f"preflight-{name}.txt"
    argv = [str(hub.python.parent / "parlab"), "preflight", "--url", hub.url, "--token-file", str(hub.token_file),
            "--hub-dir", str(hub.hub_dir), "--instructor", INSTRUCTOR, "--exchange", str(hub.exchange),
            "--report", str(report), "--search-budget", "300", *extra]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "JUPYTER"))}
    env["PATH"] = path or f"{hub.python.parent}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1400, cwd="/")
    text = report.read_text() if report.exists() else proc.stdout + proc.stderr
    artifacts = REPO / "test-artifacts" / "hub"  # the report, as an admin keeps it
    artifacts.mkdir(parents=True, exist_ok=True)
    (artifacts / report.name).write_text(text)
    checks = {}
    for line in text.splitlines():
        found = LINE.match(line)
        if found and found.group(1) != "--":
            checks[found.group(2)] = (found.group(1), found.group(3))
    return proc.returncode, checks, text


def no_throwaway_left(hub) -> None:
    assert not [u.pw_name for u in pwd.getpwall() if u.pw_name.startswith("parlab-pf-")]
    assert not [u["name"] for u in hub.api("GET", "/users") if u["name"].startswith("parlab-pf-")]


@pytest.fixture
def fake_gpu_nodes():
    made = []
    if any(Path("/dev").glob("nvidia*")):
        pytest.skip("this host has NVIDIA device nodes of its own: the tier makes none")
    try:
        for path, minor in FAKE_DEVICES.items():
            os.mknod(path, 0o666 | 0o020000, os.makedev(195, minor))  # S_IFCHR
            os.chmod(path, 0o666)
            made.append(path)
        yield made
    finally:
        for path in made:
            os.unlink(path)


def test_preflight_passes_on_the_kit_as_deployed(course_hub, fake_gpu_nodes):
    hub = course_hub
    # The grading check is left out here (CI's time): the story graded as root outside any server already
    # (test_hub_course.py), and the check's verdicts are tests/unit/test_preflight.py's.
    rc, checks, text = preflight(hub, "kit", "--skip", "grading")
    assert rc == 0, text
    assert {c for c, (status, _) in checks.items() if status != "ok"} == {"gpu-queue", "grading"}, text
    assert checks["grading"] == ("skip", "--skip grading"), text
    assert set(checks) >= {"hub", "server", "solutions", "homes", "gpus", "cpus", "memory", "pids", "kernel",
                           "validate", "exchange", "bwrap", "culler", "late", "cleanup"}, text
    # after the whole course (released, submitted, graded, feedback): every file a student can read,
    # behind parlab.__file__ (the environment's site-packages, no checkout), searched; none holds solution text
    found = re.search(r"none of (\d+) solution lines readable by a student: (\d+) files", checks["solutions"][1])
    assert found and int(found.group(1)) > 100 and int(found.group(2)) > 10_000, checks["solutions"]
    assert f"parlab installed at {hub.python.parent.parent}/lib/" in checks["kernel"][1], checks["kernel"]
    # the simulated GPUs: refused by the server's devices cgroup, not by their mode (0666)
    assert all(f"{path}: EPERM" in checks["gpus"][1] for path in FAKE_DEVICES), checks["gpus"]
    assert "1 of 2 cores" in checks["cpus"][1] and "3 GiB" in checks["memory"][1], text
    no_throwaway_left(hub)




def wrong_kernel(python: Path) -> str:
    """A kernelspec named python3 that runs ``python``."""
    return json.dumps({"argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                       "display_name": "Python 3 (not the course's)", "language": "python"})


BROKEN_CONFIG = """# tests/hub/test_hub_preflight.py: a deployment broken every way preflight must flag
from jupyterhub.spawner import LocalProcessSpawner
c.JupyterHub.spawner_class = LocalProcessSpawner      # no CPU set, memory, pids or devices cgroup
c.LocalProcessSpawner.cmd = [{singleuser!r}]
c.Spawner.environment.update({{"JUPYTER_PATH": {jupyter_path!r}}})  # the kernel named python3: another Python
"""


def test_preflight_flags_each_broken_deployment_with_its_remedy(course_hub, fake_gpu_nodes):
    import server_env

    hub = course_hub
    wrong_env = STATE / "env-without-parlab"  # this environment's packages, parlab left out
    server_env.clone_without_parlab(Path(sys.prefix), wrong_env)
    kernels = STATE / "wrong-kernels"
    (kernels / "kernels" / "python3").mkdir(parents=True, exist_ok=True)
    (kernels / "kernels" / "python3" / "kernel.json").write_text(wrong_kernel(wrong_env / "bin" / "python"))
    for folder, _, _ in os.walk(kernels):
        os.chmod(folder, 0o755)
    local_config = hub.hub_dir / "local_config.py"
    local_config.write_text(BROKEN_CONFIG.format(singleuser=str(hub.python.parent / "jupyterhub-singleuser"),
                                                 jupyter_path=str(kernels)))
    home = Path(pwd.getpwnam(INSTRUCTOR).pw_dir)
    course_exchange = hub.exchange / "parlab"
    owner = course_exchange.stat()
    student = pwd.getpwnam(STUDENTS[0])
    no_bwrap = STATE / "bin-without-bwrap"
    no_bwrap.mkdir(exist_ok=True)
    for folder in ("/usr/local/bin", "/usr/bin"):  # (/bin is /usr/bin on Debian 12)
        for name in os.listdir(folder):
            if name != "bwrap" and not (no_bwrap / name).exists():
                os.symlink(os.path.join(folder, name), no_bwrap / name)
    hub.extra_env = {"PARLAB_HUB_MEM_LIMIT": "none"}
    try:
        hub.stop_hub()
        hub.start()
        os.chmod(home, 0o755)  # the instructor's course (solutions/) now readable by every user
        os.chown(course_exchange, student.pw_uid, student.pw_gid)
        rc, checks, text = preflight(hub, "broken", path=os.pathsep.join(
            [str(hub.python.parent), str(no_bwrap), "/usr/local/sbin", "/usr/sbin"]))
    finally:
        os.chmod(home, 0o700)
        os.chown(course_exchange, owner.st_uid, owner.st_gid)
        local_config.unlink()
        hub.extra_env = {}
        hub.stop_hub()
        hub.start()
    assert rc == 1, text
    flagged = {c for c, (status, _) in checks.items() if status == "FAIL"}
    expected = {"solutions", "homes", "gpus", "cpus", "memory", "pids", "kernel", "validate", "exchange", "bwrap",
                "grading"}
    assert flagged == expected, text
    assert all("Remedy: " in checks[c][1] for c in expected), text
    assert f"{home}/parlab/" in checks["solutions"][1], checks["solutions"]  # the instructor's course
    assert all(f"{path}" in checks["gpus"][1] for path in FAKE_DEVICES), checks["gpus"]
    assert "all 2 cores" in checks["cpus"][1] and "no memory limit" in checks["memory"][1], text
    assert str(wrong_env / "bin" / "python") in checks["kernel"][1] and "cannot import parlab" in checks["kernel"][1]
    assert f"owned by {STUDENTS[0]}" in checks["exchange"][1] and "not installed" in checks["bwrap"][1], text
    assert checks["cleanup"][0] == "ok", text
    no_throwaway_left(hub)
    shutil.rmtree(wrong_env, ignore_errors=True)
    print("preflight, broken deployment:", json.dumps({c: s for c, (s, _) in checks.items()}))
