"""Answers to Lab 04's schedule exercises (pipeline parallelism), right and wrong.

The four tables of tests/answer_suite.py, keyed by ``parlab.grading.lab04.EXERCISES``:
``CORRECT`` (right answers written differently from the notebook's solution),
``WRONG`` and ``ALONE``, each wrong answer with the words the check's message
must contain; no answer of this lab is wrong only on the hidden cases
(``WRONG_HIDDEN`` is empty).  ``ALONE`` holds the answer that hangs (blocking
sends that face each other) and the one that raises on some stages; the
suite grades those one at a time, through the public check, with a short
timeout.  tests/ranks/test_lab04.py runs every answer.

Every answer gets ``stage`` (this rank's ``GPTStage``), the micro-batches as
(x, y) pairs (one pair for Exercise 1) and ``shape``, one activation's shape.
"""
import torch
import torch.distributed as dist

import parlab
from wrong_answers import says


# ------------------------------------------------ building blocks the answers share
def _recv(shape, src):
    buf = torch.empty(shape, device=parlab.device())
    dist.recv(buf, src=src)
    return buf


def _forward(stage, x, shape, *, grad=True):
    """Receive (unless first), run the stage; returns (input, output)."""
    rank = dist.get_rank()
    inp = x if stage.is_first else _recv(shape, rank - 1)
    if grad and not stage.is_first:
        inp.requires_grad_()
    return inp, stage(inp)


def _forward_mb(stage, x, y, shape, m, losses, send, divide=True):
    """One micro-batch's forward: the last stage turns its output into loss / m (keeping the loss),
    the others send their output on with ``send``; returns (input, output)."""
    inp, out = _forward(stage, x, shape)
    if stage.is_last:
        loss = stage.loss(out, y)
        losses.append(loss.detach())
        return inp, (loss / dist.get_world_size() if divide == "p" else loss / m if divide else loss)
    send(out.detach(), dist.get_rank() + 1)
    return inp, out


def _share_loss(stage, mean, how):
    """The mean loss as the last stage holds it, or, a mistake, shared with other stages:
    ``how="to_first"`` sends it to stage 0 (a message that is not an activation or gradient),
    ``how="all_reduce"`` sums it over every stage (a collective)."""
    if how == "to_first" and stage.is_last:
        dist.send(mean.reshape(1), 0)
    elif how == "to_first" and stage.is_first:
        mean = torch.empty(1, device=parlab.device())
        dist.recv(mean, dist.get_world_size() - 1)
    elif how == "all_reduce":
        total = mean.reshape(1).clone() if stage.is_last else torch.zeros(1, device=parlab.device())
        dist.all_reduce(total)
        mean = total[0]
    return mean


def _gpipe(stage, micro_batches, shape, *, divide=True, zero_between=False, share_loss=None,
           one_backward=False, backward_order=None, barrier=False):
    """GPipe with blocking send/recv, with switches for the mistakes below."""
    rank, m = dist.get_rank(), len(micro_batches)
    kept, losses = [], []
    for x, y in micro_batches:
        kept.append(_forward_mb(stage, x, y, shape, m, losses, dist.send, divide))
    if barrier:
        dist.barrier()
    if stage.is_last and one_backward:
        sum(out for _, out in kept).backward()
    for i in backward_order or range(m):
        inp, out = kept[i]
        if zero_between:
            stage.zero_grad()
        if stage.is_last:
            if not one_backward:
                out.backward()
        else:
            out.backward(_recv(shape, rank + 1))
        if not stage.is_first:
            dist.send(inp.grad, rank - 1)
    return _share_loss(stage, torch.stack(losses).mean() if stage.is_last else None, share_loss)


