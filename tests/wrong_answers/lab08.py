"""Typical wrong answers to Lab 08's exercises (loss scaling, clipping across shards, a sharded checkpoint).

The four tables of tests/answer_suite.py, keyed by ``parlab.grading.lab08.EXERCISES``.
Loss scaler: the overflow checked on the rank's own gradients only (the
silent divergence), the gradients never unscaled, the scale never grown, the
count of clean steps not reset by an overflow, a test for inf that misses
NaN (hidden), a barrier after the flag; one that all-reduces only when its
own rank overflowed hangs the others (ALONE).  Clipping: the replicated
parameters counted once per rank, each rank's own norm, the ranks' norms
added, the norm after clipping returned, the gradients scaled up when the
norm is below max_norm (hidden), per-parameter squares sent.  Checkpoint:
only rank 0 saves, offsets rank·(R // N), a loader that splits R // M rows
per rank, and a save that gathers every shard to rank 0.
tests/ranks/test_lab08.py runs every fixture.
"""
import os

import torch
import torch.distributed as dist


# ------------------------------------------------ loss scaler, with one knob per mistake
def _scaler(agree="max", unscale=True, grow=True, reset=True, finite=torch.isfinite, extra=False,
            only_if_bad=False):
    class Scaler:
        def __init__(self, init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
            self.s, self.g, self.b, self.k = init_scale, growth_factor, backoff_factor, growth_interval
            self.clean, self.found = 0, False

        def scale(self, loss):
            return loss * self.s

        def get_scale(self):
            return self.s

        def step(self, optimizer):
            params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
            bad = False
            for p in params:
                if unscale:
                    p.grad.div_(self.s)
                bad = bad or not bool(finite(p.grad).all())
            flag = torch.tensor([float(bad)])
            if agree == "max" and (bad or not only_if_bad):
                dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if extra:
                dist.barrier()
            self.found = bool(flag.item())
            if not self.found:
                optimizer.step()

        def update(self):
            if self.found:
                self.s *= self.b
                if reset:
                    self.clean = 0
            else:
                self.clean += 1
                if self.clean >= self.k:
                    self.s *= self.g if grow else 1.0
                    self.clean = 0

    return Scaler


def _named(cls, name, doc):
    cls.__name__ = cls.__qualname__ = name
    cls.__doc__ = doc
    return cls


OwnRankOnlyScaler = _named(_scaler(agree="none"), "OwnRankOnlyScaler",
                           "Checks only its own rank's gradients: no collective.")
NotUnscaledScaler = _named(_scaler(unscale=False), "NotUnscaledScaler",
                           "Steps with the scaled gradients (never divided by the scale).")
NeverGrowsScaler = _named(_scaler(grow=False), "NeverGrowsScaler", "Backs off, but never grows the scale.")
NoResetScaler = _named(_scaler(reset=False), "NoResetScaler",
                       "An overflow does not start the count of clean steps again.")
InfOnlyScaler = _named(_scaler(finite=lambda g: ~torch.isinf(g)), "InfOnlyScaler",
                       "Tests for inf with torch.isinf: a NaN passes.")
BarrierScaler = _named(_scaler(extra=True), "BarrierScaler",
                       "Right, with a barrier after the flag's all-reduce: two collectives a step.")
AllReduceIfBadScaler = _named(_scaler(only_if_bad=True), "AllReduceIfBadScaler",
                              "All-reduces the flag only on a rank that overflowed: the others never join.")


class GatheredFlagsScaler:
    """Each rank's flag all-gathered (one element per rank); counts down to the next growth."""

    def __init__(self, init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
        self.value = torch.tensor(float(init_scale))
        self.factors = (growth_factor, backoff_factor)
        self.interval = self.left = growth_interval
        self.skipped = None

    def scale(self, loss):
        return loss * self.value

    def step(self, optimizer):
        found = torch.zeros(1)
        inv = (1.0 / self.value).reshape(1)
        grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found, inv)
        every = torch.zeros(dist.get_world_size())
        dist.all_gather_into_tensor(every, found)
        self.skipped = bool(every.sum() > 0)
        if not self.skipped:
            optimizer.step()

    def update(self):
        if self.skipped:
            self.value = self.value * self.factors[1]
            self.left = self.interval
            return
        self.left -= 1
        if self.left == 0:
            self.value, self.left = self.value * self.factors[0], self.interval

    def get_scale(self):
        return float(self.value)


class SummedCountScaler:
    """Counts the non-finite elements, sums the counts over the ranks, unscales with one foreach."""

    def __init__(self, init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
        self.cfg = dict(scale=init_scale, up=growth_factor, down=backoff_factor, every=growth_interval)
        self.streak, self.overflow = 0, False

    def scale(self, loss):
        return loss * self.cfg["scale"]

    def step(self, optimizer):
        grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        torch._foreach_mul_(grads, 1.0 / self.cfg["scale"])
        count = torch.stack([(~torch.isfinite(g)).sum() for g in grads]).sum().float().reshape(1)
        dist.all_reduce(count)
        self.overflow = count.item() > 0
        if not self.overflow:
            optimizer.step()

    def update(self):
        self.streak = 0 if self.overflow else self.streak + 1
        if self.overflow:
            self.cfg["scale"] *= self.cfg["down"]
        elif self.streak == self.cfg["every"]:
            self.cfg["scale"] *= self.cfg["up"]
            self.streak = 0

    def get_scale(self):
        return self.cfg["scale"]


# ------------------------------------------------ clipping across shards
def _sq(params):
    return sum((p.grad.pow(2).sum() for p in params), torch.zeros(()))


def _clip_all(params, coef):
    for p in params:
        p.grad.mul_(coef)


def clip_counts_replicated_n_times(sharded, replicated, max_norm):
    """All-reduces the squares of every gradient, the replicated ones too: counted once per rank."""
    total = (_sq(sharded) + _sq(replicated)).reshape(1)
    dist.all_reduce(total)
    norm = total.sqrt()[0]
    _clip_all(list(sharded) + list(replicated), torch.clamp(max_norm / (norm + 1e-6), max=1.0))
    return norm


def clip_own_norm(sharded, replicated, max_norm):
    """torch's clip_grad_norm_ on this rank's gradients alone."""
    return torch.nn.utils.clip_grad_norm_(list(sharded) + list(replicated), max_norm)


def clip_adds_norms(sharded, replicated, max_norm):
    """All-reduces each rank's norm (not its square): the norms are added."""
    norm = (_sq(sharded) + _sq(replicated)).sqrt().reshape(1)
    dist.all_reduce(norm)
    _clip_all(list(sharded) + list(replicated), torch.clamp(max_norm / (norm[0] + 1e-6), max=1.0))
    return norm[0]


def clip_returns_clipped_norm(sharded, replicated, max_norm):
    """Clips right, then returns the norm of the clipped gradients."""
    total = _sq(sharded).reshape(1)
    dist.all_reduce(total)
    norm = (total[0] + _sq(replicated)).sqrt()
    coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    _clip_all(list(sharded) + list(replicated), coef)
    return norm * coef


def clip_scales_up(sharded, replicated, max_norm):
    """Always multiplies by max_norm / norm, also when the norm is below max_norm."""
    total = _sq(sharded).reshape(1)
    dist.all_reduce(total)
    norm = (total[0] + _sq(replicated)).sqrt()
    _clip_all(list(sharded) + list(replicated), max_norm / (norm + 1e-6))
    return norm


def clip_per_parameter_squares(sharded, replicated, max_norm):
    """Right norm, but all-reduces one square per parameter: a vector, not one number per rank."""
    squares = torch.stack([p.grad.pow(2).sum() for p in sharded])
    dist.all_reduce(squares)
    norm = (squares.sum() + _sq(replicated)).sqrt()
    _clip_all(list(sharded) + list(replicated), torch.clamp(max_norm / (norm + 1e-6), max=1.0))
    return norm


def clip_replicated_divided(sharded, replicated, max_norm):
    """Adds the replicated squares divided by N inside the all-reduce; torch's clip_grads_with_norm_."""
    n = dist.get_world_size()
    total = (_sq(sharded) + _sq(replicated) / n).reshape(1)
    dist.all_reduce(total)
    norm = total.sqrt()[0]
    torch.nn.utils.clip_grads_with_norm_(list(sharded) + list(replicated), max_norm, norm)
    return norm


def clip_gathered_squares(sharded, replicated, max_norm):
    """All-gathers every rank's square, adds them and the replicated square once; a float back."""
    mine = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in sharded])) ** 2
    every = torch.zeros(dist.get_world_size())
    dist.all_gather_into_tensor(every, mine.reshape(1))
    rep = sum(float(p.grad.pow(2).sum()) for p in replicated)
    norm = (float(every.sum()) + rep) ** 0.5
    coef = min(1.0, max_norm / (norm + 1e-6))
    for p in list(sharded) + list(replicated):
        p.grad *= coef
    return norm


