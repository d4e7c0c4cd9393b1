"""Typical wrong answers to Lab 01's exercises (collectives from primitives), and right ones.

The four tables of tests/answer_suite.py, keyed by ``parlab.grading.lab01.EXERCISES``:
``CORRECT`` (right answers written differently from the notebook's), ``WRONG`` and
``WRONG_HIDDEN`` (each with the words the check's message must contain), ``ALONE`` (a
deadlock, a size mismatch that gloo aborts, an error on one rank: graded one at a time
with a short timeout).  Exercises "rs_ag", "ring" and "tree" run on ranks; "bandwidths"
is a plain function.  tests/ranks/test_lab01.py runs every answer.
"""
import math

import torch
import torch.distributed as dist

from wrong_answers import says


# ------------------------------------------------ 1. all-reduce = reduce-scatter + all-gather

def rs_ag_forgets_remainder(x):
    """Splits numel // n elements per rank and never touches the leftover tail."""
    n = dist.get_world_size()
    out = x.reshape(-1).clone()
    c = out.numel() // n
    mine = torch.empty(c, dtype=x.dtype)
    dist.reduce_scatter(mine, list(out[: c * n].split(c)))
    parts = [torch.empty_like(mine) for _ in range(n)]
    dist.all_gather(parts, mine)
    out[: c * n] = torch.cat(parts)
    return out.reshape(x.shape)


