"""``parlab preflight``: prove a deployed course hub before the first class, and after any change.

Run as root on the hub's host, with the hub running::

    PARLAB_HUB_ADMIN_TOKEN=... parlab preflight --url https://hub.example.edu --instructor teacher

It creates a throw-away student (a Unix user and a hub user), starts their
server through the hub's REST API, and from a kernel of that server
(``probe.py``, as that student, inside that server's limits) checks what the
course promises; then grades lab 00's solution and one hostile submission
the way docs/jupyterhub.md says to grade (as root, outside any server, no
GPU); where the host has GPUs and Slurm, launches NCCL on 2, 4 and 8 GPUs
through the queue from the student's server (``gpu_queue``).  One line per
check, ``ok`` or ``FAIL`` with the remedy (``skip`` with why, for a check
that cannot run here); the same lines go to a report
file; the throw-away student is removed whatever happens.  Exit status 0
when nothing failed.

The hub needs the course-admin service token (``PARLAB_HUB_ADMIN_TOKEN`` in
the hub's environment, ``jupyterhub_config.py``); preflight reads it from
the same variable or ``--token-file``.  It loads the hub kit's helpers
(``kernel_api.py``, ``course_hub.py``) from the hub's config folder
(``--hub-dir``, default ``/etc/parlab-hub``).

One module: each check is a short function with its remedy, run in order against the same
throw-away student's server, and an admin reads the list top to bottom to see what preflight
promises; the parts that need more than a function (``gpu_queue``, ``rehearsal``) have their own.
"""
from __future__ import annotations

import argparse
import json
import os
import pwd
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
from datetime import datetime, timezone
from pathlib import Path

from . import gpu_queue, probe

LAB = "00-setup"
#: One solution cell of the hostile submission becomes this: it reaches for the gradebook and the
#: solutions through their real paths, writes to the host's /tmp, and prints what it got.  (Opening a
#: GPU is not among them: the boxes keep the host's GPU devices, docs/instructor.md.)
HOSTILE = """import os
got = []
for path in {targets!r}:
    try:
        with open(path, "rb") as f:
            f.read(64)
        got.append(path)
    except OSError:
        pass
try:
    with open({escape!r}, "w") as f:
        f.write("escaped")
    got.append({escape!r})
except OSError:
    pass
print("PREFLIGHT-HOSTILE-GOT", sorted(got))
"""


class Report:
    """The lines of one run: printed as they come and written to the report file at the end."""

    def __init__(self):
        self.lines: list[str] = []
        self.failed: list[str] = []

    def add(self, status: str, check: str, text: str) -> None:
        text = " | ".join(part.strip() for part in text.splitlines() if part.strip())  # one line per check
        line = f"{status:<4} {check:<12} {text}"
        self.lines.append(line)
        if status == "FAIL":
            self.failed.append(check)
        print(line, flush=True)

    def ok(self, check: str, text: str) -> None:
        self.add("ok", check, text)

    def fail(self, check: str, text: str, remedy: str) -> None:
        self.add("FAIL", check, f"{text}. Remedy: {remedy}")

    def skip(self, check: str, text: str) -> None:
        self.add("skip", check, text)


