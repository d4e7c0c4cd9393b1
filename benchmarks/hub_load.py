"""The course hub under a class: one server's memory, and N students launching at once.

Starts the hub of hub/jupyterhub_config.py (hub/course_hub.py) with N
students as real Unix users, then, measured in one run:

1. one student's server, by kind of process (the server, its kernel, and
   during the launch the launcher, i.e. the kernel's fork server and torchrun's agent, and the ranks): RSS
   (resident, counting shared libraries in every process that maps them) and
   USS (private to the process: what it adds to the machine), sampled every
   0.25 s; the kernel bare and after lab 00's imports (``torch.distributed``,
   ``parlab``); then during lab 00's first launch on 4 ranks, with the
   cgroup's own peak (``memory.max_usage_in_bytes`` on cgroup v1,
   ``memory.peak`` on v2);
2. N students at once, through the hub's REST API (a token each, not a
   browser each): each starts a server, starts a ``python3`` kernel through
   the server's API and runs lab 00's imports; when all N kernels are up
   (or failed), the machine's memory taken by the N idle servers is read
   (``MemAvailable`` before and after), then every student runs lab 00's
   first launch (``hello`` on NPROC ranks) at the same moment.  Memory of
   the class: ``MemAvailable`` (which other work on the machine moves too)
   and the memory charged to the students' cgroups, summed (theirs alone),
   when all are idle and at its peak during the launches.  With
   ``--launch-slots K`` at most K launches run at once and the others wait
   for a slot (an admission of the benchmark's own, standing in for a
   queue: the hub itself has none); without it all N run together.  Per
   student: seconds from the common start until the server is ready, until
   the kernel is up, spent waiting for a slot, and until the launch's result
   is back; and whether every result is the right one (nothing lost);
3. optionally (``--tier``) the hub test tier, timed as a whole
   (``pytest tests/hub``), before the rest.

Memory: before step 2 the run is refused, with the figures, when N
students would need more than ``MemAvailable`` less ``--reserve-gb`` (from
step 1's private memory: N idle servers plus the launches that may run at
once).  During it, if ``MemAvailable`` still falls below the reserve, every
student's processes are ended (by pid, from their cgroups) and the run says
so.  The machine is shared: keep the reserve.

Afterwards every server is stopped through the API, and the processes left
of the students' users are counted (then the users are removed).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/hub_load.py [--students 30] [--nproc 2]
        [--launch-slots K] [--reserve-gb 3] [--tier]

Needs root, JupyterHub (the hub extra) and configurable-http-proxy.
"""
from __future__ import annotations

import argparse
import fcntl
import os
import pwd
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "hub"))
from course_hub import CourseHub, pids_of_uid  # noqa: E402
from course_spawner import MemoryCgroup, class_cpu_block, kill_pids  # noqa: E402
from kernel_api import UserKernel  # noqa: E402

HELLO = '''
import torch.distributed as dist
import parlab

def hello():
    message = f"hello from rank {dist.get_rank()} of {dist.get_world_size()}"
    print(message)
    return message
'''


