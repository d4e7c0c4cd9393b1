"""Typical wrong answers to Lab 07's exercises (ring attention, zig-zag split, expert parallelism).

The four tables of tests/answer_suite.py: ``CORRECT`` (right answers written
differently from the notebook's), ``WRONG``, ``ALONE`` (graded one at a time),
each keyed by the exercises of ``parlab.grading.lab07.EXERCISES``; a wrong
answer comes with the words the check's message must contain.  Ring attention: partial
softmaxes merged without rescaling; the causal mask wrong on global
positions (later chunks attended, or every block masked as if it were the
diagonal) or never applied; the scores left unscaled or scaled by 1/D; a
send/send deadlock; a backward whose dK/dV never travel, or stop one hop
short of their owner; and right numbers reached the wrong way (an
all-gather of K/V, compute before the send, an input scaled in place, the
ring run towards rank r - 1).  Zig-zag: the plain split, no check of the
length, an error that does not say what is wrong.  Expert parallelism: the
combine in the wrong order, the router's weights not applied, an expert's
gradient summed over the world, uneven splits assumed equal, `group`
ignored, E not divisible by n accepted, and right numbers reached the wrong
way (tokens all-gathered; the payload sent before the counts).  The
expert-parallel fixtures honour `group` and raise on E % n, each with only
the mistake its name says.
tests/ranks/test_lab07.py runs every fixture.
"""
import copy

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dnn
import torch.nn as nn
import torch.nn.functional as F

from parlab.models.moe import route
from wrong_answers import says


# ------------------------------------------------ ring attention, with one knob per mistake
def _scores(q, k, qpos, kpos, causal, mask, scale):
    s = q @ k.transpose(-1, -2) * scale
    if not causal:
        return s
    if mask == "global":
        hide = kpos[None, :] > qpos[:, None]
    elif mask == "future":  # only the diagonal block is masked; later chunks are attended
        hide = (kpos[None, :] > qpos[:, None]) & (kpos[0] == qpos[0])
    else:  # "local": a lower triangle on every block, as if each were the diagonal
        hide = torch.ones(len(qpos), len(kpos), dtype=torch.bool).triu(1)
    return s.masked_fill(hide, float("-inf"))


def _ring(merge="rescale", mask="global", order="send_first", blocking=False, in_place=False, way=1, scaled=True,
          power=0.5, dkdv="travel"):
    class Ring(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, positions, causal):
            rank, n = dist.get_rank(), dist.get_world_size()
            scale = q.shape[-1] ** -power if scaled else 1.0
            if in_place:
                q.mul_(scale)
                scale_q = 1.0
            else:
                scale_q = scale
            out = torch.zeros_like(q)
            lse = torch.full(q.shape[:-1] + (1,), float("-inf"), dtype=q.dtype)
            kv, total = torch.stack([k, v]), 0
            nxt, prev = (rank + way) % n, (rank - way) % n
            for step in range(n):
                j = (rank - way * step) % n
                incoming = torch.empty_like(kv)
                reqs = []
                if step < n - 1 and order == "send_first" and not blocking:
                    reqs = [dist.isend(kv, nxt), dist.irecv(incoming, prev)]
                s = _scores(q, kv[0], positions[rank], positions[j], causal, mask, scale_q)
                b_lse = torch.logsumexp(s, -1, keepdim=True)
                o_b = torch.exp(s - b_lse.clamp_min(-1e300)) @ kv[1]
                if merge == "rescale":
                    new = torch.logaddexp(lse, b_lse)
                    out = out * torch.exp(lse - new) + o_b * torch.exp(b_lse - new)
                    lse = new
                else:  # each block's softmax on its own, averaged over the blocks that saw something
                    seen = torch.isfinite(b_lse)
                    out, total = out + torch.where(seen, o_b, 0.0), total + seen.to(q.dtype)
                    lse = torch.logaddexp(lse, b_lse)
                if step < n - 1 and blocking:
                    dist.send(kv, nxt)
                    dist.recv(incoming, prev)
                elif step < n - 1 and order == "compute_first":
                    reqs = [dist.isend(kv, nxt), dist.irecv(incoming, prev)]
                for r in reqs:
                    r.wait()
                if step < n - 1:
                    kv = incoming
            if merge != "rescale":
                out = out / total
            ctx.save_for_backward(q, k, v, out, lse, positions)
            ctx.causal, ctx.scale, ctx.dq_factor = causal, scale_q, scale if in_place else 1.0
            return out

        @staticmethod
        def backward(ctx, dout):
            q, k, v, out, lse, positions = ctx.saved_tensors
            rank, n = dist.get_rank(), dist.get_world_size()
            delta = (dout * out).sum(-1, keepdim=True)
            dq = torch.zeros_like(q)
            held = torch.stack([k, v, torch.zeros_like(k), torch.zeros_like(v)])
            nxt, prev = (rank + way) % n, (rank - way) % n
            for step in range(n):
                j = (rank - way * step) % n
                s = _scores(q, held[0], positions[rank], positions[j], ctx.causal, mask, ctx.scale)
                p = torch.exp(s - lse)
                ds = p * (dout @ held[1].transpose(-1, -2) - delta)
                dq = dq + ds @ held[0] * ctx.scale
                part = torch.stack([ds.transpose(-1, -2) @ q * ctx.scale, p.transpose(-1, -2) @ dout])
                if dkdv == "stay":  # only K and V travel; the rank keeps its own queries' part of its chunk
                    mine = part if step == 0 else mine
                    if step == n - 1:
                        break
                    send = held[:2].contiguous()
                else:
                    held = torch.cat([held[:2], held[2:] + part])
                    if step == n - 1 and dkdv == "short":  # the last hop home is never sent
                        mine = held[2:]
                        break
                    send = held if step < n - 1 else held[2:].contiguous()
                incoming = torch.empty_like(send)
                for r in [dist.isend(send, nxt), dist.irecv(incoming, prev)]:
                    r.wait()
                if step == n - 1:
                    mine = incoming
                else:
                    held = incoming
            return dq * ctx.dq_factor, mine[0], mine[1], None, None

    def ring_attention(q, k, v, positions, causal=False):
        return Ring.apply(q, k, v, positions, causal)
    return ring_attention


