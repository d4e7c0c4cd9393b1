"""Lab 07's checks: they pass correct answers written differently from the notebook's solution and
reject every wrong answer in tests/wrong_answers/lab07.py with a message that names its mistake.

Everything goes through ``harness.grade_batch``: one launch per world size for all answers at once.
The ring is also graded on 4 ranks here (``ring.FOUR_RANKS``), which the notebook's budget leaves out.
"""
import dataclasses

import pytest
import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dnn
import torch.nn as nn

from parlab.grading import harness, lab07
from parlab.grading.lab07 import ring
from parlab.models.moe import route
from grading_reports import short_keys as _short
from wrong_answers import lab07 as wrong

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(600)]


# ---------------------------------------------------------------- correct answers, written differently
class _RingBatched(torch.autograd.Function):
    """K and V as two messages, one batch_isend_irecv per hop with the receives listed first, the
    backward ring running the other way (towards rank r - 1, as TransformerEngine's does), one dense
    masked block per step (no half-block skipping)."""

    @staticmethod
    def forward(ctx, q, k, v, positions, causal):
        rank, n = dist.get_rank(), dist.get_world_size()
        scale = q.shape[-1] ** -0.5
        m = torch.full(q.shape[:-1] + (1,), float("-inf"), dtype=q.dtype)
        num, den = torch.zeros_like(q), torch.zeros_like(m)
        cur_k, cur_v = k.clone(), v.clone()
        for step in range(n):
            j = (rank - step) % n  # forward: the chunk of rank r - step, from rank r - 1
            if step < n - 1:
                nk, nv = torch.empty_like(cur_k), torch.empty_like(cur_v)
                ops = [dist.P2POp(dist.irecv, nk, (rank - 1) % n), dist.P2POp(dist.irecv, nv, (rank - 1) % n),
                       dist.P2POp(dist.isend, cur_k, (rank + 1) % n), dist.P2POp(dist.isend, cur_v, (rank + 1) % n)]
                reqs = dist.batch_isend_irecv(ops)
            s = torch.matmul(q, cur_k.transpose(-1, -2)) * scale
            if causal:
                s = s.masked_fill(positions[j][None, :] > positions[rank][:, None], float("-inf"))
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
            fix = torch.where(torch.isinf(m_new), 0.0, torch.exp(m - m_new))
            p = torch.where(torch.isinf(m_new), 0.0, torch.exp(s - m_new))
            num, den, m = num * fix + torch.matmul(p, cur_v), den * fix + p.sum(-1, keepdim=True), m_new
            if step < n - 1:
                for r in reqs:
                    r.wait()
                cur_k, cur_v = nk, nv
        out = num / den
        ctx.save_for_backward(q, k, v, out, m + torch.log(den), positions)
        ctx.causal = causal
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, positions = ctx.saved_tensors
        rank, n = dist.get_rank(), dist.get_world_size()
        scale = q.shape[-1] ** -0.5
        delta = (dout * out).sum(-1, keepdim=True)
        dq = torch.zeros_like(q)
        ck, cv, dk, dv = k, v, torch.zeros_like(k), torch.zeros_like(v)
        for step in range(n):
            j = (rank + step) % n
            s = torch.matmul(q, ck.transpose(-1, -2)) * scale
            if ctx.causal:
                s = s.masked_fill(positions[j][None, :] > positions[rank][:, None], float("-inf"))
            p = torch.exp(s - lse)
            ds = p * (torch.matmul(dout, cv.transpose(-1, -2)) - delta)
            dq = dq + torch.matmul(ds, ck) * scale
            dk = dk + torch.matmul(ds.transpose(-1, -2), q) * scale
            dv = dv + torch.matmul(p.transpose(-1, -2), dout)
            travelling = [dk, dv] if step == n - 1 else [ck, cv, dk, dv]
            arrived = [torch.empty_like(t) for t in travelling]
            ops = ([dist.P2POp(dist.isend, t.contiguous(), (rank - 1) % n) for t in travelling]
                   + [dist.P2POp(dist.irecv, t, (rank + 1) % n) for t in arrived])
            for r in dist.batch_isend_irecv(ops):
                r.wait()
            if step < n - 1:
                ck, cv, dk, dv = arrived
            else:
                dk, dv = arrived
        return dq, dk, dv, None, None


def ring_batched(q, k, v, positions, causal=False):
    return _RingBatched.apply(q, k, v, positions, causal)


def zigzag_by_index(s, c):
    """The zig-zag layout from index arithmetic on each position."""
    if s % (2 * c) != 0:
        raise ValueError(f"s = {s} must be a multiple of 2c = {2 * c}")
    half = s // (2 * c)
    rows = []
    for r in range(c):
        rows.append([r * half + i for i in range(half)] + [(2 * c - 1 - r) * half + i for i in range(half)])
    return torch.tensor(rows, dtype=torch.long)