def _one_f_one_b(stage, micro_batches, shape, *, warmup=None, blocking=False, divide=True,
                 retain=False, keep=False, last=None, share_loss=None):
    """1F1B with isend for every message, with switches for the mistakes below (and ``last``, a
    list that keeps the micro-batch of the latest backward alive until the next one)."""
    rank, p, m = dist.get_rank(), dist.get_world_size(), len(micro_batches)
    pending, held, losses = [], {}, []

    def send(t, peer):
        if blocking:
            dist.send(t, peer)
        else:
            pending.append((dist.isend(t, peer), t))

    def forward(i):
        x, y = micro_batches[i]
        held[i] = _forward_mb(stage, x, y, shape, m, losses, send, divide)

    def backward(i):
        inp, out = held[i] if retain or keep else held.pop(i)
        if last is not None:
            last[:] = [inp, out]
        grad = None if stage.is_last else _recv(shape, rank + 1)
        out.backward(grad, retain_graph=retain)
        if not stage.is_first:
            send(inp.grad, rank - 1)

    w = min(p - rank - 1, m) if warmup is None else warmup(p, rank, m)
    for i in range(w):
        forward(i)
    for i in range(m - w):
        forward(w + i)
        backward(i)
    for i in range(m - w, m):
        backward(i)
    for work, _ in pending:
        work.wait()
    return _share_loss(stage, torch.stack(losses).mean() if stage.is_last else None, share_loss)


# ------------------------------------------------ 1. one micro-batch: correct, written differently
def single_isend_irecv(stage, x, y, shape):
    """Every message posted with isend/irecv and waited on at once."""
    rank, dev = dist.get_rank(), parlab.device()
    inp = x
    if not stage.is_first:
        inp = torch.empty(shape, device=dev)
        dist.irecv(inp, rank - 1).wait()
        inp.requires_grad_(True)
    out = stage(inp)
    loss = None
    if stage.is_last:
        loss = stage.loss(out, y)
        loss.backward()
    else:
        dist.isend(out.detach(), rank + 1).wait()
        grad = torch.empty_like(out)
        dist.irecv(grad, rank + 1).wait()
        torch.autograd.backward(out, grad)
    if not stage.is_first:
        dist.isend(inp.grad, rank - 1).wait()
    return loss.item() if loss is not None else None


def single_batch_p2p(stage, x, y, shape):
    """Megatron's style: each exchange through dist.batch_isend_irecv."""
    rank = dist.get_rank()
    inp = x
    if not stage.is_first:
        inp = torch.empty(shape, device=parlab.device(), requires_grad=False)
        for req in dist.batch_isend_irecv([dist.P2POp(dist.irecv, inp, rank - 1)]):
            req.wait()
        inp = inp.requires_grad_()
    out = stage(inp)
    if stage.is_last:
        loss = stage.loss(out, y)
        loss.backward()
    else:
        grad = torch.empty(shape, device=parlab.device())
        ops = [dist.P2POp(dist.isend, out.detach().contiguous(), rank + 1),
               dist.P2POp(dist.irecv, grad, rank + 1)]
        for req in dist.batch_isend_irecv(ops):
            req.wait()
        out.backward(grad)
    if not stage.is_first:
        for req in dist.batch_isend_irecv([dist.P2POp(dist.isend, inp.grad, rank - 1)]):
            req.wait()
    return loss.detach() if stage.is_last else None


# ------------------------------------------------ 1. one micro-batch: wrong
def single_zeroes_first(stage, x, y, shape):
    """Zeroes the stage's gradients itself before its pass: the right numbers (the caller zeroed
    them already), against the stated rule."""
    stage.zero_grad()
    return single_isend_irecv(stage, x, y, shape)


def single_steps_optimizer(stage, x, y, shape):
    """Right gradients, then steps an optimizer of its own over the stage: the caller's job."""
    loss = single_isend_irecv(stage, x, y, shape)
    torch.optim.SGD(stage.parameters(), lr=0.1).step()
    return loss


def single_sends_loss_back(stage, x, y, shape):
    """Right, then the last stage also sends its loss back to stage 0 "so rank 0 can print it"."""
    out = _gpipe(stage, [(x, y)], shape, share_loss="to_first")
    return out