def ring_no_rescale(q, k, v, positions, causal=False):
    """Each block's softmax normalised on its own and the blocks averaged: no running-max rescaling."""
    return _ring(merge="mean")(q, k, v, positions, causal)


def ring_mask_future_chunks(q, k, v, positions, causal=False):
    """Masks only the diagonal block: chunks after a query's own are attended."""
    return _ring(mask="future")(q, k, v, positions, causal)


def ring_mask_every_block_local(q, k, v, positions, causal=False):
    """A lower triangle on every block, as if each block were the diagonal one."""
    return _ring(mask="local")(q, k, v, positions, causal)


def ring_send_send_deadlock(q, k, v, positions, causal=False):
    """Every rank calls a blocking dist.send first, then dist.recv."""
    return _ring(blocking=True)(q, k, v, positions, causal)


def ring_dkdv_stay_home(q, k, v, positions, causal=False):
    """Backward sends only K and V round the ring: each rank keeps its own queries' part of dK, dV."""
    return _ring(dkdv="stay")(q, k, v, positions, causal)


def ring_dkdv_hop_short(q, k, v, positions, causal=False):
    """dK, dV travel with K and V, but the last hop home is never sent: rank r keeps chunk r + 1's."""
    return _ring(dkdv="short")(q, k, v, positions, causal)


def ring_ignores_causal(q, k, v, positions, causal=False):
    """Never masks: every query attends to every key, causal or not."""
    return _ring()(q, k, v, positions, False)


def ring_all_gather(q, k, v, positions, causal=False):
    """All-gathers every rank's K and V, then attends locally: right numbers, no ring."""
    n = dist.get_world_size()
    ks, vs = dnn.all_gather(k.contiguous()), dnn.all_gather(v.contiguous())
    order = positions.reshape(-1).argsort()
    k_all, v_all = torch.cat(ks, -2)[..., order, :], torch.cat(vs, -2)[..., order, :]
    qpos = positions[dist.get_rank()]
    s = q @ k_all.transpose(-1, -2) * q.shape[-1] ** -0.5
    if causal:
        s = s.masked_fill(torch.arange(k_all.shape[-2])[None, :] > qpos[:, None], float("-inf"))
    return F.softmax(s, -1) @ v_all


def ring_compute_then_send(q, k, v, positions, causal=False):
    """Computes on the chunk it holds, and only then sends it on: no overlap."""
    return _ring(order="compute_first")(q, k, v, positions, causal)


def ring_unscaled(q, k, v, positions, causal=False):
    """The scores q·kᵀ left without the 1/√D scale."""
    return _ring(scaled=False)(q, k, v, positions, causal)