class ExpertParallelScatter(nn.Module):
    """torch.distributed.nn's differentiable all_to_all_single, a per-destination loop to build the
    send buffer, and a combine written with scatter_add."""

    def __init__(self, moe, group=None):
        super().__init__()
        import copy

        n, rank = dist.get_world_size(group), dist.get_rank(group)
        if moe.n_experts % n:
            raise ValueError(f"E = {moe.n_experts} is not a multiple of the group's {n} ranks")
        self.group, self.n, self.per = group, n, moe.n_experts // n
        self.top_k, self.cf = moe.top_k, moe.capacity_factor
        self.router = copy.deepcopy(moe.router)
        self.experts = nn.ModuleList([copy.deepcopy(moe.experts[rank * self.per + i]) for i in range(self.per)])

    def forward(self, x):
        expert, weight, kept = route(self.router, x, self.top_k, self.cf)
        pieces, meta = [], []
        per_expert = torch.zeros(self.n * self.per, dtype=torch.int64)
        for e in range(self.n * self.per):
            t, slot = torch.nonzero((expert == e) & kept, as_tuple=True)
            per_expert[e] = t.numel()
            pieces.append(x[t])
            meta.append((t, slot))
        got = torch.zeros_like(per_expert)
        dist.all_to_all_single(got, per_expert, group=self.group)
        send = per_expert.view(self.n, self.per).sum(1).tolist()
        recv = got.view(self.n, self.per).sum(1).tolist()
        buf = torch.empty(sum(recv), x.shape[1], dtype=x.dtype)
        arrived = dnn.all_to_all_single(buf, torch.cat(pieces), recv, send, group=self.group)
        results, at = [], 0
        for count, i in zip(got.tolist(), list(range(self.per)) * self.n):
            results.append(self.experts[i](arrived[at:at + count]))
            at += count
        done = torch.cat(results) + 0 * arrived
        back_buf = torch.empty(sum(send), x.shape[1], dtype=x.dtype)
        back = dnn.all_to_all_single(back_buf, done, send, recv, group=self.group)
        tokens = torch.cat([t for t, _ in meta])
        w = torch.cat([weight[t, slot] for t, slot in meta])
        index = tokens[:, None].expand(-1, x.shape[1])
        return torch.zeros_like(x).scatter_add(0, index, back * w[:, None])


class ExpertParallelOwnRouter(ExpertParallelScatter):
    """Keeps moe's own router, not a copy (the notebook allows either)."""

    def __init__(self, moe, group=None):
        super().__init__(moe, group)
        self.router = moe.router


CORRECT = {lab07.RING: {"ring_batched": ring_batched}, lab07.ZIGZAG: {"zigzag_by_index": zigzag_by_index},
           lab07.EXPERTS: {"ExpertParallelScatter": ExpertParallelScatter,
                           "ExpertParallelOwnRouter": ExpertParallelOwnRouter}}
RING4 = dataclasses.replace(lab07.RING, key="lab07.ring4", visible=ring.FOUR_RANKS)


def _batch(with_wrong: bool) -> dict:
    batch = {ex: dict(answers) for ex, answers in CORRECT.items()}
    batch[RING4] = dict(CORRECT[lab07.RING])
    if with_wrong:
        for key, fixtures in wrong.WRONG.items():
            batch[lab07.EXERCISES[key]].update({f.__name__: f for f, _ in fixtures})
    return batch


@pytest.fixture(scope="module")
def visible():
    return _short(harness.grade_batch(_batch(with_wrong=True)))


@pytest.fixture(scope="module")
def hidden():
    return _short(harness.grade_batch(_batch(with_wrong=False), hidden=True))


@pytest.mark.parametrize("ex,name", [(ex.key.split(".")[1], n) for ex in CORRECT for n in CORRECT[ex]]
                         + [("ring4", "ring_batched")])
def test_correct_answers_pass_visible_and_hidden(visible, hidden, ex, name):
    assert visible[(ex, name)] is None, visible[(ex, name)]
    if ex != "ring4":
        assert hidden[(ex, name)] is None, hidden[(ex, name)]


@pytest.mark.parametrize("key,fixture,words", [(k, f.__name__, w) for k, fs in wrong.WRONG.items() for f, w in fs])
def test_wrong_answers_fail_with_a_message_naming_the_mistake(visible, key, fixture, words):
    message = visible[(key, fixture)]
    assert message is not None, f"{fixture} passed"
    assert words in message, message


def test_every_rule_is_broken_by_some_fixture(visible):
    for key, ex in lab07.EXERCISES.items():
        messages = [visible[(key, f.__name__)] or "" for f, _ in wrong.WRONG.get(key, [])]
        for rule in ex.rules:
            assert any(rule.says in m for m in messages), f"no fixture breaks: {rule.says}"


def test_uneven_length_gets_a_clear_error():
    with pytest.raises(ValueError, match="not divisible by 6"):
        ring.layout_positions(10, 3, "zigzag")


def test_send_send_deadlock_fails_in_bounded_time():
    fn, words = wrong.DEADLOCK
    with pytest.raises(AssertionError, match="did not finish") as info:
        lab07.check_ring_attention(fn, timeout=16)
    assert words in str(info.value)
