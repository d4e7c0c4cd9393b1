"""Answers to Lab 03's exercises (tensor parallelism), right and typically wrong.

The tables of tests/answer_suite.py, keyed by ``parlab.grading.lab03.EXERCISES``:
``CORRECT`` (right answers written differently from the notebook's: an async
all-reduce, a detached sum, index arithmetic and the single-tensor
collectives, attention written out, refusals in other words) and ``WRONG``
(each with the words the check's message must contain).  The wrong ones are the
mistakes students make: f and g swapped, the all-reduce missing in
backward, the weight split along the wrong dimension, the bias of a
row-parallel layer added on every rank, heads split without reshaping,
unequal shards when the split is uneven, sequence parallelism without the
gather before attention, and right numbers reached the wrong way (an
all-gather of the full weight, an all-reduce in the sequence-parallel
block).  tests/ranks/test_lab03.py runs every answer.
"""
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from wrong_answers import says


# ------------------------------------------------ shared pieces (correct), used by the wrong layers
class _F(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group=None):
        ctx.group = group
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _G(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group=None):
        ctx.group = group
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def _shard(total, what, group=None):
    n = dist.get_world_size(group)
    if total % n:
        raise ValueError(f"{what} {total} is not divisible by {n} ranks")
    return total // n, dist.get_rank(group)


def _column_params(module, linear, dim=0, group=None):
    size, r = _shard(linear.weight.shape[dim], "features", group)
    module.weight = nn.Parameter(linear.weight.detach().narrow(dim, r * size, size).clone())
    module.bias = None
    if linear.bias is not None:
        module.bias = nn.Parameter(linear.bias.detach()[r * size:(r + 1) * size].clone()
                                   if dim == 0 else linear.bias.detach().clone())


def _gather_last(y, group=None):
    """All-gather along the last dim; the gradient flows back through this rank's own part."""
    parts = [torch.empty_like(y) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, y.contiguous(), group=group)
    parts[dist.get_rank(group)] = y
    return torch.cat(parts, -1)


class _Col(nn.Module):
    def __init__(self, linear, *, gather_output=False, group=None):
        super().__init__()
        _column_params(self, linear, group=group)
        self.gather_output, self.group = gather_output, group

    def forward(self, x):
        y = F.linear(_F.apply(x, self.group), self.weight, self.bias)
        return _gather_last(y, self.group) if self.gather_output else y


class _Row(nn.Module):
    def __init__(self, linear, *, group=None):
        super().__init__()
        _column_params(self, linear, dim=1)

    def forward(self, x):
        y = _G.apply(F.linear(x, self.weight))
        return y if self.bias is None else y + self.bias


def _attention(q, k, v, head_dim, causal=True, scale=None):
    B, T, _ = q.shape
    q, k, v = (t.view(B, T, -1, head_dim).transpose(1, 2) for t in (q, k, v))
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale).transpose(1, 2).reshape(B, T, -1)


# ------------------------------------------------ 1. f and g
class f_is_g(_G):
    """f and g swapped: this 'f' all-reduces in forward and passes the gradient through."""


class f_no_backward_all_reduce(_F):
    """Identity both ways: the all-reduce in backward is missing."""

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class f_ignores_group(_F):
    """All-reduces over the whole world instead of the group it was given."""

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad, None


class f_sums_both_ways(_F):
    """All-reduces in forward as well as in backward."""

    forward = _G.forward


class g_averages(_G):
    """Divides the sum by the group's size, as DP averages gradients: g sums, it does not average."""

    @staticmethod
    def forward(ctx, x, group=None):
        return _G.forward(ctx, x, group) / dist.get_world_size(group)


class f_sums_all_gather(_F):
    """Right numbers, but the sum is an all-gather followed by a local sum."""

    @staticmethod
    def backward(ctx, grad):
        parts = [torch.empty_like(grad) for _ in range(dist.get_world_size(ctx.group))]
        dist.all_gather(parts, grad.contiguous(), group=ctx.group)
        return torch.stack(parts).sum(0), None


class g_is_f(_F):
    """f and g swapped: this 'g' is the identity in forward and all-reduces in backward."""