def rs_ag_returns_own_chunk(x):
    """Stops after the reduce-scatter and returns this rank's reduced chunk."""
    n = dist.get_world_size()
    c = -(-x.numel() // n)
    padded = torch.zeros(c * n, dtype=x.dtype)
    padded[: x.numel()] = x.reshape(-1)
    mine = torch.empty(c, dtype=x.dtype)
    dist.reduce_scatter(mine, list(padded.split(c)))
    return mine


def rs_ag_no_all_gather(x):
    """Reduces its own chunk in place but never gathers the other chunks."""
    n, rank = dist.get_world_size(), dist.get_rank()
    c = -(-x.numel() // n)
    padded = torch.zeros(c * n, dtype=x.dtype)
    padded[: x.numel()] = x.reshape(-1)
    mine = torch.empty(c, dtype=x.dtype)
    dist.reduce_scatter(mine, list(padded.split(c)))
    padded[rank * c:(rank + 1) * c] = mine
    return padded[: x.numel()].reshape(x.shape)


def rs_ag_default_dtype(x):
    """Builds its buffers without dtype=x.dtype: right for float32, wrong for other dtypes."""
    n = dist.get_world_size()
    c = -(-x.numel() // n)
    padded = torch.zeros(c * n)
    padded[: x.numel()] = x.reshape(-1)
    mine = torch.empty(c)
    dist.reduce_scatter(mine, list(padded.split(c)))
    parts = [torch.empty(c) for _ in range(n)]
    dist.all_gather(parts, mine)
    return torch.cat(parts)[: x.numel()].reshape(x.shape)


def rs_ag_uses_all_reduce(x):
    """Right numbers, but from the built-in all_reduce the exercise rules out."""
    out = x.clone()
    dist.all_reduce(out)
    return out


def rs_ag_result_into_input(x):
    """Pads, reduce-scatters and all-gathers correctly, then writes the sum into x and returns x."""
    n = dist.get_world_size()
    c = -(-x.numel() // n)
    padded = torch.zeros(c * n, dtype=x.dtype, device=x.device)
    padded[: x.numel()] = x.reshape(-1)
    mine = torch.empty(c, dtype=x.dtype, device=x.device)
    dist.reduce_scatter_tensor(mine, padded)
    dist.all_gather_into_tensor(padded, mine)
    x.copy_(padded[: x.numel()].view(x.shape))
    return x


def rs_ag_only_reduce_scatter(x):
    """Reduce-scatters, then rebuilds the rest with broadcasts instead of an all-gather."""
    n = dist.get_world_size()
    c = -(-x.numel() // n)
    padded = torch.zeros(c * n, dtype=x.dtype, device=x.device)
    padded[: x.numel()] = x.reshape(-1)
    mine = torch.empty(c, dtype=x.dtype, device=x.device)
    dist.reduce_scatter_tensor(mine, padded)
    parts = [mine if r == dist.get_rank() else torch.empty_like(mine) for r in range(n)]
    for r in range(n):
        dist.broadcast(parts[r], src=r)
    return torch.cat(parts)[: x.numel()].view(x.shape)


# ------------------------------------------------ 2. ring all-reduce from point-to-point

def _exchange(send, recv, rank, n):
    reqs = [dist.isend(send, (rank + 1) % n), dist.irecv(recv, (rank - 1) % n)]
    for r in reqs:
        r.wait()


def _ring(x, rs_steps, ag_steps, ag_offset=1, chunks_of=None, in_place=False):
    """A ring all-reduce with knobs to get it wrong."""
    rank, n = dist.get_rank(), dist.get_world_size()
    out = x.view(-1) if in_place else x.reshape(-1).clone()
    chunks = chunks_of(out, n) if chunks_of else list(out.tensor_split(n))
    for s in range(rs_steps(n)):
        i = (rank - s - 1) % n
        buf = torch.empty_like(chunks[i])
        _exchange(chunks[(rank - s) % n], buf, rank, n)
        chunks[i] += buf
    for s in range(ag_steps(n)):
        buf = torch.empty_like(chunks[(rank - s) % n])
        _exchange(chunks[(rank + ag_offset - s) % n], buf, rank, n)
        chunks[(rank - s) % n].copy_(buf)
    return out.reshape(x.shape)


def ring_one_step_short(x):
    """Reduce-scatter phase runs n-2 steps instead of n-1."""
    return _ring(x, lambda n: n - 2, lambda n: n - 1)


def ring_forgets_remainder(x):
    """Chunks of numel // n elements: the tail is never reduced."""
    def floor_chunks(out, n):
        c = out.numel() // n
        return list(out[: c * n].split(c)) if c else [out[:0]] * n
    return _ring(x, lambda n: n - 1, lambda n: n - 1, chunks_of=floor_chunks)


def ring_no_all_gather(x):
    """Only the reduce-scatter phase; every other chunk holds a partial sum."""
    return _ring(x, lambda n: n - 1, lambda n: 0)


def ring_all_gather_wrong_chunk(x):
    """All-gather phase starts from chunk `rank` (partial) instead of `rank + 1` (complete)."""
    return _ring(x, lambda n: n - 1, lambda n: n - 1, ag_offset=0)


def ring_blocking_deadlock(x):
    """Every rank sends first with blocking send: on gloo nobody ever gets to recv."""
    rank, n = dist.get_rank(), dist.get_world_size()
    out = x.reshape(-1).clone()
    chunks = list(out.tensor_split(n))
    for s in range(n - 1):
        i = (rank - s - 1) % n
        buf = torch.empty_like(chunks[i])
        dist.send(chunks[(rank - s) % n].contiguous(), (rank + 1) % n)
        dist.recv(buf, (rank - 1) % n)
        chunks[i] += buf
    return out.reshape(x.shape)


def ring_recv_buffer_wrong_size(x):
    """Sizes the receive buffer like the chunk it sends: fine for even chunks, but
    with uneven ones gloo aborts on the size mismatch."""
    rank, n = dist.get_rank(), dist.get_world_size()
    out = x.reshape(-1).clone()
    chunks = list(out.tensor_split(n))
    for s in range(n - 1):
        send = chunks[(rank - s) % n]
        buf = torch.empty_like(send)
        _exchange(send, buf, rank, n)
        chunks[(rank - s - 1) % n] += buf
    for s in range(n - 1):
        send = chunks[(rank + 1 - s) % n]
        buf = torch.empty_like(send)
        _exchange(send, buf, rank, n)
        chunks[(rank - s) % n].copy_(buf)
    return out.reshape(x.shape)


def ring_raises_on_one_rank(x):
    """A bug only one rank hits (indexing past the last chunk on the last rank)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    chunks = list(x.reshape(-1).tensor_split(n))
    return chunks[rank + 1] if rank == n - 1 else x


def ring_uses_all_reduce(x):
    """Right numbers from the built-in collective, not from send/recv."""
    out = x.clone()
    dist.all_reduce(out)
    return out


def ring_whole_buffer(x):
    """Passes the whole buffer around the ring n - 1 times: right sum, but every message is
    the full tensor (n times the traffic of a real ring all-reduce)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    total, passing = x.clone(), x.clone()
    for _ in range(n - 1):
        buf = torch.empty_like(passing)
        _exchange(passing, buf, rank, n)
        total += buf
        passing = buf
    return total


def ring_everyone_to_everyone(x):
    """Sends its input straight to every other rank with isend/irecv and adds what arrives."""
    rank, n = dist.get_rank(), dist.get_world_size()
    bufs = {p: torch.empty_like(x) for p in range(n) if p != rank}
    reqs = [dist.isend(x.contiguous(), p) for p in bufs] + [dist.irecv(b, p) for p, b in bufs.items()]
    for q in reqs:
        q.wait()
    return x + sum(bufs.values())


def ring_in_place(x):
    """A correct ring, but on a view of x: the input is overwritten with the sum."""
    return _ring(x, lambda n: n - 1, lambda n: n - 1, in_place=True)


# ------------------------------------------------ 3. tree broadcast from send/recv

def tree_assumes_root_zero(x, root):
    """Heap tree over the real ranks: always broadcasts rank 0's data."""
    rank, n = dist.get_rank(), dist.get_world_size()
    if rank > 0:
        dist.recv(x, (rank - 1) // 2)
    for c in (2 * rank + 1, 2 * rank + 2):
        if c < n:
            dist.send(x, c)
    return x


def tree_power_of_two_only(x, root):
    """Binomial tree with floor(log2 n) rounds: misses ranks when n is not a power of two."""
    rank, n = dist.get_rank(), dist.get_world_size()
    v = (rank - root) % n
    for k in range(int(math.log2(n))):
        step = 2 ** k
        if v < step and v + step < n:
            dist.send(x, (v + step + root) % n)
        elif step <= v < 2 * step:
            dist.recv(x, (v - step + root) % n)
    return x


def tree_returns_input(x, root):
    """Receives into a fresh buffer, forwards it, but returns the untouched input."""
    rank, n = dist.get_rank(), dist.get_world_size()
    v = (rank - root) % n
    buf = x.clone()
    if v > 0:
        dist.recv(buf, ((v - 1) // 2 + root) % n)
    for c in (2 * v + 1, 2 * v + 2):
        if c < n:
            dist.send(buf, (c + root) % n)
    return x


def tree_uses_broadcast(x, root):
    """The built-in collective the exercise rules out."""
    dist.broadcast(x, src=root)
    return x


def tree_linear_from_root(x, root):
    """Root sends to every other rank in turn: right values, but a chain from one rank."""
    rank, n = dist.get_rank(), dist.get_world_size()
    if rank == root:
        for r in range(n):
            if r != root:
                dist.send(x, r)
    else:
        dist.recv(x, root)
    return x


# ------------------------------------------------ 4. algbw and busbw (GB/s)

def bw_factor_two(numel, dtype, seconds, n):
    s = numel * dtype.itemsize
    return s / seconds / 1e9, 2 * s / seconds / 1e9


def bw_per_rank_bytes(numel, dtype, seconds, n):
    s = numel * dtype.itemsize / n
    return s / seconds / 1e9, s / seconds * 2 * (n - 1) / n / 1e9


def bw_bits(numel, dtype, seconds, n):
    bits = numel * torch.finfo(dtype).bits if dtype.is_floating_point else numel * torch.iinfo(dtype).bits
    return bits / seconds / 1e9, bits / seconds * 2 * (n - 1) / n / 1e9


def bw_elements_not_bytes(numel, dtype, seconds, n):
    return numel / seconds / 1e9, numel / seconds * 2 * (n - 1) / n / 1e9


def bw_algbw_times_ranks(numel, dtype, seconds, n):
    """algbw as the bandwidth of all the ranks together: S/t times the number of ranks."""
    algbw = numel * dtype.itemsize / seconds / 1e9 * n
    return algbw, algbw * 2 * (n - 1) / n


def bw_busbw_factor_inverted(numel, dtype, seconds, n):
    """busbw with the all-reduce factor upside down: 2n/(n − 1)."""
    algbw = numel * dtype.itemsize / seconds / 1e9
    return algbw, algbw * 2 * n / (n - 1)


def rs_ag_gathers_first(x):
    """All-gathers every input and sums them, then calls the two collectives for show."""
    n = dist.get_world_size()
    parts = [torch.empty_like(x) for _ in range(n)]
    dist.all_gather(parts, x)
    c = -(-x.numel() // n)
    dummy = torch.zeros(c * n, dtype=x.dtype)
    mine = torch.empty(c, dtype=x.dtype)
    dist.reduce_scatter(mine, list(dummy.split(c)))
    dist.all_gather([torch.empty_like(mine) for _ in range(n)], mine)
    return torch.stack(parts).sum(0)


def rs_ag_gathers_the_input(x):
    """A reduce-scatter whose result is dropped, then an all-gather of every whole input, summed."""
    n = dist.get_world_size()
    c = -(-x.numel() // n)
    padded = torch.zeros(c * n, dtype=x.dtype)
    padded[: x.numel()] = x.reshape(-1)
    dist.reduce_scatter(torch.empty(c, dtype=x.dtype), list(padded.split(c)))
    parts = [torch.empty_like(x) for _ in range(n)]
    dist.all_gather(parts, x)
    return torch.stack(parts).sum(0)


def tree_binomial_isend(x, root):
    """Binomial tree: in round k, every rank that has the data sends it 2**k ranks further.
    The notebook's binary tree's partners on up to 4 ranks, not on 5."""
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


WRONG = {
    "rs_ag": [
        (rs_ag_forgets_remainder, "forget the last chunk"),
        (rs_ag_returns_own_chunk, "only its own chunk"),
        (rs_ag_no_all_gather, "own input"),
        (rs_ag_default_dtype, "must keep the input's dtype"),
        (rs_ag_uses_all_reduce, "called dist.all_reduce"),
        (rs_ag_result_into_input, "input x was modified"),
        (rs_ag_only_reduce_scatter, "never called dist.all_gather"),
        (rs_ag_gathers_first, ("called dist.all_gather of", "before its first reduce-scatter")),
        (rs_ag_gathers_the_input, ("more than one reduced chunk", "not the input")),
    ],
    "ring": [
        (ring_one_step_short, "only some ranks' inputs"),
        (ring_forgets_remainder, "forget the last chunk"),
        (ring_no_all_gather, "only some ranks' inputs"),
        (ring_all_gather_wrong_chunk, "differs from all_reduce"),
        (ring_uses_all_reduce, "called dist.all_reduce"),
        (ring_whole_buffer, "carries one chunk"),
        (ring_everyone_to_everyone, "only to its right neighbour"),
        (ring_in_place, "input x was modified"),
    ],
    "tree": [
        (tree_assumes_root_zero, "assume the root is rank 0"),
        (tree_returns_input, "own input: the broadcast never reached"),
        (tree_uses_broadcast, "called dist.broadcast"),
        (tree_linear_from_root, "linear chain"),
    ],
    "bandwidths": [
        (bw_factor_two, "factor 2"),
        (bw_per_rank_bytes, "not one rank's share"),
        (bw_bits, "bits instead of bytes"),
        (bw_elements_not_bytes, "not elements"),
        (bw_algbw_times_ranks, says("When world_size doubles, your answer grows 2 times, not 1 times",
                                    "a dependence on world_size (algbw = S/t has none)",
                                    never="1/world_size")),
        (bw_busbw_factor_inverted, says("When world_size doubles, your answer grows",
                                        "the all-reduce factor 2(n − 1)/n", never="factor 2;")),
    ],
}

#: Caught only by the hidden tests (other world sizes and sizes).
WRONG_HIDDEN = {
    "tree": [(tree_power_of_two_only, "not a power of two"),
             # The notebook's binary tree on 3 and 4 ranks, not on 5, where the root sends to 4 too.
             (tree_binomial_isend, ("called dist.isend of", "its children in the binary tree"))],
}

#: Hang or crash some ranks: each is graded alone, through the public check, so that it
#: stops no other answer's launch.  The crash comes at numel 10 on 4 ranks: a shape error
#: on one rank, gloo's size abort on another.
ALONE = {
    "ring": [
        (ring_blocking_deadlock, ("did not finish", "blocking dist.send")),
        (ring_recv_buffer_wrong_size, "must match the size"),
        (ring_raises_on_one_rank, ("raised an error on 4 ranks", "IndexError", "rank 3")),
    ],
}


# ------------------------------------------------ right, written differently

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
    "rs_ag": [rs_ag_padded, rs_ag_tensor_api],
    "ring": [ring_isend_irecv, ring_even_odd_blocking, ring_batch_p2p],
    "tree": [tree_binary_heap, tree_into_clone],
    "bandwidths": [bandwidths, bandwidths_tensor],
}