class Hub:
    """The hub's REST API with the course-admin token (the kit's ``course_hub.hub_api``)."""

    def __init__(self, url: str, token: str, kit):
        self.url, self.token, self.kit = url.rstrip("/"), token, kit

    def api(self, method: str, path: str, body: dict | None = None, timeout: float = 60):
        return self.kit.hub_api(self.url, self.token, method, path, body, timeout)

    def wait(self, user: str, running: bool, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = self.api("GET", f"/users/{user}")
            server = info.get("servers", {}).get("")
            if running and server and server.get("ready"):
                return
            if not running and not info.get("servers") and not info.get("pending"):
                return
            time.sleep(0.5)
        raise TimeoutError(f"{user}'s server did not {'start' if running else 'stop'} within {timeout:.0f} s")


# ---------------------------------------------------------------- what the course's solutions look like


def _delimiters() -> tuple[list[str], list[str]]:
    """nbgrader's begin and end delimiters of solution and hidden-test regions (its configured defaults)."""
    from nbgrader.preprocessors import ClearHiddenTests, ClearSolutions

    return ([ClearSolutions.begin_solution_delimeter.default_value, ClearHiddenTests.begin_test_delimeter.default_value],
            [ClearSolutions.end_solution_delimeter.default_value, ClearHiddenTests.end_test_delimeter.default_value])


def secret_lines(course: Path) -> set[str]:
    """Lines of the course's solution and hidden-test regions that nothing public shows.

    Public: the released notebooks (``labs/``) and the installed parlab package, which holds a few
    solution lines by design (tests/nbgrader/test_student_dist.py lists them).  Lines shorter than
    ``probe.MIN_LINE`` and comments are left out.
    """
    begins, ends = _delimiters()
    inside, found = False, set()
    for nb in sorted((course / "solutions").glob("*/*.ipynb")):
        for line in probe.file_lines(str(nb), nb.read_bytes()):
            if any(d in line for d in begins):
                inside = True
            elif any(d in line for d in ends):
                inside = False
            elif inside and len(line.strip()) >= probe.MIN_LINE and not line.strip().startswith("#"):
                found.add(line.strip())
    public = set()
    package = Path(__file__).resolve().parents[1]
    for path in [*sorted((course / "labs").glob("*/*.ipynb")), *sorted(package.rglob("*.py"))]:
        public |= {line.strip() for line in probe.file_lines(str(path), path.read_bytes())}
    return found - public


# ---------------------------------------------------------------- the throw-away student


def _run_as(user: str, argv: list[str], timeout: float = 60, env: dict | None = None) -> subprocess.CompletedProcess:
    entry = pwd.getpwnam(user)

    def become():
        os.setgid(entry.pw_gid)
        os.setgroups(os.getgrouplist(user, entry.pw_gid))
        os.setuid(entry.pw_uid)
    base = {"HOME": entry.pw_dir, "USER": user, "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
    return subprocess.run(argv, preexec_fn=become, cwd=entry.pw_dir, env={**base, **(env or {})},
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)


class ThrowAwayStudent:
    """A Unix user and hub user made for this run, with a private home; ``remove`` ends and deletes both."""

    def __init__(self, hub: Hub, kit):
        self.hub, self.kit = hub, kit
        self.name = f"parlab-pf-{secrets.token_hex(3)}"
        self.made_unix = self.made_hub = False

    def create(self) -> None:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", self.name], check=True,
                       capture_output=True)
        self.made_unix = True
        os.chmod(pwd.getpwnam(self.name).pw_dir, 0o700)
        self.hub.api("POST", f"/users/{self.name}")
        self.made_hub = True

    def remove(self) -> list[str]:
        problems = []
        if self.made_hub:
            try:
                self.hub.api("DELETE", f"/users/{self.name}/server")
            except (urllib.error.URLError, OSError):
                pass
            try:
                self.hub.wait(self.name, running=False, timeout=60)
                self.hub.api("DELETE", f"/users/{self.name}")
            except (urllib.error.URLError, OSError, TimeoutError) as e:
                problems.append(f"hub user {self.name}: {e}")
        if self.made_unix:
            uid = pwd.getpwnam(self.name).pw_uid
            for _ in range(20):
                left = self.kit.pids_of_uid(uid)
                if not left:
                    break
                self.kit.kill_pids(left)
                time.sleep(0.2)
            done = subprocess.run(["userdel", "--remove", self.name], capture_output=True, text=True)
            if done.returncode not in (0, 12):  # 12: the home could not be removed (mail spool and so on)
                problems.append(f"userdel {self.name}: {done.stderr.strip()}")
        return problems


# ---------------------------------------------------------------- the checks


def check_kernel(report: Report, facts: dict) -> None:
    k = facts.get("kernel", {})
    if not k.get("parlab"):
        report.fail("kernel", f"the python3 kernel the labs name ({k.get('python')}) cannot import parlab "
                    f"({k.get('parlab_error', k.get('error'))})",
                    "run the servers from the parlab environment (CourseSpawner runs jupyterhub-singleuser of the "
                    "hub's Python) and remove any kernelspec named python3 that points elsewhere "
                    "(jupyter kernelspec list, JUPYTER_PATH)")
        return
    server = k.get("server_python") or ""
    if server and Path(server).parent != Path(k["python"]).parent:
        report.fail("kernel", f"the python3 kernel runs {k['python']}, not the server's environment ({server})",
                    "remove the kernelspec named python3 that points elsewhere (jupyter kernelspec list, "
                    "JUPYTER_PATH in the spawner's environment)")
        return
    if k.get("parlab_repository") != str(Path(k["parlab"]).parent):
        report.fail("kernel", f"parlab comes from a source checkout ({k['parlab_repository']}), an editable install",
                    "install the student edition, not editable (make student-dist; pip install dist/student)")
        return
    report.ok("kernel", f"python3 is {k['python']}, the server's environment, with parlab installed at {k['parlab']}")


def check_solutions(report: Report, facts: dict, n_fingerprints: int) -> None:
    s = facts.get("search", {})
    if "error" in s:
        report.fail("solutions", f"the search could not run: {s['error']}", "see the report; rerun preflight")
        return
    where = (f"{s['files']} files ({s['bytes'] / 1e6:.0f} MB) under {len(s['roots'])} folders in {s['seconds']} s; "
             f"{s['single']} files with a single such line, which common code writes too")
    if s["hits"]:
        shown = ", ".join(f"{p} ({n} lines)" for p, n in sorted(s["hits"].items())[:6])
        report.fail("solutions", f"a student can read solution text: {shown}",
                    "build the servers' environment from the student edition, not an editable install "
                    "(docs/jupyterhub.md, The servers' environment); chmod 700 every home and the course checkout")
    elif s["incomplete"]:
        report.fail("solutions", f"the search did not finish ({s['incomplete']}); none found in {where}",
                    "rerun with a larger --search-budget")
    else:
        report.ok("solutions", f"none of {n_fingerprints} solution lines readable by a student: {where}")


def check_gpus(report: Report, facts: dict) -> None:
    g = facts.get("gpus", {})
    if "error" in g:
        report.fail("gpus", f"could not look: {g['error']}", "see the report")
        return
    if not g:
        report.ok("gpus", "no NVIDIA device node on this host")
        return
    # ENXIO/ENODEV: the open passed every permission check and found no driver behind the node
    open_ = sorted(p for p, r in g.items() if r in ("opened", "ENXIO", "ENODEV"))
    if open_:
        report.fail("gpus", f"a student's server opens {', '.join(open_)}",
                    "close the devices to servers: CourseSpawner on cgroup v1 (its devices cgroup), or "
                    "PARLAB_HUB_SPAWNER=systemd (DevicePolicy=closed); CUDA_VISIBLE_DEVICES alone hides nothing")
    else:
        report.ok("gpus", f"no GPU device opens from a student's server ({', '.join(f'{p}: {r}' for p, r in g.items())})")


def check_limits(report: Report, facts: dict, class_size: int) -> None:
    lim = facts.get("limits", {})
    if "error" in lim:
        report.fail("cpus", f"could not look: {lim['error']}", "see the report")
        return
    cpus, host, widened = lim["cpus"], lim["host_cpus"], lim["cpus_after_widening"]
    remedy_cpu = ("leave PARLAB_HUB_CPUS_PER_SERVER unset (each server gets the cores divided by the class) and "
                  "run a spawner whose CPU set is a cgroup: CourseSpawner (cpuset) or SystemdSpawner (AllowedCPUs)")
    if isinstance(widened, list) and len(widened) > len(cpus):
        report.fail("cpus", f"a student widened their CPU set from {len(cpus)} to {len(widened)} cores with "
                    "sched_setaffinity", remedy_cpu)
    elif class_size > 1 and host > 1 and len(cpus) >= host:
        report.fail("cpus", f"a student's server has all {host} cores of the host (a class of {class_size})", remedy_cpu)
    else:
        report.ok("cpus", f"a student's server has {len(cpus)} of {host} cores ({lim.get('cpuset')}); "
                  "sched_setaffinity to every core left it there")
    for check, value, write, unlimited in (("memory", lim["memory"], lim["memory_write"], ("max", "-1")),
                                           ("pids", lim["pids"], lim["pids_write"], ("max",))):
        limited = value is not None and value not in unlimited and not (value.isdigit() and int(value) >= 2**62)
        remedy = ("set PARLAB_HUB_MEM_LIMIT (c.Spawner.mem_limit) and run CourseSpawner or SystemdSpawner"
                  if check == "memory" else "run CourseSpawner (pids cgroup) or SystemdSpawner (TasksMax)")
        if not limited:
            report.fail(check, f"a student's server has no {check} limit ({value or 'no cgroup file'})", remedy)
        elif write == "written":
            report.fail(check, f"a student raised their own {check} limit", "the cgroup's files must be root's")
        else:
            shown = f"{int(value) / 2**30:g} GiB" if check == "memory" else f"{value} processes"
            report.ok(check, f"{shown}, not writable by the student ({write})")


def check_validate(report: Report, facts: dict, course_timeout: int | None) -> None:
    v = facts.get("validate", {})
    if "error" in v:
        report.fail("validate", f"Validate could not run in a student's server: {v['error'][-300:]}",
                    "see the report: nbgrader must be in the servers' environment")
        return
    problems = []
    if course_timeout is not None and (v["timeout"] or 0) < course_timeout:
        problems.append(f"its cell timeout is {v['timeout']} s, the course's {course_timeout} s")
    if v["failed"]:
        problems.append("a queue cell went for the queue under Validate")
    if problems:
        report.fail("validate", "; ".join(problems),
                    "the students' servers must load the kit's student config (JUPYTER_CONFIG_PATH=<hub>/student: "
                    "the course's timeout, and hub/validate_config.py's PARLAB_VALIDATE)")
    else:
        report.ok("validate", f"cell timeout {v['timeout']} s; a queue cell stands down under Validate")


def check_exchange(report: Report, facts: dict, exchange: Path, staff: set[str]) -> None:
    remedy = (f"chown root {exchange} && chmod 1777 {exchange}; mkdir -p {exchange}/parlab && chown <instructor> "
              f"{exchange}/parlab && chmod 755 {exchange}/parlab (the kit's prepare_course does this)")
    try:
        root, course = exchange.stat(), (exchange / "parlab").stat()
    except OSError as e:
        report.fail("exchange", f"{e.filename}: {e.strerror}", remedy)
        return
    owner = pwd.getpwuid(course.st_uid).pw_name
    problems = []
    if root.st_uid != 0 or (root.st_mode & 0o002 and not root.st_mode & 0o1000):
        problems.append(f"{exchange} is {oct(root.st_mode & 0o7777)}, owned by {pwd.getpwuid(root.st_uid).pw_name}")
    if owner not in staff:
        problems.append(f"{exchange}/parlab is owned by {owner}, not an instructor")
    if course.st_mode & 0o022:
        problems.append(f"{exchange}/parlab is writable by others ({oct(course.st_mode & 0o777)})")
    if facts.get("exchange", {}).get("course_writable"):
        problems.append("a student can write into it")
    if problems:
        report.fail("exchange", "; ".join(problems), remedy)
    else:
        report.ok("exchange", f"{exchange} {oct(root.st_mode & 0o7777)} root's; parlab/ {owner}'s, "
                  f"{oct(course.st_mode & 0o777)}, not writable by a student")


def check_homes(report: Report, users: list[str]) -> None:
    open_ = []
    for user in users:
        try:
            home = pwd.getpwnam(user).pw_dir
            mode = os.stat(home).st_mode
        except (KeyError, OSError):
            continue
        if mode & 0o007:
            open_.append(f"{home} ({oct(mode & 0o777)})")
    if open_:
        report.fail("homes", f"other users can enter {', '.join(open_)}",
                    "chmod 700 each home (Debian's useradd makes them 0755; HOME_MODE 0700 in /etc/login.defs)")
    else:
        report.ok("homes", f"the {len(users)} hub users' homes are closed to other users")


def check_checkout(report: Report, checkout: Path) -> None:
    blocked = [str(p) for p in [checkout, *checkout.parents] if p.exists() and not p.stat().st_mode & 0o001]
    readable = checkout.exists() and checkout.stat().st_mode & 0o004
    if blocked or not readable:
        report.ok("checkout", f"{checkout} is closed to other users ({'blocked at ' + blocked[0] if blocked else 'mode'})")
    else:
        report.fail("checkout", f"other users can read the course checkout {checkout} (solutions/, tests/)",
                    f"chmod 700 {checkout} (the servers need only the student edition)")


def check_bwrap(report: Report, student: str) -> bool:
    found = shutil.which("bwrap")
    if not found:
        report.fail("bwrap", "bubblewrap is not installed: grading cannot box submissions",
                    "apt-get install bubblewrap")
        return False
    probe_cmd = [found, "--unshare-user", "--unshare-net", "--ro-bind", "/", "/", "true"]
    as_root = subprocess.run(probe_cmd, capture_output=True, text=True, timeout=30)
    as_user = _run_as(student, probe_cmd, timeout=30)
    if as_root.returncode != 0:
        report.fail("bwrap", f"bwrap fails as root: {as_root.stderr.strip()}", "see bwrap's message")
        return False
    if as_user.returncode != 0:
        from parlab.grading.boundary import USERNS_REMEDY

        report.fail("bwrap", f"bwrap fails for a non-root user ({as_user.stderr.strip()}); grading as root works",
                    USERNS_REMEDY)
        return True
    report.ok("bwrap", f"{found} boxes as root and as a non-root user")
    return True


def check_culler(report: Report, hub: Hub) -> None:
    try:
        culler = hub.api("GET", "/services/idle-culler")
    except urllib.error.HTTPError as e:
        if e.code == 404:
            report.fail("culler", "no idle-culler service", "the kit's jupyterhub_config.py starts jupyterhub-idle-culler")
        else:
            report.fail("culler", f"the hub's services cannot be read ({e.code})",
                        "give the course-admin role the read:services scope (the kit's jupyterhub_config.py does)")
        return
    timeout = next((a.split("=", 1)[1] for a in culler.get("command") or [] if a.startswith("--timeout=")), None)
    pid = culler.get("pid")
    if pid and not Path(f"/proc/{pid}").exists():
        report.fail("culler", f"the idle culler (pid {pid}) is not running", "restart the hub; see its log")
    else:
        report.ok("culler", f"idle-culler runs (pid {pid}), stopping servers idle {timeout} s")


def check_late_penalty(report: Report, hub_dir: Path) -> None:
    from traitlets.config.loader import PyFileConfigLoader

    config_file = hub_dir / "instructor" / "nbgrader_config.py"
    try:
        config = PyFileConfigLoader(config_file.name, str(config_file.parent)).load_config()
        name = config.AssignLatePenalties.plugin_class
        if not isinstance(name, str):
            raise LookupError("AssignLatePenalties.plugin_class is not set: nbgrader's default takes off nothing")
        module, cls = name.rsplit(".", 1)
        sys.path.insert(0, str(hub_dir))
        plugin = getattr(__import__(module), cls)(config=config)
        penalty = plugin.late_submission_penalty("preflight", 7.0, 3600.0)
    except Exception as e:  # noqa: BLE001 - whatever stops it is the finding
        report.fail("late", f"the instructor's late policy does not load: {e}",
                    f"the kit's {config_file} names hub/late_penalty.py (c.AssignLatePenalties.plugin_class)")
        return
    if not penalty:
        report.fail("late", f"{name} takes nothing off a submission one hour late", "see docs/instructor.md, late work")
    else:
        report.ok("late", f"{name}: a submission of 7 points one hour late loses {penalty:g}")


def grading_problems(scores: dict, hostile_text: str, escape: str, escaped: bool) -> list[str]:
    """What is wrong with a boxed grading: the solution short of full marks, or the hostile cell out of its box.

    ``scores``: {student: (score, max score)}; ``hostile_text``: the hostile submission's autograded
    notebook; ``escaped``: whether the file it wrote to ``escape`` is on the host.
    """
    top = scores.get("pf-solution", (0, 0))
    problems = []
    if not top[1] or top[0] != top[1]:
        problems.append(f"lab 00's solution scored {top[0]} of {top[1]}")
    got = re.findall(r"PREFLIGHT-HOSTILE-GOT \[([^\]]*)\]", hostile_text)
    # inside its box the hostile cell may write its own /tmp (the box's); anything else it got is a breach
    reached = [p.strip().strip("'") for p in got[0].split(",") if p.strip()] if got else []
    reached = [p for p in reached if p != escape]
    if reached or escaped:
        problems.append(f"the hostile submission reached {reached or escape + ' on the host'}")
    if not got:
        problems.append("the hostile cell's output is missing from its autograded notebook")
    return problems


def check_grading(report: Report, course: Path, workers: int) -> None:
    """Lab 00's solution and one hostile submission, graded as the docs say: root, no server, no GPU."""
    escape = f"/tmp/parlab-preflight-escaped-{secrets.token_hex(4)}"
    work = Path(tempfile.mkdtemp(prefix="parlab-preflight-grade-"))
    try:
        os.chmod(work, 0o700)
        shutil.copy(course / "nbgrader_config.py", work / "nbgrader_config.py")
        shutil.copytree(course / "solutions" / LAB, work / "solutions" / LAB)
        bin_dir = Path(sys.executable).parent  # nbgrader runs alembic, parlab grade runs python: this environment's
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1",
               "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}"}
        env.pop("JUPYTER_CONFIG_PATH", None)

        def run(argv, timeout):
            return subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=timeout)
        made = run([str(bin_dir / "nbgrader"), "generate_assignment", LAB, "--force"], 600)
        if made.returncode:
            raise RuntimeError(f"nbgrader generate_assignment: {made.stdout[-800:]}{made.stderr[-800:]}")
        import nbformat

        source = nbformat.read(work / "solutions" / LAB / f"{LAB}.ipynb", as_version=4)
        hostile = nbformat.read(work / "solutions" / LAB / f"{LAB}.ipynb", as_version=4)
        cell = next(c for c in hostile.cells if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("solution"))
        cell.source = HOSTILE.format(targets=[str(work / "gradebook.db"), str(course / "gradebook.db"),
                                              str(work / "solutions" / LAB / f"{LAB}.ipynb")], escape=escape)
        for student, nb in (("pf-solution", source), ("pf-hostile", hostile)):
            folder = work / "submitted" / student / LAB
            folder.mkdir(parents=True)
            nbformat.write(nb, folder / f"{LAB}.ipynb")
        start = time.monotonic()
        graded = run([str(bin_dir / "parlab"), "grade", LAB, "--workers", str(workers)], 3600)
        seconds = time.monotonic() - start
        if graded.returncode:
            raise RuntimeError(f"parlab grade exited {graded.returncode}: {(graded.stdout + graded.stderr)[-1500:]}")
        from nbgrader.api import Gradebook

        with Gradebook(f"sqlite:///{work / 'gradebook.db'}", "parlab") as gb:
            scores = {s.student.id: (s.score, s.max_score) for s in gb.find_assignment(LAB).submissions}
        hostile_text = (work / "autograded" / "pf-hostile" / LAB / f"{LAB}.ipynb").read_text()
    except Exception as e:  # noqa: BLE001 - whatever stops grading is the finding
        report.fail("grading", f"grading lab 00 as root outside any server failed: {str(e)[-1200:]}",
                    "see docs/jupyterhub.md, Grading: as root on the host, CUDA_VISIBLE_DEVICES= parlab grade LAB")
        return
    finally:
        shutil.rmtree(work, ignore_errors=True)
    escaped = os.path.exists(escape)
    if escaped:
        os.unlink(escape)
    top = scores.get("pf-solution", (0, 0))
    problems = grading_problems(scores, hostile_text, escape, escaped)
    if problems:
        report.fail("grading", "; ".join(problems), "see docs/instructor.md, grading's boundary")
    else:
        report.ok("grading", f"as root, no GPU, {workers} workers, {seconds:.0f} s: lab 00's solution {top[0]:g} of "
                  f"{top[1]:g}; the hostile submission reached none of the gradebook, the solutions or the host's /tmp")


