"""One SGD step of a tiny model on a device, and what it shows: the GPU tier runs it on CUDA,
the CPU paths test on the CPU."""
from __future__ import annotations

import torch

from parlab.data import get_batch
from parlab.models import build, lm_loss


def sgd_step(name: str, device: str, seed: int = 0) -> dict:
    """Loss before and after one step, where the gradients lived, and how far the weights moved."""
    model = build(name, seed=seed).to(device)
    x, y = (t.to(device) for t in get_batch(0, batch_size=4, seq_len=16, seed=seed))
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = lm_loss(model, x, y)
    loss.backward()
    grad_devices = {str(p.grad.device) for p in model.parameters() if p.grad is not None}
    opt.step()
    with torch.no_grad():
        after = lm_loss(model, x, y)
    moved = max((p.detach() - b).abs().max().item() for p, b in zip(model.parameters(), before))
    return {"loss": loss.item(), "after": after.item(), "grad_devices": grad_devices, "moved": moved}
