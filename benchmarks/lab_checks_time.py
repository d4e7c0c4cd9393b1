"""A lab's notebook run end to end, as a student runs it, with the fork server and with cold launches.

Each round executes the solution notebook of one lab (every cell: the
demonstrations, the answers, the visible and hidden checks and their
launches) in a fresh kernel with nbclient, once with the launcher's fork
server (``parlab.launch.fork_server``, the default) and once with
``PARLAB_FORK_SERVER=0`` (every process of every launch starts Python and
imports torch), interleaved so that the machine's load falls on both alike.

    OMP_NUM_THREADS=1 python benchmarks/lab_checks_time.py [--lab 02-data-parallel] [--rounds 3]

Prints each round, then the medians and their ratio.
"""
import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_notebook(lab: str, fork_server: bool) -> float:
    import nbformat
    from nbclient import NotebookClient

    source = REPO / "solutions" / lab
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / lab
        shutil.copytree(source, folder)
        path = folder / f"{lab}.ipynb"
        nb = nbformat.read(path, as_version=4)
        before = os.environ.get("PARLAB_FORK_SERVER")
        os.environ["PARLAB_FORK_SERVER"] = "1" if fork_server else "0"
        try:
            start = time.perf_counter()
            NotebookClient(nb, timeout=900, kernel_name="python3",
                           resources={"metadata": {"path": str(folder)}}).execute()
            return time.perf_counter() - start
        finally:
            if before is None:
                os.environ.pop("PARLAB_FORK_SERVER")
            else:
                os.environ["PARLAB_FORK_SERVER"] = before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lab", default="02-data-parallel")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    times = {"fork server": [], "cold": []}
    for r in range(args.rounds):
        load = os.getloadavg()[0]
        for name in times:
            times[name].append(run_notebook(args.lab, name == "fork server"))
        print(f"round {r + 1} (load {load:.2f}): " + ", ".join(f"{n} {t[-1]:.1f} s" for n, t in times.items()),
              flush=True)
    fork, cold = (statistics.median(times[n]) for n in ("fork server", "cold"))
    print(f"\n{args.lab}, the solution notebook end to end, median of {args.rounds} interleaved rounds "
          f"({os.cpu_count()} CPU cores): fork server {fork:.1f} s, cold {cold:.1f} s, ratio {fork / cold:.2f}")


if __name__ == "__main__":
    main()
