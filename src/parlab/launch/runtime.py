"""What code running on a rank can ask about itself."""
from __future__ import annotations

_RANK_DEVICE = None


def device():
    """This rank's device: ``cuda:<local_rank>`` under NCCL, else ``cpu``.

    Outside a launched rank (in the notebook itself) this is always the CPU, so
    that asking never initialises CUDA in the kernel that many students share.
    """
    import torch

    return _RANK_DEVICE if _RANK_DEVICE is not None else torch.device("cpu")


def bind_device(dev) -> None:
    global _RANK_DEVICE
    _RANK_DEVICE = dev
