"""Make every collective on a launched rank refuse a tensor that is not on ``parlab.device()``.

The GPU tier puts this folder on PYTHONPATH (with PARLAB_STRICT_DEVICE=1) for
the launches it starts, so Python imports it in every rank at start-up.  The
launcher runs NCCL beside gloo ("cpu:gloo,cuda:nccl"), where a CPU tensor in
a collective would quietly go over gloo instead of failing; under this spy it
fails on the rank, naming the collective and the device, so a lab or a check
that builds a tensor on the CPU on an NCCL rank fails the test.  On gloo
ranks parlab.device() is the CPU, so nothing changes there.

Only the ``torch.distributed.<name>`` functions that lab code and checks call
are wrapped; torch's own internals (DDP, object collectives) call the
originals in ``distributed_c10d`` and are not watched.
"""
import functools
import os

WATCHED = ("all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor",
           "all_gather_single", "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single",
           "all_to_all", "all_to_all_single", "gather", "scatter", "send", "recv", "isend", "irecv",
           "batch_isend_irecv")


def tensors_in(value):
    """Every tensor in an argument: a tensor, a list of them, or P2POps."""
    import torch

    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from tensors_in(item)
    elif hasattr(value, "tensor") and hasattr(value, "peer"):  # dist.P2POp
        yield value.tensor


def guard(name, original):
    @functools.wraps(original)
    def watched(*args, **kwargs):
        import torch.distributed as dist

        if dist.is_initialized():
            import parlab

            want = parlab.device()
            for t in tensors_in([*args, *kwargs.values()]):
                if t.device.type != want.type:
                    raise RuntimeError(
                        f"dist.{name} got a tensor on {t.device}, but this rank's device is {want} "
                        "(PARLAB_STRICT_DEVICE): create every tensor a collective moves on "
                        "parlab.device()")
        return original(*args, **kwargs)

    watched.parlab_strict = True
    return watched


def install():
    import torch.distributed as dist

    for name in WATCHED:
        original = getattr(dist, name, None)
        if original is not None and not getattr(original, "parlab_strict", False):
            setattr(dist, name, guard(name, original))


if os.environ.get("PARLAB_STRICT_DEVICE") == "1" and ("RANK" in os.environ or "PARLAB_KERNEL_PID" in os.environ):
    # In torchrun's ranks (RANK is set), and in the launcher's fork server, whose forked ranks
    # inherit it (its agent never initialises a process group, so the guard never acts there);
    # not in the kernel.
    install()
