"""The labs' hand-written parallelism against torch's built-ins, on CPU gloo, side by side in one run.

Five pairs, each (hand-written) / (built-in):

1. lab 01 ``ring_all_reduce`` (isend/irecv ring) / ``dist.all_reduce``, on a
   small (4 KB: latency; 50 calls per repeat, the time given per call) and a
   large (16 MB: bandwidth) fp32 tensor;
2. lab 02 ``BucketedDP`` / ``DistributedDataParallel``, one SGD step of
   parlab's tiny GPT, the same bucket size;
3. lab 03 ``ParallelMLP`` (f, g, column- and row-parallel layers) /
   ``parallelize_module`` with ``ColwiseParallel`` + ``RowwiseParallel`` (DTensor),
   forward and backward of one GPT MLP;
4. lab 04 ``one_f_one_b_step`` / ``Schedule1F1B`` on ``PipelineStage``s, one
   step of a GPT cut into one stage per rank;
5. lab 05 ``ZeRO3`` / FSDP2 ``fully_shard`` (one unit per Linear, then the
   root), one SGD step of an MLP.

The hand-written versions are the course's reference solutions: each rank
execs the needed answer cells of ``solutions/0N-*/*.ipynb`` (after the
notebook's first, imports cell), read as JSON at run time.  Nothing of them
is copied here or into the package.

Each pair first runs once on the same weights and data and is checked: the
outputs, losses and gradients (and, for ZeRO-3, the updated parameters) of
the two agree within float tolerance on every rank, or the run stops.  Then
the two are timed interleaved (hand, built-in; then built-in, hand), with a
barrier before each, after warm-up repeats; we print the median of each
(the slowest rank's) and the ratio hand / built-in.  Everything runs in one
launch, so machine load hits all pairs alike.

    OMP_NUM_THREADS=1 python benchmarks/builtins.py [--nproc 2] [--repeats 30] [--quick] [--check-only]

``--quick`` shrinks sizes and repeats (a smoke run); ``--check-only`` runs the
correctness checks and no timing.

Goal (issue 20): hand / built-in <= 1.10 for each pair.
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import statistics
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GOAL = 1.10

# (lab folder, grade ids of the answer cells a pair needs)
CELLS = {
    "ring": ("01-collectives", ("ex2_ring",)),
    "dp": ("02-data-parallel", ("BucketedDP",)),
    "tp": ("03-tensor-parallel", ("ex1a_f", "ex1b_g", "ex2a_column", "ex2b_row", "ex3_mlp")),
    "pp": ("04-pipeline-parallel", ("one_f_one_b_step",)),
    "zero3": ("05-sharding", ("ex5_zero3",)),
}


def solution_source(lab: str, grade_ids: tuple) -> str:
    """The imports of the lab's first code cell, then its answer cells ``grade_ids``, as one script."""
    (path,) = sorted((REPO / "solutions" / lab).glob("*.ipynb"))
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    src = lambda c: "".join(c["source"])  # noqa: E731
    first = "\n".join(x for x in src(cells[0]).splitlines() if not x.lstrip().startswith(("%", "!")))
    parts = [ast.unparse(node) for node in ast.parse(first).body if isinstance(node, (ast.Import, ast.ImportFrom))]
    by_id = {c["metadata"].get("nbgrader", {}).get("grade_id"): c for c in cells
             if c["metadata"].get("nbgrader", {}).get("solution")}
    missing = [g for g in grade_ids if g not in by_id]
    if missing:
        raise SystemExit(f"{path.relative_to(REPO)}: no solution cell with grade_id {missing}")
    return "\n".join(parts) + "\n\n" + "\n\n".join(src(by_id[g]) for g in grade_ids)


def load(sources: dict, pair: str) -> dict:
    """On a rank: the names a pair's solution cells define (a fresh namespace per lab)."""
    lab = CELLS[pair][0]
    ns = {"__name__": f"parlab_solution_{lab.replace('-', '_')}"}
    exec(compile(sources[pair], f"<solutions/{lab} answer cells>", "exec"), ns)
    return ns


# ------------------------------------------------------------------ the pairs
# Each returns (check, hand, builtin): check = {what: (relative difference, tolerance)} from one run
# of both on the same inputs; hand() and builtin() each run one timed unit.
RTOL = 1e-5  # fp32 sums added in another order differ by about 1e-7 of their size


