"""What ``parlab preflight`` looks at from inside a student's server: run in that server's kernel, as the student.

Standard library only, and sent to the kernel as source (``source()``), so it
runs even in a kernel that cannot import parlab (that is one of the things
it reports).  ``observe(spec)`` returns facts as a JSON-able dict; the
judging, and each remedy, is ``parlab.preflight``'s, on the admin's side.

What it looks at:

- **solution text**: every file the student can read under the roots it is
  given (other homes, the instructor's course, the exchange, the hub's config) and
  the ones it finds itself (the folder behind ``parlab.__file__`` up to its
  repository, every ``sys.path`` entry, what their ``.pth`` files and
  editable-install finders point at, ``JUPYTER_CONFIG_PATH`` and
  ``JUPYTER_PATH`` and the folders above them), each line hashed and compared
  with the fingerprints of the solutions' lines; a file holding two or more
  of them counts.  The fingerprints are hashes:
  no solution text is sent into the student's server;
- **GPU devices**: whether each ``/dev/nvidia*`` opens (or fails only because
  no driver is behind it, which a GPU host's would not);
- **limits**: its cgroups (``/proc/self/cgroup``) and their CPU set, memory
  and process limits, whether it can write them, and whether
  ``sched_setaffinity`` to every CPU of the host widens its CPU set;
- **the kernel**: its Python, where parlab comes from, and the server's Python;
- **Validate**: nbgrader's Validate, configured as the server's handler
  configures it, run on a queue cell with the queue on (``PARLAB_SCHEDULER=slurm``);
- **the exchange**: whether the student can write into the course's folder of it.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time

#: Files whose lines are compared (text a solution could be in); a notebook's lines are its cells' lines.
TEXT_SUFFIXES = {"", ".py", ".ipynb", ".md", ".txt", ".json", ".html", ".cfg", ".toml", ".yml", ".yaml", ".sh",
                 ".rst", ".csv", ".tex", ".pth"}
MAX_FILE = 16 << 20
SKIP = ("/proc", "/sys", "/dev", "/run")
#: Lines shorter than this are not fingerprinted: too common to say anything (``return x``).
MIN_LINE = 30
#: A file counts when it holds this many different solution lines: one alone is often a line that
#: common code writes too (torch's tests hold ``return F.linear(x, self.weight, self.bias)``).
MIN_HITS = 2


def fingerprint(line: str) -> str:
    """The hash of one stripped line, as both sides compute it."""
    return hashlib.sha256(line.strip().encode()).hexdigest()[:32]


def file_lines(path: str, data: bytes) -> list[str]:
    text = data.decode("utf-8", errors="replace")
    if path.endswith(".ipynb"):
        try:
            cells = json.loads(text).get("cells", [])
            return "\n".join("".join(c.get("source", "")) for c in cells).splitlines()
        except (ValueError, AttributeError, TypeError):
            pass
    return text.splitlines()


def _repository_of(path: str) -> str:
    """The outermost folder above ``path`` that looks like a source checkout (pyproject.toml or .git), else ``path``."""
    found, folder = path, path
    while True:
        parent = os.path.dirname(folder)
        if parent == folder:
            return found
        folder = parent
        if os.path.exists(os.path.join(folder, "pyproject.toml")) or os.path.exists(os.path.join(folder, ".git")):
            found = folder


def discovered_roots() -> list[str]:
    """Folders this kernel's own set-up leads to: parlab's, sys.path's and what they name, Jupyter's paths."""
    roots = []
    try:
        import parlab
        roots.append(_repository_of(os.path.dirname(os.path.abspath(parlab.__file__))))
    except Exception:  # noqa: BLE001 - a kernel without parlab is reported by the kernel facts
        pass
    for entry in sys.path:
        if not entry or not os.path.isdir(entry):
            continue
        roots.append(entry)
        try:
            names = os.listdir(entry)
        except OSError:
            continue
        for name in names:
            path = os.path.join(entry, name)
            try:
                if name.endswith(".pth"):
                    with open(path, errors="replace") as f:
                        roots += [line.strip() for line in f if line.strip().startswith("/")]
                elif name.startswith("__editable__") and name.endswith(".py"):
                    with open(path, errors="replace") as f:
                        roots += re.findall(r"'(/[^']+)'", f.read())
            except OSError:
                continue
    for var in ("JUPYTER_CONFIG_PATH", "JUPYTER_PATH"):
        for entry in filter(None, os.environ.get(var, "").split(os.pathsep)):
            roots += [entry, os.path.dirname(entry.rstrip("/"))]
    out = []
    for root in roots:
        root = os.path.abspath(root)
        if os.path.isfile(root):
            root = os.path.dirname(root)
        if os.path.isdir(root) and root not in out:
            out.append(root)
    return out


def search(fingerprints: set[str], roots: list[str], budget_s: float = 300) -> dict:
    """Every readable text file under ``roots``: which hold lines whose fingerprint is in ``fingerprints``.

    The searching user's own home is left out: a student's own notebooks hold their own answers,
    which are often the solution's lines.
    """
    start, seen, hits = time.monotonic(), set(), {}
    own_home = os.path.realpath(os.path.expanduser("~"))
    files = size = unreadable = single = 0
    incomplete = ""
    for root in roots:
        for folder, dirs, names in os.walk(root, onerror=lambda e: None):
            if folder.startswith(SKIP) or os.path.realpath(folder) == own_home:
                dirs[:] = []
                continue
            dirs[:] = [d for d in dirs if d not in ("__pycache__", ".git")]
            for name in names:
                if os.path.splitext(name)[1].lower() not in TEXT_SUFFIXES:
                    continue
                path = os.path.join(folder, name)
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                if not os.path.stat.S_ISREG(st.st_mode) or st.st_size > MAX_FILE or (st.st_dev, st.st_ino) in seen:
                    continue
                seen.add((st.st_dev, st.st_ino))
                try:
                    with open(path, "rb") as f:
                        data = f.read()
                except OSError:
                    unreadable += 1
                    continue
                files, size = files + 1, size + len(data)
                found = {fp for line in file_lines(path, data) if len(line.strip()) >= MIN_LINE
                         and (fp := fingerprint(line)) in fingerprints}
                if len(found) >= MIN_HITS:
                    hits[path] = len(found)
                elif found:
                    single += 1
            if time.monotonic() - start > budget_s:
                incomplete = f"stopped after {budget_s:.0f} s in {folder}"
                break
        if incomplete:
            break
    return {"hits": hits, "single": single, "files": files, "bytes": size, "unreadable": unreadable, "roots": roots,
            "seconds": round(time.monotonic() - start, 1), "incomplete": incomplete}


def gpu_devices(dev: str = "/dev") -> dict:
    """Each NVIDIA device node and what opening it gave: "opened", or the errno's name."""
    found = {}
    paths = [os.path.join(dev, n) for n in sorted(os.listdir(dev)) if n.startswith("nvidia")]
    if os.path.isdir(os.path.join(dev, "nvidia-caps")):
        paths += [os.path.join(dev, "nvidia-caps", n) for n in sorted(os.listdir(os.path.join(dev, "nvidia-caps")))]
    for path in paths:
        if os.path.isdir(path):
            continue
        try:
            fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)
            os.close(fd)
            found[path] = "opened"
        except OSError as e:
            found[path] = errno.errorcode.get(e.errno, str(e.errno))
    return found