def single_broadcasts_loss(stage, x, y, shape):
    """Right, then shares the loss with every stage through dist.broadcast."""
    out = _gpipe(stage, [(x, y)], shape)
    loss = out.reshape(1).clone() if stage.is_last else torch.zeros(1, device=parlab.device())
    dist.broadcast(loss, src=dist.get_world_size() - 1)
    return loss[0] if stage.is_last else None


def _single(stage, x, y, shape, *, requires_grad=True, pass_received=False, first_skips=False):
    """One micro-batch with blocking send/recv, with switches for the mistakes below."""
    rank = dist.get_rank()
    inp, out = _forward(stage, x, shape, grad=requires_grad)
    loss = grad = None
    if stage.is_last:
        loss = stage.loss(out, y)
        loss.backward()
    else:
        dist.send(out.detach(), rank + 1)
        if not (first_skips and stage.is_first):
            grad = _recv(shape, rank + 1)
            out.backward(grad)
    if not stage.is_first and not (first_skips and rank == 1):
        dist.send(grad if pass_received and grad is not None else inp.grad, rank - 1)
    return loss.detach() if loss is not None else None


def single_sends_received_grad(stage, x, y, shape):
    """Passes the gradient it received straight on, instead of the gradient of its own input."""
    return _single(stage, x, y, shape, pass_received=True)


def single_first_stage_skips_backward(stage, x, y, shape):
    """Stage 0 thinks nothing comes back to it: it never receives a gradient or runs backward."""
    return _single(stage, x, y, shape, first_skips=True)


def single_detached_input(stage, x, y, shape):
    """Receives the activation but never calls requires_grad_(): inp.grad stays None."""
    return _single(stage, x, y, shape, requires_grad=False)


# ------------------------------------------------ 2. GPipe
def gpipe_blocking(stage, micro_batches, shape):
    """Blocking send/recv, backwards in micro-batch order."""
    return _gpipe(stage, micro_batches, shape)


def gpipe_reverse_backward(stage, micro_batches, shape):
    """Backwards from the last micro-batch to the first (as in GPipe's paper figure)."""
    return _gpipe(stage, micro_batches, shape, backward_order=range(len(micro_batches) - 1, -1, -1))


def gpipe_backward_order_mismatch(stage, micro_batches, shape):
    """The last stage runs its backwards in micro-batch order, the others in reverse: each of those
    pairs a micro-batch's output with another micro-batch's gradient."""
    m = len(micro_batches)
    return _gpipe(stage, micro_batches, shape, backward_order=None if stage.is_last else range(m - 1, -1, -1))


def gpipe_loss_not_divided(stage, micro_batches, shape):
    """Backward on each micro-batch's mean loss, never divided by m."""
    return _gpipe(stage, micro_batches, shape, divide=False)


def gpipe_divides_by_stages(stage, micro_batches, shape):
    """Divides each micro-batch's loss by p (the stages), not m: right when m = p, 1/2 at m = 2, p = 4,
    which is also what dividing by m twice gives: no cause can be named from these cases."""
    return _gpipe(stage, micro_batches, shape, divide="p")


def gpipe_zero_grad_between(stage, micro_batches, shape):
    """Zeroes the gradients before each micro-batch's backward: nothing accumulates."""
    return _gpipe(stage, micro_batches, shape, zero_between=True)


def gpipe_returns_sum(stage, micro_batches, shape):
    """Right gradients, but returns the sum of the micro-batch losses."""
    mean = _gpipe(stage, micro_batches, shape)
    return mean * len(micro_batches) if mean is not None else None


def gpipe_one_backward(stage, micro_batches, shape):
    """The last stage runs ONE backward over the summed losses (the others still get m gradients)."""
    return _gpipe(stage, micro_batches, shape, one_backward=True)


def gpipe_sends_loss_back(stage, micro_batches, shape):
    return _gpipe(stage, micro_batches, shape, share_loss="to_first")


