"""Lab 02's checks: they pass correct answers (written two ways each) and
reject the wrong answers in tests/wrong_answers/lab02.py with a message that
names the mistake.

Launches are the cost, so the answers are graded in batches through
``lab02.run_checks``: one 2-rank launch for the visible cases and one 3-rank
launch for the hidden ones, graded by the same code as the public checks.
The public ``check_*`` functions are called directly where the launch itself
must fail (ranks that disagree about their collectives).
"""
import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from parlab.data import get_batch
from parlab.grading import lab02
from parlab.models import lm_loss
from wrong_answers import lab02 as wrong

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(300)]


# ---------------------------------------------------------------- correct answers

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


def batch_slices(x, y):
    r, n = dist.get_rank(), dist.get_world_size()
    per = x.size(0) // n
    return x[r * per:(r + 1) * per], y[r * per:(r + 1) * per]


def batch_chunk(x, y):
    r, n = dist.get_rank(), dist.get_world_size()
    return x.chunk(n)[r], y.chunk(n)[r]


def allreduce_sum_then_divide(model):
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)
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


def accum_scale_grads_after(model, micro_batches, sync):
    """Unscaled losses, then the summed gradients divided by k before the one sync."""
    for x, y in micro_batches:
        lm_loss(model, x, y).backward()
    for p in model.parameters():
        if p.grad is not None:
            p.grad /= len(micro_batches)
    sync(model)


class BucketsFlat(wrong._Buckets):
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
        self.buffers = [torch.zeros(sum(p.numel() for p in ps)) for ps in self.buckets]
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
            work = dist.all_reduce(self.buffers[b], op=dist.ReduceOp.AVG, async_op=True)
            self.futures.append((b, work.get_future()))

    def finish(self):
        torch.futures.wait_all([f for _, f in self.futures])
        for b, _ in self.futures:
            start = 0
            for p in self.buckets[b]:
                p.grad.copy_(self.buffers[b][start:start + p.numel()].view_as(p))
                start += p.numel()
        self.futures, self.filled = [], [0] * len(self.buckets)


def ddp_plain(model):
    return DistributedDataParallel(model)


def ddp_small_buckets(model):
    return DistributedDataParallel(model, bucket_cap_mb=0.01)


def train_own_functions(model, optimizer, steps, batch_size, seq_len, seed):
    broadcast_each(model)
    for step in range(steps):
        x, y = batch_slices(*get_batch(step, batch_size, seq_len, seed))
        optimizer.zero_grad()
        lm_loss(model, x, y).backward()
        allreduce_sum_then_divide(model)
        optimizer.step()


def train_with_ddp(model, optimizer, steps, batch_size, seq_len, seed):
    """The same with torch DDP doing the broadcast and the averaging."""
    ddp = DistributedDataParallel(model)
    for step in range(steps):
        x, y = batch_chunk(*get_batch(step, batch_size, seq_len, seed))
        optimizer.zero_grad()
        lm_loss(ddp, x, y).backward()
        optimizer.step()


CORRECT = {
    "broadcast": {"broadcast_each": broadcast_each, "broadcast_flat": broadcast_flat},
    "shard": {"batch_slices": batch_slices, "batch_chunk": batch_chunk},
    "allreduce": {"allreduce_sum_then_divide": allreduce_sum_then_divide,
                  "allreduce_flat_avg": allreduce_flat_avg},
    "accum": {"accum_scaled_loss": accum_scaled_loss,
              "accum_scale_grads_after": accum_scale_grads_after},
    "bucketed": {"BucketsFlat": BucketsFlat, "BucketsAvgViews": BucketsAvgViews},
    "ddp": {"ddp_plain": ddp_plain, "ddp_small_buckets": ddp_small_buckets},
    "train": {"train_own_functions": train_own_functions, "train_with_ddp": train_with_ddp},
}


