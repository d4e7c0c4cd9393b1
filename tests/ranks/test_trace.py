"""parlab.trace: spans, the collective counter, memory accounting.

The counter is checked on real gloo process groups: in-process at world
size 1, and through parlab.launch at world sizes 2, 3 and 4.
"""
import pickle
import time

import pytest
import torch
import torch.distributed as dist
from torch import nn

import parlab
from parlab import cost, trace

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(180)]
F32 = 4  # bytes per float32 element
K = 3  # elements per rank in the collective checks


# ---------------------------------------------------------------- rank body
def _rank_body():
    """Runs on every rank: one naive DP step, then one call of every counted op."""
    rank, n = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 2))  # 58 params
    model(torch.randn(4, 5) + rank).sum().backward()
    original = dist.all_reduce

    trace.reset()
    with trace.count_collectives(spans=True) as dp:
        for p in model.parameters():
            dist.all_reduce(p.grad)
    out = {"n": n, "psi": cost.count_params(model), "dp": dp.summary(),
           "dp_total": dp.total_ring_bytes, "dp_spans": [s.name for s in trace.spans()],
           "grad0": model[0].bias.grad.clone()}

    x = torch.full((K,), float(rank))
    with trace.count_collectives() as c:
        b = x.clone()
        dist.broadcast(b, src=0)
        dist.reduce(x.clone(), dst=0)
        gathered = [torch.empty(K) for _ in range(n)]
        dist.all_gather(gathered, x)
        flat = torch.empty(K * n)
        dist.all_gather_into_tensor(flat, x)
        rs = torch.empty(K)
        dist.reduce_scatter(rs, [torch.ones(K) for _ in range(n)])
        rst = torch.empty(K)
        dist.reduce_scatter_tensor(rst, torch.ones(K * n))
        a2a = torch.empty(K * n)
        dist.all_to_all_single(a2a, torch.full((K * n,), float(rank)))
        if hasattr(dist, "all_gather_single"):  # newer torch: the non-deprecated names
            dist.all_gather_single(torch.empty(K * n), x)
            dist.reduce_scatter_single(torch.empty(K), torch.ones(K * n))
        dist.all_to_all([torch.empty(K) for _ in range(n)], [x.clone() for _ in range(n)])
        ar = x.clone()
        dist.all_reduce(ar, async_op=True).wait()
        if n > 1:  # a ring of isend/irecv, and one blocking send -> recv
            inbox = torch.empty(K)
            works = [dist.isend(x, (rank + 1) % n), dist.irecv(inbox, (rank - 1) % n)]
            for w in works:
                w.wait()
            out["inbox"] = inbox
            if rank == 0:
                dist.send(x, 1)
            elif rank == 1:
                dist.recv(inbox, 0)
        dist.barrier()
    out.update(ops=c.summary(), restored=dist.all_reduce is original, bcast=b,
               gathered=torch.cat(gathered), flat=flat, rs=rs, rst=rst, a2a=a2a, ar=ar)
    return out


def _expected_ops(rank: int, n: int) -> dict:
    """Hand-written payload S and bytes-sent per op, K float32 elements per rank."""
    s = K * F32
    exp = {
        "broadcast": (s, s), "reduce": (s, s), "all_reduce": (s, s * 2 * (n - 1) / n),
        "all_gather": (s * n, s * (n - 1)), "all_gather_into_tensor": (s * n, s * (n - 1)),
        "reduce_scatter": (s * n, s * (n - 1)), "reduce_scatter_tensor": (s * n, s * (n - 1)),
        "all_to_all_single": (s * n, s * (n - 1)), "all_to_all": (s * n, s * (n - 1)),
        "barrier": (0, 0),
    }
    if hasattr(dist, "all_gather_single"):
        exp.update(all_gather_single=(s * n, s * (n - 1)), reduce_scatter_single=(s * n, s * (n - 1)))
    if n > 1:
        exp.update(isend=(s, s), irecv=(s, 0))
        if rank == 0:
            exp["send"] = (s, s)
        if rank == 1:
            exp["recv"] = (s, 0)
    return exp