# ------------------------------------------------ sharded checkpoint
def _rows(total, rank, n):
    c = -(-total // n)
    return min(rank * c, total), min((rank + 1) * c, total)


def _checkpoint(who="every", offset="ceil", split="ceil", gather=False):
    class Checkpoint:
        def __init__(self, directory):
            self.directory = directory

        def save(self, shards, shapes):
            rank, n = dist.get_rank(), dist.get_world_size()
            entry = {}
            for k, t in shards.items():
                start = _rows(shapes[k][0], rank, n)[0] if offset == "ceil" else rank * (shapes[k][0] // n)
                entry[k] = (start, t.clone(), tuple(shapes[k]))
            if gather:
                every = [None] * n
                dist.all_gather_object(every, entry)
                if rank == 0:
                    torch.save({f"{r}-{k}": v for r, e in enumerate(every) for k, v in e.items()},
                               os.path.join(self.directory, "all.pt"))
                return
            if who == "every" or rank == 0:
                torch.save(entry, os.path.join(self.directory, f"rank{rank}.pt"))

        def load(self, rank, world_size):
            full = {}
            for f in os.listdir(self.directory):
                for k, (start, rows, shape) in torch.load(os.path.join(self.directory, f)).items():
                    k = k.split("-", 1)[-1]
                    t = full.setdefault(k, torch.zeros(shape))
                    t[start:start + len(rows)] = rows[:max(0, shape[0] - start)]
            out = {}
            for k, t in full.items():
                if split == "ceil":
                    a, b = _rows(t.shape[0], rank, world_size)
                else:  # R // M rows each, the remainder to the last rank
                    each = t.shape[0] // world_size
                    a, b = rank * each, (t.shape[0] if rank == world_size - 1 else (rank + 1) * each)
                out[k] = t[a:b].clone()
            return out

    return Checkpoint


Rank0OnlyCheckpoint = _named(_checkpoint(who="rank0"), "Rank0OnlyCheckpoint",
                             "Only rank 0 writes a file; load() assembles what it finds.")
FloorOffsetCheckpoint = _named(_checkpoint(offset="floor"), "FloorOffsetCheckpoint",
                               "Saves each shard at offset rank·(R // N): off by the uneven remainder.")
FloorSplitCheckpoint = _named(_checkpoint(split="floor"), "FloorSplitCheckpoint",
                              "Loads R // M rows per rank, the remainder to the last: not FSDP2's split.")
GatherToRank0Checkpoint = _named(_checkpoint(gather=True), "GatherToRank0Checkpoint",
                                 "Right files, but save() all-gathers every shard to rank 0, which writes one file.")


class PerTensorFilesCheckpoint:
    """One file per tensor and rank, named by its first row; load() reads only the files it needs."""

    def __init__(self, directory):
        self.directory = directory

    def save(self, shards, shapes):
        n, rank = dist.get_world_size(), dist.get_rank()
        for name, t in shards.items():
            rows = shapes[name][0]
            first = min(rank * ((rows + n - 1) // n), rows)
            torch.save({"t": t, "shape": shapes[name]}, os.path.join(self.directory, f"{name}@{first}.pt"))

    def load(self, rank, world_size):
        out = {}
        names = {f.split("@")[0] for f in os.listdir(self.directory)}
        for name in names:
            pieces = sorted((int(f.split("@")[1][:-3]), f) for f in os.listdir(self.directory)
                            if f.split("@")[0] == name)
            shape = torch.load(os.path.join(self.directory, pieces[0][1]))["shape"]
            rows = shape[0]
            step = (rows + world_size - 1) // world_size
            lo, hi = min(rank * step, rows), min((rank + 1) * step, rows)
            parts = []
            for first, f in pieces:
                t = torch.load(os.path.join(self.directory, f))["t"]
                a, b = max(lo, first), min(hi, first + len(t))
                if a < b:
                    parts.append(t[a - first:b - first])
            out[name] = torch.cat(parts) if parts else torch.zeros((0, *shape[1:]))
        return out


class JsonIndexCheckpoint:
    """Raw bytes per rank (numpy), a JSON index of row ranges; load() copies the overlap of each range."""

    def __init__(self, directory):
        self.directory = directory

    def save(self, shards, shapes):
        import json

        import numpy as np

        rank, n = dist.get_rank(), dist.get_world_size()
        index = {}
        for name, t in shards.items():
            rows = shapes[name][0]
            per = -(-rows // n)
            index[name] = {"from": min(rows, per * rank), "shape": list(shapes[name])}
            np.save(os.path.join(self.directory, f"{name}.{rank}.npy"), t.numpy())
        with open(os.path.join(self.directory, f"index.{rank}.json"), "w") as f:
            json.dump(index, f)

    def load(self, rank, world_size):
        import json

        import numpy as np

        out = {}
        for f in sorted(os.listdir(self.directory)):
            if not f.startswith("index."):
                continue
            saver = f.split(".")[1]
            with open(os.path.join(self.directory, f)) as fh:
                index = json.load(fh)
            for name, e in index.items():
                rows = e["shape"][0]
                per = -(-rows // world_size)
                lo, hi = min(rows, per * rank), min(rows, per * (rank + 1))
                dest = out.setdefault(name, torch.empty((hi - lo, *e["shape"][1:])))
                piece = torch.from_numpy(np.load(os.path.join(self.directory, f"{name}.{saver}.npy")))
                a, b = max(lo, e["from"]), min(hi, e["from"] + len(piece))
                if a < b:
                    dest[a - lo:b - lo] = piece[a - e["from"]:b - e["from"]]
        return out


CORRECT = {"scaler": [GatheredFlagsScaler, SummedCountScaler],
           "clip": [clip_replicated_divided, clip_gathered_squares],
           "checkpoint": [PerTensorFilesCheckpoint, JsonIndexCheckpoint]}

WRONG = {
    "scaler": [
        (OwnRankOnlyScaler, ("own rank's gradients only", "all-reduce")),
        (NotUnscaledScaler, "not unscaled"),
        (NeverGrowsScaler, ("stayed", "growth_factor")),
        (NoResetScaler, ("too early", "starts the count again")),
        (BarrierScaler, ("2 torch.distributed calls in step 0", "single collective per step")),
    ],
    "clip": [
        (clip_counts_replicated_n_times, "counted 3 times"),
        (clip_own_norm, "this rank's own gradients only"),
        (clip_adds_norms, "norms were added"),
        (clip_returns_clipped_norm, "norm after clipping"),
        (clip_per_parameter_squares, ("more than one number per rank", "single collective")),
    ],
    "checkpoint": [
        (Rank0OnlyCheckpoint, ("only rank 0's saved rows", "Every rank saves its own shard")),
        (FloorOffsetCheckpoint, ("rank·(R // N)", "uneven remainder")),
        (FloorSplitCheckpoint, ("R // M per rank", "ceil(R / N) per rank")),
        (GatherToRank0Checkpoint, ("all_gather", "make no `torch.distributed` call")),
    ],
}

WRONG_HIDDEN = {
    "scaler": [(InfOnlyScaler, ("NaN", "torch.isfinite"))],
    "clip": [(clip_scales_up, ("below max_norm", "min(1, max_norm / (norm + 1e-6))"))],
}

ALONE = {"scaler": [(AllReduceIfBadScaler, ("did not finish", "whatever this rank found"))]}
