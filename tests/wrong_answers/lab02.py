"""Lab 02's answers (data parallelism), in the four tables of tests/answer_suite.py.

``CORRECT`` holds right answers written differently from the notebook's solution; ``WRONG``
the mistakes students make, each with the words the check's message must contain;
``WRONG_HIDDEN`` answers that pass the visible cases and only the hidden ones catch;
``ALONE`` an answer whose ranks disagree about their collectives, graded alone with a
short timeout.  tests/ranks/test_lab02.py runs every answer.
"""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from parlab.data import get_batch
from parlab.launch import device
from parlab.models import lm_loss
from wrong_answers import says

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


def batch_y_whole(x, y):
    """Splits x but hands back the whole y."""
    r, n = dist.get_rank(), dist.get_world_size()
    per = x.size(0) // n
    return x[r * per:(r + 1) * per], y


def batch_no_return(x, y):
    """Computes the block and forgets to return it."""
    r, n = dist.get_rank(), dist.get_world_size()
    per = x.size(0) // n
    x, y = x[r * per:(r + 1) * per], y[r * per:(r + 1) * per]


def batch_list_of_rows(x, y):
    """Returns a list of (row_x, row_y) pairs instead of two tensors."""
    r, n = dist.get_rank(), dist.get_world_size()
    per = x.size(0) // n
    return [(x[i], y[i]) for i in range(r * per, (r + 1) * per)]


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


def allreduce_clears_grads(model):
    """Averages, then "cleans up" with zero_grad(set_to_none=True): every p.grad is None."""
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
    model.zero_grad(set_to_none=True)


def allreduce_only_rank0_keeps(model):
    """dist.reduce to rank 0 only: the other ranks keep their partial sums."""
    for p in model.parameters():
        if p.grad is not None:
            dist.reduce(p.grad, dst=0)
            p.grad /= dist.get_world_size()


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


def accum_one_backward(model, micro_batches, sync):
    """Sums the micro-batch losses and runs ONE backward: right numbers, k times the memory."""
    k = len(micro_batches)
    total = sum(lm_loss(model, x, y) for x, y in micro_batches) / k
    total.backward()
    sync(model)


def accum_allreduces_itself(model, micro_batches, sync):
    """Ignores sync and all-reduces the gradients itself."""
    k = len(micro_batches)
    for x, y in micro_batches:
        (lm_loss(model, x, y) / k).backward()
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)


def accum_logs_mean_loss(model, micro_batches, sync):
    """Right gradients and one sync, but all-reduces the loss itself to log the mean over ranks."""
    k = len(micro_batches)
    total = 0.0
    for x, y in micro_batches:
        loss = lm_loss(model, x, y) / k
        loss.backward()
        total = total + loss.detach()
    sync(model)
    dist.all_reduce(total, op=dist.ReduceOp.AVG)


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
    wait_in_hook = False
    send_incomplete = True  # finish() launches a bucket whose gradients did not all arrive
    fill_missing = True  # a parameter without gradient gets the averaged slice

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
            if self.wait_in_hook:
                self.pending[-1][2].wait()

    def _launch(self, i):
        flat = torch.cat([p.grad.reshape(-1) if p.grad is not None else p.new_zeros(p.numel())
                          for p in self.buckets[i]])
        work = dist.all_reduce(flat, async_op=self.async_op)
        self.pending.append((i, flat, work))

    def finish(self):
        launched = {i for i, _, _ in self.pending}
        for i in range(len(self.buckets)):
            if i not in launched and (not self.launch_in_hook or self.send_incomplete):
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
            piece = flat[offset:offset + p.numel()].view_as(p)
            if p.grad is not None:
                p.grad.copy_(piece)
            elif self.fill_missing:
                p.grad = piece.clone()
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


class BucketsWaitInHook(_Buckets):
    """async_op=True, but waits for each bucket right away inside the hook: nothing overlaps."""
    wait_in_hook = True


class BucketsIgnoresUnused(_Buckets):
    """A bucket holding a parameter without gradient never completes and is never sent."""
    send_incomplete = False


