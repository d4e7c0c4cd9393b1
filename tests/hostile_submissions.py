"""A class of hostile lab 00 submissions, and what grading it must leave: one definition for every way of grading it.

``make_class`` builds a scratch course (lab 00, the cheapest) holding five
hostile submissions (one of them refused before anything runs) and one
correct submission graded after them;
``grade`` runs ``parlab grade`` over it (here, with ``--slurm``, or as
another Unix user), and the ``test_*`` functions below are what every way
must show: each test module imports them and defines the ``graded``
fixture they run on.
tests/nbgrader/test_hostile_submissions.py grades it with ``parlab grade`` here,
tests/slurm/test_grade_hostile_slurm.py a part of it as one Slurm array, and
tests/nbgrader/test_hostile_non_root.py another part as an unprivileged user.

Each hostile submission is lab 00's solution with some answer cells
replaced by an attack; an attack that worked would define the answer (and
so claim its points), print what it reached, or break what is graded after
it.  The attacks: write the checks, write ``gradebook.db``, read
``solutions/`` and print it, read another student's submission (h1); kill
the grader's parent from the kernel, point the launcher at the grader
through a rank's pid file, open a connection outside loopback (h2); edit
nbgrader's cell metadata to claim points, a fork bomb, fill the disk (h3);
allocate 30 GB, sleep forever, turn an answer already handed in into a FIFO
and put FIFOs at the later hand-in names, leaving that answer undefined
(h4: a grader that opens a FIFO waits for a writer that never comes); a
submitted folder holding a link to a root-only file and one to the
solution notebook, beside a notebook whose first answer prints both (h5:
refused, so nothing of it runs or is copied).
"""
from __future__ import annotations

import hashlib
import json
import re
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat
import psutil

from class_course import add_students, gradebook_scores, make_course, notebook, submit, tool_env
from nbgrader_harness import REPO, TOKEN_VAR, leftover_processes, source_notebook
from parlab.grading import boundary
from parlab.classgrade.worker import LOG as worker_log
from parlab.classgrade.worker import RESULT as worker_result

LAB = "00-setup"
MARKER = "zz-private-marker-7f3a9c"  # only in zz's submission
ROOT_ONLY = "root-only-secret-2b8e41"  # only in a root-only file outside the course, which h5 links to
TITLE = "Lab 00 — Setup, and why one GPU is not enough"  # only in the notebooks' markdown, not the submissions
#: Seconds a cell may run in this course: h4's sleeping cell waits this long in every way of
#: grading.  The slowest honest cell (the first: importing torch, while another worker grades)
#: took 11 s on an idle 2-core machine, and more than 30 s at a load of 8 to 13 (make test's two
#: lanes beside other work), where honest cells were stopped: so twice that.
CELL_TIMEOUT = 60
#: Less than what a grader that waits on h4's FIFOs loses: its sandbox stopped at its limit (CELL_TIMEOUT
#: for each of the 3 test cells with an answer handed in), after a hand-in stuck for CELL_TIMEOUT.
FIFO_STALL = 3 * CELL_TIMEOUT
#: Bounds of this course, small so that the attacks reach them fast.
CONFIG = f"""
c.Execute.timeout = {CELL_TIMEOUT}
c.GuardedExecute.box_memory_mb = 4096
c.GuardedExecute.box_processes = 512
c.GuardedExecute.box_scratch_mb = 64
"""
POINTS = {"hello-test": 2, "weight_bytes-test": 1, "training_state_bytes-test": 1,
          "gpus_to_hold_state-test": 1, "days_to_train-test": 2}

WRITES_THE_CHECKS = '''
import parlab.grading.lab00 as checks
try:
    with open(checks.__file__, "a") as f:
        f.write("")  # a real attack appends a line that breaks the next student's check
    def hello():
        import torch.distributed as dist
        return f"hello from rank {dist.get_rank()} of {dist.get_world_size()}"
except OSError as exc:
    print("cannot write the checks:", exc)
'''