def _check_rank(rank: int, out: dict) -> None:
    n, psi = out["n"], out["psi"]
    assert psi == 58
    # THE key check: ring-model bytes of one naive DP step == the cost model, exactly
    assert out["dp_total"] == cost.dp_comm_elems(psi, n) * F32
    assert out["dp"] == {"all_reduce": {"calls": 4, "bytes": psi * F32,
                                        "ring_bytes": cost.dp_comm_elems(psi, n) * F32}}
    assert out["dp_spans"] == ["all_reduce"] * 4
    # every op counted once with the right payload and bytes sent
    exp = _expected_ops(rank, n)
    assert set(out["ops"]) == set(exp)
    for op, (nbytes, wire) in exp.items():
        got = out["ops"][op]
        assert (got["calls"], got["bytes"]) == (1, nbytes), op
        assert got["ring_bytes"] == pytest.approx(wire), op
    assert out["restored"]
    # the wrappers passed every argument through: the collectives really ran
    ranks = torch.arange(n, dtype=torch.float32)
    assert torch.equal(out["bcast"], torch.zeros(K))
    assert torch.equal(out["gathered"], ranks.repeat_interleave(K))
    assert torch.equal(out["flat"], ranks.repeat_interleave(K))
    assert torch.equal(out["rs"], torch.full((K,), float(n)))
    assert torch.equal(out["rst"], torch.full((K,), float(n)))
    assert torch.equal(out["a2a"], ranks.repeat_interleave(K))
    assert torch.equal(out["ar"], torch.full((K,), float(sum(range(n)))))
    if n > 1:
        assert torch.equal(out["inbox"], torch.full((K,), float((rank - 1) % n)))


@pytest.mark.filterwarnings("ignore:.*is deprecated:FutureWarning")
def test_counter_world_size_1_in_process():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        out = _rank_body()
    finally:
        dist.destroy_process_group()
    _check_rank(0, out)
    assert out["dp_total"] == 0  # one rank sends nothing


@pytest.mark.parametrize("n", [2, 3, 4])
def test_counter_multi_rank(n):
    results = parlab.launch(_rank_body, nproc=n, timeout=150)
    assert len(results) == n
    for rank, out in enumerate(results):
        _check_rank(rank, out)
    # all ranks end with the same (summed) gradient
    for out in results[1:]:
        assert torch.allclose(out["grad0"], results[0]["grad0"])


def test_expected_ring_bytes_are_not_trivial():
    # guards the key check: at n=3 the count is fractional and differs from 2Ψ
    assert cost.dp_comm_elems(58, 3) * F32 != 2 * 58 * F32
    assert cost.dp_comm_elems(58, 3) * F32 == pytest.approx(58 * F32 * 4 / 3)


def test_counter_restores_on_exception_and_without_group():
    originals = {op: getattr(dist, op) for op in trace.COUNTED_OPS}
    with pytest.raises(RuntimeError, match="boom"):
        with trace.count_collectives() as c:
            assert dist.all_reduce is not originals["all_reduce"]
            raise RuntimeError("boom")
    assert all(getattr(dist, op) is fn for op, fn in originals.items())
    assert c.summary() == {} and c.total_ring_bytes == 0


# ---------------------------------------------------------------- spans
def test_span_records_and_pickles():
    trace.reset()
    with trace.span("compute", bytes=12, layer=3):
        pass
    with pytest.raises(ZeroDivisionError):
        with trace.span("fails"):
            1 / 0
    t0 = trace.now()
    trace.record("async_ar", t0, t0 + 0.5, bytes=8)
    got = trace.spans()
    assert [s.name for s in got] == ["compute", "fails", "async_ar"]
    assert got[0].bytes == 12 and got[0].meta == {"layer": 3} and got[0].rank == 0
    assert got[0].end >= got[0].start and got[2].duration == pytest.approx(0.5)
    assert pickle.loads(pickle.dumps(got)) == got
    # On the epoch's scale, so spans from different processes share one axis (the anchor is
    # taken once: a later wall-clock step, from NTP or a paused VM, may add seconds, not hours).
    assert abs(trace.now() - time.time()) < 3600
    trace.reset()
    assert trace.spans() == []
    with pytest.raises(ValueError):
        trace.record("backwards", 2.0, 1.0)


def test_merge_sorts_and_rebases():
    a = [trace.Span("f", 0, 10.0, 11.0), trace.Span("b", 0, 12.0, 13.0)]
    b = [trace.Span("f", 1, 10.5, 11.5)]
    merged = trace.merge([a, b])
    assert [(s.name, s.rank) for s in merged] == [("f", 0), ("f", 1), ("b", 0)]
    rel = trace.merge([a, b], relative=True)
    assert [(s.start, s.end) for s in rel] == [(0.0, 1.0), (0.5, 1.5), (2.0, 3.0)]


