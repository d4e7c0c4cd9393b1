"""Answers to Lab 05's exercises (ZeRO-1/2/3 by hand, FSDP2, memory and bytes), right and wrong.

The four tables of tests/answer_suite.py, keyed by the exercises of
``parlab.grading.lab05.EXERCISES``: ``CORRECT`` (right answers written
differently from the notebook's), ``WRONG`` (answers students really write,
each with the words the check's message must contain), ``WRONG_HIDDEN`` and
``ALONE`` (none in this lab).  The ZeRO fixtures are small variations of one
flat-shard design (``_Flat``) or one per-layer design (``_Layers``), each
with the one mistake its name says.  Among them, answers with the right
numbers that break a stated rule: every rank stepping the whole model
(``zero1_full_model``, ``zero2_steps_every_param``, ``zero3_full_master``),
a formula taken from ``parlab.cost`` (``memory_from_cost``,
``comm_from_cost``).  Answers whose parameters differ must also say which
state of the optimizers first differs, at which step and on which ranks:
the gradient (``zero1_grad_at_floor_offset``, a gradient shard taken at
another offset; ``zero3_summed``; ``zero2_divided_twice``), the momentum or
Adam's moments (``zero1_new_optimizer_each_step``, ``zero3_state_emptied``),
the fp32 master values (``zero2_master_from_wrong_offset``), or how often a
shard was stepped (``zero3_steps_in_hook``).  tests/ranks/test_lab05.py runs
every fixture, batched into one launch per world size.
"""
import torch
import torch.distributed as dist

import parlab
from wrong_answers import says