def _batch(*tables):
    batch = {ex: dict(fns) for ex, fns in CORRECT.items()}
    for table in tables:
        for ex, fixtures in table.items():
            batch[ex].update({f.__name__: f for f, _ in fixtures})
    return batch


# ---------------------------------------------------------------- batched: visible and hidden

@pytest.fixture(scope="module")
def visible():
    return lab02.run_checks(_batch(wrong.WRONG, wrong.WRONG_HIDDEN), hidden=False, timeout=240)


@pytest.fixture(scope="module")
def hidden():
    return lab02.run_checks(_batch(wrong.WRONG_HIDDEN), hidden=True, timeout=240)


@pytest.mark.parametrize("ex,name", [(ex, n) for ex in CORRECT for n in CORRECT[ex]])
def test_correct_answers_pass_visible_and_hidden(visible, hidden, ex, name):
    assert visible[(ex, name)] is None, visible[(ex, name)]
    assert hidden[(ex, name)] is None, hidden[(ex, name)]


@pytest.mark.parametrize("ex,fixture,words", [
    (ex, f, w) for ex, fs in wrong.WRONG.items() for f, w in fs])
def test_wrong_answers_fail_visible(visible, ex, fixture, words):
    msg = visible[(ex, fixture.__name__)]
    assert msg is not None, f"{fixture.__name__} passed the visible {ex} check"
    assert words in msg, msg


@pytest.mark.parametrize("ex,fixture,words", [
    (ex, f, w) for ex, fs in wrong.WRONG_HIDDEN.items() for f, w in fs])
def test_wrong_answers_fail_hidden_only(visible, hidden, ex, fixture, words):
    assert visible[(ex, fixture.__name__)] is None, visible[(ex, fixture.__name__)]
    msg = hidden[(ex, fixture.__name__)]
    assert msg is not None and words in msg, msg


def test_messages_name_step_rank_and_case(visible):
    msg = visible[("allreduce", "allreduce_sums")]
    assert "step 1" in msg and "rank 0" in msg and "world_size 2" in msg, msg


def test_copy_back_mistakes_get_the_copy_hint(visible):
    """A bucket reduced in a torch.cat copy must reach p.grad, after the wait."""
    # (Copying back *before* work.wait() is the same mistake, but whether it shows
    # depends on timing, so it is not a fixture: a test must not be flaky.)
    for name in ("BucketsNoCopyBack",):
        msg = visible[("bucketed", name)]
        assert msg is not None, f"{name} passed the visible bucketed check"
        assert "copy the bucket back into each p.grad after work.wait()" in msg, msg


# ---------------------------------------------------------------- bucket rule

def test_bucket_plan_rule():
    model = lab02.Case().build(0)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert lab02.bucket_plan(model, 1 << 30) == [trainable[::-1]]
    assert [len(b) for b in lab02.bucket_plan(model, 1)] == [1] * len(trainable)
    # ln_f.bias + ln_f.weight hold 32 floats each: 256 bytes closes the first bucket (>=).
    assert lab02.bucket_plan(model, 256)[0] == ["ln_f.bias", "ln_f.weight"]
    assert lab02.bucket_plan(model, 257)[0] == ["ln_f.bias", "ln_f.weight", "blocks.1.mlp.down.bias"]


# ---------------------------------------------------------------- public checks, launch failures

def test_public_check_passes_and_reports(capsys):
    lab02.check_allreduce_gradients(allreduce_flat_avg)
    assert "visible cases passed on 2 ranks" in capsys.readouterr().out


def test_disagreeing_ranks_fail_in_bounded_time():
    fn, words = wrong.HANG
    with pytest.raises(AssertionError, match="allreduce_rank_dependent") as info:
        lab02.check_allreduce_gradients(fn, timeout=20)
    assert words in str(info.value)


def test_not_a_function():
    with pytest.raises(AssertionError, match="expected your"):
        lab02.check_bucketed(None)