class g_all_reduces_backward_too(_G):
    """All-reduce in forward, and again in backward (the gradient is summed t times)."""

    backward = _F.backward


class g_sums_all_gather(_G):
    """Right numbers, but g's sum is an all-gather followed by a local sum."""

    @staticmethod
    def forward(ctx, x, group=None):
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.stack(parts).sum(0)


class f_all_reduces_in_place(_F):
    """Right numbers, but backward all-reduces the incoming gradient in place and returns it."""

    @staticmethod
    def backward(ctx, grad):
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class g_all_reduces_in_place(_G):
    """Right numbers, but forward all-reduces x itself in place and returns it."""

    @staticmethod
    def forward(ctx, x, group=None):
        dist.all_reduce(x, group=group)
        return x


# ------------------------------------------------ 2. column- and row-parallel linear
class column_without_f(_Col):
    """Never calls f: forward is right, but x's gradient is only this rank's part."""

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


class column_splits_in_features(nn.Module):
    """Splits the weight along dim 1 (in_features) and the input to match: that is a row split."""

    def __init__(self, linear, *, gather_output=False, group=None):
        super().__init__()
        _column_params(self, linear, dim=1, group=group)
        self.group = group

    def forward(self, x):
        n, r = dist.get_world_size(self.group), dist.get_rank(self.group)
        return F.linear(_F.apply(x, self.group).chunk(n, -1)[r], self.weight, self.bias)


class column_shard_is_a_view(_Col):
    """Keeps a slice of the full weight without copying it: the full weight stays alive."""

    def __init__(self, linear, *, gather_output=False, group=None):
        super().__init__(linear, gather_output=gather_output, group=group)
        size, r = _shard(linear.out_features, "out_features", group)
        self.weight = nn.Parameter(linear.weight.detach()[r * size:(r + 1) * size].contiguous())


class column_unequal_shards(_Col):
    """tensor_split: silently makes unequal shards when out_features % t != 0."""

    def __init__(self, linear, *, gather_output=False, group=None):
        nn.Module.__init__(self)
        n, r = dist.get_world_size(group), dist.get_rank(group)
        self.weight = nn.Parameter(linear.weight.detach().tensor_split(n)[r].clone())
        self.bias = (nn.Parameter(linear.bias.detach().tensor_split(n)[r].clone())
                     if linear.bias is not None else None)
        self.gather_output, self.group = gather_output, group


class column_gathers_weight(_Col):
    """All-gathers the full weight in forward and slices the output: right numbers, full weight."""

    def forward(self, x):
        n, r = dist.get_world_size(self.group), dist.get_rank(self.group)
        parts = [torch.empty_like(self.weight) for _ in range(n)]
        dist.all_gather(parts, self.weight.detach().contiguous(), group=self.group)
        parts[r] = self.weight
        bias = None
        if self.bias is not None:
            bparts = [torch.empty_like(self.bias) for _ in range(n)]
            dist.all_gather(bparts, self.bias.detach().contiguous(), group=self.group)
            bparts[r] = self.bias
            bias = torch.cat(bparts)
        if self.gather_output:  # the full weight: x's gradient is complete
            return F.linear(x, torch.cat(parts), bias)
        return F.linear(_F.apply(x, self.group), torch.cat(parts), bias).chunk(n, -1)[r]


class column_keeps_full_weight(_Col):
    """Keeps the full layer as a submodule next to its shard."""

    def __init__(self, linear, *, gather_output=False, group=None):
        super().__init__(linear, gather_output=gather_output, group=group)
        self.full = linear


class row_bias_on_every_rank(_Row):
    """Adds the bias before the all-reduce, so the sum holds it t times."""

    def forward(self, x):
        return _G.apply(F.linear(x, self.weight, self.bias))


class row_uses_f_not_g(_Row):
    """f where g belongs: no all-reduce in forward, one in backward."""

    def forward(self, x):
        y = _F.apply(F.linear(x, self.weight))
        return y if self.bias is None else y + self.bias


class row_splits_out_features(nn.Module):
    """Splits the weight along dim 0 (out_features), as a column-parallel layer does."""

    def __init__(self, linear, *, group=None):
        super().__init__()
        _column_params(self, linear, dim=0)

    def forward(self, x):
        return _G.apply(F.linear(x, self.weight))


