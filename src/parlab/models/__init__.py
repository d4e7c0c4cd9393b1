"""Models for the labs, and the one loss they all share.

- ``gpt``: parlab's own tiny GPT (``GPT``, ``GPTConfig``, ``tiny_gpt``).
- ``hf``: tiny Hugging Face Llama and GPT-2 built from configs (``tiny_llama``,
  ``tiny_gpt2``); transformers is imported only when you build one.

``build("gpt" | "llama" | "gpt2", seed=0, **overrides)`` makes any of them, and
``lm_loss(model, x, y)`` scores any of them the same way.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from .gpt import GPT, GPTConfig, tiny_gpt
from .hf import tiny_gpt2, tiny_llama

__all__ = ["GPT", "GPTConfig", "MODELS", "build", "lm_loss", "logits_of",
           "tiny_gpt", "tiny_gpt2", "tiny_llama"]

MODELS: dict[str, Callable[..., nn.Module]] = {
    "gpt": tiny_gpt,
    "llama": tiny_llama,
    "gpt2": tiny_gpt2,
}


def build(name: str, seed: int = 0, **overrides) -> nn.Module:
    """A fresh float32 model by name ("gpt", "llama" or "gpt2"), seeded."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}: choose one of {sorted(MODELS)}")
    return MODELS[name](seed=seed, **overrides)


def logits_of(model: nn.Module, idx: torch.Tensor) -> torch.Tensor:
    """Logits (B, T, V) from parlab's GPT (returns a tuple) or a Hugging Face
    model (returns an output object with ``.logits``)."""
    out = model(idx)
    return out[0] if isinstance(out, (tuple, list)) else out.logits


def lm_loss(model: nn.Module, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over all B·T positions, for any model here.

    ``targets`` are already shifted (``parlab.data.get_batch`` returns
    ``y[:, t] == x[:, t+1]``), so logits at position t are scored against
    ``targets[:, t]`` as they are.  We never pass ``labels=`` to a Hugging Face
    model: it would shift them a second time.
    """
    logits = logits_of(model, idx)
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1))  # (B·T, V) against (B·T,)
