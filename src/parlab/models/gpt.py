"""A tiny GPT in one file, written for reading.

The layout follows nanoGPT's spirit (a dataclass config, a handful of small
modules, no framework magic) but is parlab's own code.  There is no parallel
code in here on purpose: data, tensor and pipeline parallelism are applied to
this model from the outside, the way torchtitan applies its plans.

Module names are part of the API, because parallel plans address them:

    tok_emb, pos_emb                      token and learned position embeddings
    blocks.{i}.ln1 / .attn / .ln2 / .mlp  one pre-norm transformer block
    blocks.{i}.attn.q / .k / .v / .o      separate attention projections
    blocks.{i}.mlp.up / .down             the MLP (GELU in between)
    ln_f, lm_head                         final norm and output projection

With ``tie_weights=True`` the output projection reuses the token embedding
matrix, so ``named_parameters()`` lists it once, as ``tok_emb.weight``.

Parameter count (embeddings tied, biases on): h·V + L(12h² + 13h) + 2h, the
formula of Hugging Face's "The Ultra-Scale Playbook: Training LLMs on GPU
Clusters" (2025), plus s·h for the learned
positions.  ``num_params`` returns the actual count.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class GPTConfig:
    vocab_size: int = 256  # byte-level tokens, see parlab.data
    seq_len: int = 32  # longest sequence the position table covers
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 64
    dropout: float = 0.0
    bias: bool = True
    tie_weights: bool = True


class Attention(nn.Module):
    """Causal multi-head self-attention with separate q, k, v, o projections."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        if cfg.d_model % cfg.n_head != 0:
            raise ValueError(f"d_model {cfg.d_model} is not divisible by n_head {cfg.n_head}")
        self.head_dim = cfg.d_model // cfg.n_head
        self.q = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.k = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.v = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.o = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        # The number of heads is inferred (-1) rather than read from the config,
        # so a column-parallel q/k/v that holds only some heads still works.
        q = self.q(x).view(B, T, -1, self.head_dim).transpose(1, 2)  # (B, H, T, hd); H = n_head, or n_head/n on a TP rank
        k = self.k(x).view(B, T, -1, self.head_dim).transpose(1, 2)  # (B, H, T, hd)
        v = self.v(x).view(B, T, -1, self.head_dim).transpose(1, 2)  # (B, H, T, hd)
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        y = y.transpose(1, 2).reshape(B, T, -1)  # (B, T, H·hd): heads side by side again
        return self.o(y)


class MLP(nn.Module):
    """Position-wise feed-forward: up to 4·d_model, GELU, back down."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.up = nn.Linear(cfg.d_model, 4 * cfg.d_model, bias=cfg.bias)
        self.down = nn.Linear(4 * cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.down(F.gelu(self.up(x))))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln1(x)), then x + mlp(ln2(x))."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.attn = Attention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Decoder-only transformer.  ``forward(idx, targets) -> (logits, loss)``."""

    def __init__(self, config: GPTConfig | None = None, seed: int = 0):
        super().__init__()
        self.config = cfg = config or GPTConfig()
        # nn.Linear/nn.Embedding draw a default init from the global RNG; fork
        # it so building a model never shifts the caller's random stream.
        with torch.random.fork_rng(devices=[]):
            self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
            self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model)
            self.drop = nn.Dropout(cfg.dropout)
            self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)])
            self.ln_f = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
            self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_weights:
            self.lm_head.weight = self.tok_emb.weight  # one Parameter, two uses
        self.init_weights(seed)

    @torch.no_grad()
    def init_weights(self, seed: int = 0) -> None:
        """Re-initialise every weight from ``seed`` (global RNG untouched).

        Linear and embedding weights ~ N(0, 0.02²), biases 0, norms 1/0.  The
        output projections of each residual branch (``attn.o``, ``mlp.down``)
        get std 0.02/sqrt(2·n_layer), as in GPT-2, so the residual stream does
        not grow with depth.
        """
        g = torch.Generator().manual_seed(seed)
        small = 0.02 / math.sqrt(2 * self.config.n_layer)
        for name, mod in self.named_modules():
            if isinstance(mod, (nn.Linear, nn.Embedding)):
                if isinstance(mod, nn.Linear) and mod.weight is self.tok_emb.weight:
                    continue  # tied lm_head: already set through tok_emb
                std = small if name.endswith(("attn.o", "mlp.down")) else 0.02
                nn.init.normal_(mod.weight, 0.0, std, generator=g)
                if getattr(mod, "bias", None) is not None:
                    nn.init.zeros_(mod.bias)
            elif isinstance(mod, nn.LayerNorm):
                nn.init.ones_(mod.weight)
                if mod.bias is not None:
                    nn.init.zeros_(mod.bias)

    def num_params(self) -> int:
        """Number of distinct parameters (a tied matrix counts once)."""
        return sum(p.numel() for p in self.parameters())

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``idx`` (B, T) token ids -> logits (B, T, V), and the mean
        cross-entropy against ``targets`` (B, T) when they are given."""
        T = idx.size(1)
        if T > self.config.seq_len:
            raise ValueError(f"sequence length {T} exceeds config.seq_len {self.config.seq_len}")
        pos = torch.arange(T, device=idx.device)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))  # (B·T, V) against (B·T,)
        return logits, loss


def tiny_gpt(seed: int = 0, **overrides) -> GPT:
    """``GPT(GPTConfig(**overrides), seed)``, e.g. ``tiny_gpt(n_layer=2)``."""
    return GPT(GPTConfig(**overrides), seed=seed)