def gpipe_barrier_between_phases(stage, micro_batches, shape):
    """Right, with a dist.barrier() between the forwards and the backwards "so that every stage
    has finished its forwards" (the messages already order them)."""
    return _gpipe(stage, micro_batches, shape, barrier=True)


def gpipe_is_1f1b(stage, micro_batches, shape):
    """A correct 1F1B handed in as GPipe: the exercise asks for every forward first."""
    return _one_f_one_b(stage, micro_batches, shape)


# ------------------------------------------------ 3. 1F1B
def ofob_isend(stage, micro_batches, shape):
    """isend for every message, waited on at the end."""
    return _one_f_one_b(stage, micro_batches, shape)


def _p2p(sends=(), recvs=()):
    """Post every send and receive together in one dist.batch_isend_irecv and wait for all."""
    ops = ([dist.P2POp(dist.isend, t, peer) for t, peer in sends]
           + [dist.P2POp(dist.irecv, t, peer) for t, peer in recvs])
    if ops:
        for req in dist.batch_isend_irecv(ops):
            req.wait()


def ofob_keeps_latest(stage, micro_batches, shape):
    """Keeps the latest finished micro-batch in a variable until the next backward replaces it."""
    return _one_f_one_b(stage, micro_batches, shape, last=[])


def ofob_megatron_pairs(stage, micro_batches, shape):
    """Megatron-LM's structure: in the steady phase, send-forward is paired with recv-backward
    and send-backward with recv-forward in one dist.batch_isend_irecv each."""
    rank, p, m = dist.get_rank(), dist.get_world_size(), len(micro_batches)
    dev = parlab.device()
    prev, nxt = (None if stage.is_first else rank - 1), (None if stage.is_last else rank + 1)
    w = min(p - rank - 1, m)
    queue, total = [], torch.zeros((), device=dev)

    def new():
        return torch.empty(shape, device=dev)

    def recv_forward(i):
        if stage.is_first:
            return micro_batches[i][0]
        buf = new()
        _p2p(recvs=[(buf, prev)])
        return buf

    def forward(i, inp):
        nonlocal total
        if not stage.is_first:
            inp.requires_grad_()
        out = stage(inp)
        if stage.is_last:
            out = stage.loss(out, micro_batches[i][1]) / m
            total += out.detach()
        queue.append((inp, out))
        return out

    def backward(grad):
        inp, out = queue.pop(0)
        out.backward(grad)
        return None if stage.is_first else inp.grad

    for i in range(w):
        out = forward(i, recv_forward(i))
        _p2p(sends=[(out.detach(), nxt)])
    inp = recv_forward(w) if m > w else None
    for k in range(m - w):
        out = forward(w + k, inp)
        grad = None if stage.is_last else new()
        _p2p(sends=[] if stage.is_last else [(out.detach(), nxt)],
             recvs=[] if stage.is_last else [(grad, nxt)])
        gin = backward(grad)
        last = k == m - w - 1
        inp = None if (last or stage.is_first) else new()
        _p2p(sends=[] if stage.is_first else [(gin, prev)],
             recvs=[] if inp is None else [(inp, prev)])
        if stage.is_first and not last:
            inp = micro_batches[w + k + 1][0]
    for _ in range(w):
        grad = new()
        _p2p(recvs=[(grad, nxt)])
        gin = backward(grad)
        _p2p(sends=[] if stage.is_first else [(gin, prev)])
    return total if stage.is_last else None


def ofob_all_forward_first(stage, micro_batches, shape):
    """Called 1F1B, but runs every forward before any backward (GPipe in disguise)."""
    return _gpipe(stage, micro_batches, shape)


def ofob_warmup_p_minus_r(stage, micro_batches, shape):
    """One warm-up forward too many: p − r instead of p − r − 1."""
    return _one_f_one_b(stage, micro_batches, shape, warmup=lambda p, r, m: min(p - r, m))