class BucketsUnusedStaysNone(_Buckets):
    """Sends the incomplete bucket, but leaves p.grad None for the parameter without gradient."""
    fill_missing = False


class BucketsNoneGradCrash(_Buckets):
    """Assumes every bucketed parameter has a gradient when sending an incomplete bucket."""

    def _launch(self, i):
        flat = torch.cat([p.grad.reshape(-1) for p in self.buckets[i]])
        self.pending.append((i, flat, dist.all_reduce(flat, async_op=True)))


# ------------------------------------------------ 5. make_ddp


def ddp_not_wrapped(model):
    """Returns the model itself: no broadcast, no gradient averaging."""
    return model


def ddp_without_init_sync(model):
    """DDP that skips the initial broadcast (init_sync=False)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    return DDP(model, init_sync=False)


def ddp_device_ids_zero(model):
    """Copied from a GPU tutorial: device_ids=[0] for a model on the CPU."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    return DDP(model, device_ids=[0])


def ddp_returns_none(model):
    """Wraps the model but forgets to return the wrapper."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    DDP(model)


class _HandRolled(torch.nn.Module):
    """Broadcasts at construction and all-reduces each gradient from a hook: right numbers."""

    def __init__(self, model):
        super().__init__()
        self.module = model
        for p in model.parameters():
            dist.broadcast(p.data, src=0)
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._average)

    @staticmethod
    def _average(p):
        dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)


def ddp_hand_rolled(model):
    """Its own wrapper instead of torch's DistributedDataParallel."""
    return _HandRolled(model)


def ddp_wraps_a_copy(model):
    """Wraps a copy: DDP broadcasts into the copy, and the model the caller steps gets no gradient."""
    import copy

    from torch.nn.parallel import DistributedDataParallel as DDP

    return DDP(copy.deepcopy(model))


# ------------------------------------------------ 6. train_data_parallel


def _on_device(batch):
    return tuple(t.to(device()) for t in batch)


def _train(model, optimizer, steps, batch_size, seq_len, seed, broadcast=True, block=None):
    """Data-parallel training: broadcast (or not), each rank on its block (or on ``block``'s), averaged."""
    from parlab.data import get_batch, shard_batch

    if broadcast:
        for p in model.parameters():
            dist.broadcast(p.data, src=0)
    r, n = dist.get_rank(), dist.get_world_size()
    for step in range(steps):
        x, y = _on_device(shard_batch(get_batch(step, batch_size, seq_len, seed), r if block is None else block, n))
        optimizer.zero_grad()
        lm_loss(model, x, y).backward()
        for p in model.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
        optimizer.step()


def train_without_broadcast(model, optimizer, steps, batch_size, seq_len, seed):
    """Shards and averages, but never broadcasts the initial weights."""
    _train(model, optimizer, steps, batch_size, seq_len, seed, broadcast=False)


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
        x, y = _on_device(get_batch(step, batch_size, seq_len, seed))
        optimizer.zero_grad()
        lm_loss(model, x, y).backward()
        optimizer.step()


def train_with_torch_ddp(model, optimizer, steps, batch_size, seq_len, seed):
    """Right numbers, but torch DDP instead of the lab's own functions."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from parlab.data import get_batch, shard_batch

    ddp = DDP(model)
    r, n = dist.get_rank(), dist.get_world_size()
    for step in range(steps):
        x, y = _on_device(shard_batch(get_batch(step, batch_size, seq_len, seed), r, n))
        optimizer.zero_grad()
        lm_loss(ddp, x, y).backward()
        optimizer.step()


def train_rank0_block_everywhere(model, optimizer, steps, batch_size, seq_len, seed):
    """Broadcasts and averages right, but every rank trains on rank 0's block of the batch."""
    _train(model, optimizer, steps, batch_size, seq_len, seed, block=0)