def check_gpu_queue(report: Report, run_in_server, gpus: tuple[int, str] | None = None) -> None:
    """NCCL launches of 2, 4 and 8 GPUs through the queue from the student's server (``gpu_queue``).

    ``run_in_server(code, timeout)``: the stdout of ``code`` run in a kernel of the student's server.
    Skipped, saying why, on a host without GPUs or without Slurm's client.
    """
    count, how = gpu_queue.host_gpus() if gpus is None else gpus
    if not count:
        report.skip("gpu-queue", f"no GPU on this host ({how}): no NCCL launch through the queue to run")
        return
    if not shutil.which("sinfo"):
        report.skip("gpu-queue", f"{count} GPUs ({how}) but no Slurm queue (sinfo not found): the labs' queue "
                    "cells have nothing to queue on; docs/jupyterhub.md, A Slurm queue for the 8 GPUs")
        return
    sizes = [n for n in gpu_queue.SIZES if n <= count]
    timeout = 900 * len(sizes)
    code = ("import json as _j\nfrom parlab.preflight import gpu_queue as _g\n"
            f"print('PREFLIGHT-GPU ' + _j.dumps(_g.through_queue({sizes!r})))\n")
    try:
        out = run_in_server(code, timeout)
        line = next(x for x in out.splitlines() if x.startswith("PREFLIGHT-GPU "))
        results = json.loads(line.split(" ", 1)[1])
    except Exception as e:  # noqa: BLE001 - whatever stops the launches is the finding
        report.fail("gpu-queue", f"the launches through the queue did not report: {type(e).__name__}: "
                    f"{str(e)[-800:]}", "run a lab's queue cell by hand; see the hub's and slurmctld's logs")
        return
    remedy = ("check the node's NVLink (nvidia-smi topo -m: NV18 between every pair), the launch with "
              "NCCL_DEBUG=INFO, and Slurm's gres.conf (docs/jupyterhub.md, A Slurm queue for the 8 GPUs)")
    for status, text in gpu_queue.verdicts(results):
        if status == "ok":
            report.ok("gpu-queue", text)
        else:
            report.fail("gpu-queue", text, remedy)
    for n in (n for n in gpu_queue.SIZES if n > count):
        report.skip("gpu-queue", f"{n} GPUs: the host has {count}")


