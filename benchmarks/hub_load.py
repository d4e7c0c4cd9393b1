"""The course hub under a class: one server's memory, and N students launching at once.

Starts the hub of hub/jupyterhub_config.py (hub/course_hub.py) with N
students as real Unix users, then, measured in one run:

1. one student's server: the memory of every process in its cgroup (the
   server, its kernel, and during the launch torchrun and the ranks), as the
   sum of RSS sampled every 0.1 s and as the cgroup's own peak
   (``memory.max_usage_in_bytes`` on cgroup v1, ``memory.peak`` on v2):
   idle (kernel started, ``import parlab`` done) and during lab 00's first
   launch on 4 ranks;
2. N students at once, through the hub's REST API (a token each, not a
   browser each): each starts a server, starts a ``python3`` kernel through
   the server's API and runs lab 00's first launch (``hello`` on NPROC ranks).
   Per student: seconds from the common start until the server is ready and
   until the launch's result is back; and whether every result is the right
   one (nothing lost);
3. optionally (``--tier``) the hub test tier, timed as a whole
   (``pytest tests/hub``), before the rest.

Afterwards every server is stopped through the API, and the processes left
of the students' users are counted (then the users are removed).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/hub_load.py [--students 30] [--nproc 2] [--tier]

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
from course_spawner import MemoryCgroup  # noqa: E402
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


class Sampler:
    """Peak summed RSS of the processes in one memory cgroup, sampled every 0.1 s."""

    def __init__(self, cgroup: MemoryCgroup):
        self.cgroup, self.peak, self.stop = cgroup, 0, threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def rss(self) -> int:
        total = 0
        for pid in self.cgroup.pids():
            try:
                total += psutil.Process(pid).memory_info().rss
            except psutil.Error:
                pass
        return total

    def run(self):
        while not self.stop.is_set():
            self.peak = max(self.peak, self.rss())
            time.sleep(0.1)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def cgroup_peak(cgroup: MemoryCgroup) -> int:
    for name in ("memory.max_usage_in_bytes", "memory.peak"):
        try:
            return int((cgroup.path / name).read_text())
        except OSError:
            continue
    return 0


def reset_cgroup_peak(cgroup: MemoryCgroup) -> None:
    try:
        (cgroup.path / "memory.max_usage_in_bytes").write_text("0")
    except OSError:
        pass  # v2's memory.peak cannot be reset on older kernels: then it includes the idle phase


def one_server_memory(hub: CourseHub, user: str) -> dict:
    start_server(hub, user)
    cgroup = MemoryCgroup(user, 0)
    with UserKernel(f"{hub.url}/user/{user}", token(hub, user)) as kernel:
        kernel.execute(HELLO)
        time.sleep(2)
        idle = Sampler(cgroup).rss()
        idle_pids = len(cgroup.pids())
        reset_cgroup_peak(cgroup)
        with Sampler(cgroup) as sampler:
            reply = kernel.execute("parlab.launch(hello, nproc=4)", timeout=600)
        assert all(line in reply.result for line in expected(4)), reply
        out = {"idle_rss_mb": idle / 1e6, "idle_processes": idle_pids, "launch_peak_rss_mb": sampler.peak / 1e6,
               "launch_cgroup_peak_mb": cgroup_peak(cgroup) / 1e6}
    hub.stop_server(user)
    return out


def one_student(hub: CourseHub, user: str, t0: float, nproc: int) -> dict:
    row = {"user": user}
    try:
        start_server(hub, user)
        row["ready_s"] = time.monotonic() - t0
        with UserKernel(f"{hub.url}/user/{user}", token(hub, user)) as kernel:
            kernel.execute(HELLO)
            reply = kernel.execute(f"parlab.launch(hello, nproc={nproc}, timeout=900)", timeout=1200)
        row["result_s"] = time.monotonic() - t0
        row["ok"] = reply.status == "ok" and all(f"'{line}'" in reply.result for line in expected(nproc))
        if not row["ok"]:
            row["error"] = (reply.error or reply.stderr or reply.result)[-300:]
    except Exception as e:  # reported per student: a lost result counts, it does not stop the run
        row["ok"], row["error"] = False, f"{type(e).__name__}: {e}"[-300:]
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=30)
    parser.add_argument("--nproc", type=int, default=2, help="ranks of each student's launch")
    parser.add_argument("--tier", action="store_true", help="first time the hub test tier (pytest tests/hub)")
    args = parser.parse_args()
    if os.getuid() != 0:
        print("hub_load needs root (it makes the students' Unix users)")
        return 1

    if args.tier:
        start = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "pytest", "tests/hub", "-q", "-p", "no:cacheprovider"],
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        print(f"hub tier: {time.monotonic() - start:.0f} s, exit {proc.returncode}: "
              f"{proc.stdout.strip().splitlines()[-1]}", flush=True)

    students = [f"plb-s{i:02d}" for i in range(args.students)]
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
    try:
        hub.create_users()
        hub.prepare_course()
        hub.start()
        mem = one_server_memory(hub, students[0])
        print(f"one server, idle (server + kernel, {mem['idle_processes']} processes): "
              f"{mem['idle_rss_mb']:.0f} MB RSS", flush=True)
        print(f"one server, during lab 00's 4-rank launch: peak {mem['launch_peak_rss_mb']:.0f} MB RSS summed "
              f"(sampled), cgroup peak {mem['launch_cgroup_peak_mb']:.0f} MB", flush=True)

        t0 = time.monotonic()
        with ThreadPoolExecutor(max_workers=len(students)) as pool:
            rows = list(pool.map(lambda u: one_student(hub, u, t0, args.nproc), students))
        ok = [r for r in rows if r["ok"]]
        print(f"{len(students)} students at once, {args.nproc}-rank launch each: "
              f"{len(ok)} of {len(students)} results right", flush=True)
        for key, what in (("ready_s", "server ready"), ("result_s", "launch result back")):
            values = sorted(r[key] for r in rows if key in r)
            if values:
                print(f"  {what}: median {statistics.median(values):.1f} s, max {values[-1]:.1f} s "
                      f"(from the common start, {len(values)} students)")
        for r in rows:
            if not r["ok"]:
                print(f"  {r['user']}: {r.get('error')}")
        for user in students:
            hub.stop_server(user, timeout=300)
        left = {u: pids_of_uid(pwd.getpwnam(u).pw_uid) for u in students}
        print(f"after stopping every server: {sum(map(len, left.values()))} processes of the students left")
    finally:
        hub.stop()
        hub.remove_users()
        shutil.rmtree(state, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
