"""Typical wrong answers to Lab 02's exercises (data parallelism).

``WRONG`` maps each exercise of ``parlab.grading.lab02`` to a list of
(fixture, words the check's message must contain).  ``WRONG_HIDDEN`` holds
answers that pass the visible cases and only the hidden ones catch.
``HANG`` makes the ranks disagree about their collectives; it is tested
alone, with a short timeout.  tests/test_lab02.py runs every fixture.
"""
import torch
import torch.distributed as dist

from parlab.models import lm_loss

# ------------------------------------------------ 1a. broadcast_parameters


def broadcast_forgotten(model):
    """Does nothing: each rank keeps its own random initialisation."""


def broadcast_from_last_rank(model):
    """Broadcasts from the last rank instead of rank 0."""
    for p in model.parameters():
        dist.broadcast(p.data, src=dist.get_world_size() - 1)


def broadcast_by_averaging(model):
    """Averages the parameters: the ranks agree, but not on rank 0's values."""
    for p in model.parameters():
        dist.all_reduce(p.data)
        p.data /= dist.get_world_size()


def broadcast_into_copy(model):
    """Broadcasts into a clone and throws it away: the model is not changed in place."""
    for p in model.parameters():
        dist.broadcast(p.detach().clone(), src=0)


# ------------------------------------------------ 1b. my_batch


def batch_whole(x, y):
    """Every rank trains on the whole global batch."""
    return x, y


def batch_strided(x, y):
    """Strided rows, as DistributedSampler does; the lab asks for contiguous blocks."""
    r, n = dist.get_rank(), dist.get_world_size()
    return x[r::n], y[r::n]


def batch_reversed_ranks(x, y):
    """Contiguous blocks, numbered from the end."""
    r, n = dist.get_rank(), dist.get_world_size()
    per = x.size(0) // n
    s = n - 1 - r
    return x[s * per:(s + 1) * per], y[s * per:(s + 1) * per]


def batch_assumes_two_ranks(x, y):
    """Halves the batch whatever the world size (passes with 2 ranks only)."""
    half = x.size(0) // 2
    r = dist.get_rank()
    return x[r * half:(r + 1) * half], y[r * half:(r + 1) * half]


# ------------------------------------------------ 2. allreduce_gradients


def allreduce_sums(model):
    """all_reduce is a SUM; forgets to divide by the world size."""
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)


def allreduce_crashes_on_frozen(model):
    """Assumes every parameter has a gradient: p.grad is None for a frozen one."""
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()


def allreduce_divides_twice(model):
    """Uses ReduceOp.AVG and then divides by the world size again."""
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
            p.grad /= dist.get_world_size()


def allreduce_flat_no_copy_back(model):
    """Flattens the gradients into one tensor, reduces it, never copies it back."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()


def allreduce_skips_small(model):
    """Only all-reduces matrices (dim >= 2), leaving biases and norms unsynchronised."""
    for p in model.parameters():
        if p.grad is not None and p.dim() >= 2:
            dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)


# ------------------------------------------------ 3. accumulate_and_sync


def accum_syncs_every_micro_step(model, micro_batches, sync):
    """Right gradients, but pays for k all-reduces instead of one."""
    k = len(micro_batches)
    for x, y in micro_batches:
        (lm_loss(model, x, y) / k).backward()
        sync(model)


def accum_never_syncs(model, micro_batches, sync):
    """Accumulates locally and forgets the sync."""
    k = len(micro_batches)
    for x, y in micro_batches:
        (lm_loss(model, x, y) / k).backward()


def accum_no_loss_scaling(model, micro_batches, sync):
    """Sums micro-batch gradients without dividing by the number of micro-batches."""
    for x, y in micro_batches:
        lm_loss(model, x, y).backward()
    sync(model)


def accum_divides_twice(model, micro_batches, sync):
    """Divides each loss by k and then the gradients by k again."""
    k = len(micro_batches)
    for x, y in micro_batches:
        (lm_loss(model, x, y) / k).backward()
    sync(model)
    for p in model.parameters():
        if p.grad is not None:
            p.grad /= k


def accum_syncs_before_last_backward(model, micro_batches, sync):
    """Syncs once, but before the last micro-batch's backward."""
    k = len(micro_batches)
    for i, (x, y) in enumerate(micro_batches):
        loss = lm_loss(model, x, y) / k
        if i == k - 1:
            sync(model)
        loss.backward()


# ------------------------------------------------ 4. BucketedDP


class _Buckets:
    """A correct bucketed DP with switches to get it wrong (not an answer by itself)."""

    wait = True
    average = True
    reset = True
    async_op = True
    launch_in_hook = True
    copy_back = True
    strict = False  # close a bucket at > bucket_bytes instead of >=

    def __init__(self, model, bucket_bytes):
        params = [p for p in model.parameters() if p.requires_grad][::-1]
        self.buckets, cur, size = [], [], 0
        for p in params:
            cur.append(p)
            size += p.numel() * p.element_size()
            if (size > bucket_bytes) if self.strict else (size >= bucket_bytes):
                self.buckets.append(cur)
                cur, size = [], 0
        if cur:
            self.buckets.append(cur)
        self.where = {}
        for i, b in enumerate(self.buckets):
            for p in b:
                self.where[p] = i
                p.register_post_accumulate_grad_hook(self._hook)
        self._new_step()

    def _new_step(self):
        self.left = [len(b) for b in self.buckets]
        self.pending = []

    def _hook(self, p):
        i = self.where[p]
        self.left[i] -= 1
        if self.left[i] == 0 and self.launch_in_hook:
            self._launch(i)

    def _launch(self, i):
        flat = torch.cat([p.grad.reshape(-1) for p in self.buckets[i]])
        work = dist.all_reduce(flat, async_op=self.async_op)
        self.pending.append((i, flat, work))

    def finish(self):
        if not self.launch_in_hook:
            for i in range(len(self.buckets)):
                self._launch(i)
        for i, flat, work in self.pending:
            if self.wait and work is not None:
                work.wait()
            if self.average:
                flat /= dist.get_world_size()
            if self.copy_back:
                self._copy_back(i, flat)
        if self.reset:
            self._new_step()

    def _copy_back(self, i, flat):
        offset = 0
        for p in self.buckets[i]:
            p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()


