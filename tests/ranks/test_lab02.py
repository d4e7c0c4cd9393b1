"""Lab 02's checks: they pass correct answers (written several ways each) and
reject the wrong answers in tests/wrong_answers/lab02.py with a message that
names the mistake.

Launches are the cost, so every answer is graded in one batch through
``harness.grade_batch`` (the code the public checks use): one 2-rank launch
for the visible cases and one 3-rank launch for the hidden ones.  The hint
code is also run on odd results (None gradients, empty results, wrong types)
without any launch.  The public ``check_*`` functions are called directly
where the launch itself must fail (ranks that disagree about their
collectives).
"""
import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from parlab.data import get_batch
from parlab.grading import harness, lab02
from parlab.grading.lab02 import graders as lab02_graders
from parlab.models import lm_loss
from parlab.launch import device
from wrong_answers import lab02 as wrong

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(600)]


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
    return tuple(t.to(device()) for t in split(*get_batch(step, batch_size, seq_len, seed)))


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


def _batch(*tables):
    batch = {lab02.EXERCISES[ex]: {f.__name__: f for f in fns} for ex, fns in CORRECT.items()}
    for table in tables:
        for ex, fixtures in table.items():
            batch[lab02.EXERCISES[ex]].update({f.__name__: f for f, _ in fixtures})
    return batch


# ---------------------------------------------------------------- batched: visible and hidden

@pytest.fixture(scope="module")
def visible():
    return harness.grade_batch(_batch(wrong.WRONG, wrong.WRONG_HIDDEN), hidden=False, timeout=240)


@pytest.fixture(scope="module")
def hidden():
    return harness.grade_batch(_batch(wrong.WRONG_HIDDEN), hidden=True, timeout=240)


def _key(ex, name):
    return (lab02.EXERCISES[ex].key, name)


@pytest.mark.parametrize("ex,name", [(ex, f.__name__) for ex in CORRECT for f in CORRECT[ex]])
def test_correct_answers_pass_visible_and_hidden(visible, hidden, ex, name):
    assert visible[_key(ex, name)] is None, visible[_key(ex, name)]
    assert hidden[_key(ex, name)] is None, hidden[_key(ex, name)]


@pytest.mark.parametrize("ex,fixture,words", [
    (ex, f, w) for ex, fs in wrong.WRONG.items() for f, w in fs])
def test_wrong_answers_fail_visible(visible, ex, fixture, words):
    msg = visible[_key(ex, fixture.__name__)]
    assert msg is not None, f"{fixture.__name__} passed the visible {ex} check"
    assert words in msg, msg


@pytest.mark.parametrize("ex,fixture,words", [
    (ex, f, w) for ex, fs in wrong.WRONG_HIDDEN.items() for f, w in fs])
def test_wrong_answers_fail_hidden_only(visible, hidden, ex, fixture, words):
    assert visible[_key(ex, fixture.__name__)] is None, visible[_key(ex, fixture.__name__)]
    msg = hidden[_key(ex, fixture.__name__)]
    assert msg is not None and words in msg, msg


def test_messages_name_step_rank_and_case(visible):
    msg = visible[_key("allreduce", "allreduce_sums")]
    assert "step 1" in msg and "rank 0" in msg and "world_size 2" in msg, msg


def test_rule_messages_quote_the_notebook(visible):
    msg = visible[_key("bucketed", "BucketsWaitInHook")]
    assert "gives the right values" in msg and "The exercise says:" in msg, msg


def test_device_ids_error_shows_the_real_valueerror(visible):
    msg = visible[_key("ddp", "ddp_device_ids_zero")]
    assert "ValueError" in msg and "frozen" not in msg, msg


def test_never_waited_is_not_blamed_on_frozen_parameters(visible):
    msg = visible[_key("bucketed", "BucketsNeverWaited")]
    assert "never waited on" in msg and "requires_grad=False" not in msg, msg


# ---------------------------------------------------------------- bucket rule