class row_unequal_shards(nn.Module):
    """tensor_split of the input features: unequal shards when in_features % t != 0."""

    def __init__(self, linear, *, group=None):
        super().__init__()
        n, r = dist.get_world_size(), dist.get_rank()
        self.weight = nn.Parameter(linear.weight.detach().tensor_split(n, dim=1)[r].clone())
        self.bias = nn.Parameter(linear.bias.detach().clone()) if linear.bias is not None else None

    def forward(self, x):
        y = _G.apply(F.linear(x, self.weight))
        return y if self.bias is None else y + self.bias


class row_keeps_full_layer(_Row):
    """Keeps the full layer as a submodule next to its shard."""

    def __init__(self, linear, *, group=None):
        super().__init__(linear)
        self.full = linear


class row_sums_twice(_Row):
    """Adds the bias after g, then sums the finished output once more (a second g)."""

    def forward(self, x):
        y = _G.apply(F.linear(x, self.weight))
        return _G.apply(y if self.bias is None else y + self.bias)


class _SumGathered(torch.autograd.Function):
    """g written as an all-gather of the partial sums and a local sum (right numbers)."""

    @staticmethod
    def forward(ctx, x):
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, x.contiguous())
        return torch.stack(parts).sum(0)

    @staticmethod
    def backward(ctx, grad):
        return grad


class row_sums_all_gather(_Row):
    """Sums the partial outputs by all-gathering them: t times the bytes of a reduce."""

    def forward(self, x):
        y = _SumGathered.apply(F.linear(x, self.weight))
        return y if self.bias is None else y + self.bias


# ------------------------------------------------ 3. the MLP
class _Mlp(nn.Module):
    """A correct parallel MLP; the fixtures below swap one of its parts."""

    up_cls, down_cls = _Col, _Row

    def __init__(self, mlp, group=None):
        super().__init__()
        self.up, self.down = self.up_cls(mlp.up), self.down_cls(mlp.down)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))

    def local(self, x):
        return F.linear(F.gelu(F.linear(x, self.up.weight, self.up.bias)), self.down.weight)


class mlp_gathers_between(_Mlp):
    """Gathers the hidden activation after `up` and slices it again: an extra all-gather."""

    def forward(self, x):
        n, r = dist.get_world_size(), dist.get_rank()
        h = F.gelu(self.up(x)).contiguous()
        parts = [torch.empty_like(h) for _ in range(n)]
        dist.all_gather(parts, h)
        parts[r] = h
        return self.down(torch.cat(parts, -1).chunk(n, -1)[r])


class mlp_without_f(_Mlp):
    """Column layer without f: the input's gradient is only this rank's part."""

    up_cls = column_without_f


class mlp_bias_on_every_rank(_Mlp):
    """The row layer adds its bias on every rank."""

    down_cls = row_bias_on_every_rank


class mlp_keeps_full(_Mlp):
    """Keeps the full MLP as a submodule next to the shards."""

    def __init__(self, mlp, group=None):
        super().__init__(mlp)
        self.full = mlp


class mlp_full_then_g(_Mlp):
    """Keeps the shards, but computes with the full MLP on every rank and sums that with g."""

    def __init__(self, mlp, group=None):
        super().__init__(mlp)
        self.full = mlp

    def forward(self, x):
        return _G.apply(self.full(_F.apply(x)))