def wait_ready(hub: CourseHub, user: str, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        server = hub.api("GET", f"/users/{user}").get("servers", {}).get("")
        if server and server.get("ready"):
            return
        time.sleep(0.5)
    raise TimeoutError(f"{user}'s server was not ready within {timeout:.0f} s")


def start_server(hub: CourseHub, user: str) -> None:
    try:
        hub.api("POST", f"/users/{user}/server", timeout=600)
    except Exception as e:  # 202 (pending) is fine; anything else is reported by wait_ready
        if getattr(e, "code", None) not in (201, 202):
            raise
    wait_ready(hub, user)


def token(hub: CourseHub, user: str) -> str:
    return hub.api("POST", f"/users/{user}/tokens", {"note": "hub_load"})["token"]


def expected(nproc: int) -> list[str]:
    return [f"hello from rank {r} of {nproc}" for r in range(nproc)]


KINDS = (("jupyterhub-singleuser", "server"), ("ipykernel", "kernel"))
MP_FORKSERVER = "from multiprocessing.forkserver import main"


def kind_of(proc: psutil.Process) -> str:
    """server, kernel, rank, or launcher: what the kernel's launches start besides the ranks.

    The launcher's processes are forked (the kernel's fork server, torchrun's agent forked from
    it, multiprocessing's fork server under the agent, the ranks forked from that), and a forked
    process keeps the command line of the one it was forked from.  So a rank is a child of
    multiprocessing's fork server with its command line, or, started cold, runs parlab.launch.worker
    and is not the agent (whose command line names the worker too).
    """
    cmdline = " ".join(proc.cmdline())
    kind = next((kind for marker, kind in KINDS if marker in cmdline), None)
    if kind:
        return kind
    try:
        parent = " ".join(proc.parent().cmdline()) if proc.parent() else ""
    except psutil.Error:
        parent = ""
    if MP_FORKSERVER in cmdline and MP_FORKSERVER in parent or \
            "parlab.launch.worker" in cmdline and "parlab.launch.agent" not in cmdline:
        return "rank"
    return "launcher" if "parlab" in cmdline or MP_FORKSERVER in cmdline else "other"


def memory_by_kind(pids) -> dict[str, dict]:
    """{kind: {"n", "rss", "uss"}} summed over ``pids`` (bytes)."""
    out: dict[str, dict] = {}
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            info = proc.memory_full_info()
            row = out.setdefault(kind_of(proc), {"n": 0, "rss": 0, "uss": 0})
        except psutil.Error:
            continue
        row["n"] += 1
        row["rss"] += info.rss
        row["uss"] += info.uss
    return out


def total(by_kind: dict, key: str) -> int:
    return sum(row[key] for row in by_kind.values())


class Sampler:
    """Peaks of one memory cgroup's processes, sampled every 0.25 s: summed RSS and USS, and per kind."""

    def __init__(self, cgroup: MemoryCgroup):
        self.cgroup, self.stop = cgroup, threading.Event()
        self.peak = {"rss": 0, "uss": 0}
        self.kinds: dict[str, dict] = {}
        self.thread = threading.Thread(target=self.run, daemon=True)

    def sample(self) -> dict:
        by_kind = memory_by_kind(self.cgroup.pids())
        for key in self.peak:
            self.peak[key] = max(self.peak[key], total(by_kind, key))
        for kind, row in by_kind.items():
            best = self.kinds.setdefault(kind, {"n": 0, "rss": 0, "uss": 0})
            for key in best:
                best[key] = max(best[key], row[key])
        return by_kind

    def run(self):
        while not self.stop.is_set():
            self.sample()
            time.sleep(0.25)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def mem_available() -> int:
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))


def cgroup_value(cgroup: MemoryCgroup, v1_name: str, v2_name: str) -> int:
    """One of the cgroup's memory figures, in bytes (0 when it has none)."""
    for name in (v1_name, v2_name):
        try:
            return int((cgroup.path / name).read_text())
        except OSError:
            continue
    return 0


def cgroup_usage(cgroup: MemoryCgroup) -> int:
    """Memory charged to the cgroup now (its processes' memory and the page cache they brought in)."""
    return cgroup_value(cgroup, "memory.usage_in_bytes", "memory.current")


def cgroup_peak(cgroup: MemoryCgroup) -> int:
    return cgroup_value(cgroup, "memory.max_usage_in_bytes", "memory.peak")


def class_usage(students: list[str]) -> int:
    return sum(cgroup_usage(MemoryCgroup(user, 0)) for user in students)


def reset_cgroup_peak(cgroup: MemoryCgroup) -> None:
    try:
        (cgroup.path / "memory.max_usage_in_bytes").write_text("0")
    except OSError:
        pass  # v2's memory.peak cannot be reset on older kernels: then it includes the idle phase


def one_server_memory(hub: CourseHub, user: str) -> dict:
    start_server(hub, user)
    cgroup = MemoryCgroup(user, 0)
    time.sleep(2)
    out = {"server alone": memory_by_kind(cgroup.pids())}
    with UserKernel(f"{hub.url}/user/{user}", token(hub, user)) as kernel:
        kernel.execute("pass")
        time.sleep(2)
        out["kernel bare"] = memory_by_kind(cgroup.pids())
        kernel.execute(HELLO)
        time.sleep(2)
        out["idle"] = memory_by_kind(cgroup.pids())  # lab 00's imports done: torch.distributed, parlab
        reset_cgroup_peak(cgroup)
        with Sampler(cgroup) as sampler:
            reply = kernel.execute("parlab.launch(hello, nproc=4)", timeout=600)
        assert all(line in reply.result for line in expected(4)), reply
        out["launch"], out["launch peak"] = sampler.kinds, sampler.peak
        out["launch cgroup peak"] = cgroup_peak(cgroup)
    hub.stop_server(user)
    return out