def test_bucket_plan_rule():
    model = lab02.Case().build(0)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert lab02.bucket_plan(model, 1 << 30) == [trainable[::-1]]
    assert [len(b) for b in lab02.bucket_plan(model, 1)] == [1] * len(trainable)
    # ln_f.bias + ln_f.weight hold 32 floats each: 256 bytes closes the first bucket (>=).
    assert lab02.bucket_plan(model, 256)[0] == ["ln_f.bias", "ln_f.weight"]
    assert lab02.bucket_plan(model, 257)[0] == ["ln_f.bias", "ln_f.weight", "blocks.1.mlp.down.bias"]
    # The hidden boundary case: the untied lm_head alone fills its bucket exactly.
    untied = lab02.Case(overrides=lab02.SMALL + (("tie_weights", False),)).build(0)
    assert lab02.bucket_plan(untied, lab02._LM_HEAD_BYTES)[0] == ["lm_head.weight"]


def test_visible_sets_hold_the_boundary_and_unused_traps():
    cases = [c for _, cs in lab02.BUCKETED.visible for c in cs]
    assert any(c.bucket_bytes == 256 and c.frozen for c in cases)
    assert any(c.unused for c in cases)


# ---------------------------------------------------------------- hints on odd results, no launch

def _graded(ex, results, records=None, n=2):
    cases = [c for _, cs in ex.visible for c in cs][:1]
    records = records or [[{"calls": [], "printed": "", "backward": 0, "ddp": 0, "mutated": [],
                            "events": []}] for _ in range(n)]
    return harness.Graded("answer", n, cases, results, "gloo", records)


def _steps(ex, flat, none):
    case = [c for _, cs in ex.visible for c in cs][0]
    params = torch.cat([t.reshape(-1) for t in lab02_graders.initial(case, 0).values()])
    return [{"grads": {"flat": flat, "none": none}, "params": params, "calls": 0}
            for _ in range(case.steps)]


@pytest.mark.parametrize("ex", ["allreduce", "accum", "bucketed", "ddp", "train"])
def test_trained_graders_explain_odd_results_without_crashing(ex):
    exercise = lab02.EXERCISES[ex]
    case = [c for _, cs in exercise.visible for c in cs][0]
    trainable = [(n, p) for n, p in case.build(0).named_parameters() if p.requires_grad]
    zeros = torch.zeros(sum(p.numel() for _, p in trainable))
    names = [n for n, _ in trainable]
    for results in ([[_steps(exercise, zeros, names)]] * 2,   # None on every rank
                    [[_steps(exercise, torch.zeros(0), [])], [_steps(exercise, zeros, names[:3])]],
                    [[[]], [[]]]):                            # no step at all
        msg = exercise.grade(_graded(exercise, results))
        assert isinstance(msg, str) and msg, msg


def test_shard_grader_names_odd_returns():
    for got, words in ((None, "returned None"), ((), "0-tuple"), ("<ndarray>", "'<ndarray>'"),
                       ((torch.zeros(4, 16), None), "pair of tensors")):
        msg = lab02.SHARD.grade(_graded(lab02.SHARD, [[got], [got]]))
        assert words in msg, msg


def test_broadcast_grader_survives_missing_names():
    msg = lab02.BROADCAST.grade(_graded(lab02.BROADCAST, [[{}], [{}]]))
    assert "Missing" in msg, msg


def test_messages_never_show_equal_values_as_different():
    x = torch.zeros(8, 16, dtype=torch.long)
    got = (x[:4], torch.zeros(8, 16, dtype=torch.long))  # y is the one with the wrong shape
    msg = lab02.SHARD.grade(_graded(lab02.SHARD, [[got], [got]]))
    assert "y of shape (8, 16), expected (4, 16)" in msg, msg


# ---------------------------------------------------------------- public checks, launch failures

def test_public_check_passes_and_reports(capsys):
    lab02.check_allreduce_gradients(allreduce_flat_avg)
    assert "2 visible cases passed on 2 ranks" in capsys.readouterr().out


def test_disagreeing_ranks_fail_in_bounded_time():
    fn, words = wrong.HANG
    with pytest.raises(AssertionError, match="allreduce_rank_dependent") as info:
        lab02.check_allreduce_gradients(fn, timeout=20)
    assert words in str(info.value)


def test_not_a_class():
    with pytest.raises(AssertionError, match="expected your BucketedDP"):
        lab02.check_bucketed(None)