def train_never_steps(model, optimizer, steps, batch_size, seq_len, seed):
    """Averages the gradients but never calls optimizer.step()."""
    from parlab.data import get_batch, shard_batch

    for p in model.parameters():
        dist.broadcast(p.data, src=0)
    r, n = dist.get_rank(), dist.get_world_size()
    for step in range(steps):
        x, y = _on_device(shard_batch(get_batch(step, batch_size, seq_len, seed), r, n))
        model.zero_grad()
        lm_loss(model, x, y).backward()


# ------------------------------------------------ right answers, written differently


def broadcast_each(model):
    for p in model.parameters():
        dist.broadcast(p.data, src=0)


def broadcast_flat(model):
    """One broadcast of all parameters flattened together, then copied back."""
    params = list(model.parameters())
    flat = torch.cat([p.detach().reshape(-1) for p in params])
    dist.broadcast(flat, src=0)
    with torch.no_grad():
        torch.nn.utils.vector_to_parameters(flat, params)


def broadcast_state_dict(model):
    """Buffers too, through the state dict (its tensors share the parameters' storage)."""
    for t in model.state_dict().values():
        dist.broadcast(t, src=0)


def batch_slices(x, y):
    r, n = dist.get_rank(), dist.get_world_size()
    per = x.size(0) // n
    return x[r * per:(r + 1) * per], y[r * per:(r + 1) * per]


def batch_chunk(x, y):
    r, n = dist.get_rank(), dist.get_world_size()
    return x.chunk(n)[r], y.chunk(n)[r]


def batch_tensor_split(x, y):
    r, n = dist.get_rank(), dist.get_world_size()
    return torch.tensor_split(x, n)[r], torch.tensor_split(y, n)[r]


def batch_narrow_list(x, y):
    """narrow() views, returned as a list rather than a tuple."""
    r, n = dist.get_rank(), dist.get_world_size()
    per = x.size(0) // n
    return [x.narrow(0, r * per, per), y.narrow(0, r * per, per)]


def allreduce_sum_then_divide(model):
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()


def allreduce_avg_each(model):
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)


def allreduce_async_all(model):
    """Launch every all-reduce at once, then wait for all of them."""
    works = [(p, dist.all_reduce(p.grad, async_op=True)) for p in model.parameters()
             if p.grad is not None]
    for p, work in works:
        work.wait()
        p.grad /= dist.get_world_size()