# ------------------------------------------------------------ shared pieces of the fixtures
class _Flat:
    """A flat fp32 shard of the trainable parameters per rank: padded to ceil(numel / n) elements.

    Frozen parameters (``requires_grad=False``) are left out, as the exercise says.
    """

    divide = True

    def __init__(self, params, make_optimizer):
        self.params = self.sharded(list(params))
        self.n, self.rank = dist.get_world_size(), dist.get_rank()
        self.numel = sum(p.numel() for p in self.params)
        self.chunk = self.chunk_size()
        flat = self.padded([p.detach() for p in self.params])  # (chunk·n,): every trainable element, padded
        # (chunk,): this rank's slice of the flat vector, the only part it steps
        self.shard = flat[self.rank * self.chunk:(self.rank + 1) * self.chunk].clone().requires_grad_()
        self.opt = make_optimizer(self.optimized())

    def sharded(self, params):
        return [p for p in params if p.requires_grad]

    def chunk_size(self):
        return -(-self.numel // self.n)

    def optimized(self):
        return [self.shard]

    def padded(self, tensors):
        out = torch.zeros(self.chunk * self.n, dtype=tensors[0].dtype)
        flat = torch.cat([t.reshape(-1) for t in tensors])[: self.chunk * self.n]
        out[: flat.numel()] = flat
        return out

    def grads(self):
        return self.padded([p.grad for p in self.params])

    def scatter_grads(self):
        # g: (chunk·n,), this rank's full gradient, flat and padded
        g = self.grads()
        mine = torch.empty(self.chunk)  # (chunk,): the sum over ranks of this rank's slice
        dist.reduce_scatter_tensor(mine, g)
        return mine / self.n if self.divide else mine

    def gather(self):
        full = torch.empty(self.chunk * self.n)  # (chunk·n,): every rank's updated shard, in rank order
        dist.all_gather_into_tensor(full, self.shard.detach())
        self.write(full)

    def write(self, flat):
        off = 0
        with torch.no_grad():
            for p in self.params:
                if off + p.numel() <= flat.numel():
                    p.copy_(flat[off:off + p.numel()].view_as(p))
                off += p.numel()

    def step(self):
        self.shard.grad = self.scatter_grads()
        self.opt.step()
        self.gather()


# ------------------------------------------------------------ exercise 3: ZeRO-1
class zero1_full_model(_Flat):
    """Averages the gradients, then every rank steps every parameter."""

    def optimized(self):
        return self.params

    def step(self):
        for p in self.params:
            dist.all_reduce(p.grad)
            p.grad /= self.n
        self.opt.step()


class zero1_shards_off_by_one(_Flat):
    """Shards of numel // n elements: the remainder at the end is never stepped."""

    def chunk_size(self):
        return self.numel // self.n


class zero1_no_all_gather(_Flat):
    """Steps its own shard and writes it back, but never gathers the other ranks' shards."""

    def gather(self):
        flat = self.padded([p.detach() for p in self.params])
        flat[self.rank * self.chunk:(self.rank + 1) * self.chunk] = self.shard.detach()
        self.write(flat)


class zero1_never_writes_back(_Flat):
    """Steps its shard, but never gathers or writes the updated shards into the model."""

    def gather(self):
        pass


class zero1_new_optimizer_each_step(_Flat):
    """Builds a new optimizer for its shard at every step: the momentum and variance start over."""

    def __init__(self, params, make_optimizer):
        super().__init__(params, make_optimizer)
        self.make = make_optimizer

    def step(self):
        self.opt = self.make(self.optimized())
        super().step()


class zero1_no_reduce(_Flat):
    """Steps its shard with its own gradient's slice: never reduce-scatters over the ranks."""

    def scatter_grads(self):
        return self.grads()[self.rank * self.chunk:(self.rank + 1) * self.chunk].clone()


class zero1_summed(_Flat):
    """Reduce-scatters the gradients but never divides by world_size."""

    divide = False


class zero1_grad_at_floor_offset(_Flat):
    """Holds the shard at rank · ceil(Ψ / N) but takes its gradient at rank · (Ψ // N): the gradient
    shard of other elements (Ψ = 83 on 3 ranks: 1 element off on rank 1, 2 on rank 2)."""

    def scatter_grads(self):
        g = self.grads()
        dist.all_reduce(g)
        lo = self.rank * (self.numel // self.n)
        return g[lo:lo + self.chunk] / self.n


class zero1_crashes_on_frozen(_Flat):
    """Flattens every parameter's .grad, frozen ones included: None has no reshape."""

    def sharded(self, params):
        return params


class _ZeroFilled(_Flat):
    """Shards every parameter and fills a frozen one's missing gradient with zeros."""

    def sharded(self, params):
        return params

    def grads(self):
        return self.padded([p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params])


class zero1_zero_fills_frozen(_ZeroFilled):
    """AdamW's weight decay then shrinks the frozen parameters, though their gradient is zero."""


class zero1_writes_every_param(_Flat):
    """Shards the trainable parameters, but writes the gathered vector back over all of them."""

    def __init__(self, params, make_optimizer):
        self.every = list(params)
        super().__init__(self.every, make_optimizer)

    def write(self, flat):
        trainable, self.params = self.params, self.every
        try:
            super().write(flat)
        finally:
            self.params = trainable


# ------------------------------------------------------------ exercise 4: ZeRO-2
class _Freeing(_Flat):
    def step(self):
        super().step()
        for p in self.params:
            p.grad = None


class zero2_all_reduce(_Freeing):
    """All-reduces the whole gradient, then keeps its shard: right numbers, no saving."""

    def scatter_grads(self):
        g = self.grads()
        dist.all_reduce(g)
        return g[self.rank * self.chunk:(self.rank + 1) * self.chunk] / self.n


class zero2_keeps_grads(_Flat):
    """Reduce-scatters, but the model keeps its full gradients after the step."""


class zero2_summed(_Freeing):
    divide = False


class zero2_divided_twice(_Freeing):
    """Divides each rank's gradient by world_size before the reduce-scatter, and the sum again after."""

    def grads(self):
        return super().grads() / self.n


class zero2_zero_fills_frozen(_ZeroFilled):
    """ZeRO-2 that zero-fills the frozen parameters' gradients: weight decay moves them."""

    def step(self):
        super().step()
        for p in self.params:
            p.grad = None


class zero2_keeps_flat_buffer(_Flat):
    """Reduce-scatters from a full-size flat gradient buffer that it keeps between steps."""

    def step(self):
        if not hasattr(self, "flat"):
            self.flat = torch.zeros(self.chunk * self.n)
        self.flat.zero_()
        self.flat[: self.numel] = torch.cat([p.grad.reshape(-1) for p in self.params])
        for p in self.params:
            p.grad = None
        mine = torch.empty(self.chunk)
        dist.reduce_scatter_tensor(mine, self.flat)
        self.shard.grad = mine / self.n
        self.opt.step()
        self.gather()


class zero2_master_from_wrong_offset(_Freeing):
    """Steps its shard right, then copies the gathered parameters back into its fp32 shard (to keep
    it in sync) from rank · (Ψ // N), not rank · ceil(Ψ / N): the next step starts from other values."""

    def gather(self):
        super().gather()
        flat = self.padded([p.detach() for p in self.params])
        lo = self.rank * (self.numel // self.n)
        with torch.no_grad():
            self.shard.copy_(flat[lo:lo + self.chunk])


class zero2_steps_every_param(_Flat):
    """Reduce-scatters the gradients, then all-gathers them back so that every rank steps every parameter."""

    def optimized(self):
        return self.params

    def step(self):
        full = torch.empty(self.chunk * self.n)  # (chunk·n,): every rank's averaged shard, padded
        dist.all_gather_into_tensor(full, self.scatter_grads())
        off = 0
        for p in self.params:
            p.grad = full[off:off + p.numel()].view_as(p).clone()
            off += p.numel()
        self.opt.step()
        for p in self.params:
            p.grad = None


# ------------------------------------------------------------ exercise 5: ZeRO-3
class _Layers:
    """One padded flat buffer per layer; params are views of it; storage resized to 0 when freed."""

    regather = True
    free_after_forward = True
    free_grads = True
    divide = True

    def __init__(self, layers, make_optimizer):
        self.n, self.rank = dist.get_world_size(), dist.get_rank()
        self.units = []
        for layer in layers:
            params = list(layer.parameters())
            numel = sum(p.numel() for p in params)
            chunk = -(-numel // self.n)
            full = torch.zeros(chunk * self.n)  # (chunk·n,): the layer's parameters, flat and padded
            full[:numel] = torch.cat([p.detach().reshape(-1) for p in params])
            u = {"params": params, "full": full, "chunk": chunk, "numel": numel, "ready": 0,
                 # (chunk,): this rank's slice of the layer, kept while the full buffer is freed
                 "shard": full[self.rank * chunk:(self.rank + 1) * chunk].clone().requires_grad_()}
            off = 0
            for p in params:
                p.data = full[off:off + p.numel()].view_as(p)
                off += p.numel()
            self.free(u)
            self.units.append(u)
            layer.register_forward_pre_hook(lambda m, a, u=u: self.gather(u))
            layer.register_forward_hook(lambda m, a, out, u=u: self.after_forward(u, out))
            for p in params:
                p.register_post_accumulate_grad_hook(lambda p, u=u: self.grad_ready(u))
        self.opt = make_optimizer(self.optimized())

    def optimized(self):
        return [u["shard"] for u in self.units]

    def free(self, u):
        u["full"].untyped_storage().resize_(0)

    def gather(self, u):
        full = u["full"]
        full.untyped_storage().resize_(full.numel() * 4)
        dist.all_gather_into_tensor(full, u["shard"].detach())

    def after_forward(self, u, out):
        if self.free_after_forward:
            self.free(u)
        if self.regather and out.requires_grad:
            out.register_hook(lambda g, u=u: self.gather(u))

    def reduce(self, u, g):
        mine = torch.empty(u["chunk"])  # (chunk,): the sum over ranks of this rank's slice of the layer
        dist.reduce_scatter_tensor(mine, g)
        return mine

    def grad_ready(self, u):
        u["ready"] += 1
        if u["ready"] < len(u["params"]):
            return
        u["ready"] = 0
        g = torch.zeros(u["chunk"] * self.n)
        g[: u["numel"]] = torch.cat([p.grad.reshape(-1) for p in u["params"]])
        for p in u["params"]:
            if self.free_grads:
                p.grad = None
        mine = self.reduce(u, g)
        u["shard"].grad = mine / self.n if self.divide else mine
        if self.free_after_forward:
            self.free(u)

    def step(self):
        self.opt.step()


class zero3_freed_before_backward(_Layers):
    """Frees each layer after its forward and never gathers it again for backward."""

    regather = False


class zero3_gather_never_freed(_Layers):
    """Gathers each layer before its forward and backward, but never frees the gathered copy."""

    free_after_forward = False


class zero3_is_zero1_with_copies(_Flat):
    """ZeRO-1 plus an extra gather per layer: the full parameters never leave memory."""

    def __init__(self, layers, make_optimizer):
        super().__init__([p for layer in layers for p in layer.parameters()], make_optimizer)
        layers[0].register_forward_pre_hook(lambda m, a: self.gather())


class zero3_all_reduce(_Layers):
    """Gathers and frees correctly, but all-reduces each layer's gradient and slices its shard."""

    def reduce(self, u, g):
        dist.all_reduce(g)
        return g[self.rank * u["chunk"]:(self.rank + 1) * u["chunk"]].clone()


class zero3_summed(_Layers):
    divide = False


class zero3_keeps_full_grads(_Layers):
    """Reduce-scatters each layer's gradients into its shard, but leaves p.grad on the parameters."""

    free_grads = False


class zero3_kept_after_backward(_Layers):
    """Frees each layer after its forward, but keeps it gathered after its backward."""

    def grad_ready(self, u):
        self.free_after_forward = False
        try:
            super().grad_ready(u)
        finally:
            self.free_after_forward = True


class zero3_state_emptied(_Layers):
    """Steps the shards, then empties the optimizer's state (to save its memory): the momentum starts over."""

    def step(self):
        self.opt.step()
        self.opt.state.clear()


class zero3_steps_in_hook(_Layers):
    """Steps the optimizer as soon as a layer's gradient shard is ready, and again in step(): the
    shards whose gradient is already there are stepped once per hook."""

    def grad_ready(self, u):
        super().grad_ready(u)
        if u["ready"] == 0:
            self.opt.step()


class zero3_full_master(_Layers):
    """Gathers and frees each layer right, but keeps a full fp32 master copy of it that every rank steps."""

    def optimized(self):
        for u in self.units:
            u["master"] = torch.empty(u["chunk"] * self.n)  # (chunk·n,): the whole layer, padded
            dist.all_gather_into_tensor(u["master"], u["shard"].detach())
            u["master"].requires_grad_()
        return [u["master"] for u in self.units]

    def step(self):
        for u in self.units:
            u["master"].grad = torch.empty_like(u["master"])
            dist.all_gather_into_tensor(u["master"].grad, u["shard"].grad)
        self.opt.step()
        with torch.no_grad():
            for u in self.units:  # (chunk,): this rank's part of the stepped master
                u["shard"].copy_(u["master"][self.rank * u["chunk"]:(self.rank + 1) * u["chunk"]])
                u["master"].grad = None


# ------------------------------------------------------------ exercises 1 and 2: predictions
def memory_no_master(n_params, n, stage):
    """Counts Adam as 8 bytes (momentum + variance) and forgets the fp32 master weights."""
    w, g, o = 2 * n_params, 2 * n_params, 8 * n_params
    return [w + g + o, w + g + o / n, w + (g + o) / n, (w + g + o) / n][stage]


def memory_stage1_shards_grads(n_params, n, stage):
    """Stage 1 shards the gradients as well (that is stage 2)."""
    w, g, o = 2 * n_params, 2 * n_params, 12 * n_params
    return [w + g + o, w + (g + o) / n, w + (g + o) / n, (w + g + o) / n][stage]


def comm_ring_factor_inverted(n_params, n, stage, bytes_per_elem):
    """The ring factor written upside down: N/(N - 1) instead of (N - 1)/N (N = 1 sends nothing)."""
    if n == 1:
        return 0
    return (3 if stage == 3 else 2) * n / (n - 1) * n_params * bytes_per_elem


def comm_asymptote(n_params, n, stage, bytes_per_elem):
    """The large-N limits 2Ψ and 3Ψ, without the (N - 1)/N."""
    return (3 if stage == 3 else 2) * n_params * bytes_per_elem


def comm_stage3_like_dp(n_params, n, stage, bytes_per_elem):
    """Forgets the second all-gather (in backward) under stage 3."""
    return 2 * (n - 1) / n * n_params * bytes_per_elem


def comm_zero1_all_reduce(n_params, n, stage, bytes_per_elem):
    """Counts stages 1 and 2 as Exercise 3's ZeRO1 runs: an all-reduce, then an all-gather."""
    k = 2 if stage == 0 else 3
    return k * (n - 1) / n * n_params * bytes_per_elem


def memory_from_cost(n_params, n, stage):
    """Right numbers, taken from the check's own reference instead of a formula."""
    from parlab.cost import zero_memory_per_gpu

    return zero_memory_per_gpu(n_params, n, stage)


def comm_from_cost(n_params, n, stage, bytes_per_elem):
    """Right numbers, taken from the check's own reference instead of a formula."""
    from parlab.cost import zero_comm_elems

    return zero_comm_elems(n_params, n, stage) * bytes_per_elem


# ------------------------------------------------------------ exercise 6: FSDP2
def fsdp2_root_only(model, blocks):
    """Wraps only the root: right gradients, but the whole model is one unit gathered at once."""
    from torch.distributed.fsdp import fully_shard

    fully_shard(model)


def fsdp2_blocks_grouped(model, blocks):
    """One fully_shard call on the list of blocks: all of them become one unit."""
    from torch.distributed.fsdp import fully_shard

    fully_shard(blocks)
    fully_shard(model)


def fsdp2_blocks_only(model, blocks):
    """Forgets the root: embeddings, final norm and output layer are never reduced."""
    from torch.distributed.fsdp import fully_shard

    for block in blocks:
        fully_shard(block)


def fsdp2_on_a_copy(model, blocks):
    """Shards a deep copy of the model, blocks first and then the root, and returns nothing: the
    model it was given is left as it was, unsharded, and trains without any reduction."""
    import copy

    from torch.distributed.fsdp import fully_shard

    twin = copy.deepcopy(model)
    for block in twin.blocks if hasattr(twin, "blocks") else []:
        fully_shard(block)
    fully_shard(twin)


def fsdp2_root_first(model, blocks):
    """Wraps the root before the blocks."""
    from torch.distributed.fsdp import fully_shard

    fully_shard(model)
    for block in blocks:
        fully_shard(block)


def fsdp2_summed(model, blocks):
    """Turns FSDP2's division by the world size off: the gradients are summed over the ranks."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    for block in blocks:
        fully_shard(block)
    fully_shard(model)
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM
            m.set_gradient_divide_factor(1.0)


def fsdp2_no_reshard(model, blocks):
    """Keeps every unit gathered from forward to backward: not the default options."""
    from torch.distributed.fsdp import fully_shard

    for block in blocks:
        fully_shard(block, reshard_after_forward=False)
    fully_shard(model, reshard_after_forward=False)


def fsdp2_every_linear(model, blocks):
    """Wraps every Linear as its own unit, then the blocks and the root: too many units."""
    from torch.distributed.fsdp import fully_shard

    for block in blocks:
        for m in block.modules():
            if isinstance(m, torch.nn.Linear):
                fully_shard(m)
        fully_shard(block)
    fully_shard(model)


# ------------------------------------------------------------ right answers, written differently
def memory(n_params, n, stage):
    w, g, o = 2 * n_params, 2 * n_params, 12 * n_params
    return [w + g + o, w + g + o / n, w + (g + o) / n, (w + g + o) / n][stage]


def memory_from_bytes_per_param(n_params, n, stage):
    """16 bytes per parameter, with the sharded ones divided by n."""
    per = {0: 16, 1: 4 + 12 / n, 2: 2 + 14 / n, 3: 16 / n}[stage]
    return per * n_params


def comm(n_params, n, stage, bytes_per_elem):
    k = 3 if stage == 3 else 2
    return k * (n - 1) * n_params * bytes_per_elem / n


class zero1_tensor_split:
    """Uneven shards from tensor_split, per-parameter all-reduce, list all_gather of padded pieces."""

    def __init__(self, params, make_optimizer):
        self.params = [p for p in params if p.requires_grad]
        self.n, self.rank = dist.get_world_size(), dist.get_rank()
        flat = torch.cat([p.detach().reshape(-1) for p in self.params])
        self.sizes = [len(c) for c in flat.tensor_split(self.n)]
        self.lo = sum(self.sizes[: self.rank])
        self.hi = self.lo + self.sizes[self.rank]
        self.shard = flat[self.lo:self.hi].clone().requires_grad_()
        self.opt = make_optimizer([self.shard])

    def step(self):
        for p in self.params:
            dist.all_reduce(p.grad)
        g = torch.cat([p.grad.reshape(-1) for p in self.params]) / self.n
        self.shard.grad = g[self.lo:self.hi].clone()
        self.opt.step()
        big = max(self.sizes)
        mine = torch.zeros(big)
        mine[: self.hi - self.lo] = self.shard.detach()
        parts = [torch.empty(big) for _ in range(self.n)]
        dist.all_gather(parts, mine)
        flat = torch.cat([part[:s] for part, s in zip(parts, self.sizes)])
        off = 0
        with torch.no_grad():
            for p in self.params:
                p.copy_(flat[off:off + p.numel()].view_as(p))
                off += p.numel()


class zero1_flat(_Flat):
    """The shared flat-shard design: reduce-scatter is allowed in ZeRO-1 too."""


class zero1_per_tensor:
    """A padded shard of each trainable tensor; frozen ones skipped at step time by their None grad."""

    def __init__(self, params, make_optimizer):
        self.params = list(params)  # frozen ones too: they are recognised by p.grad is None
        self.n, self.rank = dist.get_world_size(), dist.get_rank()
        self.shards = {}
        for k, p in enumerate(self.params):
            if p.requires_grad:
                c = -(-p.numel() // self.n)
                flat = torch.zeros(c * self.n)
                flat[: p.numel()] = p.detach().reshape(-1)
                self.shards[k] = flat[self.rank * c:(self.rank + 1) * c].clone().requires_grad_()
        self.opt = make_optimizer(list(self.shards.values()))

    def step(self):
        for k, p in enumerate(self.params):
            if p.grad is None:
                continue
            shard = self.shards[k]
            c = shard.numel()
            g = torch.zeros(c * self.n)
            g[: p.numel()] = p.grad.reshape(-1)
            dist.all_reduce(g)
            shard.grad = g[self.rank * c:(self.rank + 1) * c] / self.n
        self.opt.step()
        for k, shard in self.shards.items():
            p = self.params[k]
            full = torch.empty(shard.numel() * self.n)
            dist.all_gather_into_tensor(full, shard.detach())
            with torch.no_grad():
                p.copy_(full[: p.numel()].view_as(p))


class zero2_flat(_Flat):
    def step(self):
        self.shard.grad = self.scatter_grads()
        for p in self.params:
            p.grad = None
        self.opt.step()
        self.gather()


class zero2_list_api(zero2_flat):
    """dist.reduce_scatter and dist.all_gather with lists of chunks."""

    def scatter_grads(self):
        chunks = list(self.grads().split(self.chunk))
        mine = torch.empty(self.chunk)
        dist.reduce_scatter(mine, chunks)
        return mine / self.n

    def gather(self):
        parts = [torch.empty(self.chunk) for _ in range(self.n)]
        dist.all_gather(parts, self.shard.detach())
        self.write(torch.cat(parts))


class zero3_layers(_Layers):
    """Per-layer padded buffers, storage resized to 0 when freed."""


class zero3_prefetch(_Layers):
    """Also gathers the next layer in forward before it is needed (two layers gathered at most)."""

    def __init__(self, layers, make_optimizer):
        super().__init__(layers, make_optimizer)
        for u, nxt in zip(self.units, self.units[1:] + [None]):
            u["next"] = nxt

    def gather(self, u):
        if u["full"].untyped_storage().nbytes() == 0:
            super().gather(u)
        nxt = u.get("next")
        if torch.is_grad_enabled() and nxt is not None and nxt["full"].untyped_storage().nbytes() == 0:
            super().gather(nxt)


def fsdp2_loop(model, blocks):
    from torch.distributed.fsdp import fully_shard

    for block in blocks:
        fully_shard(block)
    fully_shard(model)


def fsdp2_mesh_explicit_defaults(model, blocks):
    """An explicit 1-D mesh, the default resharding spelled out, the blocks found by type, returns the model."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from parlab.models.gpt import Block

    mesh = init_device_mesh(parlab.device().type, (dist.get_world_size(),))
    for m in model.modules():
        if isinstance(m, Block):
            fully_shard(m, mesh=mesh, reshard_after_forward=True)
    return fully_shard(model, mesh=mesh, reshard_after_forward=False)


class zero2_keeps_buffers(zero2_flat):
    """Keeps a shard-sized gradient buffer and a full-size parameter buffer between steps."""

    def scatter_grads(self):
        g = self.grads()
        if not hasattr(self, "mine"):
            self.mine = torch.empty(self.chunk)
        dist.reduce_scatter_tensor(self.mine, g)
        return self.mine / self.n

    def gather(self):
        if not hasattr(self, "full"):
            self.full = torch.empty(self.chunk * self.n)
        dist.all_gather_into_tensor(self.full, self.shard.detach())
        self.write(self.full)


def comm_fraction(n_params, n, stage, bytes_per_elem):
    """Per collective: (N - 1)/N of Ψ each, two of them, a third (the backward's gather) in stage 3."""
    from fractions import Fraction

    collectives = 3 if stage == 3 else 2
    return float(collectives * Fraction(n - 1, n) * Fraction(n_params) * Fraction(bytes_per_elem))


CORRECT = {
    "memory": [memory, memory_from_bytes_per_param],
    "comm": [comm, comm_fraction],
    "zero1": [zero1_tensor_split, zero1_flat, zero1_per_tensor],
    "zero2": [zero2_flat, zero2_list_api, zero2_keeps_buffers],
    "zero3": [zero3_layers, zero3_prefetch],
    "fsdp2": [fsdp2_loop, fsdp2_mesh_explicit_defaults],
}

WRONG = {
    "memory": [(memory_no_master, "master"), (memory_stage1_shards_grads, "stage 2's"),
               (memory_from_cost, "parlab.cost.zero_memory_per_gpu")],
    "comm": [(comm_ring_factor_inverted, ("When n doubles, your answer grows", "the factor that is wrong is the ring factor (N − 1)/N")),
             (comm_asymptote, "large-N limit"), (comm_stage3_like_dp, "gathers the weights twice"),
             (comm_zero1_all_reduce, "as Exercise 3's ZeRO1 runs it"),
             (comm_from_cost, "parlab.cost.zero_comm_elems")],
    "zero1": [(zero1_full_model, "whole model"), (zero1_shards_off_by_one, "do not cover every element"),
              (zero1_no_all_gather, "All-gather the updated shards"), (zero1_summed, "not averaged"),
              (zero1_never_writes_back, "never written back"),
              (zero1_new_optimizer_each_step, says(
                  "before forward 2", "the first state of the optimizers that differs is SGD's momentum "
                  "(momentum_buffer), at step 2, on ranks 0, 1 and 2",
                  "the gradient the optimizers stepped with matched on every rank",
                  "state starts over at every step", never=("summed", "gradient the optimizers stepped with, at"))),
              (zero1_grad_at_floor_offset, says(
                  "the first state of the optimizers that differs is the gradient the optimizers stepped "
                  "with, at step 1, on ranks 1 and 2", "rank 1's shard of elements 28..55",
                  "its values are the reference's at elements 27..54, -1 from the elements the shard holds",
                  never=("momentum", "Hint", "summed"))),
              (zero1_no_reduce, ("the rank whose shard holds it", "never reduced over the ranks")),
              (zero1_crashes_on_frozen, "shard only the parameters with p.requires_grad"),
              (zero1_zero_fills_frozen, "shrank by exactly AdamW's weight decay"),
              (zero1_writes_every_param, "never write into the frozen ones")],
    "zero2": [(zero2_all_reduce, "no `dist.all_reduce`"), (zero2_keeps_grads, "still hold gradients"),
              (zero2_master_from_wrong_offset, says(
                  "the first state of the optimizers that differs is the shard's values after the step "
                  "(the fp32 master), at step 2, on ranks 1 and 2",
                  "the gradient the optimizers stepped with and SGD's momentum (momentum_buffer) matched",
                  never=("Hint", "summed", "starts over"))),
              (zero2_summed, "not averaged"),
              (zero2_divided_twice, says("the gradients were divided by world_size twice",
                                         "it is 1/3 of the reference, and 3 is the world size N",
                                         never="summed")),
              (zero2_zero_fills_frozen, "shrank by exactly AdamW's weight decay"),
              (zero2_keeps_flat_buffer, "the size of the whole gradient"),
              (zero2_steps_every_param, "every rank steps every parameter")],
    "zero3": [(zero3_freed_before_backward, "storage had been freed (resized to 0)"),
              (zero3_gather_never_freed, "was not freed"),
              (zero3_is_zero1_with_copies, "ZeRO-1 with extra copies"),
              (zero3_all_reduce, "reduce-scatter"),
              (zero3_summed, says("not averaged", "the gradient the optimizers stepped with, at step 1, on "
                                  "ranks 0, 1 and 2", "it is 3x the reference, and 3 is the world size N")),
              (zero3_state_emptied, says(
                  "SGD's momentum (momentum_buffer), at step 2, on ranks 0, 1 and 2",
                  "the gradient the optimizers stepped with matched", "state starts over at every step",
                  never="summed")),
              (zero3_steps_in_hook, says(
                  "which elements the optimizers stepped, and how often, at step 1", "times in that step; single-process "
                  "training steps once", never=("Hint", "summed", "starts over"))),
              (zero3_keeps_full_grads, "still hold their full gradients"),
              (zero3_kept_after_backward, "after the backward of step"),
              (zero3_full_master, "every rank steps every parameter")],
    "fsdp2": [(fsdp2_root_only, "only the root is wrapped"),
              (fsdp2_blocks_grouped, "not each their own unit"),
              (fsdp2_blocks_only, "fully_shard on the root"),
              (fsdp2_root_first, "blocks first and the root last"),
              (fsdp2_on_a_copy, says("nothing of the model the check trains was sharded",
                                     never="fully_shard on the root model")),
              (fsdp2_summed, "not averaged"),
              (fsdp2_no_reshard, "reshard_after_forward=False"),
              (fsdp2_every_linear, "too many units")],
}

WRONG_HIDDEN: dict = {}  # every wrong answer here is caught by the visible cases
ALONE: dict = {}         # none hangs or crashes a rank for good: all share the batch launches
