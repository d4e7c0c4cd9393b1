"""Per-step time of three data-parallel trainers on CPU gloo, side by side.

1. naive: backward, then one blocking all_reduce per gradient (Lab 02, ex. 2);
2. bucketed: gradient hooks launch an async all_reduce per bucket during
   backward; ``finish()`` waits (Lab 02, ex. 4; a reference version is here);
3. torch DDP with the same bucket size.

All three train parlab's tiny GPT (d_model 128, 4 layers: about 0.83M
parameters, 3.3 MB of fp32 gradients, so the all-reduce is a visible part
of the step) on the same batches, interleaved step by step so that machine
load hits them alike.  We print the median step time of each, the ratio
bucketed / DDP, the bytes each rank sent per step (parlab.trace's counter,
for the two trainers whose collectives go through ``torch.distributed``)
divided by the ring formula 2(n-1)/n * Psi * 4 bytes (``parlab.cost.
dp_comm_elems``, ZeRO section 7), and the maximum difference between the
bucketed and DDP parameters at the end.

    OMP_NUM_THREADS=1 python benchmarks/dp_step.py [--steps 20] [--d-model 128]

Target (Lab 02 brief): bucketed / DDP <= 1.3.

Models and batches live on each rank's ``parlab.device()`` (its GPU under
NCCL), and the device is synchronised before the clock is read.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist


class Bucketed:
    """Reference bucketed DP: the rule of parlab.grading.lab02.bucket_plan."""

    def __init__(self, model, bucket_bytes):
        from parlab.grading.lab02 import bucket_plan

        named = dict(model.named_parameters())
        self.buckets = [[named[n] for n in names] for names in bucket_plan(model, bucket_bytes)]
        self.bucket_of = {p: i for i, b in enumerate(self.buckets) for p in b}
        for p in self.bucket_of:
            p.register_post_accumulate_grad_hook(self._ready)
        self._reset()

    def _reset(self):
        self.waiting = [len(b) for b in self.buckets]
        self.launched = []

    def _ready(self, p):
        i = self.bucket_of[p]
        self.waiting[i] -= 1
        if self.waiting[i] == 0:
            self._launch(i)

    def _launch(self, i):
        flat = torch.cat([q.grad.reshape(-1) if q.grad is not None else q.new_zeros(q.numel())
                          for q in self.buckets[i]])
        self.launched.append((i, flat, dist.all_reduce(flat, async_op=True)))

    def finish(self):
        for i, left in enumerate(self.waiting):
            if left > 0:  # a parameter got no gradient this step: send its bucket with zeros
                self._launch(i)
        n = dist.get_world_size()
        for i, flat, work in self.launched:
            work.wait()
            flat /= n
            offset = 0
            for q in self.buckets[i]:
                piece = flat[offset:offset + q.numel()].view_as(q)
                if q.grad is None:
                    q.grad = piece.clone()
                else:
                    q.grad.copy_(piece)
                offset += q.numel()
        self._reset()


def naive_sync(model):
    n = dist.get_world_size()
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)
            p.grad /= n


def run(steps: int, warmup: int, d_model: int, n_layer: int, batch: int, seq: int,
        bucket_mb: float) -> dict:
    from torch.nn.parallel import DistributedDataParallel as DDP

    from parlab import device, trace
    from parlab.data import get_batch, shard_batch
    from parlab.models import lm_loss, tiny_gpt

    rank, n = dist.get_rank(), dist.get_world_size()
    dev = device()

    def sync_device():  # GPU kernels run asynchronously: finish them before reading the clock
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    bucket_bytes = int(bucket_mb * 2**20)
    make = lambda: tiny_gpt(seed=0, d_model=d_model, n_layer=n_layer, n_head=4, seq_len=seq).to(dev)  # noqa: E731
    models = {k: make() for k in ("naive", "bucketed", "ddp")}
    bucketed = Bucketed(models["bucketed"], bucket_bytes)
    ddp = DDP(models["ddp"], bucket_cap_mb=bucket_mb)
    runners = {"naive": models["naive"], "bucketed": models["bucketed"], "ddp": ddp}
    opts = {k: torch.optim.SGD(m.parameters(), lr=0.1) for k, m in models.items()}
    times = {k: [] for k in models}
    wire = {}
    for step in range(warmup + steps):
        x, y = (t.to(dev) for t in shard_batch(get_batch(step, batch, seq, seed=0), rank, n))
        for kind in ("naive", "bucketed", "ddp"):
            opts[kind].zero_grad(set_to_none=True)
            sync_device()
            dist.barrier()
            t0 = time.perf_counter()
            with trace.count_collectives() as counter:
                lm_loss(runners[kind], x, y).backward()
                if kind == "naive":
                    naive_sync(models[kind])
                elif kind == "bucketed":
                    bucketed.finish()
            opts[kind].step()
            sync_device()
            dt = time.perf_counter() - t0
            if step >= warmup:
                times[kind].append(dt)
                wire[kind] = counter.total_ring_bytes
    diff = max((a - b).abs().max().item() for a, b in
               zip(models["bucketed"].parameters(), models["ddp"].parameters()))
    psi = sum(p.numel() for p in models["naive"].parameters())
    return {"median": {k: statistics.median(v) for k, v in times.items()}, "wire": wire,
            "psi": psi, "diff": diff, "buckets": len(bucketed.buckets)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--bucket-mb", type=float, default=1.0)
    a = ap.parse_args()

    import parlab
    from parlab.cost import dp_comm_elems

    res = parlab.launch(run, args=(a.steps, a.warmup, a.d_model, a.n_layer, a.batch, a.seq,
                                   a.bucket_mb), nproc=a.nproc, timeout=600)
    r0 = res[0]
    formula = dp_comm_elems(r0["psi"], a.nproc) * 4
    print(f"tiny GPT d_model {a.d_model}, {a.n_layer} layers: {r0['psi']:,} parameters; "
          f"{a.nproc} ranks, global batch {a.batch}x{a.seq}, buckets of {a.bucket_mb} MB "
          f"({r0['buckets']} buckets), {a.steps} timed steps")
    for kind in ("naive", "bucketed", "ddp"):
        med = max(r["median"][kind] for r in res)  # the slowest rank sets the pace
        wire = r0["wire"].get(kind)
        sent = (f"sent {wire / 1e6:.3f} MB/step = {wire / formula:.4f} x formula" if wire
                else "sent: not visible to parlab.trace (DDP's C++ reducer)")
        print(f"  {kind:9s} median step {med * 1e3:7.1f} ms   {sent}")
    bucketed = max(r["median"]["bucketed"] for r in res)
    ddp = max(r["median"]["ddp"] for r in res)
    naive = max(r["median"]["naive"] for r in res)
    print(f"bucketed / DDP = {bucketed / ddp:.2f} (target <= 1.3); naive / DDP = {naive / ddp:.2f}")
    print(f"formula 2(n-1)/n * Psi * 4 B = {formula / 1e6:.3f} MB; "
          f"max |bucketed - DDP| parameter difference after training: {r0['diff']:.2e}")


if __name__ == "__main__":
    main()