# ------------------------------------------------ 4. attention by heads
class _Attn(nn.Module):
    def __init__(self, attn, group=None):
        super().__init__()
        self.head_dim = attn.head_dim
        _shard(attn.q.out_features // attn.head_dim, "n_head")
        self.q, self.k, self.v = _Col(attn.q), _Col(attn.k), _Col(attn.v)
        self.o = _Row(attn.o)

    def forward(self, x):
        x = _F.apply(x)
        qkv = [F.linear(x, m.weight, m.bias) for m in (self.q, self.k, self.v)]
        return self.o(_attention(*qkv, self.head_dim))


class attn_f_per_projection(_Attn):
    """q, k and v each call f (their column layers' own forward): three all-reduces in backward."""

    def forward(self, x):
        return self.o(_attention(self.q(x), self.k(x), self.v(x), self.head_dim))


class attn_no_causal_mask(_Attn):
    """Heads split right, but attention without the causal mask."""

    def forward(self, x):
        x = _F.apply(x)
        qkv = [F.linear(x, m.weight, m.bias) for m in (self.q, self.k, self.v)]
        return self.o(_attention(*qkv, self.head_dim, causal=False))


class attn_scaled_by_d_model(_Attn):
    """Heads split right, but the scores scaled by 1/sqrt(d_model) instead of 1/sqrt(head_dim)."""

    def forward(self, x):
        x = _F.apply(x)
        qkv = [F.linear(x, m.weight, m.bias) for m in (self.q, self.k, self.v)]
        return self.o(_attention(*qkv, self.head_dim, scale=x.size(-1) ** -0.5))


class attn_keeps_full(_Attn):
    """Keeps the full attention module next to its shards."""

    def __init__(self, attn, group=None):
        super().__init__(attn)
        self.full = attn


class attn_heads_not_reshaped(_Attn):
    """Runs attention on the whole shard as one head: never views it as (n_head/t, head_dim)."""

    def forward(self, x):
        x = _F.apply(x)
        q, k, v = (F.linear(x, m.weight, m.bias).unsqueeze(1) for m in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).squeeze(1)
        return self.o(y)


class _HeadRows(nn.Module):
    """q, k, v keep the given rows of the full weights, o the same columns."""

    def __init__(self, attn, rows, head_dim):
        super().__init__()
        self.head_dim = head_dim
        for name in "qkv":
            lin, m = getattr(attn, name), nn.Module()
            m.weight = nn.Parameter(lin.weight.detach()[rows].clone())
            m.bias = nn.Parameter(lin.bias.detach()[rows].clone()) if lin.bias is not None else None
            setattr(self, name, m)
        self.o = nn.Module()
        self.o.weight = nn.Parameter(attn.o.weight.detach()[:, rows].clone())
        self.o.bias = nn.Parameter(attn.o.bias.detach().clone()) if attn.o.bias is not None else None

    def forward(self, x):
        x = _F.apply(x)
        qkv = [F.linear(x, getattr(self, m).weight, getattr(self, m).bias) for m in "qkv"]
        y = _G.apply(F.linear(_attention(*qkv, self.head_dim), self.o.weight))
        return y if self.o.bias is None else y + self.o.bias


class attn_slices_every_head(_HeadRows):
    """Gives each rank a slice of every head (head_dim/t columns each), not whole heads."""

    def __init__(self, attn, group=None):
        n, r = dist.get_world_size(), dist.get_rank()
        hd = attn.head_dim
        heads = attn.q.out_features // hd
        _shard(heads, "n_head")
        rows = torch.cat([torch.arange(h * hd, (h + 1) * hd).chunk(n)[r] for h in range(heads)])
        super().__init__(attn, rows, hd // n if hd % n == 0 else hd)


class attn_unequal_heads(_HeadRows):
    """Splits the heads unevenly when n_head % t != 0 instead of refusing."""

    def __init__(self, attn, group=None):
        n, r = dist.get_world_size(), dist.get_rank()
        hd = attn.head_dim
        heads = attn.q.out_features // hd
        mine = range(r * heads // n, (r + 1) * heads // n)
        rows = torch.cat([torch.arange(h * hd, (h + 1) * hd) for h in mine]) if mine else torch.arange(0)
        super().__init__(attn, rows, hd)


# ------------------------------------------------ 5. sequence parallelism
class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, 1)

    @staticmethod
    def backward(ctx, grad):
        parts = [p.contiguous() for p in grad.chunk(dist.get_world_size(), 1)]
        out = torch.empty_like(parts[0])
        dist.reduce_scatter(out, parts)
        return out


class _Scatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        parts = [p.contiguous() for p in x.chunk(dist.get_world_size(), 1)]
        out = torch.empty_like(parts[0])
        dist.reduce_scatter(out, parts)
        return out

    @staticmethod
    def backward(ctx, grad):
        parts = [torch.empty_like(grad) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, grad.contiguous())
        return torch.cat(parts, 1)


class _Sp(nn.Module):
    def __init__(self, block, group=None):
        super().__init__()
        self.ln1, self.ln2 = block.ln1, block.ln2
        self.attn, self.mlp = _Attn(block.attn), _Mlp(block.mlp)

    def attn_local(self, h):
        qkv = [F.linear(h, m.weight, m.bias) for m in (self.attn.q, self.attn.k, self.attn.v)]
        return F.linear(_attention(*qkv, self.attn.head_dim), self.attn.o.weight)


class sp_without_gather(_Sp):
    """Runs the TP block on this rank's part of the sequence: attention never sees the rest."""

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class _ReduceThenSlice(torch.autograd.Function):
    """All-reduce, keep this rank's part of the sequence; backward all-gathers (right numbers)."""

    @staticmethod
    def forward(ctx, x):
        x = x.clone()
        dist.all_reduce(x)
        return x.chunk(dist.get_world_size(), 1)[dist.get_rank()].contiguous()

    @staticmethod
    def backward(ctx, grad):
        parts = [torch.empty_like(grad) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, grad.contiguous())
        return torch.cat(parts, 1)


class sp_all_reduce_then_slice(_Sp):
    """Gathers the sequence, then all-reduces the full partial sums and keeps its slice."""

    def forward(self, x):
        x = x + _ReduceThenSlice.apply(self.attn_local(_Gather.apply(self.ln1(x)))) + self.attn.o.bias
        return x + _ReduceThenSlice.apply(self.mlp.local(_Gather.apply(self.ln2(x)))) + self.mlp.down.bias


class sp_gathers_q_k_v_apart(_Sp):
    """One all-gather for each of q, k and v: right numbers, three times the bytes."""

    def forward(self, x):
        h = self.ln1(x)
        a = self.attn
        qkv = [F.linear(_Gather.apply(h), m.weight, m.bias) for m in (a.q, a.k, a.v)]
        x = x + _Scatter.apply(F.linear(_attention(*qkv, a.head_dim), a.o.weight)) + a.o.bias
        return x + _Scatter.apply(self.mlp.local(_Gather.apply(self.ln2(x)))) + self.mlp.down.bias


class sp_norm_on_gathered(_Sp):
    """All-gathers the sequence first and runs each LayerNorm on the whole of it: right numbers."""

    def forward(self, x):
        a = self.attn
        x = x + _Scatter.apply(self.attn_local(self.ln1(_Gather.apply(x)))) + a.o.bias
        return x + _Scatter.apply(self.mlp.local(self.ln2(_Gather.apply(x)))) + self.mlp.down.bias


# ------------------------------------------------ 6. the byte formula
def bytes_from_cost(b, s, h, t, k=2):
    """Right numbers, from the check's own reference (parlab.cost) instead of a formula."""
    from parlab import cost

    return cost.comm_bytes(cost.tp_comm_elems_per_layer(b, s, h, t), k)


def bytes_forward_only(b, s, h, t, k=2):
    """Counts the two all-reduces of forward only."""
    return 4 * b * s * h * (t - 1) / t * k


def bytes_no_ring_factor(b, s, h, t, k=2):
    """Each all-reduce counted as 2bsh per rank: the ring's (t - 1)/t is missing."""
    return 8 * b * s * h * k


def bytes_in_bits(b, s, h, t, k=2):
    return 8 * b * s * h * (t - 1) / t * k * 8


def bytes_elements(b, s, h, t, k=2):
    """Forgets bytes_per_element."""
    return 8 * b * s * h * (t - 1) / t


# ------------------------------------------------ correct answers, written differently from the notebook's
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
        return self.gather.apply(y, self.group) if self.gather_output else y

    gather = _GatherLast  # the autograd Function that gathers the output


class _GatherLastGlobalRank(_GatherLast):
    @staticmethod
    def backward(ctx, grad):
        n, r = dist.get_world_size(ctx.group), dist.get_rank()  # the global rank, not the group's
        size = grad.shape[-1] // n
        return grad[..., r * size:(r + 1) * size], None


class column_gather_backward_global_rank(column_tensor_api):
    """gather_output's backward slices the gradient at the global rank: right on the whole world,
    an empty slice on ranks 2 and 3 of a group of 2."""

    gather = _GatherLastGlobalRank


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
    "f": [f_async], "g": [g_detached],
    "column": [column_tensor_api, column_plain_words], "row": [row_matmul],
    "mlp": [mlp_inline], "attn": [attn_manual_softmax, attn_plain_words],
    "sp": [sp_tensor_api],
    "bytes": [bytes_integer_first],
}

WRONG = {
    "f": [(f_is_g, "did you swap f and g"), (f_no_backward_all_reduce, "missing in backward"),
          (f_ignores_group, says("pass group=group", never="did you swap")),
          (f_sums_both_ways, says("f's forward is the identity", "in backward (right) and again in forward",
                                  never="did you swap")), (f_sums_all_gather, "called dist.all_gather"),
          (f_all_reduces_in_place, "modified the upstream gradient in place")],
    "g": [(g_is_f, "missing in forward"),
          (g_all_reduces_backward_too, says("g's backward is the identity", never="did you swap")),
          (g_averages, says("is wrong on ranks 0, 1, 2 and 3 of 4 (each is 1/4 of the right one)",
                            never=("pass group=group", "is missing"))),
          (g_sums_all_gather, "called dist.all_gather"),
          (g_all_reduces_in_place, "modified its input x in place")],
    "column": [(column_without_f, "(f's backward) is missing"),
               (column_splits_in_features, says('with "features 6 is not divisible by 4 ranks"', "out_features (dim 0",
                                                never="did you split")),
               (column_unequal_shards, "names both numbers"),
               (column_shard_is_a_view, "is a view into a larger tensor"),
               (column_gathers_weight, "No all-gather of the full weight"),
               (column_keeps_full_weight, "the full layer has")],
    "row": [(row_bias_on_every_rank, "Add the bias once, after the all-reduce"),
            (row_uses_f_not_g, "the all-reduce in forward (g) is missing"),
            (row_splits_out_features, says('with "features 5 is not divisible by 4 ranks"', "in_features (dim 1",
                                            never="did you split")),
            (row_unequal_shards, "names both numbers"),
            (row_keeps_full_layer, "the full layer has"),
            (row_sums_all_gather, "one all-reduce in forward, none in backward"),
            (row_sums_twice, says("every rank holds 4 x the right output: rank 0 made 2 all-reduces in forward",
                                  never=("f and g swapped", "holds the whole layer")))],
    "mlp": [(mlp_gathers_between, "one all-reduce in each"), (mlp_without_f, "(f's backward) is missing"),
            (mlp_bias_on_every_rank, "Add the bias once"), (mlp_keeps_full, "the full layer has"),
            (mlp_full_then_g, says("every rank holds 4 x the right output: each rank holds the whole layer and "
                                   "computed its output",
                                   never=("f and g swapped", "summed again")))],
    "attn": [(attn_heads_not_reshaped, "Reshape each shard"), (attn_slices_every_head, "do not reassemble"),
             (attn_unequal_heads, "names both numbers"),
             (attn_f_per_projection, "one all-reduce in each"), (attn_keeps_full, "the full layer has"),
             (attn_no_causal_mask, says("not causal", never=("Reshape each shard", "scaled"))),
             (attn_scaled_by_d_model, says("scaled by 1/√d_model", never=("Reshape each shard", "not causal")))],
    "sp": [(sp_without_gather, "attention ran without the other positions"),
           (sp_all_reduce_then_slice, "called dist.all_reduce"),
           (sp_gathers_q_k_v_apart, "once for q, k and v together"),
           (sp_norm_on_gathered, "ran a LayerNorm on")],
    "bytes": [(bytes_forward_only, "count backward"), (bytes_no_ring_factor, "(t − 1)/t"),
              (bytes_in_bits, "bits"), (bytes_elements, "bytes_per_element"),
              (bytes_from_cost, "parlab.cost.tp_comm_elems_per_layer")],
}

#: Crash some ranks only (2 and 3, on the groups of 2): graded alone, so that they stop no other
#: answer's launch.
ALONE = {
    "column": [(column_gather_backward_global_rank, ("invalid gradient", "dist.get_rank(group)"))],
}
