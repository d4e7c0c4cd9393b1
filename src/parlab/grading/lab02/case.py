"""Lab 02's test input: a model, its frozen (or unused) parameters, and the batch layout.

The models are awkward on purpose: parlab's GPT ties ``lm_head`` to ``tok_emb``
(one Parameter used twice), some cases freeze a parameter (its ``.grad`` stays
None), and some of Exercise 4's add a trainable parameter that the forward pass
never uses (``SPARE``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from ...models import build

#: Seconds per launch; the process-group timeout is half of it.
TIMEOUT = 90.0
#: Where ranks must start DIFFERENT (so only a broadcast makes them agree),
#: rank r builds its model from seed INIT_SEED + r and the reference is rank
#: 0's model.  Elsewhere every rank builds from seed 0.
INIT_SEED = 100
DATA_SEED = 3
#: The trainable parameter that ``Case(unused=True)`` adds and forward never uses.
SPARE = "spare"

SMALL = (("n_layer", 2), ("d_model", 32), ("n_head", 2))
UNTIED = SMALL + (("tie_weights", False),)
FROZEN = ("pos_emb.weight",)


@dataclass(frozen=True)
class Case:
    """One test input: a model, its frozen (or unused) parameters, and the batch layout."""

    model: str = "gpt"
    overrides: tuple = SMALL
    frozen: tuple = ()
    unused: bool = False
    batch: int = 8  # global batch (all ranks together)
    seq: int = 16
    steps: int = 3
    micro: int = 1  # micro-batches per rank (gradient accumulation)
    bucket_bytes: int = 0
    lr: float = 0.1

    def build(self, seed: int) -> nn.Module:
        """The case's model, on the CPU (runners move it to the rank's device)."""
        model = build(self.model, seed=seed, **dict(self.overrides))
        if self.unused:
            model.register_parameter(SPARE, nn.Parameter(torch.full((8,), 0.5)))
        named = dict(model.named_parameters())
        for name in self.frozen:
            named[name].requires_grad_(False)
        return model

    def describe(self, n: int) -> str:
        tied = self.model == "gpt" and dict(self.overrides).get("tie_weights", True)
        parts = [self.model + (" (tied lm_head/tok_emb)" if tied else "")]
        if self.frozen:
            parts.append(f"frozen {', '.join(self.frozen)}")
        if self.unused:
            parts.append(f"a trainable parameter '{SPARE}' that forward never uses")
        parts.append(f"global batch {self.batch}")
        if self.micro > 1:
            parts.append(f"{self.micro} micro-batches per rank")
        if self.bucket_bytes:
            parts.append(f"bucket_bytes {self.bucket_bytes}")
        return ", ".join(parts) + f", world_size {n}"