class BucketsSum(_Buckets):
    """Waits, copies back, but never divides by the world size."""
    average = False


class BucketsNeverWaited(_Buckets):
    """Copies the buffers back without waiting for the all-reduces."""
    wait = False


class BucketsNoReset(_Buckets):
    """Forgets to reset the per-step counters: from step 2 on nothing is launched."""
    reset = False


class BucketsBlocking(_Buckets):
    """A blocking all_reduce inside the hook: right numbers, no overlap."""
    async_op = False


class BucketsAllInFinish(_Buckets):
    """Launches every bucket from finish(): nothing overlaps backward."""
    launch_in_hook = False


class BucketsOnePerParam(_Buckets):
    """Ignores bucket_bytes: one all-reduce per parameter."""

    def __init__(self, model, bucket_bytes):
        super().__init__(model, 1)


class BucketsNoCopyBack(_Buckets):
    """Reduces the flat torch.cat copy, waits, averages, but never copies it into p.grad."""
    copy_back = False


class BucketsStrict(_Buckets):
    """Closes a bucket only when it holds MORE than bucket_bytes (the rule says >=)."""
    strict = True


# ------------------------------------------------ 6. make_ddp


def ddp_not_wrapped(model):
    """Returns the model itself: no broadcast, no gradient averaging."""
    return model


def ddp_without_init_sync(model):
    """DDP that skips the initial broadcast (init_sync=False)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    return DDP(model, init_sync=False)


# ------------------------------------------------ 7. train_data_parallel


def train_without_broadcast(model, optimizer, steps, batch_size, seq_len, seed):
    """Shards and averages, but never broadcasts the initial weights."""
    from parlab.data import get_batch, shard_batch

    r, n = dist.get_rank(), dist.get_world_size()
    for step in range(steps):
        x, y = shard_batch(get_batch(step, batch_size, seq_len, seed), r, n)
        optimizer.zero_grad()
        lm_loss(model, x, y).backward()
        for p in model.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
        optimizer.step()


def train_whole_batch_no_sync(model, optimizer, steps, batch_size, seq_len, seed):
    """Broadcasts, then every rank trains on the whole batch without any all-reduce.

    The numbers equal the reference (each rank repeats the single-process
    run), but nothing is parallel: the check counts the rows each rank's
    forward pass sees.
    """
    from parlab.data import get_batch

    for p in model.parameters():
        dist.broadcast(p.data, src=0)
    for step in range(steps):
        x, y = get_batch(step, batch_size, seq_len, seed)
        optimizer.zero_grad()
        lm_loss(model, x, y).backward()
        optimizer.step()


_NOT_BACK = "never reached p.grad: torch.cat makes a copy, so copy the bucket back into each p.grad"

WRONG = {
    "broadcast": [(broadcast_forgotten, "still holds its own initial parameters"),
                  (broadcast_from_last_rank, "the source must be rank 0"),
                  (broadcast_by_averaging, "averaged"),
                  (broadcast_into_copy, "still holds its own initial parameters")],
    "shard": [(batch_whole, "whole batch"), (batch_strided, "strided"),
              (batch_reversed_ranks, "that is rank 1's block")],
    "allreduce": [(allreduce_sums, "summed, not averaged"),
                  (allreduce_crashes_on_frozen, "frozen"),
                  (allreduce_divides_twice, "divided by the world size twice"),
                  (allreduce_flat_no_copy_back, "never reached p.grad"),
                  (allreduce_skips_small, "never all-reduced")],
    "accum": [(accum_syncs_every_micro_step, "sync only on the last micro-step"),
              (accum_never_syncs, "never called"),
              (accum_no_loss_scaling, "divide each micro-batch loss"),
              (accum_divides_twice, "twice"),
              (accum_syncs_before_last_backward, "never all-reduced")],
    "bucketed": [(BucketsSum, "summed, not averaged"),
                 (BucketsNeverWaited, "never waited on"),
                 (BucketsNoReset, "reset your bucket state"),
                 (BucketsBlocking, "async_op=True"),
                 (BucketsAllInFinish, "after backward returned"),
                 (BucketsOnePerParam, "expected 1 (one per bucket"),
                 (BucketsNoCopyBack, _NOT_BACK + " after work.wait()")],
    "ddp": [(ddp_not_wrapped, "synchronised"),
            (ddp_without_init_sync, "broadcast")],
    "train": [(train_without_broadcast, "broadcast"),
              (train_whole_batch_no_sync, "rows")],
}

WRONG_HIDDEN = {
    "shard": [(batch_assumes_two_ranks, "returned x of shape")],
    "bucketed": [(BucketsStrict, "all_reduce calls, expected")],
}


def allreduce_rank_dependent(model):
    """Rank 0 skips parameters without a gradient; the others all-reduce zeros for them."""
    for p in model.parameters():
        if p.grad is None:
            if dist.get_rank() == 0:
                continue
            p.grad = torch.zeros_like(p)
        dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)


HANG = (allreduce_rank_dependent, "same collectives")