WRITES_THE_GRADEBOOK = '''
import os, sqlite3
for path in [{root!r} + "/gradebook.db", os.path.abspath("../../../gradebook.db"),
             os.path.abspath("../../../../../../gradebook.db")]:
    try:
        con = sqlite3.connect(f"file:{{path}}?mode=rw", uri=True)
        con.execute("UPDATE grade SET manual_score = 100")
        con.commit()
        def weight_bytes(n_params, bytes_per_param):
            return n_params * bytes_per_param
    except sqlite3.Error as exc:
        print("no gradebook at", path, exc)
'''

READS_SOLUTIONS = '''
import glob
for path in (glob.glob({root!r} + "/solutions/*/*.ipynb") + glob.glob({repo!r} + "/solutions/*/*.ipynb")
             + glob.glob("../../../solutions/*/*.ipynb") + glob.glob("../../../../../../solutions/*/*.ipynb")):
    print(open(path).read())
print("solutions found:", len(glob.glob({root!r} + "/solutions/*/*.ipynb")))
'''

READS_ANOTHER_SUBMISSION = '''
import glob, os
found = glob.glob({root!r} + "/submitted/*/*/*.ipynb") + glob.glob("../../*/*/*.ipynb") \\
    + glob.glob({root!r} + "/.parlab-grade/*/*/submitted/*/*/*.ipynb") + glob.glob("../../../submitted/*/*/*.ipynb")
found = [p for p in found if not os.path.realpath(p).startswith(os.getcwd() + "/")]  # not its own
for path in found:
    print(open(path).read())
print("submissions found:", len(found))
'''

KILLS_THE_GRADERS_PARENT = '''
import os, signal
try:
    os.kill(os.getppid(), signal.SIGKILL)
except OSError as exc:
    print("cannot kill the parent:", exc)
for pid in [p for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]:
    try:  # the grader's processes carry the run's token: kill each one and its parent
        if b"{token_var}={token}" in open(f"/proc/{{pid}}/environ", "rb").read().split(b"\\0"):
            ppid = int(open(f"/proc/{{pid}}/stat").read().rsplit(")", 1)[1].split()[1])
            os.kill(ppid, signal.SIGKILL)
            os.kill(int(pid), signal.SIGKILL)
    except (OSError, ValueError) as exc:
        pass
print("the kernel sees", len(os.listdir("/proc")), "entries in /proc")
'''

POINTS_THE_LAUNCHER_AT_THE_GRADER = '''
def weight_bytes(n_params, bytes_per_param):
    """On a rank: name the grading sandbox as this rank in its pid file, so that the launcher signals it."""
    import os, signal

    def parent(pid):
        return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])

    def started(pid):
        return "t" + open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[19]

    target = parent(parent(parent(os.getpid())))  # rank -> torchrun -> bwrap -> the sandbox
    import torch.distributed as dist
    path = os.path.join(os.environ["PARLAB_JOB_DIR"], f"pid.{dist.get_rank() if dist.is_initialized() else 0}")
    with open(path + ".part", "w") as f:
        f.write(f"{target} {started(target)}")
    os.replace(path + ".part", path)
    try:
        os.kill(target, signal.SIGKILL)
    except OSError:
        pass
    raise RuntimeError("now the launcher ends 'this rank'")
'''

OPENS_A_CONNECTION = '''
import socket
print("interfaces:", [name for _, name in socket.if_nameindex()])
try:
    socket.create_connection(({host!r}, {port}), timeout=3).close()
    print("connected")
except OSError as exc:
    print("no way out:", exc)


def training_state_bytes(n_params):
    """On a rank: SIGKILL every process it can see outside its own ancestors, then fill its launch folder.

    With the host's pids and the grader's uid (a non-root grader, before the ranks' box had a pid
    namespace), those were the grader, its other workers and the instructor's own processes.
    """
    import os, signal

    def parent(pid):
        return int(open(f"/proc/{{pid}}/stat").read().rsplit(")", 1)[1].split()[1])

    mine, pid = set(), os.getpid()
    while pid > 0 and pid not in mine:
        mine.add(pid)
        try:
            pid = parent(pid)
        except (OSError, ValueError, IndexError):
            break
    killed = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) not in mine:
            try:
                os.kill(int(entry), signal.SIGKILL)
                killed += 1
            except OSError:
                pass
    written, fill = 0, os.path.join(os.environ["PARLAB_JOB_DIR"], "fill.bin")
    try:  # the launch folder, which the grader reads from its own disk
        with open(fill, "wb") as f:
            for _ in range(256):
                f.write(b"x" * (1 << 20))
                written += 1
    except OSError:
        pass
    os.unlink(fill)  # room for this rank's error report, which says how far it got
    raise RuntimeError(f"done (killed {{killed}}; the launch folder took {{written}} MiB)")
'''