def rel_diff(a, b) -> float:
    """max |a - b| / max |b|, over tensors or lists of tensors of the same shapes."""
    import torch

    a, b = ([t.detach().float().reshape(-1) for t in (x if isinstance(x, (list, tuple)) else [x])]
            for x in (a, b))
    a, b = torch.cat(a), torch.cat(b)
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def pair_ring(ns, numel, calls):
    """``calls`` all-reduces per timed unit (the medians are divided by it): a small one takes µs."""
    import torch
    import torch.distributed as dist

    g = torch.Generator().manual_seed(dist.get_rank())
    x = torch.randn(numel, generator=g)
    ring = ns["ring_all_reduce"]

    def builtin_once():
        y = x.clone()  # the ring returns a new tensor too (it clones x)
        dist.all_reduce(y)
        return y

    def hand():
        for _ in range(calls):
            ring(x)

    def builtin():
        for _ in range(calls):
            builtin_once()

    return {"sum": (rel_diff(ring(x), builtin_once()), RTOL)}, hand, builtin


def pair_dp(ns, d_model, n_layer, batch, seq, bucket_mb):
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    import torch.distributed as dist
    from parlab.data import get_batch, shard_batch
    from parlab.models import lm_loss, tiny_gpt

    rank, n = dist.get_rank(), dist.get_world_size()
    make = lambda: tiny_gpt(seed=0, d_model=d_model, n_layer=n_layer, n_head=4, seq_len=seq)  # noqa: E731
    mine, theirs = make(), make()
    bucketed = ns["BucketedDP"](mine, int(bucket_mb * 2**20))
    ddp = DDP(theirs, bucket_cap_mb=bucket_mb)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (mine, theirs)]
    x, y = shard_batch(get_batch(0, batch, seq, seed=0), rank, n)

    def hand(step=True):
        opts[0].zero_grad(set_to_none=True)
        lm_loss(mine, x, y).backward()
        bucketed.finish()
        if step:
            opts[0].step()

    def builtin(step=True):
        opts[1].zero_grad(set_to_none=True)
        lm_loss(ddp, x, y).backward()
        if step:
            opts[1].step()

    hand(step=False)
    builtin(step=False)
    grads = rel_diff([p.grad for p in mine.parameters()], [p.grad for p in theirs.parameters()])
    return {"gradients": (grads, RTOL)}, hand, builtin