def print_memory(mem: dict) -> None:
    mb = 1e6

    def line(what: str, by_kind: dict) -> str:
        parts = [f"{kind} {row['rss'] / mb:.0f}/{row['uss'] / mb:.0f}" + (f" (x{row['n']})" if row["n"] > 1 else "")
                 for kind, row in sorted(by_kind.items())]
        return (f"  {what}: {total(by_kind, 'rss') / mb:.0f} MB RSS, {total(by_kind, 'uss') / mb:.0f} MB private"
                f" [{', '.join(parts)}; RSS/private MB]")
    print("one server's memory (RSS counts shared libraries in each process; private (USS) is what it adds):")
    print(line("server alone, no kernel", mem["server alone"]))
    print(line("with a bare python3 kernel", mem["kernel bare"]))
    print(line("idle, the kernel after lab 00's imports", mem["idle"]))
    kernel_gain = mem["idle"]["kernel"]["uss"] - mem["kernel bare"]["kernel"]["uss"]
    print(f"  lab 00's imports (torch) add {kernel_gain / mb:.0f} MB private to the kernel")
    print(line("lab 00's 4-rank launch, each kind at its peak", mem["launch"]))
    print(f"  launch peak, summed: {mem['launch peak']['rss'] / mb:.0f} MB RSS, "
          f"{mem['launch peak']['uss'] / mb:.0f} MB private; cgroup peak {mem['launch cgroup peak'] / mb:.0f} MB",
          flush=True)


def launch_private(mem: dict, nproc: int) -> int:
    """Private bytes one student's ``nproc``-rank launch adds to an idle server (from the 4-rank figures)."""
    launch = mem["launch"]
    if "rank" not in launch:
        raise RuntimeError(f"no rank found among the launch's processes ({sorted(launch)}): kind_of no longer "
                           "knows how the launcher starts them")
    per_rank = launch.get("rank", {}).get("uss", 0) / max(1, launch.get("rank", {}).get("n", 1))
    return int(launch.get("launcher", {}).get("uss", 0) + nproc * per_rank)


def fits(n: int, slots: int, idle: int, launch: int, available: int, reserve: int) -> bool:
    return n * idle + min(n, slots or n) * launch <= available - reserve


class MemoryGuard(threading.Thread):
    """Watches MemAvailable every 0.5 s; below the reserve, ends every student's processes (by pid)."""

    def __init__(self, students: list[str], reserve: int):
        super().__init__(daemon=True)
        self.students, self.reserve = students, reserve
        self.lowest, self.tripped, self.done = mem_available(), None, threading.Event()
        self.class_peak = 0  # the students' cgroups' usage, summed

    def run(self):
        while not self.done.is_set():
            now = mem_available()
            self.lowest = min(self.lowest, now)
            self.class_peak = max(self.class_peak, class_usage(self.students))
            if now < self.reserve:
                self.tripped = now
                for _ in range(3):
                    for user in self.students:
                        kill_pids(MemoryCgroup(user, 0).pids())
                    time.sleep(0.5)
                return
            time.sleep(0.5)


class AllUp:
    """Every student's kernel is up (or failed): the last to arrive runs ``action``, then all go on."""

    def __init__(self, n: int, action):
        self.left, self.action, self.lock, self.event = n, action, threading.Lock(), threading.Event()

    def arrive(self) -> None:
        with self.lock:
            self.left -= 1
            last = self.left == 0
        if last:
            self.action()
            self.event.set()


def keep_alive(kernel, done) -> None:
    """Wait until ``done(0)`` is true (asked every 0.2 s), the kernel's websocket served meanwhile.

    In one run that waited here with the websocket unserved, 10 of 30 results
    were lost: the client serves its websocket only while one of its calls
    runs (``UserKernel.idle``), so the first kernels up, waiting minutes for
    the last, answered none of Jupyter Server's pings, and the server closed
    each websocket whose pong was 90 s late (``ws_ping_timeout``);
    tests/hub/test_hub_kernel_ws.py shows it.  A browser answers pings by
    itself: students' JupyterLab tabs are not affected.
    """
    while not done(0):
        kernel.idle(0.2)