# ---------------------------------------------------------------- the run


def course_timeout(course: Path) -> int | None:
    found = re.search(r"^c\.Execute\.timeout = (\d+)", (course / "nbgrader_config.py").read_text(), re.M)
    return int(found.group(1)) if found else None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="parlab preflight", description=__doc__.splitlines()[0])
    p.add_argument("--url", default=os.environ.get("PARLAB_HUB_URL", "http://127.0.0.1:8000"),
                   help="the hub's URL (default: PARLAB_HUB_URL, else http://127.0.0.1:8000)")
    p.add_argument("--token-file", type=Path, default=None,
                   help="a file holding the course-admin token (default: PARLAB_HUB_ADMIN_TOKEN)")
    p.add_argument("--hub-dir", type=Path, default=Path(os.environ.get("PARLAB_HUB_DIR", "/etc/parlab-hub")),
                   help="the hub's config folder, the student edition's hub/ (default /etc/parlab-hub)")
    p.add_argument("--instructor", action="append", default=None,
                   help="an instructor's Unix name (default: PARLAB_HUB_INSTRUCTORS); the course is at ~/parlab")
    p.add_argument("--course", type=Path, default=None, help="the instructor's course folder (default ~INSTRUCTOR/parlab)")
    p.add_argument("--exchange", type=Path, default=Path(os.environ.get("PARLAB_EXCHANGE", "/srv/nbgrader/exchange")))
    p.add_argument("--checkout", type=Path, default=None, help="the full course repository, which must be closed")
    p.add_argument("--class-size", type=int, default=None, help="servers at once (default: the hub's users)")
    p.add_argument("--workers", type=int, default=2, help="grading workers for the boxed grading (default 2)")
    p.add_argument("--search-budget", type=float, default=600, help="seconds for the solution search (default 600)")
    p.add_argument("--skip", action="append", default=[], choices=["grading"],
                   help="leave out a slow check (grading)")
    p.add_argument("--report", type=Path, default=None,
                   help="the report file (default /var/log/parlab-preflight-<UTC time>.txt)")
    return p


