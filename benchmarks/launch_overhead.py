"""Launch overhead: parlab.launch vs plain torchrun vs torch.multiprocessing.spawn.

Each way runs the same job on N ranks (default 4) on CPU gloo: start the
processes, init the process group, one all_reduce, tear down.  The three ways
are interleaved round by round so machine load affects them alike; we print
each way's median wall time and its ratio to plain torchrun.

    OMP_NUM_THREADS=1 python benchmarks/launch_overhead.py [--nproc 4] [--rounds 3]

Target (issue 2): parlab.launch <= 1.10 x plain torchrun.
"""
import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

JOB = textwrap.dedent("""
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == dist.get_world_size()
    dist.destroy_process_group()
""")


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


def run_parlab(nproc, script):
    import parlab

    assert parlab.launch(job_in_rank, nproc=nproc) == [float(nproc)] * nproc


def run_torchrun(nproc, script):
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                    f"--nproc-per-node={nproc}", script], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def run_spawn(nproc, script):
    # mp.spawn needs an interpreter for the parent too, as a notebook kernel
    # would already be; we time it from a fresh interpreter so that all three
    # ways pay for the same imports.
    code = (f"import sys; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r});"
            "import socket, torch.multiprocessing as mp, launch_overhead as b;"
            "s = socket.socket(); s.bind(('127.0.0.1', 0)); port = s.getsockname()[1]; s.close();"
            f"mp.spawn(b.spawn_entry, args=({nproc}, port), nprocs={nproc})")
    subprocess.run([sys.executable, "-c", code], check=True)


WAYS = {"parlab.launch": run_parlab, "torchrun --standalone": run_torchrun, "mp.spawn": run_spawn}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "job.py")
        with open(script, "w") as f:
            f.write(JOB)
        run_parlab(2, script)  # warm the page cache and parlab's imports once
        times = {name: [] for name in WAYS}
        for r in range(args.rounds):
            for name, way in WAYS.items():
                start = time.perf_counter()
                way(args.nproc, script)
                times[name].append(time.perf_counter() - start)
            print(f"round {r + 1}: " + ", ".join(f"{n} {t[-1]:.2f} s" for n, t in times.items()), flush=True)
    base = statistics.median(times["torchrun --standalone"])
    print(f"\n{args.nproc} ranks, init + all_reduce + teardown, median of {args.rounds} rounds "
          f"({os.cpu_count()} CPU cores, OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}):")
    for name, t in times.items():
        med = statistics.median(t)
        print(f"  {name:<22} {med:6.2f} s   {med / base:5.2f} x torchrun")


if __name__ == "__main__":
    main()