def one_student(hub: CourseHub, user: str, t0: float, nproc: int, all_up: AllUp,
                slots: threading.Semaphore | None) -> dict:
    row = {"user": user}
    kernel = None
    try:
        start_server(hub, user)
        row["ready_s"] = time.monotonic() - t0
        kernel = UserKernel(f"{hub.url}/user/{user}", token(hub, user)).__enter__()
        kernel.execute(HELLO)
        row["kernel_s"] = time.monotonic() - t0
    except Exception as e:  # reported per student: a lost result counts, it does not stop the run
        row["ok"], row["error"] = False, f"{type(e).__name__}: {e}"[-300:]
    all_up.arrive()  # every kernel up: the idle class is measured, then all launch together
    if kernel is None:
        return row
    try:
        keep_alive(kernel, all_up.event.wait)
        asked = time.monotonic()
        if slots is not None:
            keep_alive(kernel, lambda seconds: slots.acquire(timeout=seconds))
        try:
            row["slot_wait_s"] = time.monotonic() - asked
            reply = kernel.execute(f"parlab.launch(hello, nproc={nproc}, timeout=900)", timeout=1800)
        finally:
            if slots is not None:
                slots.release()
        row["result_s"] = time.monotonic() - t0
        row["ok"] = reply.status == "ok" and all(f"'{line}'" in reply.result for line in expected(nproc))
        if not row["ok"]:
            row["error"] = (reply.error or reply.stderr or reply.result)[-300:]
    except Exception as e:
        row["ok"], row["error"] = False, f"{type(e).__name__}: {e}"[-300:]
    finally:
        try:
            kernel.__exit__(None, None, None)
        except Exception:  # the server may be gone (the memory guard); the stop below cleans up
            pass
    return row


