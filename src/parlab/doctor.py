"""``parlab doctor``: is this machine ready for the labs?  Run it first."""
from __future__ import annotations

import os
import sys
import time


def _all_reduce_smoke() -> float:
    import torch
    import torch.distributed as dist

    import parlab

    t = torch.tensor([float(dist.get_rank() + 1)], device=parlab.device())
    dist.all_reduce(t)
    return t.item()


def checks() -> list[tuple[str, bool, str]]:
    """(what, ok, detail) for each check, in order."""
    rows = []
    try:
        import torch
        import torch.distributed as dist
    except ImportError as exc:
        return [("torch", False, f"cannot import torch ({exc}); run `make lab` or `pip install -e .`")]
    rows.append(("torch", True, f"{torch.__version__} (Python {sys.version.split()[0]})"))
    if not dist.is_available():
        rows.append(("torch.distributed", False, "this torch build has no distributed support"))
        return rows
    backends = {"gloo": dist.is_gloo_available(), "nccl": dist.is_nccl_available(), "mpi": dist.is_mpi_available()}
    listed = ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in backends.items())
    rows.append(("backends", backends["gloo"] or backends["nccl"], listed))
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    names = ", ".join(torch.cuda.get_device_name(i) for i in range(gpus)) if gpus else "none (labs run on CPU with gloo)"
    rows.append(("GPUs", True, f"{gpus}: {names}"))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    rows.append(("CPU cores", True, str(cores)))
    from .launcher import launch, choose_backend

    nproc, backend = choose_backend(2 if gpus != 1 else 1, None)
    start = time.perf_counter()
    try:
        got = launch(_all_reduce_smoke, nproc=nproc, timeout=120)
    except Exception as exc:  # noqa: BLE001 - report, don't crash
        rows.append((f"{nproc}-rank all_reduce", False, f"{type(exc).__name__}: {exc}"))
        return rows
    expected = float(sum(range(1, nproc + 1)))
    ok = got == [expected] * nproc
    rows.append((f"{nproc}-rank all_reduce ({backend})", ok,
                 f"{got} in {time.perf_counter() - start:.1f} s" + ("" if ok else f", expected {expected} on every rank")))
    return rows


def main() -> int:
    rows = checks()
    width = max(len(r[0]) for r in rows)
    for what, ok, detail in rows:
        print(f"{'ok ' if ok else 'BAD'}  {what:<{width}}  {detail}")
    bad = [r for r in rows if not r[1]]
    if bad:
        print(f"\nparlab doctor: {len(bad)} problem(s): {'; '.join(r[0] for r in bad)}", file=sys.stderr)
        return 1
    print("\nparlab doctor: all good")
    return 0
