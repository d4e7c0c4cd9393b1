"""Lab 03's checks: they pass correct answers written differently from the
notebook's solution and reject every wrong answer in
tests/wrong_answers/lab03.py with a message that names its mistake.

Everything goes through ``harness.grade_batch``: one launch per world size
for all answers at once (visible: 4 ranks; hidden: 2 and 3), graded by
the same exercises as the notebook's check functions.
"""
import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from parlab.grading import harness, lab03
from grading_reports import short_keys as _short
from wrong_answers import lab03 as wrong

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(400)]


# ---------------------------------------------------------------- correct answers, written differently
class f_async(torch.autograd.Function):
    """Returns x itself in forward; backward waits on an async all-reduce."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        out = grad.contiguous().clone()
        dist.all_reduce(out, group=ctx.group, async_op=True).wait()
        return out, None


class g_detached(torch.autograd.Function):
    """Sums a detached copy; backward hands back a copy of the gradient."""

    @staticmethod
    def forward(ctx, x, group):
        total = x.detach().clone()
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=group)
        return total

    @staticmethod
    def backward(ctx, grad):
        return grad.clone(), None


def _even(total: int, what: str, group=None) -> int:
    n = dist.get_world_size(group)
    if total % n != 0:
        raise ValueError(f"{what} ({total}) must be divisible by the {n} tensor-parallel ranks")
    return total // n


class _GatherLast(torch.autograd.Function):
    """All-gather along the last dim with all_gather_into_tensor (dim moved to the front)."""

    @staticmethod
    def forward(ctx, y, group):
        ctx.group = group
        n = dist.get_world_size(group)
        front = y.movedim(-1, 0).contiguous()
        out = torch.empty((n * front.shape[0],) + front.shape[1:], dtype=y.dtype, device=y.device)
        dist.all_gather_into_tensor(out, front, group=group)
        return out.movedim(0, -1)

    @staticmethod
    def backward(ctx, grad):
        n, r = dist.get_world_size(ctx.group), dist.get_rank(ctx.group)
        size = grad.shape[-1] // n
        return grad[..., r * size:(r + 1) * size], None


class column_tensor_api(nn.Module):
    """Weight rows by index arithmetic, bias kept None, gather with all_gather_into_tensor."""

    def __init__(self, linear, *, gather_output=False, group=None):
        super().__init__()
        size = _even(linear.out_features, "out_features", group)
        start = dist.get_rank(group) * size
        self.group, self.gather_output = group, gather_output
        self.weight = nn.Parameter(linear.weight.detach()[start:start + size].clone())
        self.register_parameter("bias", None if linear.bias is None else
                                nn.Parameter(linear.bias.detach()[start:start + size].clone()))

    def forward(self, x):
        x = f_async.apply(x, self.group)
        y = x @ self.weight.t()
        if self.bias is not None:
            y = y + self.bias
        return _GatherLast.apply(y, self.group) if self.gather_output else y


class column_plain_words(column_tensor_api):
    """Refuses an uneven split in its own words, naming both numbers, without 'divisible'."""

    def __init__(self, linear, *, gather_output=False, group=None):
        n = dist.get_world_size(group)
        if linear.out_features % n:
            raise ValueError(f"cannot split out_features={linear.out_features} evenly over {n} ranks")
        super().__init__(linear, gather_output=gather_output, group=group)


class row_matmul(nn.Module):
    """x @ W_iᵀ with torch.matmul, g, then the bias."""

    def __init__(self, linear, *, group=None):
        super().__init__()
        size = _even(linear.in_features, "in_features", group)
        start = dist.get_rank(group) * size
        self.group = group
        self.weight = nn.Parameter(linear.weight.detach()[:, start:start + size].clone())
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone())

    def forward(self, x):
        y = g_detached.apply(torch.matmul(x, self.weight.t()), self.group)
        return y if self.bias is None else y + self.bias


class mlp_inline(nn.Module):
    """f, two local matmuls and g written out, no separate layer classes for the work."""

    def __init__(self, mlp, group=None):
        super().__init__()
        self.group = group
        self.up = column_tensor_api(mlp.up, group=group)
        self.down = row_matmul(mlp.down, group=group)

    def forward(self, x):
        h = F.gelu(F.linear(f_async.apply(x, self.group), self.up.weight, self.up.bias))
        y = g_detached.apply(F.linear(h, self.down.weight), self.group)
        return y if self.down.bias is None else y + self.down.bias


class attn_manual_softmax(nn.Module):
    """Heads by reshape, attention written out with a causal mask instead of SDPA."""

    def __init__(self, attn, group=None):
        super().__init__()
        self.group, self.head_dim = group, attn.head_dim
        _even(attn.q.out_features // attn.head_dim, "n_head", group)
        self.q = column_tensor_api(attn.q, group=group)
        self.k = column_tensor_api(attn.k, group=group)
        self.v = column_tensor_api(attn.v, group=group)
        self.o = row_matmul(attn.o, group=group)

    def forward(self, x):
        B, T, _ = x.shape
        x = f_async.apply(x, self.group)
        q, k, v = (F.linear(x, m.weight, m.bias).reshape(B, T, -1, self.head_dim).permute(0, 2, 1, 3)
                   for m in (self.q, self.k, self.v))
        scores = q @ k.transpose(-1, -2) / self.head_dim ** 0.5
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        y = (scores.masked_fill(mask, float("-inf")).softmax(-1) @ v).permute(0, 2, 1, 3).reshape(B, T, -1)
        return self.o(y)


class attn_plain_words(attn_manual_softmax):
    """Refuses uneven heads in its own words, naming both numbers."""

    def __init__(self, attn, group=None):
        n, heads = dist.get_world_size(group), attn.q.out_features // attn.head_dim
        if heads % n:
            raise ValueError(f"n_head={heads} heads cannot be split evenly over {n} ranks")
        super().__init__(attn, group)


class _SeqGather(torch.autograd.Function):
    """All-gather along dim 1 (all_gather_into_tensor); backward reduce_scatter_tensor."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        n = dist.get_world_size(group)
        front = x.transpose(0, 1).contiguous()
        out = torch.empty((n * front.shape[0],) + front.shape[1:], dtype=x.dtype, device=x.device)
        dist.all_gather_into_tensor(out, front, group=group)
        return out.transpose(0, 1)

    @staticmethod
    def backward(ctx, grad):
        front = grad.transpose(0, 1).contiguous()
        out = torch.empty((front.shape[0] // dist.get_world_size(ctx.group),) + front.shape[1:],
                          dtype=grad.dtype, device=grad.device)
        dist.reduce_scatter_tensor(out, front, group=ctx.group)
        return out.transpose(0, 1), None


class _SeqScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        front = x.transpose(0, 1).contiguous()
        out = torch.empty((front.shape[0] // dist.get_world_size(group),) + front.shape[1:],
                          dtype=x.dtype, device=x.device)
        dist.reduce_scatter_tensor(out, front, group=group)
        return out.transpose(0, 1)

    @staticmethod
    def backward(ctx, grad):
        return _SeqGather.forward(ctx, grad, ctx.group), None


class sp_tensor_api(nn.Module):
    """SP with the single-tensor collectives along a transposed sequence dim."""

    def __init__(self, block, group=None):
        super().__init__()
        self.group = group
        self.ln1, self.ln2 = block.ln1, block.ln2
        self.attn = attn_manual_softmax(block.attn, group)
        self.mlp = mlp_inline(block.mlp, group)

    def _attn_partial(self, h):
        a = self.attn
        B, T, _ = h.shape
        q, k, v = (F.linear(h, m.weight, m.bias).reshape(B, T, -1, a.head_dim).transpose(1, 2)
                   for m in (a.q, a.k, a.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, -1)
        return F.linear(y, a.o.weight)

    def forward(self, x):
        a, m = self.attn, self.mlp
        x = x + _SeqScatter.apply(self._attn_partial(_SeqGather.apply(self.ln1(x), self.group)), self.group)
        x = x + a.o.bias
        h = _SeqGather.apply(self.ln2(x), self.group)
        part = F.linear(F.gelu(F.linear(h, m.up.weight, m.up.bias)), m.down.weight)
        return x + _SeqScatter.apply(part, self.group) + m.down.bias


def bytes_integer_first(b, s, h, t, k=2):
    """Per all-reduce 2(t-1)/t·bsh elements, four of them, as an exact fraction first."""
    from fractions import Fraction

    return float(4 * Fraction(2 * (t - 1), t) * b * s * h * k)


CORRECT = {
    "f": {"f_async": f_async}, "g": {"g_detached": g_detached},
    "column": {"column_tensor_api": column_tensor_api, "column_plain_words": column_plain_words}, "row": {"row_matmul": row_matmul},
    "mlp": {"mlp_inline": mlp_inline}, "attn": {"attn_manual_softmax": attn_manual_softmax, "attn_plain_words": attn_plain_words},
    "sp": {"sp_tensor_api": sp_tensor_api},
    "bytes": {"bytes_integer_first": bytes_integer_first},
}


def _batch(with_wrong: bool) -> dict:
    batch = {lab03.EXERCISES[ex]: dict(answers) for ex, answers in CORRECT.items()}
    if with_wrong:
        for ex, fixtures in wrong.WRONG.items():
            batch[lab03.EXERCISES[ex]].update({f.__name__: f for f, _ in fixtures})
    return batch


@pytest.fixture(scope="module")
def visible():
    return _short(harness.grade_batch(_batch(with_wrong=True)))


@pytest.fixture(scope="module")
def hidden():
    return _short(harness.grade_batch(_batch(with_wrong=False), hidden=True))


@pytest.mark.parametrize("ex,name", [(ex, n) for ex in CORRECT for n in CORRECT[ex]])
def test_correct_answers_pass_visible_and_hidden(visible, hidden, ex, name):
    assert visible[(ex, name)] is None, visible[(ex, name)]
    assert hidden[(ex, name)] is None, hidden[(ex, name)]


@pytest.mark.parametrize("ex,fixture,words", [(ex, f, w) for ex, fs in wrong.WRONG.items() for f, w in fs],
                         ids=lambda v: getattr(v, "__name__", None))
def test_wrong_answers_fail_with_a_message_naming_the_mistake(visible, ex, fixture, words):
    msg = visible[(ex, fixture.__name__)]
    assert msg is not None, f"{fixture.__name__} passed the visible {ex} check"
    assert words in msg, msg


def test_every_rule_is_broken_by_some_fixture(visible):
    """Each stated rule's words appear in at least one wrong answer's message."""
    for key, ex in lab03.EXERCISES.items():
        for rule in ex.rules:
            quoted = f'The exercise says: "{rule.says}"'
            uneven = "divisible" in rule.says  # judged before the values: not quoted
            hit = [name for (k, name), msg in visible.items() if k == key and msg and
                   (quoted in msg or uneven and "names both numbers" in msg)]
            assert hit, f"no fixture breaks the {key} rule {rule.says!r}"


def test_uneven_split_is_a_case_in_every_visible_set():
    for key in ("column", "row", "attn"):
        ex = lab03.EXERCISES[key]
        assert any(not c.divisible(n) for n, cases in ex.visible for c in cases), key
