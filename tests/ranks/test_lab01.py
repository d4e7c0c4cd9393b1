"""Lab 01's checks: they pass correct answers (written several ways) and
reject the wrong answers in tests/wrong_answers/lab01.py with a message that
names the mistake.

Launches are the cost (a cold 4-rank start is ~10 s on 2 cores), so most
cases are batched through ``harness.grade_batch``: one launch per world size
for many functions at once, graded by the same exercises as the public checks.
The public ``check_*`` functions are called directly for the cases where the
launch itself must fail (a hang, an exception on one rank).
"""
import math

import pytest
import torch
import torch.distributed as dist

from parlab.grading import harness, lab01
from grading_reports import short_keys as _by_short_key
from wrong_answers import lab01 as wrong

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(240)]


# ---------------------------------------------------------------- correct answers

def rs_ag_padded(x):
    """Pad to a multiple of n, reduce_scatter a list of chunks, all_gather them back."""
    n = dist.get_world_size()
    flat = x.reshape(-1)
    c = -(-flat.numel() // n)
    padded = torch.zeros(c * n, dtype=x.dtype, device=x.device)
    padded[: flat.numel()] = flat
    mine = torch.empty(c, dtype=x.dtype, device=x.device)
    dist.reduce_scatter(mine, list(padded.split(c)))
    parts = [torch.empty_like(mine) for _ in range(n)]
    dist.all_gather(parts, mine)
    return torch.cat(parts)[: flat.numel()].reshape(x.shape)


def rs_ag_tensor_api(x):
    """Same idea with the single-tensor APIs (reduce_scatter_tensor / all_gather_into_tensor)."""
    n = dist.get_world_size()
    c = -(-x.numel() // n)
    padded = torch.nn.functional.pad(x.reshape(-1), (0, c * n - x.numel()))
    mine = torch.empty(c, dtype=x.dtype, device=x.device)
    dist.reduce_scatter_tensor(mine, padded)
    full = torch.empty(c * n, dtype=x.dtype, device=x.device)
    dist.all_gather_into_tensor(full, mine)
    return full[: x.numel()].view(x.shape)


def ring_isend_irecv(x):
    """Uneven chunks (tensor_split); each step posts isend and irecv, then waits on both."""
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % n, (rank - 1) % n
    out = x.reshape(-1).clone()
    chunks = list(out.tensor_split(n))
    for s in range(n - 1):  # reduce-scatter
        i = (rank - s - 1) % n
        buf = torch.empty_like(chunks[i])
        for req in (dist.isend(chunks[(rank - s) % n], right), dist.irecv(buf, left)):
            req.wait()
        chunks[i] += buf
    for s in range(n - 1):  # all-gather
        i = (rank - s) % n
        buf = torch.empty_like(chunks[i])
        for req in (dist.isend(chunks[(rank + 1 - s) % n], right), dist.irecv(buf, left)):
            req.wait()
        chunks[i].copy_(buf)
    return out.reshape(x.shape)


def ring_even_odd_blocking(x):
    """Padded equal chunks, blocking send/recv; even ranks send first, odd ranks receive first."""
    rank, n = dist.get_rank(), dist.get_world_size()
    c = -(-x.numel() // n)
    buf = torch.zeros(c * n, dtype=x.dtype)
    buf[: x.numel()] = x.reshape(-1)
    chunk = buf.view(n, c)
    tmp = torch.empty(c, dtype=x.dtype)

    def swap(send_row):
        if rank % 2 == 0:
            dist.send(chunk[send_row].clone(), (rank + 1) % n)
            dist.recv(tmp, (rank - 1) % n)
        else:
            dist.recv(tmp, (rank - 1) % n)
            dist.send(chunk[send_row].clone(), (rank + 1) % n)

    for s in range(n - 1):
        swap((rank - s) % n)
        chunk[(rank - s - 1) % n] += tmp
    for s in range(n - 1):
        swap((rank + 1 - s) % n)
        chunk[(rank - s) % n] = tmp
    return buf[: x.numel()].reshape(x.shape)


def tree_binary_heap(x, root):
    """Binary heap over virtual ranks v = (rank - root) % n: parent (v-1)//2, children 2v+1, 2v+2."""
    rank, n = dist.get_rank(), dist.get_world_size()
    v = (rank - root) % n
    if v > 0:
        dist.recv(x, ((v - 1) // 2 + root) % n)
    for c in (2 * v + 1, 2 * v + 2):
        if c < n:
            dist.send(x, (c + root) % n)
    return x


def tree_binomial_isend(x, root):
    """Binomial tree: in round k, every rank that has the data sends it 2**k ranks further."""
    rank, n = dist.get_rank(), dist.get_world_size()
    v = (rank - root) % n
    out = x.clone()
    for k in range(math.ceil(math.log2(n)) if n > 1 else 0):
        step = 1 << k
        if v < step and v + step < n:
            dist.isend(out, (v + step + root) % n).wait()
        elif step <= v < 2 * step:
            dist.irecv(out, (v - step + root) % n).wait()
    return out


def ring_batch_p2p(x):
    """Uneven chunks; each step is one dist.batch_isend_irecv of a send right and a recv left."""
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % n, (rank - 1) % n
    out = x.reshape(-1).clone()
    chunks = list(out.tensor_split(n))

    def step(send, recv):
        ops = [dist.P2POp(dist.isend, send, right), dist.P2POp(dist.irecv, recv, left)]
        for req in dist.batch_isend_irecv(ops):
            req.wait()

    for s in range(n - 1):
        buf = torch.empty_like(chunks[(rank - s - 1) % n])
        step(chunks[(rank - s) % n], buf)
        chunks[(rank - s - 1) % n] += buf
    for s in range(n - 1):
        buf = torch.empty_like(chunks[(rank - s) % n])
        step(chunks[(rank + 1 - s) % n], buf)
        chunks[(rank - s) % n].copy_(buf)
    return out.view(x.shape)


def tree_into_clone(x, root):
    """Heap tree on virtual ranks, receiving into a copy so the input is left alone."""
    rank, n = dist.get_rank(), dist.get_world_size()
    v, out = (rank - root) % n, x.clone()
    if v:
        dist.recv(out, ((v - 1) // 2 + root) % n)
    for child in (2 * v + 1, 2 * v + 2):
        if child < n:
            dist.send(out, (child + root) % n)
    return out


def bandwidths(numel, dtype, seconds, n):
    s = numel * dtype.itemsize
    algbw = s / seconds / 1e9
    return algbw, algbw * 2 * (n - 1) / n


def bandwidths_tensor(numel, dtype, seconds, n):
    """Computed with torch: returns 0-d tensors instead of floats."""
    s = torch.tensor(numel * torch.empty((), dtype=dtype).element_size(), dtype=torch.float64)
    return s / seconds / 1e9, s / seconds / 1e9 * (2 * (n - 1) / n)


CORRECT = {
    "rs_ag": {"rs_ag_padded": rs_ag_padded, "rs_ag_tensor_api": rs_ag_tensor_api},
    "ring": {"ring_isend_irecv": ring_isend_irecv, "ring_even_odd_blocking": ring_even_odd_blocking,
             "ring_batch_p2p": ring_batch_p2p},
    "tree": {"tree_binary_heap": tree_binary_heap, "tree_binomial_isend": tree_binomial_isend,
             "tree_into_clone": tree_into_clone},
    "bandwidths": {"bandwidths": bandwidths, "bandwidths_tensor": bandwidths_tensor},
}


def _batch(tables) -> dict:
    batch = {lab01.EXERCISES[ex]: dict(answers) for ex, answers in CORRECT.items()}
    for table in tables:
        for ex, fixtures in table.items():
            batch[lab01.EXERCISES[ex]].update({f.__name__: f for f, _ in fixtures})
    return {ex: answers for ex, answers in batch.items() if answers}


# ---------------------------------------------------------------- batched: visible and hidden

@pytest.fixture(scope="module")
def visible():
    return _by_short_key(harness.grade_batch(_batch([wrong.WRONG, wrong.WRONG_HIDDEN])))


@pytest.fixture(scope="module")
def hidden():
    return _by_short_key(harness.grade_batch(_batch([wrong.WRONG_HIDDEN]), hidden=True))


@pytest.mark.parametrize("ex,name", [(ex, n) for ex in CORRECT for n in CORRECT[ex]])
def test_correct_answers_pass_visible_and_hidden(visible, hidden, ex, name):
    assert visible[(ex, name)] is None, visible[(ex, name)]
    assert hidden[(ex, name)] is None, hidden[(ex, name)]


@pytest.mark.parametrize("ex,fixture,words", [(ex, f, w) for ex, fs in wrong.WRONG.items() for f, w in fs])
def test_wrong_answers_fail_visible(visible, ex, fixture, words):
    msg = visible[(ex, fixture.__name__)]
    assert msg is not None, f"{fixture.__name__} passed the visible {ex} check"
    assert words in msg, msg


@pytest.mark.parametrize("ex,fixture,words", [
    (ex, f, w) for ex, fs in wrong.WRONG_HIDDEN.items() for f, w in fs])
def test_wrong_answers_fail_hidden(visible, hidden, ex, fixture, words):
    assert visible[(ex, fixture.__name__)] is None, "should pass the visible tests (only hidden catch it)"
    msg = hidden[(ex, fixture.__name__)]
    assert msg is not None and words in msg, msg


def test_messages_name_case_and_rank(visible):
    msg = visible[("rs_ag", "rs_ag_forgets_remainder")]
    assert "numel 10" in msg and "world_size 4" in msg and "rank 0" in msg, msg


def test_rule_messages_quote_the_notebook(visible):
    msg = visible[("ring", "ring_uses_all_reduce")]
    assert "right values" in msg and 'The exercise says: "Use only `dist.send`' in msg, msg


# ---------------------------------------------------------------- public checks, launch failures

def test_public_check_passes_and_reports(capsys):
    lab01.check_ring_allreduce(ring_isend_irecv)
    assert "5 visible cases passed on 4 ranks" in capsys.readouterr().out


def test_deadlock_fails_in_bounded_time():
    fn, words = wrong.DEADLOCK
    with pytest.raises(AssertionError, match="did not finish") as info:
        lab01.check_ring_allreduce(fn, timeout=16)
    assert words in str(info.value)


def test_crash_is_explained():
    fn, words = wrong.CRASH
    with pytest.raises(AssertionError) as info:
        lab01.check_ring_allreduce(fn)
    assert words in str(info.value), str(info.value)


def test_exception_on_one_rank_surfaces():
    fn, words = wrong.RAISES
    with pytest.raises(AssertionError, match="raised an error on 4 ranks") as info:
        lab01.check_ring_allreduce(fn)
    assert words in str(info.value) and "rank 3" in str(info.value)


def test_not_a_function():
    with pytest.raises(AssertionError, match="expected your tree_broadcast"):
        lab01.check_tree_broadcast(None)


# ---------------------------------------------------------------- exercise 4 (in process)

def test_bandwidths_public_check(capsys):
    lab01.check_bandwidths(bandwidths)
    lab01.check_bandwidths(bandwidths, hidden=True)
    out = capsys.readouterr().out
    assert "3 visible cases passed" in out and "4 hidden cases passed" in out and "ranks" not in out


@pytest.mark.parametrize("fixture,words", [
    (wrong.bw_factor_two, "factor 2"), (lambda *a: None, "forget the `return`"),
    (lambda *a: (1.0,), "should return a pair")])
def test_bandwidths_odd_returns(fixture, words):
    with pytest.raises(AssertionError, match=words):
        lab01.check_bandwidths(fixture)
