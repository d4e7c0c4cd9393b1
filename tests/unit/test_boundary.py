"""The grading boundary's rules, read off its command lines and settings (no process started).

What a box hides and exposes, what its environment keeps, that grading
refuses without bwrap (saying how to install it), and that every way of
grading (nbgrader autograde through the course config, parlab grade, its
Slurm array tasks) goes through the same boxed execute step.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nbgrader_harness import REPO
from parlab.grading import boundary
from parlab.classgrade import inputs, plan, processes, task, worker

pytestmark = pytest.mark.unit

SPEC = {"uid": 2000000123, "gid": 2000000123, "drop_to_uid": True, "hidden": ["/srv/course", "/root", "/home"],
        "code": ["/srv/course/.venv", "/srv/course/src", "/usr/lib/python3.11"], "cgroups": {},
        "limits": {"memory_bytes": 1 << 30, "processes": 64, "scratch_bytes": 1 << 20},
        "handin": "/tmp/work/box/handin", "ipc": "/tmp/work/box/ipc", "bwrap": "/usr/bin/bwrap",
        "hosts": "/tmp/work/box/hosts"}


def _pairs(args: list[str], flag: str) -> list[tuple[str, str]]:
    return [(args[i + 1], args[i + 2]) for i, a in enumerate(args) if a == flag]


def _tmpfs(args: list[str]) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args) if a == "--tmpfs"]


def test_kernel_box_hides_the_course_and_binds_back_only_code(monkeypatch):
    monkeypatch.setattr(boundary.os.path, "isdir", lambda p: True)
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "secret")
    monkeypatch.setenv("PARLAB_AUTOGRADE", "/tmp/work/box/handin")
    args = boundary.bwrap_args(SPEC, "kernel", "/srv/course/autograded/ada/00-setup")
    assert args[:2] == ["/usr/bin/bwrap", "--die-with-parent"]
    assert {"--unshare-net", "--unshare-pid", "--unshare-ipc", "--clearenv"} <= set(args)
    assert ("/", "/") in _pairs(args, "--ro-bind")
    hidden = _tmpfs(args)
    assert {"/srv/course", "/root", "/home", "/tmp", "/var/tmp", "/dev/shm"} <= set(hidden)
    # code under the hidden course root comes back read-only; nothing else of the course does
    assert ("/srv/course/.venv", "/srv/course/.venv") in _pairs(args, "--ro-bind")
    assert ("/srv/course/src", "/srv/course/src") in _pairs(args, "--ro-bind")
    assert ("/usr/lib/python3.11", "/usr/lib/python3.11") not in _pairs(args, "--ro-bind")  # never hidden
    writable = _pairs(args, "--bind")
    assert writable == [("/tmp/work/box/ipc", "/tmp/work/box/ipc"), ("/tmp/work/box/handin", "/tmp/work/box/handin")]
    # the submission's folder: read-only source of the scratch copy, then a bounded tmpfs in its place
    assert ("/srv/course/autograded/ada/00-setup", boundary.SUBMISSION_RO) in _pairs(args, "--ro-bind")
    at = next(i for i, a in enumerate(args) if a == "--tmpfs" and args[i + 1] == "/srv/course/autograded/ada/00-setup")
    assert args[at - 2:at] == ["--size", str(1 << 20)] and args[at + 2:at + 4] == ["--chdir", args[at + 1]]
    # every tmpfs comes after the root it covers, and every bind after the tmpfs it lands in
    assert args.index("/srv/course") < args.index("/srv/course/src")
    env = dict(_pairs(args, "--setenv"))
    assert "JUPYTERHUB_API_TOKEN" not in env and env["PARLAB_AUTOGRADE"] == "/tmp/work/box/handin"
    assert env["HOME"] == "/srv/course/autograded/ada/00-setup" and env["USER"] == "parlab-box"


def test_ranks_box_has_its_own_pids_and_binds_only_the_launch_folder(monkeypatch):
    monkeypatch.setattr(boundary.os.path, "isdir", lambda p: True)
    monkeypatch.setenv("PARLAB_JOB_DIR", "/tmp/launches/parlab-0/launch-1")
    monkeypatch.setenv("TMPDIR", "/tmp/launches/parlab-0/launch-1/tmp")
    monkeypatch.setenv("PARLAB_AUTOGRADE", "/tmp/work/box/handin")
    monkeypatch.setenv("PARLAB_AGENT_WRAPPER", "{}")
    args = boundary.bwrap_args(SPEC, "ranks", "/srv/course")
    # its own pid namespace and /proc: the launcher maps the ranks' pids (launch.procs.namespace_pids)
    assert "--unshare-pid" in args and "--unshare-net" in args and args[args.index("--proc") + 1] == "/proc"
    assert _pairs(args, "--bind") == [("/tmp/launches/parlab-0/launch-1", "/tmp/launches/parlab-0/launch-1")]
    env = dict(_pairs(args, "--setenv"))
    assert env["PARLAB_JOB_DIR"] == "/tmp/launches/parlab-0/launch-1" and env["PARLAB_KERNEL_PID"] == "0"
    assert "PARLAB_AUTOGRADE" not in env and "PARLAB_AGENT_WRAPPER" not in env


def test_grading_refuses_without_bwrap(monkeypatch, tmp_path):
    monkeypatch.setattr(boundary.shutil, "which", lambda name: None)
    with pytest.raises(boundary.BoundaryError, match="apt-get install bubblewrap"):
        boundary.Box(tmp_path, tmp_path)
    (tmp_path / "nbgrader_config.py").write_text((REPO / "nbgrader_config.py").read_text())
    with pytest.raises(inputs.CourseError, match="bubblewrap.*boundary = False"):
        plan.require_boundary(tmp_path)
    (tmp_path / "nbgrader_config.py").write_text((REPO / "nbgrader_config.py").read_text()
                                                 + "\nc.GuardedExecute.boundary = False\n")
    plan.require_boundary(tmp_path)  # the documented opt-out: no refusal


def test_every_way_of_grading_uses_the_boxed_execute_step(monkeypatch, tmp_path):
    from parlab.grading.autograde import BoxedKernelManager, GuardedExecute

    config = inputs.load_config(REPO)
    assert GuardedExecute in config.Autograde.autograde_preprocessors
    assert config.GuardedExecute.boundary is True
    assert GuardedExecute(config=config).kernel_manager_class is BoxedKernelManager
    # parlab grade's workers and the Slurm array's tasks start the same worker command
    started = []
    monkeypatch.setattr(processes.subprocess, "Popen", lambda cmd, **kw: started.append(cmd) or _Done())
    processes.spawn(tmp_path, "00-setup", "ada", "tok")[1].close()
    assert started == [worker.command(tmp_path, "00-setup", "ada")]
    assert task.grade_one.__code__.co_names.count("spawn") == 1  # task.grade_one -> processes.spawn


class _Done:
    pid, returncode = 0, 0

    def wait(self, timeout=None):
        return 0


def test_course_root_is_the_outermost_config(tmp_path):
    copy = tmp_path / ".parlab-grade" / "00-setup" / "ada"
    (copy / "autograded" / "ada" / "00-setup").mkdir(parents=True)
    for root in (tmp_path, copy):
        (root / "nbgrader_config.py").write_text("")
    assert boundary.course_root(copy / "autograded" / "ada" / "00-setup") == tmp_path
    assert boundary.project_root() == REPO  # an editable install: its solutions/ are hidden too


def test_limits_in_words():
    words = boundary.Limits(3 << 30, 512, 64 << 20).describe()
    assert words == {"memory": "3 GiB", "processes": "512 processes", "scratch": "64 MiB of scratch disk"}
    assert json.loads(json.dumps(SPEC)) == SPEC
    assert Path(boundary.UID_CLAIMS).is_absolute() and boundary.UID_BASE + boundary.UID_SPAN < 2 ** 31


def test_only_installed_code_is_bound_back(monkeypatch, tmp_path):
    """``python -m`` puts the working folder (a course copy, with its solutions/) on sys.path: never bound back."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    code = boundary._code_paths()
    assert str(tmp_path) not in code and all(not p.startswith(str(tmp_path)) for p in code)
    assert str(REPO / "src") in code  # the editable install's package folder