def ring_scaled_by_d(q, k, v, positions, causal=False):
    """The scores scaled by 1/D instead of 1/sqrt(D), in forward and backward."""
    return _ring(power=1.0)(q, k, v, positions, causal)


def ring_runs_backwards(q, k, v, positions, causal=False):
    """Right numbers from a ring run the other way: each rank sends to rank r - 1."""
    return _ring(way=-1)(q, k, v, positions, causal)


def ring_scales_q_in_place(q, k, v, positions, causal=False):
    """Scales q in place before the ring (the gradients allow for it, so only the input is wrong)."""
    return _ring(in_place=True)(q, k, v, positions, causal)


# ------------------------------------------------ zig-zag
def zigzag_contiguous(s, c):
    """The plain split, not the zig-zag one."""
    if s % (2 * c):
        raise ValueError(f"sequence length {s} is not divisible by 2c = {2 * c}")
    return torch.arange(s).view(c, s // c)


def zigzag_no_check(s, c):
    """Right when the length divides, but an uneven length is cut silently."""
    half = s // (2 * c)
    return torch.stack([torch.cat([torch.arange(r * half, (r + 1) * half),
                                   torch.arange((2 * c - 1 - r) * half, (2 * c - r) * half)]) for r in range(c)])


def zigzag_vague_error(s, c):
    """Raises on an uneven length, but the message does not say what is wrong."""
    if s % (2 * c):
        raise ValueError("bad sequence length")
    return zigzag_no_check(s, c)


# ------------------------------------------------ expert parallelism, with one knob per mistake
class _A2A(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, send, recv, group=None):
        ctx.send, ctx.recv, ctx.group = send, recv, group
        out = x.new_empty((sum(recv) if recv is not None else x.shape[0],) + x.shape[1:])
        dist.all_to_all_single(out, x.contiguous(), recv, send, group=group)
        return out

    @staticmethod
    def backward(ctx, g):
        back = g.new_empty((sum(ctx.send) if ctx.send is not None else g.shape[0],) + g.shape[1:])
        dist.all_to_all_single(back, g.contiguous(), ctx.send, ctx.recv, group=ctx.group)
        return back, None, None, None


class _Sum(torch.autograd.Function):
    """Identity in forward; all-reduces the gradient (applied to an expert's weights: the mistake)."""

    @staticmethod
    def forward(ctx, w):
        return w.view_as(w)

    @staticmethod
    def backward(ctx, g):
        g = g.clone()
        dist.all_reduce(g)
        return g


class _Owner(nn.Module):
    """Keeps the router and this rank's experts (correct; the mistakes are in the subclasses' forward)."""

    def __init__(self, moe, group=None):
        super().__init__()
        n, self.rank, self.group = dist.get_world_size(group), dist.get_rank(group), group
        if moe.n_experts % n:
            raise ValueError(f"{moe.n_experts} experts do not divide over {n} ranks")
        self.n, self.per, self.k, self.cf = n, moe.n_experts // n, moe.top_k, moe.capacity_factor
        self.router = copy.deepcopy(moe.router)
        self.experts = nn.ModuleList(copy.deepcopy(moe.experts[e])
                                     for e in range(self.rank * self.per, (self.rank + 1) * self.per))


def _ep(combine="right", weighted=True, sum_grads=False, equal_splits=False):
    class EP(_Owner):
        def _expert(self, i, rows):
            m = self.experts[i]
            if not sum_grads:
                return m(rows)
            h = F.gelu(F.linear(rows, _Sum.apply(m.up.weight), m.up.bias))
            return F.linear(h, _Sum.apply(m.down.weight), m.down.bias)

        def forward(self, x):
            expert, weight, kept = route(self.router, x, self.k, self.cf)
            flat = kept.reshape(-1)
            token = torch.arange(x.shape[0]).repeat_interleave(self.k)[flat]
            chosen, w = expert.reshape(-1)[flat], weight.reshape(-1)[flat]
            order = torch.argsort(chosen, stable=True)
            token, chosen, w = token[order], chosen[order], w[order]
            counts = torch.bincount(chosen, minlength=self.n * self.per)
            got = torch.empty_like(counts)
            dist.all_to_all_single(got, counts, group=self.group)
            send = counts.view(self.n, self.per).sum(1).tolist()
            recv = got.view(self.n, self.per).sum(1).tolist()
            if equal_splits:
                arrived = _A2A.apply(x[token], None, None, self.group)
            else:
                arrived = _A2A.apply(x[token], send, recv, self.group)
            local = torch.arange(self.per).repeat(self.n).repeat_interleave(got)
            if equal_splits:
                local = local[:arrived.shape[0]]
                local = torch.cat([local, local.new_zeros(arrived.shape[0] - local.shape[0])])
            done = 0 * arrived
            for i in range(self.per):
                rows = torch.nonzero(local == i).squeeze(1)
                if rows.numel():
                    done = done.index_add(0, rows, self._expert(i, arrived[rows]))
            back = (_A2A.apply(done, None, None, self.group) if equal_splits
                    else _A2A.apply(done, recv, send, self.group))
            if weighted:
                back = back * w[:, None]
            if combine == "sorted":  # results added to tokens in the sorted order, not undone
                token = token.sort().values
            return torch.zeros_like(x).index_add(0, token, back)
    return EP


EPCombineWrongOrder = _ep(combine="sorted")
EPCombineWrongOrder.__name__ = EPCombineWrongOrder.__qualname__ = "EPCombineWrongOrder"
EPCombineWrongOrder.__doc__ = "Adds the results back in the dispatch's sorted order, not at their tokens."
EPWeightsNotApplied = _ep(weighted=False)
EPWeightsNotApplied.__name__ = EPWeightsNotApplied.__qualname__ = "EPWeightsNotApplied"
EPWeightsNotApplied.__doc__ = "Sums the experts' results without the router's weights."
EPExpertGradAllReduced = _ep(sum_grads=True)
EPExpertGradAllReduced.__name__ = EPExpertGradAllReduced.__qualname__ = "EPExpertGradAllReduced"
EPExpertGradAllReduced.__doc__ = "All-reduces each expert's weight gradient over the world."
EPEqualSplits = _ep(equal_splits=True)
EPEqualSplits.__name__ = EPEqualSplits.__qualname__ = "EPEqualSplits"
EPEqualSplits.__doc__ = "Calls the payload's all-to-all without split sizes: equal splits assumed."


class _Gather(torch.autograd.Function):
    """All-gather (stacked); backward sums the gradients over the group and keeps this rank's."""

    @staticmethod
    def forward(ctx, x, group, rank):
        ctx.group, ctx.rank = group, rank
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.stack(parts)

    @staticmethod
    def backward(ctx, g):
        g = g.contiguous().clone()
        dist.all_reduce(g, group=ctx.group)
        return g[ctx.rank], None, None


class EPAllGather(_Owner):
    """Every rank all-gathers every token, runs its experts on those routed to them, and the
    outputs are all-reduced: right numbers, every token sent everywhere."""

    def forward(self, x):
        mine = torch.tensor([x.shape[0]])
        sizes = [torch.zeros_like(mine) for _ in range(self.n)]
        dist.all_gather(sizes, mine, group=self.group)  # ranks may hold different numbers of tokens
        most = max(int(t) for t in sizes)
        padded = torch.cat([x, x.new_zeros(most - x.shape[0], x.shape[1])])
        parts = [p[:int(t)] for p, t in zip(_Gather.apply(padded, self.group, self.rank), sizes)]
        outs = []
        for xs in parts:
            e, w, kept = route(self.router, xs, self.k, self.cf)
            out = 0 * xs
            for i, m in enumerate(self.experts):
                t, slot = torch.nonzero((e == self.rank * self.per + i) & kept, as_tuple=True)
                if t.numel():
                    out = out.index_add(0, t, w[t, slot, None] * m(xs[t]))
            outs.append(torch.cat([out, out.new_zeros(most - out.shape[0], out.shape[1])]))
        return dnn.all_reduce(torch.stack(outs), group=self.group)[self.rank][:x.shape[0]]


class EPPayloadBeforeCounts(_Owner):
    """Pads every rank's payload to a fixed 32·k rows per destination (more than any rank's T·k
    here), sends it, and only then the counts."""

    def forward(self, x):
        e, w, kept = route(self.router, x, self.k, self.cf)
        rows = 32 * self.k
        slots, pads, metas = [], [], []
        for dst in range(self.n):
            t, slot = torch.nonzero((e // self.per == dst) & kept, as_tuple=True)
            pad = x.new_zeros(rows, x.shape[1])
            pads.append(pad.index_copy(0, torch.arange(t.numel()), x[t]))
            slots.append((t, slot))
            metas.append(torch.cat([e[t, slot] % self.per, t.new_full((rows - t.numel(),), -1)]))
        arrived = _A2A.apply(torch.cat(pads), None, None, self.group)
        meta = torch.empty(self.n * rows, dtype=torch.long)
        dist.all_to_all_single(meta, torch.cat(metas), group=self.group)  # the counts (as expert ids) after the payload
        done = 0 * arrived
        for i, m in enumerate(self.experts):
            r = torch.nonzero(meta == i).squeeze(1)
            if r.numel():
                done = done.index_add(0, r, m(arrived[r]))
        back = _A2A.apply(done, None, None, self.group).view(self.n, rows, -1)
        out = 0 * x
        for dst, (t, slot) in enumerate(slots):
            out = out.index_add(0, t, w[t, slot, None] * back[dst, :t.numel()])
        return out


class EPIgnoresGroup(_ep()):
    """Right on the whole world, but spreads the experts over the world whatever `group` says."""

    def __init__(self, moe, group=None):
        super().__init__(moe)


class EPNoDivisibilityCheck(_ep()):
    """Builds a layer when E does not divide over the ranks (each rank keeps E // n experts)."""

    def __init__(self, moe, group=None):
        nn.Module.__init__(self)
        n, self.rank, self.group = dist.get_world_size(group), dist.get_rank(group), group
        self.n, self.per, self.k, self.cf = n, moe.n_experts // n, moe.top_k, moe.capacity_factor
        self.router = copy.deepcopy(moe.router)
        self.experts = nn.ModuleList(copy.deepcopy(moe.experts[e])
                                     for e in range(self.rank * self.per, (self.rank + 1) * self.per))


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


class ExpertParallelRouterAveraged(ExpertParallelScatter):
    """Averages the router's gradient over the ranks from a hook in backward: each rank then holds
    the mean, whose sum over the ranks is the reference's. An all-reduce, but not of the tokens."""

    def __init__(self, moe, group=None):
        super().__init__(moe, group)
        for p in self.router.parameters():
            p.register_hook(self._average)

    def _average(self, grad):
        grad = grad.clone()
        dist.all_reduce(grad, group=self.group)
        return grad / self.n


CORRECT = {"ring": [ring_batched], "zigzag": [zigzag_by_index],
           "experts": [ExpertParallelScatter, ExpertParallelOwnRouter, ExpertParallelRouterAveraged]}

#: Graded alone, with a short timeout: a hang would stop every answer sharing its launch.
ALONE = {"ring": [(ring_send_send_deadlock, ("did not finish", "blocking dist.send"))]}

WRONG = {
    "ring": [
        (ring_no_rescale, says("rescaling", never="scale 1/√D")),
        (ring_mask_future_chunks, says("causal mask is wrong", never=("rescaling", "scale 1/√D"))),
        (ring_mask_every_block_local, says("causal mask is wrong", never=("rescaling", "scale 1/√D"))),
        (ring_ignores_causal, says("non-causal attention", never=("rescaling", "scale 1/√D"))),
        (ring_dkdv_stay_home, says("its own queries alone", "travel around the ring", never="one more hop")),
        (ring_dkdv_hop_short, says("one hop further along", never="its own queries alone")),
        (ring_all_gather, "point-to-point messages only"),
        (ring_compute_then_send, "computed attention before posting any send"),
        (ring_scales_q_in_place, "in place"),
        (ring_unscaled, says("softmax scale 1/√D", never="rescaling")),
        (ring_scaled_by_d, says("scaled by 1/D", never=("rescaling", "causal mask is wrong"))),
        (ring_runs_backwards, "sending only to its next neighbour, rank (r + 1) mod c"),
    ],
    "zigzag": [
        (zigzag_contiguous, "plain contiguous split"),
        (zigzag_no_check, "raise a ValueError"),
        (zigzag_vague_error, "say what is wrong, with both numbers"),
    ],
    "experts": [
        (EPCombineWrongOrder, "combine is in the wrong order"),
        (EPWeightsNotApplied, "router's weights are not applied"),
        (EPExpertGradAllReduced, "must not be summed (all-reduced)"),
        (EPEqualSplits, "uneven splits were assumed equal"),
        (EPAllGather, "tokens travel by all-to-all"),
        (EPPayloadBeforeCounts, "exchange the per-rank counts first"),
        (EPIgnoresGroup, "split the experts over the ranks of `group`"),
        (EPNoDivisibilityCheck, "do not split evenly over 2 ranks, so raise a ValueError"),
    ],
}