def _load_kit(hub_dir: Path):
    sys.path.insert(0, str(hub_dir))
    import course_hub
    import kernel_api

    return course_hub, kernel_api


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if os.geteuid() != 0:
        print("parlab preflight: run it as root on the hub's host (it makes and removes a Unix user, and "
              "grades as root, as the docs say to)", file=sys.stderr)
        return 2
    token = (args.token_file.read_text().strip() if args.token_file else os.environ.get("PARLAB_HUB_ADMIN_TOKEN", ""))
    instructors = args.instructor or [u for u in os.environ.get("PARLAB_HUB_INSTRUCTORS", "").split(",") if u]
    course = args.course or (Path(pwd.getpwnam(instructors[0]).pw_dir) / "parlab" if instructors else None)
    when = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    report_file = args.report or Path(f"/var/log/parlab-preflight-{when}.txt")
    report = Report()
    report.add("--", "preflight", f"{args.url}, hub config {args.hub_dir}, course {course}, {when}")
    if not token or course is None or not (args.hub_dir / "kernel_api.py").exists():
        report.fail("setup", "preflight needs the course-admin token, an instructor (or --course) and the hub's "
                    f"config folder ({args.hub_dir})",
                    "set PARLAB_HUB_ADMIN_TOKEN (or --token-file), --instructor and --hub-dir")
        return _finish(report, report_file)
    kit, kernel_api = _load_kit(args.hub_dir)
    hub = Hub(args.url, token, kit)
    try:
        users = [u["name"] for u in hub.api("GET", "/users")]
    except (urllib.error.URLError, OSError) as e:
        report.fail("hub", f"the hub's API at {args.url} does not answer with the token: {e}",
                    "start the hub; give preflight the course-admin service token")
        return _finish(report, report_file)
    report.ok("hub", f"{args.url} answers; {len(users)} users")
    student = ThrowAwayStudent(hub, kit)
    try:
        student.create()
        started = time.monotonic()
        hub.api("POST", f"/users/{student.name}/server")
        hub.wait(student.name, running=True, timeout=300)
        report.ok("server", f"{student.name}'s server started through the REST API in {time.monotonic() - started:.0f} s")
        user_token = hub.api("POST", f"/users/{student.name}/tokens", {"note": "parlab preflight"})["token"]
        fingerprints = sorted({probe.fingerprint(line) for line in secret_lines(course)})
        roots = sorted({str(Path(pwd.getpwnam(u).pw_dir)) for u in users + instructors if _exists(u)}
                       | {str(course), str(args.exchange), str(args.hub_dir), "/home"}
                       | ({str(args.checkout)} if args.checkout else set()))
        spec = {"fingerprints": fingerprints, "roots": roots, "exchange": str(args.exchange),
                "budget_s": args.search_budget}
        code = (probe.source() + "\nimport json as _j\nprint('PREFLIGHT-FACTS ' + _j.dumps(observe("
                + json.dumps(spec) + ")))\n")
        with kernel_api.UserKernel(f"{args.url}/user/{student.name}", user_token) as kernel:
            reply = kernel.execute(code, timeout=args.search_budget + 900)
        line = next((x for x in reply.stdout.splitlines() if x.startswith("PREFLIGHT-FACTS ")), None)
        if line is None:
            raise RuntimeError(f"the probe printed no facts: {reply.error[-1500:] or reply.stdout[-1500:]}")
        facts = json.loads(line.split(" ", 1)[1])
        class_size = args.class_size or max(2, len(users))
        check_solutions(report, facts, len(fingerprints))
        if args.checkout:
            check_checkout(report, args.checkout)
        check_homes(report, sorted(set(users + instructors) - {student.name}))
        check_gpus(report, facts)
        check_limits(report, facts, class_size)
        check_kernel(report, facts)
        check_validate(report, facts, course_timeout(course))
        check_exchange(report, facts, args.exchange, set(instructors) | {"root"})
        boxed = check_bwrap(report, student.name)
        if "grading" in args.skip:
            report.skip("grading", "--skip grading")
        elif boxed:
            check_grading(report, course, args.workers)
        else:
            report.fail("grading", "not run: no bwrap to box the submissions", "apt-get install bubblewrap")
        check_culler(report, hub)
        check_late_penalty(report, args.hub_dir)

        def run_in_server(code: str, timeout: float) -> str:
            with kernel_api.UserKernel(f"{args.url}/user/{student.name}", user_token) as k:
                done = k.execute(code, timeout=timeout)
            if done.status != "ok":
                raise RuntimeError(done.error[-1500:] or done.stderr[-1500:])
            return done.stdout
        check_gpu_queue(report, run_in_server)
    except Exception as e:  # noqa: BLE001 - a run that cannot go on says where it stopped
        report.fail("preflight", f"stopped: {type(e).__name__}: {str(e)[-1500:]}", "see the hub's log and this report")
    finally:
        problems = student.remove()
        if problems:
            report.fail("cleanup", "; ".join(problems), f"remove them by hand (userdel --remove {student.name})")
        else:
            report.ok("cleanup", f"{student.name} removed (Unix user, hub user, server, processes)")
    return _finish(report, report_file)


def _exists(user: str) -> bool:
    try:
        pwd.getpwnam(user)
        return True
    except KeyError:
        return False


def _finish(report: Report, report_file: Path) -> int:
    verdict = f"{len(report.failed)} FAILED: {', '.join(report.failed)}" if report.failed else "all ok"
    report.add("--", "preflight", verdict)
    try:
        report_file.parent.mkdir(parents=True, exist_ok=True)
        report_file.write_text("\n".join(report.lines) + "\n")
        print(f"parlab preflight: report in {report_file}")
    except OSError as e:
        print(f"parlab preflight: could not write the report {report_file}: {e}", file=sys.stderr)
    return 1 if report.failed else 0