def test_box_memory_leaves_the_grader_room_inside_the_enclosing_cgroup(tmp_path, monkeypatch):
    """A Slurm task's --mem encloses the box (v1: nested): the box's bound must bind first."""
    monkeypatch.setattr(boundary, "CGROUP_MOUNT", tmp_path)
    job = tmp_path / "memory" / "slurm_n1" / "uid_0" / "job_7"
    task = job / "step_batch" / "task_0"
    task.mkdir(parents=True)
    (job / "memory.limit_in_bytes").write_text(str(5 << 30))
    (task / "memory.limit_in_bytes").write_text("9223372036854771712")  # v1's "no limit"
    assert boundary.enclosing_memory(task / "parlab-box-x") == 5 << 30
    assert boundary.enclosing_memory(tmp_path / "memory" / "other") is None
    assert boundary.box_memory(4 << 30, 5 << 30) == 4 << 30  # 5G - 1 GiB for the grader: the bound holds
    assert boundary.box_memory(6 << 30, 4 << 30) == 3 << 30  # lowered to what the task leaves
    assert boundary.box_memory(6 << 30, None) == 6 << 30


def test_stale_box_cgroups_are_removed_and_live_ones_kept(tmp_path, monkeypatch):
    import fcntl
    import os

    claims, parent = tmp_path / "claims", tmp_path / "memory"
    claims.mkdir()
    parent.mkdir()
    monkeypatch.setattr(boundary, "UID_CLAIMS", claims)
    monkeypatch.setattr(boundary.os, "geteuid", lambda: 0)
    live, killed, unclaimed, busy = (boundary.UID_BASE + k for k in range(4))
    names = {uid: f"parlab-box-{uid}-0123abcd" for uid in (live, killed, unclaimed, busy)}
    for uid, name in names.items():
        (parent / name).mkdir()
        if uid != unclaimed:
            (claims / str(uid)).write_text("")
    (parent / names[busy] / "cgroup.procs").write_text("1234")  # a process in it: rmdir fails
    (parent / "parlab-hub").mkdir()
    held = os.open(claims / str(live), os.O_RDWR)
    fcntl.flock(held, fcntl.LOCK_EX)  # as a Box's claim is held while it lives
    try:
        boundary.remove_stale_cgroups({"memory": parent})
    finally:
        os.close(held)
    assert sorted(p.name for p in parent.iterdir()) == sorted([names[live], names[busy], "parlab-hub"])


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("bwrap") is None, reason="needs root and bwrap")
def test_what_the_boxes_write_for_the_grader_is_bounded_and_a_killed_graders_folder_removed(tmp_path):
    """The hand-in folder and the ranks' launch folders live on the grader's disk: as root they are
    a tmpfs of the box's own, twice its scratch, and one a killed grader left is detached when the
    next box is made. Everywhere, RLIMIT_FSIZE bounds each file a box writes to the scratch size."""
    (tmp_path / "nb").mkdir()
    code = ("import sys, tempfile, time\nfrom pathlib import Path\nfrom parlab.grading.boundary import Box, Limits\n"
            f"box = Box(Path(tempfile.mkdtemp(prefix={boundary.WORKDIR_PREFIX!r}, dir={str(tmp_path)!r})), "
            f"Path({str(tmp_path / 'nb')!r}), Limits(scratch_bytes=8 << 20))\n"
            "print(box.dir, flush=True)\ntime.sleep(60)\n")
    grader = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        where = grader.stdout.readline().strip()
        assert f" {where} " in Path("/proc/self/mountinfo").read_text()
        assert boundary.remove_stale_mounts() == 0  # its grader is alive
        # files of up to 9 MiB each: each stops at 8 (RLIMIT_FSIZE, EFBIG), all of them at 16 (ENOSPC)
        fill = ("import os\nn, errors = 0, []\nfor k in range(4):\n    try:\n"
                "        with open(f'{0}/f{{k}}', 'wb') as f:\n            for _ in range(9):\n"
                "                f.write(b'x' * (1 << 20)); n += 1\n"
                "    except OSError as e:\n        errors.append(e.errno)\nprint(n, *errors)\n").format(Path(where) / "handin")
        box = json.loads((Path(where) / "spec.json").read_text())
        out = subprocess.run([sys.executable, "-m", "parlab.grading.boundary", "kernel", str(Path(where) / "spec.json"),
                              "--", sys.executable, "-c", fill], cwd=tmp_path / "nb", capture_output=True, text=True,
                             env={**os.environ, "PARLAB_AUTOGRADE": box["handin"]})
        written, *errors = (int(x) for x in out.stdout.split())
        assert errors[0] == 27 and 28 in errors and written <= 16, out  # EFBIG, then ENOSPC
    finally:
        grader.kill()
        grader.wait()
    assert boundary.remove_stale_mounts() == 1
    assert f" {where} " not in Path("/proc/self/mountinfo").read_text() and not Path(where).exists()


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("bwrap") is None, reason="needs root and bwrap")
def test_a_venv_reached_through_a_link_the_box_hides_still_runs_inside(tmp_path):
    """A checkout whose ``.venv`` links to a venv elsewhere: the box hides the checkout (here under /tmp),
    so the interpreter is started inside by its real path, and stays that venv (its packages import)."""
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    (checkout / ".venv").symlink_to(os.path.realpath(sys.prefix), target_is_directory=True)
    linked = str(checkout / ".venv" / "bin" / os.path.basename(sys.executable))
    (tmp_path / "nb").mkdir()
    code = ("import os, subprocess, sys, tempfile\nfrom pathlib import Path\nfrom parlab.grading.boundary import Box\n"
            f"box = Box(Path(tempfile.mkdtemp(prefix={boundary.WORKDIR_PREFIX!r}, dir={str(tmp_path)!r})), Path({str(tmp_path / 'nb')!r}))\n"
            "out = subprocess.run(box.command('kernel') + [sys.executable, '-c', "
            "'import sys, parlab; print(\"inside\", sys.prefix)'], cwd=" + repr(str(tmp_path / "nb")) + ", "
            "capture_output=True, text=True, env={**os.environ, 'PARLAB_AUTOGRADE': str(box.handin)})\n"
            "box.close()\nprint(out.returncode, out.stdout.strip(), out.stderr.strip()[-500:])\n")
    done = subprocess.run([linked, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.startswith("0 inside ") and os.path.realpath(sys.prefix) in done.stdout, (done.stdout, done.stderr)