FORK_BOMB = '''
import os, time
born = 0
while True:
    try:
        pid = os.fork()
    except OSError as exc:
        print(f"the fork bomb stopped after {born} forks: {exc}")
        break
    if pid == 0:
        while True:  # every child forks too, and holds its slot
            try:
                os.fork()
            except OSError:
                pass
            time.sleep(5)
    born += 1
'''

FILLS_THE_DISK = '''
import os
written = 0
try:  # the folder answers are handed in through, on the grader's own disk
    with open(os.path.join(os.environ["PARLAB_AUTOGRADE"], "fill.bin"), "wb") as f:
        for _ in range(256):
            f.write(b"x" * (1 << 20))
            written += 1
except OSError as exc:
    print("the hand-in folder took", written, "MiB:", exc)
with open("fill.bin", "wb") as f:
    while True:
        f.write(b"x" * (1 << 20))
'''

ALLOCATES_30_GB = '''
blocks = []
for _ in range(120):
    blocks.append(b"x" * (256 << 20))  # 30 GB, touched
def weight_bytes(n_params, bytes_per_param):
    return n_params * bytes_per_param
'''

SLEEPS_FOREVER = '''
import time
time.sleep(10 ** 9)
'''

HANDS_IN_FIFOS = '''
import glob, os, re
handin = os.environ["PARLAB_AUTOGRADE"]  # the folder this kernel hands its answers in
index = {path: int(re.search(r"cell(\\d+)-", path).group(1)) for path in glob.glob(handin + "/cell*-*.pkl")}
last = max(index.values(), default=0)
made = 0
for path in [p for p, i in index.items() if i == last]:  # the last answer handed in (hello's) becomes a FIFO
    os.unlink(path)
    os.mkfifo(path)
    made += 1
for i in range(last + 1, last + 40):  # a FIFO at each later hand-in name; this answer is left undefined
    for k in range(2):
        os.mkfifo(f"{handin}/cell{i}-{k}.pkl")
        made += 1
print(f"FIFOs made: {made}, {len(index)} of them in place of answers handed in")
'''

PRINTS_THE_LINKS = '''
for name in ("notes.txt", "sol.txt"):
    try:
        print(open(name).read())
    except OSError as exc:
        print("cannot read", name, exc)
'''


def answer_cell(nb, grade_id: str):
    return next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


def _attack(nb, attacks: dict[str, str]):
    for grade_id, code in attacks.items():
        answer_cell(nb, grade_id).source = code
    return nb


def _claims_points(nb):
    """The hello test cell made to pass and worth 100 points, checksums recomputed, its answer left out."""
    from nbgrader.utils import compute_checksum

    answer_cell(nb, "hello").source = "raise NotImplementedError()"
    for grade_id in ("hello", "hello-test"):
        cell = answer_cell(nb, grade_id)
        meta = cell.metadata["nbgrader"]
        if grade_id == "hello-test":
            cell.source = 'print("all tests passed")'
        meta.update(grade=True, points=100, locked=False)
        meta["checksum"] = compute_checksum(cell)
    return nb


def _host_address() -> str | None:
    """This machine's own non-loopback IPv4 address (never anything outside it)."""
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                return a.address
    return None