def ofob_warmup_same_everywhere(stage, micro_batches, shape):
    """Every stage warms up with p − 1 forwards, as if it were stage 0."""
    return _one_f_one_b(stage, micro_batches, shape, warmup=lambda p, r, m: min(p - 1, m))


def ofob_retain_graph(stage, micro_batches, shape):
    """Right order, but keeps every micro-batch's (input, output) to the end of the step and calls
    backward(retain_graph=True): every graph, and its saved activations, stays alive."""
    return _one_f_one_b(stage, micro_batches, shape, retain=True)


def ofob_keeps_references(stage, micro_batches, shape):
    """Right order and no retain_graph, but every micro-batch's (input, output) stays in its dict."""
    return _one_f_one_b(stage, micro_batches, shape, keep=True)


def ofob_loss_not_divided(stage, micro_batches, shape):
    return _one_f_one_b(stage, micro_batches, shape, divide=False)


def ofob_all_reduces_loss(stage, micro_batches, shape):
    """Right, then sums the loss over every stage with dist.all_reduce so that each rank can log it."""
    return _one_f_one_b(stage, micro_batches, shape, share_loss="all_reduce")


def ofob_sends_loss_to_first(stage, micro_batches, shape):
    """Right, then the last stage sends the mean loss to stage 0 "so rank 0 can print it"."""
    return _one_f_one_b(stage, micro_batches, shape, share_loss="to_first")


def ofob_blocking_sends(stage, micro_batches, shape):
    """Blocking dist.send everywhere: in the steady phase stage r sends its activation forward
    while stage r + 1 sends a gradient back, and both wait for the other's recv."""
    return _one_f_one_b(stage, micro_batches, shape, blocking=True)


# ------------------------------------------------ 4. measuring the bubble (plain functions)
_BUSY = ("forward", "backward")


def _covered(intervals):
    total, reach = 0.0, float("-inf")
    for a, b in sorted(intervals):
        a = max(a, reach)
        if b > a:
            total, reach = total + b - a, b
    return total


def bubble_by_events(spans):
    """Correct, another way: sweep over start/end events of every stage at once."""
    busy = [s for s in spans if s.name in _BUSY]
    t0, t1 = min(s.start for s in busy), max(s.end for s in busy)
    ranks = sorted({s.rank for s in busy})
    idle = 0.0
    for r in ranks:
        events = sorted([(s.start, 1) for s in busy if s.rank == r] + [(s.end, -1) for s in busy if s.rank == r])
        depth, last, busy_time = 0, t0, 0.0
        for t, d in events:
            if depth > 0:
                busy_time += t - last
            depth, last = depth + d, t
        idle += (t1 - t0 - busy_time) / (t1 - t0)
    return idle / len(ranks)


def bubble_any_span_window(spans):
    """The window from the first to the last span of any kind, sends and receives included."""
    busy = [s for s in spans if s.name in _BUSY]
    t0, t1 = min(s.start for s in spans), max(s.end for s in spans)
    ranks = sorted({s.rank for s in busy})
    return sum(1 - _covered([(s.start, s.end) for s in busy if s.rank == r]) / (t1 - t0)
               for r in ranks) / len(ranks)


def predict_from_cost(p, m, schedule, rank, mb_bytes):
    """Right numbers, from the check's own reference (parlab.cost) instead of a formula."""
    from parlab import cost

    return cost.bubble_fraction(p, m, schedule), cost.activations_held(p, m, schedule, rank) * mb_bytes


def bubble_own_window(spans):
    """Each stage measured over its own first and last span."""
    shares = []
    for r in sorted({s.rank for s in spans}):
        mine = [s for s in spans if s.rank == r and s.name in _BUSY]
        a, b = min(s.start for s in mine), max(s.end for s in mine)
        shares.append(1 - _covered([(s.start, s.end) for s in mine]) / (b - a))
    return sum(shares) / len(shares)


