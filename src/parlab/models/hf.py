"""Tiny Hugging Face models built from a config: nothing is downloaded.

Both models use parlab's byte vocabulary (256 ids), hidden size 64, 2 layers
and 4 heads, so they train on a CPU in milliseconds per step (measured:
a Llama of this size does forward and backward in about 15 ms).  Attention is
the plain "eager" implementation and every dropout is 0, so runs repeat
exactly.  Weights come from ``seed`` without disturbing the global RNG.

Train them through ``parlab.models.lm_loss``, never by passing ``labels=``:
Hugging Face shifts labels itself, and parlab's batches are already shifted.
"""
from __future__ import annotations

import torch
import torch.nn as nn

VOCAB = 256


def _build_seeded(model_cls, config, seed: int) -> nn.Module:
    # Hugging Face initialises from the global RNG; fork it so the caller's
    # RNG state is the same after this call as before.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_cls(config)
    return model.float().train()


def tiny_llama(seed: int = 0, **overrides) -> nn.Module:
    """A 2-layer ``LlamaForCausalLM`` (hidden 64, 4 heads, MLP 128, 128 positions).

    ``overrides`` are passed to ``LlamaConfig``, e.g. ``num_hidden_layers=4``.
    Module names: ``model.layers.{i}.self_attn.{q,k,v,o}_proj`` and
    ``model.layers.{i}.mlp.{gate,up,down}_proj``.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    kw = dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
        max_position_embeddings=128, attention_dropout=0.0,
        bos_token_id=1, eos_token_id=2, pad_token_id=None,
        tie_word_embeddings=False, attn_implementation="eager",
    )
    kw.update(overrides)
    return _build_seeded(LlamaForCausalLM, LlamaConfig(**kw), seed)


def tiny_gpt2(seed: int = 0, **overrides) -> nn.Module:
    """A 2-layer ``GPT2LMHeadModel`` (hidden 64, 4 heads, 128 positions).

    GPT-2's default bos/eos id (50256) lies outside a 256 vocabulary, so both
    are set to 0 here.  Its output matrix is tied to ``transformer.wte``.
    """
    from transformers import GPT2Config, GPT2LMHeadModel

    kw = dict(
        vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=128,
        n_inner=128, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        bos_token_id=0, eos_token_id=0, attn_implementation="eager",
    )
    kw.update(overrides)
    return _build_seeded(GPT2LMHeadModel, GPT2Config(**kw), seed)