def _cgroup_files() -> dict:
    """{controller or "unified": the folder of this process's cgroup in it}."""
    out = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if controllers == "":
                out["unified"] = "/sys/fs/cgroup" + path
            for c in controllers.split(","):
                if c in ("cpuset", "memory", "pids", "devices"):
                    out[c] = f"/sys/fs/cgroup/{c}{path}"
    return out


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _writable(path: str, value: str) -> str:
    """Try to write ``value`` into a cgroup file: "written" (the limit was raised), or the errno's name."""
    if not os.path.exists(path):
        return "absent"
    if os.geteuid() == 0:  # root could write any limit: only a student's attempt says something
        return "not tried as root"
    try:
        with open(path, "w") as f:
            f.write(value)
        return "written"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))


def limits() -> dict:
    groups = _cgroup_files()
    v1 = "memory" in groups
    mem_dir = groups.get("memory") or groups.get("unified", "")
    pids_dir = groups.get("pids") or groups.get("unified", "")
    cpuset_dir = groups.get("cpuset") or groups.get("unified", "")
    mem_file = os.path.join(mem_dir, "memory.limit_in_bytes" if v1 else "memory.max")
    pids_file = os.path.join(pids_dir, "pids.max")
    cpus_file = os.path.join(cpuset_dir, "cpuset.cpus" if v1 else "cpuset.cpus.effective")
    before = sorted(os.sched_getaffinity(0))
    host = list(range(os.cpu_count() or 1))
    try:
        os.sched_setaffinity(0, host)
        widened = sorted(os.sched_getaffinity(0))
    except OSError as e:
        widened = errno.errorcode.get(e.errno, str(e.errno))
    finally:
        try:
            os.sched_setaffinity(0, before)
        except OSError:
            pass
    return {
        "cgroups": groups, "v1": v1,
        "memory": _read(mem_file), "memory_file": mem_file,
        "memory_write": _writable(mem_file, "-1" if v1 else "max"),
        "pids": _read(pids_file), "pids_file": pids_file, "pids_write": _writable(pids_file, "max"),
        "cpuset": _read(cpus_file), "cpuset_write": _writable(os.path.join(cpuset_dir, "cpuset.cpus"),
                                                              f"0-{len(host) - 1}"),
        "cpus": before, "host_cpus": len(host), "cpus_after_widening": widened,
    }