def conditions(args, hub: CourseHub) -> str:
    load = os.getloadavg()
    cores = len(os.sched_getaffinity(0))
    setting = None if hub.cpus_per_server is None else str(hub.cpus_per_server)
    per_server = class_cpu_block(cores, len(set(hub.instructors) | set(hub.students)), setting)  # as the hub's config
    return (f"conditions: {cores} usable cores, {psutil.virtual_memory().total / 1e9:.1f} GB "
            f"memory, {mem_available() / 1e9:.1f} GB available, load average {load[0]:.1f}; each server: memory "
            f"limit {hub.mem_limit or 'none'}, a CPU set of {per_server} cores; {args.nproc}-rank launches, "
            f"{args.launch_slots or 'no'} launch slots, {args.reserve_gb:g} GB kept free; "
            f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=30)
    parser.add_argument("--nproc", type=int, default=2, help="ranks of each student's launch")
    parser.add_argument("--launch-slots", type=int, default=0,
                        help="at most this many launches at once, the others wait (default: no limit)")
    parser.add_argument("--reserve-gb", type=float, default=3.0,
                        help="memory kept free for the rest of the machine (default 3 GB)")
    parser.add_argument("--tier", action="store_true", help="first time the hub test tier (pytest tests/hub)")
    args = parser.parse_args()
    if os.getuid() != 0:
        print("hub_load needs root (it makes the students' Unix users)")
        return 1
    if args.students < 1 or args.nproc < 1 or args.launch_slots < 0 or args.reserve_gb < 0:
        print("--students and --nproc must be at least 1, --launch-slots and --reserve-gb at least 0")
        return 2

    if args.tier:
        start = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "pytest", "tests/hub", "-q", "-p", "no:cacheprovider"],
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        print(f"hub tier: {time.monotonic() - start:.0f} s, exit {proc.returncode}: "
              f"{proc.stdout.strip().splitlines()[-1]}", flush=True)

    students = [f"plb-s{i:02d}" for i in range(args.students)]
    reserve = int(args.reserve_gb * 1e9)
    state = Path(tempfile.gettempdir()) / "parlab-hub-load"
    lock = open(Path(tempfile.gettempdir()) / "parlab-hub-load.lock", "w")
    try:  # one run at a time: a second one would delete the first one's users
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print("another hub_load run is going on; wait for it to end")
        return 1
    CourseHub(state, [], students).remove_users()
    shutil.rmtree(state, ignore_errors=True)
    hub = CourseHub(state, [], students, mem_limit="3G")
    status = 0
    try:
        hub.create_users()
        hub.prepare_course()
        hub.start()
        print(conditions(args, hub), flush=True)
        mem = one_server_memory(hub, students[0])
        print_memory(mem)

        idle, launch, available = total(mem["idle"], "uss"), launch_private(mem, args.nproc), mem_available()
        if not fits(args.students, args.launch_slots, idle, launch, available, reserve):
            most = next((k for k in range(args.students, 0, -1)
                         if fits(args.students, k, idle, launch, available, reserve)), 0)
            print(f"refused: {args.students} students need about {args.students * idle / 1e9:.1f} GB idle "
                  f"({idle / 1e6:.0f} MB private each) plus {launch / 1e6:.0f} MB per {args.nproc}-rank launch "
                  f"running at once, and {available / 1e9:.1f} GB is available with {args.reserve_gb:g} GB "
                  "kept free. " + (f"Run with --launch-slots {most} (or fewer) so that the launches wait for "
                                   "each other, " if most else "") + "or with fewer students or ranks.")
            return 1

        guard = MemoryGuard(students, reserve)
        measured: dict = {}
        before = mem_available()
        all_up = AllUp(len(students), action=lambda: measured.update(
            idle_s=time.monotonic() - t0, idle_drop=before - mem_available(), idle_charged=class_usage(students)))
        slots = threading.Semaphore(args.launch_slots) if args.launch_slots else None
        guard.start()
        t0 = time.monotonic()
        with ThreadPoolExecutor(max_workers=len(students)) as pool:
            rows = list(pool.map(lambda u: one_student(hub, u, t0, args.nproc, all_up, slots), students))
        guard.done.set()
        guard.join()
        ok = [r for r in rows if r.get("ok")]
        print(f"{len(students)} students at once, {args.nproc}-rank launch each"
              f"{f', at most {args.launch_slots} at a time' if args.launch_slots else ''}: "
              f"{len(ok)} of {len(students)} results right", flush=True)
        if "idle_drop" in measured:
            print(f"  all {len(students)} kernels up after {measured['idle_s']:.1f} s: the idle servers took "
                  f"{measured['idle_drop'] / 1e9:.2f} GB of the machine's memory (MemAvailable before and after, "
                  f"{measured['idle_drop'] / len(students) / 1e6:.0f} MB per student; other work on the machine "
                  f"moves this figure) and their cgroups were charged {measured['idle_charged'] / 1e9:.2f} GB "
                  f"({measured['idle_charged'] / len(students) / 1e6:.0f} MB per student)")
        print(f"  peak charged to the students' cgroups, summed: {guard.class_peak / 1e9:.2f} GB; lowest "
              f"MemAvailable during the run: {guard.lowest / 1e9:.2f} GB (from {before / 1e9:.2f} GB before "
              "the servers started)")
        if guard.tripped is not None:
            status = 1
            print(f"  STOPPED: MemAvailable fell to {guard.tripped / 1e9:.2f} GB, below the "
                  f"{args.reserve_gb:g} GB reserve; every student's processes were ended")
        for key, what in (("ready_s", "server ready"), ("kernel_s", "kernel up, lab 00 imported"),
                          ("slot_wait_s", "waiting for a launch slot"), ("result_s", "launch result back")):
            values = sorted(r[key] for r in rows if key in r)
            if values:
                origin = "" if key == "slot_wait_s" else ", from the common start"
                print(f"  {what}: median {statistics.median(values):.1f} s, max {values[-1]:.1f} s "
                      f"({len(values)} students{origin})")
        for r in rows:
            if not r.get("ok"):
                print(f"  {r['user']}: {r.get('error')}")
        for user in students:
            hub.stop_server(user, timeout=300)
        left = {u: pids_of_uid(pwd.getpwnam(u).pw_uid) for u in students}
        print(f"after stopping every server: {sum(map(len, left.values()))} processes of the students left")
        print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    finally:
        hub.stop()
        hub.remove_users()
        shutil.rmtree(state, ignore_errors=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