def pair_tp(ns, d_model, batch, seq):
    import copy

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from parlab.models.gpt import MLP, GPTConfig
    from parlab.parallel.tp_reference import randomize_

    full = randomize_(MLP(GPTConfig(d_model=d_model)), seed=0)  # random biases too, same on every rank
    mine = ns["ParallelMLP"](copy.deepcopy(full))
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    theirs = parallelize_module(copy.deepcopy(full), mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    g = torch.Generator().manual_seed(1)
    x = torch.randn(batch, seq, d_model, generator=g).requires_grad_()  # replicated: the same on every rank
    w = torch.randn(batch, seq, d_model, generator=g)

    def run(model):
        x.grad = None
        for p in model.parameters():
            p.grad = None
        out = model(x)
        (out * w).sum().backward()
        return out

    hand, builtin = (lambda: run(mine)), (lambda: run(theirs))  # noqa: E731
    out_h = hand()
    dx_h = x.grad.clone()
    out_b = builtin()
    local = lambda t: t.to_local() if hasattr(t, "to_local") else t  # noqa: E731
    shards = [(getattr(getattr(mine, a), b).grad, local(getattr(getattr(theirs, a), b).grad))
              for a in ("up", "down") for b in ("weight", "bias")]
    return {"output": (rel_diff(out_h, out_b), RTOL), "input grad": (rel_diff(dx_h, x.grad), RTOL),
            "grad shards": (rel_diff(*zip(*shards)), RTOL)}, hand, builtin


def pair_pp(ns, n_layer, d_model, m, mb_rows, seq):
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    from parlab.data import get_batch, microbatches
    from parlab.models import tiny_gpt
    from parlab.parallel.pp_stages import GPTStage, gpt_stage

    rank, p = dist.get_rank(), dist.get_world_size()
    make = lambda: gpt_stage(tiny_gpt(seed=0, n_layer=n_layer, d_model=d_model, n_head=4,  # noqa: E731
                                      seq_len=seq, tie_weights=False), p, rank)
    mine, theirs = make(), make()
    x, y = get_batch(0, m * mb_rows, seq)
    mbs = list(microbatches((x, y), m))
    sched = Schedule1F1B(PipelineStage(theirs, rank, p, torch.device("cpu")), n_microbatches=m,
                         loss_fn=GPTStage.loss)  # scale_grads=True: the gradients of the mean loss

    def hand():
        mine.zero_grad(set_to_none=True)
        return ns["one_f_one_b_step"](mine, mbs, (mb_rows, seq, d_model))

    def builtin():
        theirs.zero_grad(set_to_none=True)
        losses = []
        if rank == 0:
            sched.step(x)
        elif rank == p - 1:
            sched.step(target=y, losses=losses)
        else:
            sched.step()
        return sum(t.item() for t in losses) / m if losses else None

    loss_h, loss_b = hand(), builtin()
    grads = rel_diff([q.grad for q in mine.parameters()], [q.grad for q in theirs.parameters()])
    check = {"gradients": (grads, RTOL)}
    if loss_h is not None:
        check["loss"] = (abs(loss_h - loss_b) / abs(loss_b), RTOL)
    return check, hand, builtin


def pair_zero3(ns, width, n_linear, rows, lr=0.1):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.distributed.fsdp import fully_shard

    rank, n = dist.get_rank(), dist.get_world_size()

    def mlp():
        torch.manual_seed(0)
        layers = []
        for _ in range(n_linear):
            layers += [nn.Linear(width, width), nn.Tanh()]
        return nn.Sequential(*layers[:-1])

    mine, theirs = mlp(), mlp()
    linears = [mod for mod in theirs if isinstance(mod, nn.Linear)]
    zero3 = ns["ZeRO3"]([mod for mod in mine if isinstance(mod, nn.Linear)],
                        lambda ts: torch.optim.SGD(ts, lr=lr))
    for mod in linears:  # lab 05's recipe, default options: one unit per layer, then the root
        fully_shard(mod)
    fully_shard(theirs)
    opt = torch.optim.SGD(theirs.parameters(), lr=lr)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(rows * n, width, generator=g)[rank * rows:(rank + 1) * rows]  # this rank's rows

    def hand():
        loss = mine(x).pow(2).mean()
        loss.backward()
        zero3.step()
        return loss

    def builtin():
        opt.zero_grad(set_to_none=True)
        loss = theirs(x).pow(2).mean()
        loss.backward()
        opt.step()
        return loss

    loss_h, loss_b = hand(), builtin()

    def gathered(shard):  # a ZeRO-3 unit's flat (chunk·N,) tensor from every rank's chunk
        full = torch.empty(shard.numel() * n, dtype=shard.dtype)
        dist.all_gather_single(full, shard.detach().contiguous())
        return full

    units = list(zip(zero3.units, linears))  # FSDP2's DTensors gathered whole with full_tensor()
    d_grad = rel_diff([gathered(u["shard"].grad)[:u["numel"]] for u, _ in units],
                      [p.grad.full_tensor() for _, mod in units for p in mod.parameters()])
    d_param = rel_diff([gathered(u["shard"])[:u["numel"]] for u, _ in units],
                       [p.full_tensor() for _, mod in units for p in mod.parameters()])
    return {"loss": (rel_diff(loss_h, loss_b), RTOL), "gradients": (d_grad, RTOL),
            "parameters after a step": (d_param, RTOL)}, hand, builtin


# ------------------------------------------------------------------ on every rank

def timed(hand, builtin, warmup: int, repeats: int) -> dict:
    """Median seconds of hand and builtin, interleaved (the order alternates), a barrier before each."""
    import torch.distributed as dist

    times = {"hand": [], "builtin": []}
    for r in range(warmup + repeats):
        order = (("hand", hand), ("builtin", builtin))
        for kind, fn in (order if r % 2 == 0 else order[::-1]):
            dist.barrier()
            t0 = time.perf_counter()
            fn()
            dt = time.perf_counter() - t0
            if r >= warmup:
                times[kind].append(dt)
    return {k: statistics.median(v) for k, v in times.items()}


def run(sources: dict, rows: list, warmup: int, repeats: int) -> dict:
    import torch

    torch.set_num_threads(1)
    builders = {"ring": pair_ring, "dp": pair_dp, "tp": pair_tp, "pp": pair_pp, "zero3": pair_zero3}
    out = {}
    for key, pair, kwargs in rows:
        check, hand, builtin = builders[pair](load(sources, pair), **kwargs)
        out[key] = {"check": check}
        if repeats:
            medians = timed(hand, builtin, warmup, repeats)
            out[key]["median"] = {k: v / kwargs.get("calls", 1) for k, v in medians.items()}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="small sizes, 3 repeats: a smoke run")
    ap.add_argument("--check-only", action="store_true", help="the correctness checks, no timing")
    a = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    import parlab

    q = a.quick
    if q:
        a.repeats, a.warmup = min(a.repeats, 3), 1
    small, large = 1024, (2**16 if q else 2**22)
    dp = dict(d_model=64 if q else 128, n_layer=2 if q else 4, batch=4 * a.nproc if q else 16, seq=32,
              bucket_mb=0.25 if q else 1.0)
    tp = dict(d_model=64 if q else 256, batch=2 if q else 8, seq=16 if q else 64)
    pp = dict(n_layer=2 * a.nproc, d_model=32 if q else 64, m=2 * a.nproc if q else 8, mb_rows=2 if q else 4,
              seq=16 if q else 32)
    z3 = dict(width=64 if q else 512, n_linear=4, rows=8 if q else 64)
    rows = [  # (key, pair, its sizes), in the order printed
        ("ring_small", "ring", dict(numel=small, calls=5 if q else 50)),
        ("ring_large", "ring", dict(numel=large, calls=1)),
        ("dp", "dp", dp),
        ("tp", "tp", tp),
        ("pp", "pp", pp),
        ("zero3", "zero3", z3),
    ]
    labels = {
        "ring_small": (f"lab 01 ring_all_reduce, {small * 4 // 1024} KB (1 call)", "dist.all_reduce"),
        "ring_large": (f"lab 01 ring_all_reduce, {large * 4 / 2**20:g} MB", "dist.all_reduce"),
        "dp": (f"lab 02 BucketedDP, GPT d{dp['d_model']}x{dp['n_layer']}", "DDP"),
        "tp": (f"lab 03 ParallelMLP, d{tp['d_model']}, {tp['batch']}x{tp['seq']} tokens",
               "parallelize_module"),
        "pp": (f"lab 04 one_f_one_b_step, m={pp['m']}", "Schedule1F1B"),
        "zero3": (f"lab 05 ZeRO3, MLP {z3['n_linear']}x{z3['width']}", "FSDP2 fully_shard"),
    }
    sources = {pair: solution_source(lab, ids) for pair, (lab, ids) in CELLS.items()}
    repeats = 0 if a.check_only else a.repeats
    started = time.perf_counter()
    res = parlab.launch(run, args=(sources, rows, a.warmup, repeats), nproc=a.nproc, timeout=600)
    print(f"{a.nproc} ranks on gloo, OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}"
          + ("" if a.check_only else f", median of {repeats} interleaved repeats after {a.warmup} warm-up")
          + f"; launch {time.perf_counter() - started:.0f} s")
    failed = []
    for key, *_ in rows:
        checks = {}  # what -> (the largest difference on any rank, tolerance); a loss: last stage only
        for r in res:
            for what, (d, tol) in r[key]["check"].items():
                checks[what] = (max(d, checks.get(what, (d,))[0]), tol)
        bad = [w for w, (d, tol) in checks.items() if not d <= tol]
        failed += [f"{key}: {w}" for w in bad]
        hand_label, builtin_label = labels[key]
        agree = ", ".join(f"{w} {d:.1e}" for w, (d, _) in checks.items())
        verdict = "agree" if not bad else "DIFFER (" + ", ".join(bad) + ")"
        if repeats:
            h = max(r[key]["median"]["hand"] for r in res)  # the slowest rank sets the pace
            b = max(r[key]["median"]["builtin"] for r in res)
            flag = "" if h / b <= GOAL else "  (over the goal)"
            print(f"  {hand_label:<38} {h * 1e3:8.2f} ms  / {builtin_label:<18} {b * 1e3:8.2f} ms"
                  f"  = {h / b:5.2f}{flag}")
        else:
            print(f"  {hand_label:<38} vs {builtin_label}")
        print(f"      max |hand - built-in| / max |built-in|: {agree}: {verdict}")
    if failed:
        raise SystemExit("hand-written and built-in differ: " + "; ".join(failed))
    if repeats:
        print(f"ratio = hand-written / built-in median; goal <= {GOAL:.2f}")


if __name__ == "__main__":
    main()
