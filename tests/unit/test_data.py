"""parlab.data: tokenizer, corpus, deterministic batches, per-rank splits."""
import pytest
import torch

from parlab.data import (corpus_path, decode, encode, generate_corpus, get_batch,
                         load_corpus, microbatches, rank_slice, shard_batch)

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


@pytest.mark.parametrize("text", ["hello, world\n", "naïve café — 東京 ✓", ""])
def test_tokenizer_round_trip(text):
    ids = encode(text)
    assert ids.dtype == torch.long and ids.dim() == 1
    assert ids.numel() == len(text.encode("utf-8"))
    assert bool(((ids >= 0) & (ids < 256)).all())
    assert decode(ids) == text
    assert decode(ids.tolist()) == text


def test_decode_replaces_invalid_bytes():
    assert decode([104, 0xFF, 105]) == "h\ufffdi"


def test_corpus_loads_is_small_and_is_the_generated_text():
    text = load_corpus()
    size = corpus_path().stat().st_size
    assert 50_000 <= size <= 1_000_000
    assert len(text.encode("utf-8")) == size
    assert text == generate_corpus()  # the shipped file is reproducible from the generator
    assert generate_corpus(seed=1) != text


def test_batches_are_deterministic_and_shifted():
    x, y = get_batch(3, 8, seq_len=16, seed=0)
    assert x.shape == y.shape == (8, 16) and x.dtype == torch.long
    torch.manual_seed(999)
    torch.rand(10)  # global RNG activity must not matter
    x2, y2 = get_batch(3, 8, seq_len=16, seed=0)
    assert torch.equal(x, x2) and torch.equal(y, y2)
    assert torch.equal(x[:, 1:], y[:, :-1])
    text = load_corpus()
    assert all(decode(torch.cat([x[i], y[i, -1:]])) in text for i in range(8))
    assert not torch.equal(get_batch(4, 8, 16)[0], x)
    assert not torch.equal(get_batch(3, 8, 16, seed=1)[0], x)


def test_get_batch_leaves_global_rng_alone():
    before = torch.get_rng_state()
    get_batch(0, 4)
    assert torch.equal(before, torch.get_rng_state())


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_rank_shards_reassemble_the_global_batch(world_size):
    x, y = get_batch(0, 12)
    pieces = [shard_batch(x, r, world_size) for r in range(world_size)]
    assert all(p.shape[0] == 12 // world_size for p in pieces)
    assert torch.equal(torch.cat(pieces), x)
    pairs = [shard_batch((x, y), r, world_size) for r in range(world_size)]
    assert torch.equal(torch.cat([p[1] for p in pairs]), y)
    assert rank_slice(12, world_size - 1, world_size) == slice(12 - 12 // world_size, 12)
    if world_size > 1:  # a wrong order would not reassemble
        assert not torch.equal(torch.cat(pieces[::-1]), x)


def test_bad_divisibility_and_rank_raise():
    x, _ = get_batch(0, 10)
    with pytest.raises(ValueError, match="global batch 10 is not divisible by world_size 4: "
                                         "pick a multiple of 4"):
        shard_batch(x, 0, 4)
    with pytest.raises(ValueError, match="rank 2 is outside"):
        shard_batch(x, 2, 2)
    with pytest.raises(ValueError, match="at least 1"):
        rank_slice(8, 0, 0)
    with pytest.raises(ValueError, match="batch 10 is not divisible by number of micro-batches 3"):
        microbatches(x, 3)


def test_microbatches_split_in_order():
    x, y = get_batch(0, 8)
    mbs = microbatches((x, y), 4)
    assert len(mbs) == 4 and all(m[0].shape == (2, 32) for m in mbs)
    assert torch.equal(torch.cat([m[0] for m in mbs]), x)
    assert torch.equal(torch.cat([m[1] for m in mbs]), y)
    assert torch.equal(torch.cat(microbatches(x, 1)), x)