def allreduce_flat_avg(model):
    """All gradients in one flat tensor, ReduceOp.AVG, copied back."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.AVG)
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def accum_scaled_loss(model, micro_batches, sync):
    k = len(micro_batches)
    for x, y in micro_batches:
        (lm_loss(model, x, y) / k).backward()
    sync(model)


def accum_autograd_backward(model, micro_batches, sync):
    """torch.autograd.backward instead of loss.backward()."""
    for x, y in micro_batches:
        torch.autograd.backward(lm_loss(model, x, y) / len(micro_batches))
    sync(model)


def accum_scale_grads_after(model, micro_batches, sync):
    """Unscaled losses, then the summed gradients divided by k before the one sync."""
    for x, y in micro_batches:
        lm_loss(model, x, y).backward()
    for p in model.parameters():
        if p.grad is not None:
            p.grad /= len(micro_batches)
    sync(model)


class BucketsFlat(_Buckets):
    """The reference switches of the fixture class: flat buckets, SUM then divide."""


class BucketsAvgViews:
    """Another way: per-bucket flat buffer filled as gradients arrive, ReduceOp.AVG, futures."""

    def __init__(self, model, bucket_bytes):
        self.buckets, cur, size = [], [], 0
        for p in reversed([p for p in model.parameters() if p.requires_grad]):
            cur.append(p)
            size += p.numel() * p.element_size()
            if size >= bucket_bytes:
                self.buckets.append(cur)
                cur, size = [], 0
        if cur:
            self.buckets.append(cur)
        self.index = {id(p): (b, i) for b, ps in enumerate(self.buckets) for i, p in enumerate(ps)}
        self.buffers = [torch.zeros(sum(p.numel() for p in ps), device=ps[0].device)
                        for ps in self.buckets]
        self.filled = [0] * len(self.buckets)
        self.futures = []
        for ps in self.buckets:
            for p in ps:
                p.register_post_accumulate_grad_hook(self.ready)

    def ready(self, p):
        b, i = self.index[id(p)]
        start = sum(q.numel() for q in self.buckets[b][:i])
        self.buffers[b][start:start + p.numel()].copy_(p.grad.reshape(-1))
        self.filled[b] += 1
        if self.filled[b] == len(self.buckets[b]):
            self._send(b)

    def _send(self, b):
        work = dist.all_reduce(self.buffers[b], op=dist.ReduceOp.AVG, async_op=True)
        self.futures.append((b, work.get_future()))

    def finish(self):
        sent = {b for b, _ in self.futures}
        for b in range(len(self.buckets)):
            if b not in sent:  # some parameter got no gradient: its slice is still zero
                self._send(b)
        torch.futures.wait_all([f for _, f in self.futures])
        for b, _ in self.futures:
            start = 0
            for p in self.buckets[b]:
                piece = self.buffers[b][start:start + p.numel()].view_as(p)
                if p.grad is None:
                    p.grad = piece.clone()
                else:
                    p.grad.copy_(piece)
                start += p.numel()
        for buf in self.buffers:
            buf.zero_()
        self.futures, self.filled = [], [0] * len(self.buckets)


def ddp_plain(model):
    return DistributedDataParallel(model)


def ddp_small_buckets(model):
    return DistributedDataParallel(model, bucket_cap_mb=0.01)


def ddp_find_unused(model):
    return DistributedDataParallel(model, find_unused_parameters=True)


def _local_batch(step, batch_size, seq_len, seed, split):
    return _on_device(split(*get_batch(step, batch_size, seq_len, seed)))


def train_own_functions(model, optimizer, steps, batch_size, seq_len, seed):
    broadcast_each(model)
    for step in range(steps):
        x, y = _local_batch(step, batch_size, seq_len, seed, batch_slices)
        optimizer.zero_grad()
        lm_loss(model, x, y).backward()
        allreduce_sum_then_divide(model)
        optimizer.step()


def train_flat_functions(model, optimizer, steps, batch_size, seq_len, seed):
    """The other correct versions of the lab's functions, and set_to_none=False."""
    broadcast_flat(model)
    for step in range(steps):
        x, y = _local_batch(step, batch_size, seq_len, seed, batch_tensor_split)
        optimizer.zero_grad(set_to_none=False)
        lm_loss(model, x, y).backward()
        allreduce_flat_avg(model)
        optimizer.step()


def train_logs_full_loss(model, optimizer, steps, batch_size, seq_len, seed):
    """Also evaluates the whole global batch under no_grad, for a log line: trains nothing."""
    broadcast_each(model)
    for step in range(steps):
        x, y = _local_batch(step, batch_size, seq_len, seed, batch_chunk)
        optimizer.zero_grad()
        lm_loss(model, x, y).backward()
        allreduce_avg_each(model)
        optimizer.step()
        with torch.no_grad():
            lm_loss(model, *_local_batch(step, batch_size, seq_len, seed, lambda *b: b))


# ------------------------------------------------ graded alone: the ranks disagree


def allreduce_rank_dependent(model):
    """Rank 0 skips parameters without a gradient; the others all-reduce zeros for them."""
    for p in model.parameters():
        if p.grad is None:
            if dist.get_rank() == 0:
                continue
            p.grad = torch.zeros_like(p)
        dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)


CORRECT = {
    "broadcast": [broadcast_each, broadcast_flat, broadcast_state_dict],
    "shard": [batch_slices, batch_chunk, batch_tensor_split, batch_narrow_list],
    "allreduce": [allreduce_sum_then_divide, allreduce_avg_each, allreduce_async_all,
                  allreduce_flat_avg],
    "accum": [accum_scaled_loss, accum_autograd_backward, accum_scale_grads_after],
    "bucketed": [BucketsFlat, BucketsAvgViews],
    "ddp": [ddp_plain, ddp_small_buckets, ddp_find_unused],
    "train": [train_own_functions, train_flat_functions, train_logs_full_loss],
}

