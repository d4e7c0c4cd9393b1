"""Byte tokenizer, the shipped corpus, deterministic batches, per-rank splits.

Corpus.  ``parlab/corpus/corpus.txt`` is generated text, not a copy of any
book: ``generate_corpus()`` below writes it from a small word grammar with a
fixed seed, so it is ours and free of copyright.  Re-create it with

    python -c "import parlab.data as d; d.write_corpus()"

and the test suite checks that the shipped file equals the generator's output.

Tokens.  One token per UTF-8 byte, so the vocabulary is 256 and nothing needs
training or downloading.

Splitting a batch across ranks.  parlab gives rank r the *contiguous* block
``batch[r*B/W : (r+1)*B/W]`` (like ``torch.chunk`` or a DTensor ``Shard(0)``),
so ``torch.cat`` of all ranks' pieces in rank order is the global batch.
(``torch.utils.data.DistributedSampler`` strides instead, ``indices[r::W]``;
both give every sample to exactly one rank, and because the loss is a mean
over equal-sized pieces, both give the same averaged gradient.)  The global
batch must divide evenly: parlab raises instead of padding or dropping.
"""
from __future__ import annotations

import functools
import random
from importlib import resources
from pathlib import Path
from typing import Sequence, Union

import torch

VOCAB_SIZE = 256
Batch = Union[torch.Tensor, Sequence[torch.Tensor]]

# ----------------------------------------------------------------- tokenizer


def encode(text: str) -> torch.Tensor:
    """Text -> 1-D LongTensor of its UTF-8 bytes (values 0..255)."""
    return torch.tensor(list(text.encode("utf-8")), dtype=torch.long)


def decode(ids) -> str:
    """Token ids (tensor or list) -> text; invalid UTF-8 becomes U+FFFD."""
    if isinstance(ids, torch.Tensor):
        ids = ids.reshape(-1).tolist()  # flat: every id, row-major (a (B, T) batch reads row by row)
    return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


# -------------------------------------------------------------------- corpus

_NAMES = ["Ada", "Bram", "Cora", "Dov", "Esme", "Finn", "Greta", "Hugo", "Iris",
          "Jonas", "Kaia", "Lev", "Mira", "Nils", "Odile", "Pavel", "Rosa", "Tomas"]
_NOUNS = ["river", "mill", "lantern", "ledger", "bridge", "orchard", "harbor", "bell",
          "cart", "garden", "window", "letter", "road", "tower", "boat", "market",
          "kettle", "fence", "well", "map", "barn", "ferry", "clock", "field"]
_ADJS = ["old", "quiet", "red", "narrow", "bright", "heavy", "small", "cold", "green",
         "broken", "long", "warm", "crooked", "new", "distant", "patient"]
_VERBS = [("carried", "carry"), ("mended", "mend"), ("counted", "count"),
          ("painted", "paint"), ("watched", "watch"), ("followed", "follow"),
          ("opened", "open"), ("cleaned", "clean"), ("measured", "measure"),
          ("sold", "sell"), ("found", "find"), ("built", "build")]
_PLACES = ["by the river", "at the market", "near the mill", "under the bridge",
           "in the orchard", "behind the barn", "on the long road", "at the harbor"]
_TIMES = ["In the morning", "At noon", "Before the rain", "After supper",
          "On the first day", "Late in the evening", "When the bell rang", "At dawn"]
_ADVS = ["slowly", "carefully", "twice", "again", "quietly", "at once", "together"]
_NUMS = ["two", "three", "four", "five", "seven", "nine", "twelve", "twenty"]


def _plural(noun: str) -> str:
    return noun[:-1] + "ies" if noun.endswith("y") and noun[-2] not in "aeiou" else noun + "s"


def _sentence(r: random.Random) -> str:
    a, b = r.sample(_NAMES, 2)
    noun, noun2 = r.sample(_NOUNS, 2)
    past, base = r.choice(_VERBS)
    adj = r.choice(_ADJS)
    nouns, nouns2 = _plural(noun), _plural(noun2)
    kind = r.randrange(7)
    if kind == 0:
        return f"{r.choice(_TIMES)}, {a} {past} the {adj} {noun} {r.choice(_PLACES)}."
    if kind == 1:
        return f"{a} and {b} {past} {r.choice(_NUMS)} {nouns} {r.choice(_ADVS)}."
    if kind == 2:
        return f'"Will you {base} the {noun}?" asked {a}. "Yes," said {b}, "after the {noun2}."'
    if kind == 3:
        return f"The {noun} was {adj}, so {a} {past} it {r.choice(_ADVS)}."
    if kind == 4:
        return f"{a} wrote in the ledger: {r.randint(2, 99)} {nouns}, {r.randint(2, 99)} {nouns2}."
    if kind == 5:
        return f"Nobody {past} the {noun} {r.choice(_PLACES)}, because the {noun2} was {adj}."
    return f"{b} said that the {adj} {noun} stood {r.choice(_PLACES)} for {r.choice(_NUMS)} years."