def bubble_counts_comm(spans):
    """Counts send and recv spans as busy."""
    busy = [s for s in spans if s.name in _BUSY]
    t0, t1 = min(s.start for s in busy), max(s.end for s in busy)
    ranks = sorted({s.rank for s in spans})
    return sum(1 - _covered([(max(s.start, t0), min(s.end, t1)) for s in spans if s.rank == r]) / (t1 - t0)
               for r in ranks) / len(ranks)


def bubble_sums_durations(spans):
    """Adds up span lengths: overlapping spans count twice."""
    busy = [s for s in spans if s.name in _BUSY]
    t0, t1 = min(s.start for s in busy), max(s.end for s in busy)
    ranks = sorted({s.rank for s in busy})
    return sum(1 - sum(s.end - s.start for s in busy if s.rank == r) / (t1 - t0) for r in ranks) / len(ranks)


def bubble_megatron(spans):
    """Idle time divided by busy time."""
    busy = [s for s in spans if s.name in _BUSY]
    t0, t1 = min(s.start for s in busy), max(s.end for s in busy)
    ranks = sorted({s.rank for s in busy})
    work = sum(_covered([(s.start, s.end) for s in busy if s.rank == r]) for r in ranks)
    return (len(ranks) * (t1 - t0) - work) / work


def bubble_per_stage(spans):
    """Returns every stage's idle share instead of their mean."""
    busy = [s for s in spans if s.name in _BUSY]
    t0, t1 = min(s.start for s in busy), max(s.end for s in busy)
    return {r: 1 - _covered([(s.start, s.end) for s in busy if s.rank == r]) / (t1 - t0)
            for r in sorted({s.rank for s in busy})}


# ------------------------------------------------ 5. predictions (plain functions)
def predict_with_min(p, m, schedule, rank, mb_bytes):
    """Correct, written with cost-free arithmetic and an explicit warm-up count."""
    warmup = min(p - rank - 1, m)
    held = m if schedule == "gpipe" else min(warmup + 1, m)
    return 1 - m / (m + p - 1), held * mb_bytes


def predict_megatron(p, m, schedule, rank, mb_bytes):
    return (p - 1) / m, (m if schedule == "gpipe" else min(p - rank, m)) * mb_bytes


def predict_1f1b_no_bubble(p, m, schedule, rank, mb_bytes):
    bubble = (p - 1) / (m + p - 1) if schedule == "gpipe" else 0.0
    return bubble, (m if schedule == "gpipe" else min(p - rank, m)) * mb_bytes


def predict_held_p_everywhere(p, m, schedule, rank, mb_bytes):
    return (p - 1) / (m + p - 1), (m if schedule == "gpipe" else p) * mb_bytes


def predict_warmup_only(p, m, schedule, rank, mb_bytes):
    return (p - 1) / (m + p - 1), (m if schedule == "gpipe" else min(p - rank - 1, m)) * mb_bytes


def predict_warmup_plus_one(p, m, schedule, rank, mb_bytes):
    """1F1B holds the warm-up forwards plus one in flight, even when the warm-up took all m."""
    held = m if schedule == "gpipe" else min(p - rank - 1, m) + 1
    return (p - 1) / (m + p - 1), held * mb_bytes


def predict_counts_not_bytes(p, m, schedule, rank, mb_bytes):
    return (p - 1) / (m + p - 1), m if schedule == "gpipe" else min(p - rank, m)


CORRECT = {
    "single": [single_isend_irecv, single_batch_p2p],
    "gpipe": [gpipe_blocking, gpipe_reverse_backward],
    "1f1b": [ofob_isend, ofob_megatron_pairs, ofob_keeps_latest],
    "bubble": [bubble_by_events],
    "prediction": [predict_with_min],
}

def gpipe_zeroes_first(stage, micro_batches, shape):
    """Right numbers, but zeroes the gradients through an optimizer of its own first: the caller's job."""
    torch.optim.SGD(stage.parameters(), lr=0.0).zero_grad()
    return gpipe_blocking(stage, micro_batches, shape)