def tree_digest(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root``, but the grading state nbgrader and parlab grade write."""
    skip = ("autograded/", "feedback/", ".parlab-grade/", "gradebook.db")
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and not str(p.relative_to(root)).startswith(skip)}


def _code_digest() -> dict[str, str]:
    import parlab.grading.lab00 as checks

    folder = Path(checks.__file__).parent
    files = [*sorted(folder.rglob("*.py")), *sorted((REPO / "solutions" / LAB).glob("*.ipynb"))]
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def box_uids(root: Path) -> set[int]:
    """The box uids this course's grading claimed (each worker's log names its submission's)."""
    uids = set()
    for log in (root / ".parlab-grade" / LAB).glob(f"*/{worker_log}"):
        uids |= {int(u) for u in re.findall(r"this submission's boxes run as uid (\d+)", log.read_text())}
    return {u for u in uids if boundary.UID_BASE <= u < boundary.UID_BASE + boundary.UID_SPAN}


class Listener:
    """Accepts on this machine's own address and counts who got through."""

    def __init__(self, host: str):
        self.sock = socket.create_server((host, 0))
        self.port, self.accepted = self.sock.getsockname()[1], 0
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()


ATTACKED = {"h1": {"hello-test", "weight_bytes-test", "training_state_bytes-test", "gpus_to_hold_state-test"},
            "h2": {"hello-test", "weight_bytes-test", "training_state_bytes-test"},
            "h3": {"hello-test", "weight_bytes-test", "training_state_bytes-test"},
            "h4": {"hello-test", "weight_bytes-test", "training_state_bytes-test", "gpus_to_hold_state-test"},
            "h5": set(POINTS),  # refused: graded not at all
            "zz": set()}
#: Submissions refused before grading, and the file each one's reason must name.
REFUSED = {"h5": f"h5/{LAB}/notes.txt is a symbolic link"}


def graded_students(cls) -> list[str]:
    return [s for s in cls.students if s not in REFUSED]


def _autograded(root: Path, student: str):
    return nbformat.read(root / "autograded" / student / LAB / source_notebook(LAB).name, as_version=4)


def outputs(root: Path, student: str) -> str:
    return json.dumps([c.get("outputs", []) for c in _autograded(root, student).cells])


def _cell_outputs(root: Path, student: str, cells: set) -> str:
    """What the named graded cells printed, for a failure message."""
    shown = [f"--- {c.metadata.get('nbgrader', {}).get('grade_id')}\n{json.dumps(c.get('outputs', []))[-2000:]}"
             for c in _autograded(root, student).cells if c.metadata.get("nbgrader", {}).get("grade_id") in cells]
    return "\n".join(shown)


def feedback(root: Path, student: str) -> str:
    return (root / "feedback" / student / LAB / f"{LAB}.html").read_text()



@dataclass
class HostileClass:
    """A course holding the hostile class, hashed before grading."""

    root: Path
    students: list[str]
    listener: Listener | None
    before: dict[str, str]
    code_before: dict[str, str]


def make_class(folder: Path, token: str, students=tuple(ATTACKED)) -> HostileClass:
    """The course under ``folder`` with ``students`` (all five by default) submitted; ``token`` marks the grader's processes."""
    root = make_course(folder / "course", [LAB])
    with open(root / "nbgrader_config.py", "a") as f:
        f.write(CONFIG)
    host = _host_address()
    listener = Listener(host) if host else None
    fill = {"root": str(root), "repo": str(REPO), "token_var": TOKEN_VAR, "token": token,
            "host": host or "127.0.0.2", "port": listener.port if listener else 9}
    build = {
        "h1": lambda: _attack(notebook(LAB, root), {
            "hello": WRITES_THE_CHECKS, "weight_bytes": WRITES_THE_GRADEBOOK.format(**fill),
            "training_state_bytes": READS_SOLUTIONS.format(**fill),
            "gpus_to_hold_state": READS_ANOTHER_SUBMISSION.format(**fill)}),
        "h2": lambda: _attack(notebook(LAB, root), {
            "hello": KILLS_THE_GRADERS_PARENT.format(**fill), "weight_bytes": POINTS_THE_LAUNCHER_AT_THE_GRADER,
            "training_state_bytes": OPENS_A_CONNECTION.format(**fill)}),
        "h3": lambda: _attack(_claims_points(notebook(LAB, root)), {
            "weight_bytes": FORK_BOMB, "training_state_bytes": FILLS_THE_DISK}),
        "h4": lambda: _attack(notebook(LAB, root), {"weight_bytes": ALLOCATES_30_GB,
                                                    "training_state_bytes": SLEEPS_FOREVER,
                                                    "gpus_to_hold_state": HANDS_IN_FIFOS}),
        "h5": lambda: _attack(notebook(LAB, root), {"hello": PRINTS_THE_LINKS + answer_cell(
            notebook(LAB, root), "hello").source}),
        "zz": lambda: _marked(notebook(LAB, root)),
    }
    add_students(root, list(students))
    for student in students:
        submit(root, student, LAB, build[student]())
    if "h5" in students:  # a file only root may read, outside the course, and the solution notebook
        secret = folder / "root-only.txt"
        secret.write_text(f"{ROOT_ONLY}\n")
        secret.chmod(0o600)
        (root / "submitted" / "h5" / LAB / "notes.txt").symlink_to(secret)
        (root / "submitted" / "h5" / LAB / "sol.txt").symlink_to(root / "solutions" / LAB / source_notebook(LAB).name)
    return HostileClass(root, list(students), listener, tree_digest(root), _code_digest())


def _marked(nb):
    answer_cell(nb, "weight_bytes").source += f"\n# {MARKER}\n"
    return nb


def grade(cls: HostileClass, token: str, *args: str, prefix: tuple = (), env: dict | None = None,
          timeout: float = 1400) -> dict:
    """``prefix + parlab grade LAB ARGS`` in the course; what the checks below read."""
    start = time.perf_counter()
    proc = subprocess.run([*prefix, sys.executable, "-m", "parlab", "grade", LAB, *args], cwd=cls.root,
                          env=env or tool_env(**{TOKEN_VAR: token}), stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    print(f"\nparlab grade {' '.join(args)} over {len(cls.students)} submissions: "
          f"{time.perf_counter() - start:.1f} s\n{proc.stdout}")
    return {"class": cls, "token": token, "rc": proc.returncode, "out": proc.stdout, "scores": gradebook_scores(cls.root, LAB),
            "after": tree_digest(cls.root), "code_after": _code_digest()}


# ---------------------------------------------------------------- what every way of grading must show
# (each test module imports these tests and gives them its own ``graded`` fixture: grade()'s result)
def test_every_submission_graded(graded: dict) -> None:
    assert graded["rc"] == 0, graded["out"]
    assert set(graded["scores"]) == set(graded_students(graded["class"])), graded["out"]


def test_attacked_exercises_score_zero_the_rest_full_marks(graded: dict) -> None:
    for student in graded_students(graded["class"]):
        got = graded["scores"][student]
        want = {cell: (0.0 if cell in ATTACKED[student] else float(points), float(points))
                for cell, points in POINTS.items()}
        wrong = {cell for cell in want if got.get(cell) != want[cell]}
        assert got == want, (student, got, graded["out"], _cell_outputs(graded["class"].root, student, wrong))


def test_nothing_reached_leaks_into_outputs_or_feedback(graded: dict) -> None:
    root = graded["class"].root
    h1 = outputs(root, "h1")
    # (the submissions hold the solution's answer cells, markers and all, so "BEGIN SOLUTION" may be in
    # their sources; never in what their cells printed)
    assert "BEGIN SOLUTION" not in h1 and "BEGIN HIDDEN TESTS" not in h1, h1
    for text in (h1, feedback(root, "h1")):
        assert TITLE not in text and MARKER not in text  # the solution notebook's title; zz's submission
    assert "solutions found: 0" in h1 and "submissions found: 0" in h1, h1
    assert "cannot write the checks" in h1 and ("Read-only file system" in h1 or "Permission denied" in h1), h1
    assert "no gradebook at" in h1, h1


def test_a_submission_holding_links_is_refused_unread(graded: dict) -> None:
    """h5 is refused, the reason naming its first link, and nothing it links to is anywhere in the results."""
    root = graded["class"].root
    notes = root / "submitted" / "h5" / LAB / "notes.txt"
    assert notes.is_symlink() and (root / "submitted" / "h5" / LAB / "sol.txt").is_symlink()
    assert ROOT_ONLY in notes.read_text()  # the attack's precondition: a copy made through the link carries it
    assert f"h5{' ' * 14} rejected {REFUSED['h5']}" in graded["out"], graded["out"]
    assert f"h5: {REFUSED['h5']}" in graded["out"], graded["out"]  # in the summary too
    assert "h5" not in graded["scores"]
    for kind in ("autograded", "feedback"):
        assert not (root / kind / "h5").exists()
        for path in (root / kind).rglob("*"):
            if path.is_file():
                text = path.read_text(errors="replace")
                assert ROOT_ONLY not in text and TITLE not in text, path


def test_a_fifo_hand_in_costs_its_exercise_and_no_wait(graded: dict) -> None:
    """h4's FIFOs: the FIFO in place of hello's answer and the one at gpus_to_hold_state's hand-in name cost
    those two exercises (scored in the test above), the answer handed in after them still counts, and
    no one waits on a FIFO: the sandbox finished within its limit (it was not stopped)."""
    h4 = outputs(graded["class"].root, "h4")
    assert re.search(r"FIFOs made: \d+, [12] of them in place of answers handed in", h4), h4
    assert "hello was not handed in for grading: its file is a FIFO (named pipe)" in h4, h4
    assert "gpus_to_hold_state could not be handed in for grading (NameError" in h4, h4
    assert "grading took longer than" not in h4, h4  # what the sandbox's cells say when it is stopped
    seconds = {s: json.loads((graded["class"].root / ".parlab-grade" / LAB / s / worker_result).read_text())["seconds"]
               for s in ("h4", "zz")}
    assert seconds["h4"] < seconds["zz"] + FIFO_STALL, seconds  # h4 also sleeps CELL_TIMEOUT in one cell


def test_network_is_loopback_only(graded: dict) -> None:
    h2 = outputs(graded["class"].root, "h2")
    assert "interfaces: ['lo']" in h2, h2
    # the rank that tried to kill every process it could see killed none (the box's own pids only),
    # and filled its launch folder no further than a scratch folder's bound
    found = re.search(r"killed (\d+); the launch folder took (\d+) MiB", h2)
    assert found and found.group(1) == "0" and int(found.group(2)) <= 64, h2
    if graded["class"].listener is not None:
        assert "no way out" in h2, h2
        assert graded["class"].listener.accepted == 0


def test_cells_that_reach_a_bound_say_which(graded: dict) -> None:
    root, students = graded["class"].root, graded["class"].students
    if "h3" in students:
        h3 = outputs(root, "h3")
        assert "the fork bomb stopped after" in h3 and "bound on 512 processes" in h3, h3
        assert "writable folders hold at most 64 MiB" in h3, h3
        took = re.search(r"the hand-in folder took (\d+) MiB", h3)
        assert took and int(took.group(1)) <= 64, h3
    h4 = outputs(root, "h4")
    assert re.search(r"bound on 4 GiB|may use at most 4096 MiB", h4), h4
    assert f"each cell may run at most {CELL_TIMEOUT} s" in h4, h4


def test_course_tree_and_code_unchanged(graded: dict) -> None:
    assert graded["after"] == graded["class"].before
    assert graded["code_after"] == graded["class"].code_before


def test_nothing_left_running(graded: dict) -> None:
    """No process under the run's token, of the run's box uids, or (``graded["uids"]``) of the users who graded."""
    uids = set(graded.get("uids", ())) or box_uids(graded["class"].root)
    if not graded.get("uids"):  # graded as root: one box uid of its own per submission
        assert len(uids) == len(graded_students(graded["class"])), uids

    def left():
        return leftover_processes(graded["token"]) + [
            (p.pid, " ".join(p.info["cmdline"] or [])) for p in psutil.process_iter(["uids", "cmdline"])
            if p.info["uids"] and uids & {p.info["uids"].real, p.info["uids"].effective}]

    deadline = time.monotonic() + 15
    while (found := left()) and time.monotonic() < deadline:
        time.sleep(0.25)
    assert not found, found
