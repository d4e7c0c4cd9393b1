"""The stop button: how long Ctrl-C takes to end a launch with two sleeping ranks, phase by phase.

A "kernel" process launches 2 ranks that sleep, and gets SIGINT once both
run (what Jupyter's stop button sends).  Measured from SIGINT, on the one
system-wide monotonic clock:

- raised:   KeyboardInterrupt leaves ``parlab.launch`` (the cell ends here in Jupyter);
- ranks:    both ranks have ended;
- torchrun: the torchrun agent has ended (nothing of the launch is left);
- exited:   the kernel process has exited (a script; a Jupyter kernel keeps running).

``--against SRC`` runs another checkout's ``src`` (for example the commit
before a change, from ``git archive``) in the same run, round by round
interleaved with this one so that the machine's load falls on both alike,
and prints the ratio of the medians.

    python benchmarks/interrupt_time.py [--rounds 5] [--against /tmp/old/src]

The browser tier's stop-button test allows 3 s from the press to the cell's end.
"""
import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE_SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
KERNEL = r'''
import os, signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # a kernel turns SIGINT into KeyboardInterrupt
import parlab

def sleeper(path):
    import torch.distributed as dist
    with open(path, "a") as f:
        f.write(f"{dist.get_rank()} {os.getpid()} {os.getppid()}\n")
    while True:
        time.sleep(0.2)

try:
    parlab.launch(sleeper, args=(sys.argv[1],), nproc=2, timeout=300)
except KeyboardInterrupt:
    print("RAISED", time.monotonic(), file=sys.stderr, flush=True)
'''
PHASES = ("raised", "ranks", "torchrun", "exited")


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def one_drill(src: str, folder: str) -> dict:
    path = os.path.join(folder, f"pids-{time.time_ns()}")
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-c", KERNEL, path], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180
    while not (os.path.exists(path) and len(open(path).read().splitlines()) == 2):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"the ranks never started: {proc.communicate()}")
        time.sleep(0.05)
    time.sleep(0.5)  # both ranks inside sleeper
    rows = [line.split() for line in open(path).read().splitlines()]
    ranks, agent = {int(r[1]) for r in rows}, {int(r[2]) for r in rows}
    gone = {}
    pressed = time.monotonic()
    proc.send_signal(signal.SIGINT)
    while proc.poll() is None or any(p not in gone for p in ranks | agent):
        now = time.monotonic()
        gone.update({p: now for p in ranks | agent if p not in gone and not _running(p)})
        if proc.poll() is not None and "exited" not in gone:
            gone["exited"] = now
        if now > pressed + 60:
            raise RuntimeError("the launch did not end within 60 s of SIGINT")
        time.sleep(0.005)
    gone.setdefault("exited", time.monotonic())
    _, err = proc.communicate()
    raised = [float(line.split()[1]) for line in err.splitlines() if line.startswith("RAISED ")]
    if not raised:
        raise RuntimeError(f"no KeyboardInterrupt reached the caller:\n{err[-2000:]}")
    return {"raised": raised[0] - pressed, "ranks": max(gone[p] for p in ranks) - pressed,
            "torchrun": max(gone[p] for p in agent) - pressed, "exited": gone["exited"] - pressed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--against", help="another checkout's src folder, run interleaved with this one")
    args = parser.parse_args()
    ways = {"this checkout": HERE_SRC}
    if args.against:
        if not os.path.isdir(os.path.join(args.against, "parlab")):
            parser.error(f"--against {args.against!r} holds no parlab package")
        ways["against"] = os.path.abspath(args.against)
    seen = {name: [] for name in ways}
    with tempfile.TemporaryDirectory(prefix="parlab-interrupt-") as folder:
        for r in range(args.rounds):
            for name, src in ways.items():
                t = one_drill(src, folder)
                seen[name].append(t)
                print(f"round {r + 1} {name:13s} " + "  ".join(f"{k} {t[k]:.2f} s" for k in PHASES), flush=True)
    print(f"\nmedians over {args.rounds} rounds (s after SIGINT; load average now "
          f"{os.getloadavg()[0]:.1f}):")
    medians = {name: {k: statistics.median(t[k] for t in ts) for k in PHASES} for name, ts in seen.items()}
    for name, m in medians.items():
        print(f"  {name:13s} " + "  ".join(f"{k} {m[k]:.2f}" for k in PHASES))
    if args.against:
        print("  ratio (this / against): " + "  ".join(
            f"{k} {medians['this checkout'][k] / medians['against'][k]:.2f}" for k in PHASES))


if __name__ == "__main__":
    main()