def ofob_zeroes_first(stage, micro_batches, shape):
    """Right numbers, but zeroes the stage's gradients first (stage.zero_grad): the caller's job."""
    stage.zero_grad(set_to_none=True)
    return ofob_isend(stage, micro_batches, shape)


WRONG = {
    "single": [(single_sends_loss_back, "(the loss?)"),
               (single_broadcasts_loss, "called dist.broadcast"),
               (single_sends_received_grad, says("the first wrong stage on the way back is stage 1",
                                                 "the one at stage 2's output", "stage 2 sent back the gradient it "
                                                 "received instead of the gradient of its INPUT",
                                                 never="same micro-batch")),
               (single_first_stage_skips_backward, "have no gradient (None)"),
               (single_zeroes_first, ("called GPTStage.zero_grad()", "the caller zeroes the gradients")),
               (single_steps_optimizer, says("gradients of step 1 are right but its parameters after the step are "
                                             "not (stage 0 called SGD.step() during step 1)",
                                             "leave the optimizer", never=("zero_grad", "Divide each")))],
    "gpipe": [(gpipe_loss_not_divided, "Divide each micro-batch's loss by m"),
              (gpipe_zeroes_first, ("called SGD.zero_grad()", "the caller zeroes the gradients")),
              (gpipe_divides_by_stages, says("every gradient is 1/2 of the single-process reference",
                                             never=("divided by m twice", "number of stages"), differs=True)),
              (gpipe_zero_grad_between, "only the LAST micro-batch's"),
              (gpipe_backward_order_mismatch, says("the first wrong stage on the way back is stage 2",
                                                   "another micro-batch's gradient (in reverse order",
                                                   never="INPUT")),
              (gpipe_returns_sum, "SUM of the"),
              (gpipe_one_backward, "call backward once per micro-batch"),
              (gpipe_sends_loss_back, "(the loss?)"),
              (gpipe_is_1f1b, "forwards before its first backward"),
              (gpipe_barrier_between_phases, "called dist.barrier")],
    "1f1b": [(ofob_all_forward_first, "forwards before its first backward"),
             (ofob_zeroes_first, ("called GPTStage.zero_grad()", "the caller zeroes the gradients")),
             (ofob_warmup_p_minus_r, "warm-up forwards"),
             (ofob_warmup_same_everywhere, "warm-up forwards"),
             (ofob_retain_graph, "retain_graph"),
             (ofob_keeps_references, "whose backward had already run"),
             (ofob_loss_not_divided, "Divide each micro-batch's loss by m"),
             (ofob_all_reduces_loss, "called dist.all_reduce"),
             (ofob_sends_loss_to_first, "(the loss?)")],
    "bubble": [(bubble_own_window, "SAME window"), (bubble_counts_comm, "send and recv"),
               (bubble_sums_durations, "union"), (bubble_megatron, "Megatron's ratio"),
               (bubble_per_stage, "return ONE number"),
               (bubble_any_span_window, "over the compute spans only")],
    "prediction": [(predict_megatron, "Megatron's definition"), (predict_1f1b_no_bubble, "keeps GPipe's bubble"),
                   (predict_held_p_everywhere, "p only on stage 0"), (predict_warmup_only, "warm-up forwards only"),
                   (predict_counts_not_bytes, "multiply by mb_bytes"),
                   (predict_from_cost, "parlab.cost.bubble_fraction"),
                   (predict_warmup_plus_one, says("When m doubles, your answer grows 1.333 times, not 2 times",
                                                  "the dependence on the number of micro-batches"))],
}

WRONG_HIDDEN: dict = {}

ALONE = {
    # hangs until the process group's timeout; the message names the rank, its stage and the send
    "1f1b": [(ofob_blocking_sends, ("send", "rank", "stage"))],
    # raises on every stage but the first, while stage 0 waits
    "single": [(single_detached_input, "requires_grad_()")],
}