def generate_corpus(n_chars: int = 120_000, seed: int = 1234) -> str:
    """Deterministic English-like text from a tiny grammar (our own, no source).

    Paragraphs of 3-7 sentences, separated by blank lines, until ``n_chars``.
    """
    r = random.Random(seed)
    paragraphs, size = [], 0
    while size < n_chars:
        para = " ".join(_sentence(r) for _ in range(r.randint(3, 7)))
        paragraphs.append(para)
        size += len(para) + 2
    return "\n\n".join(paragraphs) + "\n"


def corpus_path() -> Path:
    """Where the shipped corpus lives inside the installed package."""
    return Path(str(resources.files("parlab.corpus").joinpath("corpus.txt")))


def write_corpus() -> Path:
    """Regenerate the shipped corpus file from ``generate_corpus()``."""
    path = corpus_path()
    path.write_text(generate_corpus(), encoding="utf-8")
    return path


@functools.lru_cache(maxsize=1)
def load_corpus() -> str:
    """The shipped corpus as one string (read once, then cached)."""
    return resources.files("parlab.corpus").joinpath("corpus.txt").read_text(encoding="utf-8")


@functools.lru_cache(maxsize=1)
def corpus_tokens() -> torch.Tensor:
    """The corpus encoded once; callers must not modify the returned tensor."""
    return encode(load_corpus())


# ------------------------------------------------------------------- batches


def get_batch(step: int, batch_size: int, seq_len: int = 32, seed: int = 0
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Batch number ``step``: ``x``, ``y`` of shape (batch_size, seq_len).

    Each row is a random window of the corpus and ``y`` is ``x`` shifted left
    by one token.  The windows depend only on (step, batch_size, seq_len, seed)
    through a private ``torch.Generator``, so every rank and every call gets
    the same batch, whatever the global RNG has been doing.
    """
    data = corpus_tokens()
    if seq_len + 1 > len(data):
        raise ValueError(f"seq_len {seq_len} is longer than the corpus")
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    starts = torch.randint(0, len(data) - seq_len, (batch_size,), generator=g)
    offsets = torch.arange(seq_len + 1)
    windows = data[starts[:, None] + offsets]  # (B, T+1)
    return windows[:, :-1].clone(), windows[:, 1:].clone()  # x, y: (B, T)


def _check_divisible(total: int, parts: int, what: str, part_name: str) -> None:
    if parts < 1:
        raise ValueError(f"{part_name} must be at least 1, got {parts}")
    if total % parts != 0:
        raise ValueError(
            f"{what} {total} is not divisible by {part_name} {parts}: "
            f"pick a multiple of {parts}"
        )


def rank_slice(batch_size: int, rank: int, world_size: int) -> slice:
    """Rows of the global batch that belong to ``rank``: a contiguous block."""
    _check_divisible(batch_size, world_size, "global batch", "world_size")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside 0..{world_size - 1}")
    per = batch_size // world_size
    return slice(rank * per, (rank + 1) * per)


def _rows(batch: Batch) -> int:
    first = batch if isinstance(batch, torch.Tensor) else batch[0]
    return first.size(0)


def _take(batch: Batch, s: slice) -> Batch:
    if isinstance(batch, torch.Tensor):
        return batch[s]
    return tuple(t[s] for t in batch)


def shard_batch(batch: Batch, rank: int, world_size: int) -> Batch:
    """This rank's piece of a global batch (a tensor or a tuple like (x, y)).

    ``torch.cat([shard_batch(x, r, W) for r in range(W)]) == x``.
    """
    return _take(batch, rank_slice(_rows(batch), rank, world_size))


def microbatches(batch: Batch, n: int) -> list[Batch]:
    """Split a batch (tensor or tuple) into ``n`` equal contiguous micro-batches,
    for gradient accumulation or a pipeline schedule."""
    total = _rows(batch)
    _check_divisible(total, n, "batch", "number of micro-batches")
    per = total // n
    return [_take(batch, slice(i * per, (i + 1) * per)) for i in range(n)]