_NOT_BACK = "never reached p.grad: torch.cat makes a copy, so copy the bucket back into each p.grad"

WRONG = {
    "broadcast": [(broadcast_forgotten, "still holds its own initial parameters"),
                  (broadcast_from_last_rank, "the source must be rank 0"),
                  (broadcast_by_averaging, "averaged (all_reduce) instead of copying"),
                  (broadcast_into_copy, "still holds its own initial parameters")],
    "shard": [(batch_whole, "whole batch"), (batch_strided, "strided"),
              (batch_reversed_ranks, "that is rank 1's block"),
              (batch_y_whole, "returned y of shape (8, 16), expected (4, 16)"),
              (batch_no_return, "returned None"),
              (batch_list_of_rows, "should return a pair of tensors")],
    "allreduce": [(allreduce_sums, "summed, not averaged"),
                  (allreduce_crashes_on_frozen, "(requires_grad=False) never gets one; skip it"),
                  (allreduce_divides_twice, "divided by the world size twice"),
                  (allreduce_flat_no_copy_back, "never reached p.grad"),
                  (allreduce_skips_small, "never all-reduced"),
                  (allreduce_clears_grads, "have no gradient (None)"),
                  (allreduce_only_rank0_keeps, "the ranks used different gradients")],
    "accum": [(accum_syncs_every_micro_step, "sync only on the last micro-step"),
              (accum_never_syncs, "never called"),
              (accum_no_loss_scaling, "divide each micro-batch loss"),
              (accum_divides_twice, "number of micro-batches (3) twice"),
              (accum_syncs_before_last_backward, "before the last micro-batch's backward"),
              (accum_one_backward, "one backward over the summed losses"),
              (accum_allreduces_itself, "never called sync(model)"),
              (accum_logs_mean_loss, ("called dist.all_reduce of", "itself"))],
    "bucketed": [(BucketsSum, "summed, not averaged"),
                 (BucketsNeverWaited, "never waited on"),
                 (BucketsNoReset, "reset your bucket state"),
                 (BucketsBlocking, "async_op=True"),
                 (BucketsAllInFinish, "after backward returned"),
                 (BucketsOnePerParam, "one per bucket"),
                 (BucketsNoCopyBack, _NOT_BACK + " after work.wait()"),
                 (BucketsStrict, "one per bucket"),
                 (BucketsWaitInHook, "nothing overlapped"),
                 (BucketsIgnoresUnused, "never completed"),
                 (BucketsUnusedStaysNone, "its p.grad is None"),
                 (BucketsNoneGradCrash, "one that forward never used counts as zeros")],
    "ddp": [(ddp_not_wrapped, "were they synchronised (all-reduced) at all?"),
            (ddp_without_init_sync, "must be broadcast first"),
            (ddp_device_ids_zero, "device_ids names the GPU a module lives on; leave it out"),
            (ddp_returns_none, "not a module"),
            (ddp_hand_rolled, "never built a torch DistributedDataParallel"),
            (ddp_wraps_a_copy, says("have no gradient (None)", never="broadcast"))],
    "train": [(train_without_broadcast, "must be broadcast first"),
              (train_whole_batch_no_sync, "saw 8 rows of the global batch of 8; its share is 4 rows"),
              (train_with_torch_ddp, "it wrapped the model in torch's DistributedDataParallel"),
              (train_never_steps, "took 0 optimizer steps, expected 3"),
              (train_rank0_block_everywhere, says("the broadcast and the averaging are not what differs",
                                                  never="must be broadcast first"))],
}

WRONG_HIDDEN = {
    "shard": [(batch_assumes_two_ranks, "returned x of shape")],
}

ALONE = {
    "allreduce": [(allreduce_rank_dependent, ("allreduce_rank_dependent", "same collectives"))],
}