def test_overlap_fraction_known_answers():
    S = trace.Span
    spans = [
        S("all_reduce", 0, 0.0, 4.0), S("backward", 0, 1.0, 2.0), S("backward", 0, 1.5, 3.0),
        S("all_reduce", 1, 0.0, 2.0), S("backward", 1, 5.0, 6.0),
        S("backward", 2, 0.0, 1.0),  # rank 2 has no comm: ignored
    ]
    # rank 0: comm 4 s, of which [1, 3] = 2 s under compute -> 0.5; rank 1: 0
    assert trace.overlap_fraction(spans, per_rank=True) == {0: 0.5, 1: 0.0}
    assert trace.overlap_fraction(spans) == pytest.approx(2 / 6)
    # overlapping comm spans are not double counted; several names allowed
    spans2 = [S("ar", 0, 0, 2), S("ag", 0, 1, 3), S("fwd", 0, 0, 1), S("bwd", 0, 2, 3)]
    assert trace.overlap_fraction(spans2, comm=("ar", "ag"), compute=("fwd", "bwd")) == pytest.approx(2 / 3)
    with pytest.raises(ValueError):
        trace.overlap_fraction(spans, comm="nothing")


def _gpipe_spans(p: int, m: int, tf: float = 1.0, tb: float = 2.0) -> list:
    """Synthetic GPipe timeline: all forwards in a wave, then all backwards in reverse."""
    out = []
    for r in range(p):
        for j in range(m):
            start = (r + j) * tf
            out.append(trace.Span("forward", r, start, start + tf))
    t_fwd = (m + p - 1) * tf
    for r in range(p):
        for j in range(m):
            start = t_fwd + ((p - 1 - r) + j) * tb
            out.append(trace.Span("backward", r, start, start + tb))
    return out


@pytest.mark.parametrize("p, m", [(2, 4), (4, 4), (4, 8), (3, 1), (1, 5)])
def test_measured_bubble_matches_gpipe_formula(p, m):
    spans = _gpipe_spans(p, m)
    expected = cost.bubble_fraction(p, m, "gpipe", definition="share")  # (p-1)/(m+p-1)
    per = trace.bubble_fraction(spans, per_rank=True)
    assert set(per) == set(range(p))
    for frac in per.values():
        assert frac == pytest.approx(expected)
    assert trace.bubble_fraction(spans) == pytest.approx(expected)


def test_bubble_fraction_hand_case():
    S = trace.Span
    spans = [S("forward", 0, 0, 1), S("backward", 0, 3, 4), S("forward", 1, 1, 2),
             S("backward", 1, 2, 3), S("optimizer", 1, 0, 4)]  # not a busy name
    assert trace.bubble_fraction(spans, per_rank=True) == {0: 0.5, 1: 0.5}
    assert trace.bubble_fraction(spans, window=(0, 8)) == 0.75
    with pytest.raises(ValueError):
        trace.bubble_fraction(spans, busy="idle")


# ---------------------------------------------------------------- memory
class _Tied(nn.Module):
    def __init__(self, vocab=13, h=6):
        super().__init__()
        self.emb = nn.Embedding(vocab, h)
        self.mid = nn.Linear(h, h)
        self.head = nn.Linear(h, vocab, bias=False)
        self.head.weight = self.emb.weight  # tied: one tensor

    def forward(self, idx):
        return self.head(torch.tanh(self.mid(self.emb(idx))))


def test_state_bytes_adam_after_one_step():
    model = _Tied()
    psi = cost.count_params(model)
    assert psi == 13 * 6 + 6 * 6 + 6  # the tied weight once
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    before = trace.state_bytes(model, opt)
    assert before == {"params": 4 * psi, "grads": 0, "optimizer": 0, "total": 4 * psi}

    model(torch.tensor([[1, 2, 3]])).sum().backward()
    opt.step()
    n_tensors = len(list(model.parameters()))  # 3: one fp32 step counter each
    assert all(st["step"].numel() == 1 and st["step"].dtype == torch.float32
               for st in opt.state.values())
    got = trace.state_bytes(model, opt)
    assert got["params"] == 4 * psi
    assert got["grads"] == 4 * psi
    assert got["optimizer"] == 8 * psi + 4 * n_tensors  # exp_avg + exp_avg_sq + steps
    assert got["total"] == 16 * psi + 4 * n_tensors
    assert trace.state_bytes(model)["optimizer"] == 0


def test_state_bytes_dedupes_shared_storage():
    a = nn.Linear(4, 4, bias=False)
    b = nn.Linear(4, 4, bias=False)
    b.weight = nn.Parameter(a.weight.data)  # a different Parameter on the same storage
    model = nn.ModuleList([a, b])
    assert cost.count_params(model) == 32  # two Parameter objects
    assert trace.state_bytes(model)["params"] == 16 * F32  # one storage of 16 floats
    b.weight = nn.Parameter(torch.zeros(4, 4))
    assert trace.state_bytes(model)["params"] == 128


def test_cuda_peak_bytes_none_on_cpu():
    if torch.cuda.is_available():
        assert isinstance(trace.cuda_peak_bytes(), int)
    else:
        assert trace.cuda_peak_bytes() is None
