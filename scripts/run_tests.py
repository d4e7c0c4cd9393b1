"""``make test``: the whole suite in two pytest processes at once, or one pytest when asked for part of it.

Most of the suite's wall time is spent waiting, not computing: Slurm's queue and time limits, a
hub spawning servers, Chromium rendering, a hang watchdog counting down, nbgrader kernels starting.
On the 2-core CI machine one pytest keeps about half a core busy.  So ``make test`` runs the tiers
in two lanes side by side, each a plain pytest process:

- lane ``a``: nbgrader, slurm (the nbgrader and slurm tiers share the session's serial grading
  of lab 00, ``serial_lab00`` in tests/conftest.py, so they must sit in one process);
- lane ``b``: ranks, unit, browser, gpu, hub (the hub tier last: its fixtures hold real users, a hub and Chromium).

The lanes share nothing a test could trip over: Unix users are named per fixture with a random tag
(tests/unix_users.py, hub/course_hub.py), ports are free ports, Slurm's daemons belong to the slurm
tier alone, every test's files live under its own tmp_path, and each lane keeps its own pytest cache.
Each output line is prefixed with its lane; each lane ends with its own summary, its 25 slowest
tests and its time by tier.  The exit status is non-zero when either lane fails.

With arguments (``make test PYTEST_ARGS="-m unit"``, ``-k broadcast``, a path) it runs one
ordinary pytest with them, as before.  ``PARLAB_TEST_LANES=1`` runs the whole suite in one process.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LANES = {"a": ("nbgrader", "slurm"), "b": ("ranks", "unit", "browser", "gpu", "hub")}


def _tiers() -> tuple[str, ...]:
    """tests/conftest.py's TIERS, read from the file (several conftest modules share that name)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("parlab_tests_conftest", os.path.join(ROOT, "tests", "conftest.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.TIERS


def check_lanes(tiers: tuple[str, ...]) -> None:
    """Every tier in exactly one lane, and no lane naming a tier that does not exist."""
    placed = [t for lane in LANES.values() for t in lane]
    missing = sorted(set(tiers) - set(placed))
    doubled = sorted({t for t in placed if placed.count(t) > 1})
    unknown = sorted(set(placed) - set(tiers))
    if missing or doubled or unknown:
        raise SystemExit(f"scripts/run_tests.py: LANES must hold every tier of tests/conftest.py once "
                         f"(missing {missing}, twice {doubled}, unknown {unknown})")


def _pump(name: str, stream, lock: threading.Lock) -> None:
    for line in iter(stream.readline, b""):
        with lock:
            sys.stdout.buffer.write(f"[{name}] ".encode() + line)
            sys.stdout.buffer.flush()


def run_lanes() -> int:
    check_lanes(_tiers())
    lock = threading.Lock()
    procs, pumps = {}, []
    started = time.monotonic()
    for name, tiers in LANES.items():
        argv = [sys.executable, "-m", "pytest", "--color=no", "-o", f"cache_dir=.pytest_cache/lane-{name}",
                *(f"tests/{t}" for t in tiers)]
        print(f"[{name}] {' '.join(argv[1:])}", flush=True)
        procs[name] = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL)
        pump = threading.Thread(target=_pump, args=(name, procs[name].stdout, lock), daemon=True)
        pump.start()
        pumps.append(pump)
    try:
        codes = {}
        for name, proc in procs.items():
            codes[name] = proc.wait()
            print(f"[{name}] lane ended with exit status {codes[name]} after "
                  f"{time.monotonic() - started:.0f} s", flush=True)
    except KeyboardInterrupt:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)  # pytest stops its test and prints its summary
        for proc in procs.values():
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:  # SIGINT ignored (a lane started in the background) or stuck
                proc.terminate()
                proc.wait()
        return 130
    for pump in pumps:
        pump.join()
    failed = [n for n, c in codes.items() if c != 0]
    print(f"make test: {time.monotonic() - started:.0f} s, lanes " +
          ", ".join(f"{n} {'FAILED (' + str(c) + ')' if c else 'passed'}" for n, c in codes.items()),
          flush=True)
    return 1 if failed else 0


def main(args: list[str]) -> int:
    if args or os.environ.get("PARLAB_TEST_LANES") == "1":
        return subprocess.call([sys.executable, "-m", "pytest", *args], cwd=ROOT)
    return run_lanes()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
