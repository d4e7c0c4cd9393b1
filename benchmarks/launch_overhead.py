"""Cold launches side by side: parlab (first and following launch) against the launchers people use.

Every way runs the same job on N ranks (default 4) on CPU gloo: start the
processes, init the process group, one all_reduce, tear down.  Each way is
timed inside its own fresh "kernel" process that has already imported torch
(and parlab), as a notebook kernel would have, and only the launch call is
timed.  The ways are interleaved round by round, so that the machine's load
falls on all of them alike; each round prints the load average.

    OMP_NUM_THREADS=1 python benchmarks/launch_overhead.py [--nproc 4] [--rounds 7]

The ways:
  parlab first       the kernel's first parlab.launch (it starts the kernel's fork server)
  parlab following   a launch 3 s after another in the same kernel (a student's next cell)
  parlab cold        PARLAB_FORK_SERVER=0: every interpreter started anew (parlab before the fork server)
  torchrun           python -m torch.distributed.run --standalone, a script
  mp.spawn           torch.multiprocessing.spawn, a fresh interpreter per rank
  accelerate         accelerate's notebook_launcher (forks the kernel itself; skipped if not installed:
                     pip install -e ".[bench]")

After the timed rounds, one more launch per way is watched for its peak memory:
the proportional set size (PSS) summed over the kernel's descendants (the
launch's processes, and parlab's fork server), sampled every 50 ms, and the
most processes seen at once.  The kernel itself is not counted.

Targets (issue 45): parlab following <= 0.55 x torchrun; parlab first no slower than parlab cold.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

JOB = textwrap.dedent("""
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == dist.get_world_size()
    dist.destroy_process_group()
""")
WAYS = ("parlab first", "parlab following", "parlab cold", "torchrun", "mp.spawn", "accelerate")
BASE = "torchrun"


def job_in_rank():
    import torch
    import torch.distributed as dist

    t = torch.ones(1)
    dist.all_reduce(t)
    return t.item()


def spawn_entry(rank, world, port):
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    t = torch.ones(1)
    dist.all_reduce(t)
    dist.destroy_process_group()


def accelerate_entry():
    import os

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == int(os.environ["WORLD_SIZE"])
    dist.destroy_process_group()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------ inside one "kernel"

def prepare(way: str, nproc: int, script: str):
    """What the kernel does before the timed call; returns the call."""
    import torch  # noqa: F401 - a kernel that has imported torch

    if way.startswith("parlab"):
        import parlab

        if way == "parlab cold":
            os.environ["PARLAB_FORK_SERVER"] = "0"
        if way == "parlab following":
            assert parlab.launch(job_in_rank, nproc=nproc) == [float(nproc)] * nproc
            time.sleep(3.0)  # the student reads the output, then runs the next cell
        return lambda: parlab.launch(job_in_rank, nproc=nproc)
    if way == "torchrun":
        return lambda: subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                       f"--nproc-per-node={nproc}", script], check=True,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if way == "mp.spawn":
        import torch.multiprocessing as mp

        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import launch_overhead as me  # spawn needs the entry importable by name

        return lambda: mp.spawn(me.spawn_entry, args=(nproc, free_port()), nprocs=nproc)
    if way == "accelerate":
        from accelerate import notebook_launcher

        return lambda: notebook_launcher(accelerate_entry, num_processes=nproc, use_port=str(free_port()))
    raise ValueError(way)


class Watch:
    """Peak PSS summed over this process's descendants, and the most of them at once."""

    def __init__(self):
        import psutil

        self.me, self.peak, self.most, self._stop = psutil.Process(), 0, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        import psutil

        while not self._stop.is_set():
            total, kids = 0, self.me.children(recursive=True)
            for p in kids:
                try:
                    total += p.memory_full_info().pss
                except psutil.Error:
                    pass
            self.peak, self.most = max(self.peak, total), max(self.most, len(kids))
            self._stop.wait(0.05)

    def stop(self):
        self._stop.set()
        self._thread.join()
        return self.peak, self.most


def kernel(way: str, nproc: int, script: str, watch: bool) -> None:
    call = prepare(way, nproc, script)
    watcher = Watch() if watch else None
    start = time.perf_counter()
    call()
    seconds = time.perf_counter() - start
    peak, most = watcher.stop() if watcher else (None, None)
    print("RESULT " + json.dumps({"seconds": seconds, "pss": peak, "processes": most}), flush=True)


# ------------------------------------------------------------------ the driver

def run_way(way: str, nproc: int, script: str, watch: bool = False) -> dict:
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--kernel", way, "--nproc", str(nproc),
                          "--script", script] + (["--watch"] if watch else []),
                         capture_output=True, text=True, timeout=600)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if out.returncode != 0 or line is None:
        raise RuntimeError(f"{way} failed:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
    return json.loads(line[len("RESULT "):])


def available(way: str) -> bool:
    if way != "accelerate":
        return True
    try:
        import accelerate  # noqa: F401
    except ImportError:
        print("accelerate is not installed: its row is skipped (pip install -e '.[bench]')")
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--kernel", help=argparse.SUPPRESS)
    parser.add_argument("--script", help=argparse.SUPPRESS)
    parser.add_argument("--watch", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.kernel:
        return kernel(args.kernel, args.nproc, args.script, args.watch)
    ways = [w for w in WAYS if available(w)]
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "job.py")
        with open(script, "w") as f:
            f.write(JOB)
        run_way("parlab first", 2, script)  # the page cache warm for everyone
        times = {w: [] for w in ways}
        loads = []
        for r in range(args.rounds):
            loads.append(os.getloadavg()[0])
            for way in ways:
                times[way].append(run_way(way, args.nproc, script)["seconds"])
            print(f"round {r + 1} (load {loads[-1]:.2f}): "
                  + ", ".join(f"{w} {t[-1]:.2f} s" for w, t in times.items()), flush=True)
        memory = {w: run_way(w, args.nproc, script, watch=True) for w in ways}
    base = statistics.median(times[BASE])
    print(f"\n{args.nproc} ranks, gloo, init + all_reduce + teardown; the launch call timed in a kernel that "
          f"has imported torch; median and range of {args.rounds} interleaved rounds; {os.cpu_count()} CPU "
          f"cores, OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}, load average {min(loads):.2f}-{max(loads):.2f}")
    print(f"  {'way':<18} {'median':>8} {'range':>15} {'x torchrun':>11} {'peak PSS':>10} {'processes':>10}")
    for way, t in times.items():
        med, pss, most = statistics.median(t), memory[way]["pss"], memory[way]["processes"]
        print(f"  {way:<18} {med:7.2f}s {min(t):6.2f}-{max(t):5.2f} s {med / base:10.2f}x "
              f"{pss / 2 ** 20:7.0f} MiB {most:>10}")
    following, first, cold = (statistics.median(times[w]) for w in ("parlab following", "parlab first",
                                                                     "parlab cold"))
    print(f"\nparlab following / torchrun = {following / base:.2f} (target <= 0.55); "
          f"parlab first / parlab cold = {first / cold:.2f} (target <= 1.00)")


if __name__ == "__main__":
    main()