def kernel() -> dict:
    facts = {"python": sys.executable, "prefix": sys.prefix}
    try:  # the server started this kernel: its interpreter is the first word of its command line
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
            facts["server_python"] = f.read().split(b"\0")[0].decode()
    except OSError:
        facts["server_python"] = None
    try:
        import parlab
        facts["parlab"] = os.path.abspath(parlab.__file__)
        facts["parlab_repository"] = _repository_of(os.path.dirname(facts["parlab"]))
    except Exception as e:  # noqa: BLE001 - reported as it is
        facts["parlab"], facts["parlab_error"] = None, f"{type(e).__name__}: {e}"
    return facts


VALIDATE_CELL = """import os
os.environ["PARLAB_SCHEDULER"] = "slurm"
import parlab
assert parlab.launch.queue_configured()
assert not parlab.launch.offer_queue("preflight's queue cell", gpus=8), "VALIDATE WOULD QUEUE"
"""

VALIDATE_RUN = """
import json, sys
from nbgrader.server_extensions.validate_assignment.handlers import ValidateAssignmentHandler as H
from nbgrader.preprocessors import Execute
from nbgrader.validator import Validator
validator = Validator(config=H.load_config(None))
result = validator.validate(sys.argv[1])
print("PREFLIGHT-VALIDATE " + json.dumps({"timeout": Execute(parent=validator).timeout,
      "failed": [f.get("error", "")[-400:] for f in result.get("failed", [])]}))
"""


def validate(python: str) -> dict:
    """Validate, as the server's handler runs it (its Python, its config), on a notebook of one queue cell."""
    cell = {"cell_type": "code", "execution_count": None, "outputs": [], "source": VALIDATE_CELL,
            "metadata": {"nbgrader": {"grade": True, "grade_id": "queue", "points": 1, "solution": False,
                                      "locked": True, "schema_version": 3}}}
    nb = {"cells": [cell], "nbformat": 4, "nbformat_minor": 5,
          "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}}
    with tempfile.TemporaryDirectory(prefix="parlab-preflight-") as folder:
        path = os.path.join(folder, "queue.ipynb")
        with open(path, "w") as f:
            json.dump(nb, f)
        env = {k: v for k, v in os.environ.items() if k not in ("PARLAB_VALIDATE", "PARLAB_AUTOGRADE")}
        proc = subprocess.run([python, "-c", VALIDATE_RUN, path], cwd=folder, env=env, capture_output=True,
                              text=True, timeout=600)
    for line in proc.stdout.splitlines():
        if line.startswith("PREFLIGHT-VALIDATE "):
            return json.loads(line.split(" ", 1)[1])
    return {"error": (proc.stdout + proc.stderr)[-1500:]}


def observe(spec: dict) -> dict:
    """Everything above, for ``spec`` = {"fingerprints": [...], "roots": [...], "exchange": path, "budget_s": s}."""
    facts = {"user": os.getuid()}
    steps = {
        "kernel": kernel,
        "limits": limits,
        "gpus": gpu_devices,
        "search": lambda: search(set(spec["fingerprints"]), discovered_roots() + list(spec["roots"]),
                                 spec.get("budget_s", 300)),
        "exchange": lambda: {"course_writable": os.access(os.path.join(spec["exchange"], "parlab"), os.W_OK),
                             "root_writable": os.access(spec["exchange"], os.W_OK)},
        "validate": lambda: validate(facts["kernel"].get("server_python") or sys.executable),
    }
    for name, step in steps.items():
        try:
            facts[name] = step()
        except Exception as e:  # noqa: BLE001 - one step's failure is that step's finding
            facts[name] = {"error": f"{type(e).__name__}: {e}"}
    return facts


def source() -> str:
    """This module's source, to send to a kernel."""
    with open(__file__) as f:
        return f.read()
