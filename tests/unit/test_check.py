"""parlab.check: every helper passes on a right answer and fails, with a useful
message, on the typical wrong ones."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from parlab import check

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]


def fails(fn, *args, **kwargs) -> str:
    """Run a check that must fail and return its message."""
    with pytest.raises(AssertionError) as info:
        fn(*args, **kwargs)
    return str(info.value)


@pytest.fixture
def ref() -> torch.Tensor:
    return torch.randn(8, 6, generator=torch.Generator().manual_seed(0))


# ---------------------------------------------------------------- tolerances

def test_tolerances_by_dtype():
    r32, a32 = check.tolerances(torch.float32)
    r64, _ = check.tolerances(torch.float64)
    rbf, _ = check.tolerances(torch.bfloat16)
    rhf, _ = check.tolerances(torch.float16)
    assert r64 < r32 < rhf < rbf
    assert 1e-8 < a32 <= 1e-5  # well above measured 1e-8 noise, far below real bugs
    assert check.tolerances(torch.int64) == (0.0, 0.0)
    assert check.tolerances(torch.bool) == (0.0, 0.0)
    assert check.tolerances(torch.float32, "nccl")[0] > r32
    with pytest.raises(ValueError, match="unknown backend"):
        check.tolerances(torch.float32, "carrier-pigeon")


# ---------------------------------------------------------------- assert_close

def test_close_passes_on_reduction_order_noise(ref):
    # the same float32 numbers summed in two orders differ only by rounding
    x = torch.randn(4, 1000, generator=torch.Generator().manual_seed(1))
    vectorised = x.sum(dim=1)
    sequential = torch.zeros(4)
    for i in range(1000):
        sequential += x[:, i]
    assert not torch.equal(vectorised, sequential)  # not bitwise equal ...
    check.assert_close(sequential, vectorised, "sum")  # ... but equal to tolerance
    check.assert_close(ref + 1e-9 * torch.randn_like(ref), ref, "w")
    check.assert_close(ref.double(), ref, "w")  # float64 vs float32: compared by value


def test_close_fails_with_name_rank_index_and_values(ref):
    got = ref.clone()
    got[5, 2] += 0.5
    msg = fails(check.assert_close, got, ref, "blocks.0.mlp.weight", 3)
    assert "rank 3" in msg and "'blocks.0.mlp.weight'" in msg
    assert "(5, 2)" in msg and "1 of 48 elements" in msg
    assert f"{got[5, 2].item():.6g}" in msg and f"{ref[5, 2].item():.6g}" in msg


def test_close_shape_mismatch_says_how_the_shapes_relate():
    msg = fails(check.assert_close, torch.zeros(64, 32), torch.zeros(64, 64),
                "blocks.0.attn.q.weight", 2)
    assert "rank 2: 'blocks.0.attn.q.weight' has shape (64, 32) but the reference has (64, 64)" in msg
    assert "dim 1 is 1/2 of the reference's, the size of one of 2 equal shards" in msg
    assert "did you" not in msg
    assert "transpose" in fails(check.assert_close, torch.zeros(3, 5), torch.zeros(5, 3))


def test_close_nan_fails_and_says_nan(ref):
    got = ref.clone()
    got[1, 4] = float("nan")
    msg = fails(check.assert_close, got, ref, "loss", 0)
    assert "NaN" in msg and "(1, 4)" in msg
    check.assert_close(torch.tensor([float("nan"), 1.0]), torch.tensor([float("nan"), 1.0]))


def test_close_dtypes():
    msg = fails(check.assert_close, torch.arange(4), torch.arange(4.0), "ids")
    assert "dtype torch.int64" in msg and "torch.float32" in msg
    check.assert_close(torch.arange(4), torch.arange(4))
    assert "1 of 4" in fails(check.assert_close, torch.tensor([0, 1, 2, 4]), torch.arange(4))
    msg = fails(check.assert_close, torch.ones(3), torch.ones(3).double(), exact_dtype=True)
    assert "float64" in msg
    # bf16 result against a float32 reference: judged at bf16 tolerance
    x = torch.linspace(-2, 2, 50)
    check.assert_close(x.bfloat16(), x)
    fails(check.assert_close, (x * 1.1).bfloat16(), x)


def test_close_none_and_dtensor_like():
    assert "None" in fails(check.assert_close, None, torch.ones(2), "out", 1)

    class FakeDTensor:  # what a DTensor looks like from the outside
        placements = ()

        def full_tensor(self):
            return torch.ones(2)

    assert ".full_tensor()" in fails(check.assert_close, FakeDTensor(), torch.ones(2), "w", 0)
    assert "not a tensor" in fails(check.assert_close, object(), torch.ones(2), "w", 0)
    msg = fails(check.assert_close, torch.tensor(2.0), torch.tensor(0.5), "loss", 0)
    assert "(a scalar)" in msg and "It is 4x the reference." in msg


# Causes a single tensor cannot tell apart: each a ratio the message states, with no cause named.
NO_CAUSE = ("summed", "averaged", "divided", "twice", "sign (loss", "computed", "Hint")


def test_close_states_a_constant_ratio_and_names_no_cause(ref):
    """One tensor 4x, 1/4 of, -1x or 0x its reference: the ratio is a fact; a sum not averaged, a
    loss summed over 4 rows, a flipped update all fit 4x or -1x, so no cause is named."""
    for got, says in ((4 * ref, "Every element is 4x the reference."),
                      (ref / 4, "Every element is 1/4 of the reference."),
                      (-ref, "Every element is the reference with the opposite sign (-1x)."),
                      (0 * ref, "Every element is zero, where the reference is not."),
                      (0.731 * ref, "Every element is 0.731x the reference.")):
        msg = fails(check.assert_close, got, ref, "w")
        assert says in msg and not any(w in msg for w in NO_CAUSE), msg
    noisy = ref * 4 + 0.01 * torch.randn(ref.shape, generator=torch.Generator().manual_seed(3))
    assert "Every element" not in fails(check.assert_close, noisy, ref, "w")  # no single factor
    # two numbers always have some ratio: an arbitrary one is not stated for fewer than 4 elements
    assert "x the reference" not in fails(check.assert_close, torch.tensor([0.731, 1.462]), torch.tensor([1.0, 2.0]))


# ---------------------------------------------------------------- params / grads

def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))


def test_params_match_module_and_dict():
    a, b = _model(0), _model(0)
    check.assert_params_match(a, {k: v.detach().clone() for k, v in b.named_parameters()})
    c = _model(1)
    msg = fails(check.assert_params_match, c, dict(b.named_parameters()), rank=1)
    assert msg.startswith("rank 1: 4 of 4 parameters do not match")
    assert "'0.weight'" in msg and "index" in msg


def test_params_missing_extra_and_wrapper_prefix():
    ref = dict(_model(0).named_parameters())
    got = dict(ref)
    del got["2.bias"]
    got["2.extra"] = torch.zeros(1)
    msg = fails(check.assert_params_match, got, ref, rank=0)
    assert "Missing: '2.bias'" in msg and "Unexpected: '2.extra'" in msg
    wrapped = {"module." + k: v for k, v in ref.items()}
    assert "'module.'" in fails(check.assert_params_match, wrapped, ref)


def test_one_parameter_off_counts_it():
    ref = {k: v.detach().clone() for k, v in _model(0).named_parameters()}
    got = {k: v.clone() for k, v in ref.items()}
    got["2.weight"][1, 0] += 1e-3
    msg = fails(check.assert_params_match, got, ref, rank=2)
    assert "1 of 4 parameters" in msg and "'2.weight'" in msg and "(1, 0)" in msg


def _grads(model: nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad()
    model(x).pow(2).mean().backward()
    return {k: p.grad.clone() for k, p in model.named_parameters()}


def test_grads_averaged_pass_summed_fail():
    torch.manual_seed(0)
    x = torch.randn(8, 4)
    model = _model(0)
    ref = _grads(model, x)
    # 4 ranks, each with 2 samples: mean of the local gradients == full-batch gradient
    local = [_grads(model, x[2 * r: 2 * r + 2]) for r in range(4)]
    averaged = {k: sum(g[k] for g in local) / 4 for k in ref}
    summed = {k: sum(g[k] for g in local) for k in ref}
    check.assert_grads_match(averaged, ref, rank=0, world_size=4)
    # every gradient N x the reference, with N known: the one reduction mistake that fits is named
    msg = fails(check.assert_grads_match, summed, ref, rank=0, world_size=4)
    assert "Every gradient is 4x the reference, and 4 is the world size N." in msg
    assert "Hint: the gradients were summed over the 4 ranks, not averaged" in msg
    msg = fails(check.assert_grads_match, summed, ref, rank=0)  # world size unknown: the fact only
    assert "Every gradient is 4x the reference." in msg and "Hint" not in msg and "summed" not in msg
    twice = {k: v / 4 for k, v in averaged.items()}
    msg = fails(check.assert_grads_match, twice, ref, world_size=4)
    assert "Every gradient is 1/4 of the reference, and 4 is the world size N." in msg
    assert "Hint: the gradients were divided by the world size twice" in msg
    halved = {k: v / 2 for k, v in averaged.items()}  # 1/2 is neither N nor 1/N: no cause
    msg = fails(check.assert_grads_match, halved, ref, world_size=4)
    assert "Every gradient is 1/2 of the reference." in msg and "Hint" not in msg


def test_grads_cause_needs_every_tensor():
    """The pieces are the tensors: N x on some and right on another rules "summed" out, and two
    ratios on different tensors fit no one mistake; each ratio is still stated, per tensor."""
    torch.manual_seed(0)
    ref = _grads(_model(0), torch.randn(8, 4))
    partly = {k: (4 * v if k != "2.bias" else v.clone()) for k, v in ref.items()}
    msg = fails(check.assert_grads_match, partly, ref, rank=0, world_size=4)
    assert "The 3 gradients that differ are each 4x the reference, and 4 is the world size N; " \
           "the other one matches." in msg and "Hint" not in msg
    mixed = {k: (4 * v if k.endswith("weight") else v / 4) for k, v in ref.items()}
    msg = fails(check.assert_grads_match, mixed, ref, rank=0, world_size=4)
    assert "'0.weight', '2.weight' are 4x the reference" in msg and "'0.bias', '2.bias' are 1/4 of" in msg
    assert "Hint" not in msg
    one_off = {k: (4 * v if k.endswith("weight") else v + 1) for k, v in ref.items()}
    msg = fails(check.assert_grads_match, one_off, ref, rank=0, world_size=4)
    assert "The other 2 that differ are no constant multiple of the reference." in msg and "Hint" not in msg
    msg = fails(check.assert_params_match, {k: 4 * v for k, v in ref.items()}, ref, rank=0)
    assert "Every parameter is 4x the reference." in msg and "Hint" not in msg  # parameters: no cause


def test_grads_from_module_and_missing_grad():
    torch.manual_seed(0)
    x = torch.randn(8, 4)
    model = _model(0)
    ref = _grads(model, x)
    check.assert_grads_match(model, ref)
    model.zero_grad(set_to_none=True)
    msg = fails(check.assert_grads_match, model, ref, rank=1)
    assert "no gradient (None)" in msg and "rank 1" in msg


# ---------------------------------------------------------------- across ranks

def test_same_across_ranks():
    w = torch.randn(5, 5)
    one_ulp = torch.nextafter(w, torch.full_like(w, float("inf")))  # rounding noise
    check.assert_same_across_ranks([w, w.clone(), one_ulp, w.clone()], "w")
    per_rank = [w, w + 0.01, w, torch.randn(5, 5)]
    msg = fails(check.assert_same_across_ranks, per_rank, "w")
    assert msg.startswith("ranks 1 and 3 differ from rank 0 in 'w'")
    assert "broadcast" in msg and "rank 1:" in msg
    with pytest.raises(AssertionError):
        check.assert_same_across_ranks([w, one_ulp], "w", exact=True)
    check.assert_same_across_ranks([w, w.clone()], "w", exact=True)


def test_same_across_ranks_dicts_unsynchronised_rank():
    good = {k: v.detach() for k, v in _model(0).named_parameters()}
    never_broadcast = {k: v.detach() for k, v in _model(1).named_parameters()}
    check.assert_same_across_ranks([good, dict(good), dict(good)], "params")
    msg = fails(check.assert_same_across_ranks, [good, never_broadcast, dict(good)], "params")
    assert msg.startswith("rank 1 differs from rank 0 in 'params'") and "'params.0.weight'" in msg
    short = {k: v for k, v in good.items() if k != "0.bias"}
    assert "'0.bias'" in fails(check.assert_same_across_ranks, [good, short], "params")
    assert "None" in fails(check.assert_same_across_ranks, [good, None], "params")


# ---------------------------------------------------------------- shards

@pytest.fixture
def full() -> torch.Tensor:
    return torch.arange(30.0).view(10, 3)  # every row distinct, so shifts are visible


def test_shards_tensor_split_style_pass(full):
    for n in (1, 2, 3, 4, 10):
        check.assert_shards_reassemble(list(torch.tensor_split(full, n)), full, world_size=n)
    check.assert_shards_reassemble(list(torch.tensor_split(full, 3, dim=1)), full, dim=1)
    check.assert_shards_reassemble(list(torch.tensor_split(full, 3, dim=1)), full, dim=-1)


def test_shard_off_by_one(full):
    shifted = [full[0:3], full[3:6], full[5:7], full[8:10]]
    msg = fails(check.assert_shards_reassemble, shifted, full, name="wte")
    assert "rank 2" in msg and "holds rows 5..6" in msg and "should hold 6..7" in msg
    overlapping = [full[0:3], full[3:6], full[5:8], full[8:10]]
    msg = fails(check.assert_shards_reassemble, overlapping, full)
    assert "add up to 11, not 10" in msg and "Rank 2's shard holds rows 5..7" in msg
    bad_cols = list(torch.tensor_split(full, 3, dim=1))
    bad_cols[1] = full[:, 0:1]
    assert "indices along dim 1" in fails(check.assert_shards_reassemble, bad_cols, full, dim=1)


def test_shard_count_and_wrong_values(full):
    assert "world size is 4" in fails(check.assert_shards_reassemble,
                                      list(torch.tensor_split(full, 2)), full, world_size=4)
    halves = [full[0:5]] * 4
    assert "split into 2 pieces instead of 4" in fails(check.assert_shards_reassemble, halves, full)
    wrong = list(torch.tensor_split(full, 4))
    wrong[3] = wrong[3] * 2
    msg = fails(check.assert_shards_reassemble, wrong, full, name="w")
    assert "rank 3" in msg and "rows 8..9" in msg
    assert "sharded along another dim" in fails(
        check.assert_shards_reassemble, list(torch.tensor_split(full, 3, dim=1)), full)


def test_chunk_style_needs_balanced_false(full):
    chunked = list(torch.chunk(full, 4))  # sizes 3, 3, 3, 1
    assert "balanced=False" in fails(check.assert_shards_reassemble, chunked, full)
    check.assert_shards_reassemble(chunked, full, balanced=False)


def test_padded_mode(full):
    c = 3  # ceil(10 / 4)
    flat_pad = torch.cat([full, torch.zeros(2, 3)])
    padded = list(flat_pad.split(c))
    check.assert_shards_reassemble(padded, full, padded=True)
    assert "padded=True" in fails(check.assert_shards_reassemble, padded, full)
    dirty = [p.clone() for p in padded]
    dirty[3][2] = 7.0
    assert "padding" in fails(check.assert_shards_reassemble, dirty, full, padded=True)
    unpadded = list(torch.tensor_split(full, 4))
    assert "ceil(10/4) = 3" in fails(check.assert_shards_reassemble, unpadded, full, padded=True)


# ---------------------------------------------------------------- collectives

def test_collective_result_ranges():
    n = 4
    inputs = [torch.arange(8.0) + r for r in range(n)]
    total = sum(inputs)
    check.assert_collective_result([total.clone() for _ in range(n)], total, "all_reduce")
    broken = [total.clone() for _ in range(n)]
    broken[2][5:8] = 0
    broken[2][1] = -1
    msg = fails(check.assert_collective_result, broken, total, "all_reduce")
    assert "rank 2's result differs from all_reduce at elements 1, 5..7" in msg
    assert "rank 0" not in msg and "rank 1" not in msg
    # N x the expected result fits a result reduced twice, a SUM where the op averages, an input
    # added N times: the ratio and the ranks are stated, no cause
    msg = fails(check.assert_collective_result, [total * n] * n, total, "all_reduce")
    assert "On every rank the result is 4x the expected one, and 4 is the number of ranks N." in msg
    assert not any(w in msg for w in NO_CAUSE), msg
    mixed = [total * n, total.clone(), total / 2, total + 1]
    msg = fails(check.assert_collective_result, mixed, total, "all_reduce")
    assert "On rank 0 the result is 4x the expected one" in msg and "On rank 2 the result is 1/2 of" in msg
    assert "rank 3 the result" not in msg and not any(w in msg for w in NO_CAUSE), msg


def test_collective_per_rank_lists_and_counts():
    chunks = [torch.full((2,), float(r)) for r in range(3)]
    check.assert_collective_result([list(chunks)] * 3, [chunks] * 3, "all_gather")
    bad = [list(chunks), list(chunks), [chunks[0], chunks[0], chunks[2]]]
    msg = fails(check.assert_collective_result, bad, [chunks] * 3, "all_gather")
    assert "rank 2's result[1] differs from all_gather at elements 0..1" in msg
    assert "2 ranks but expected 3" in fails(check.assert_collective_result, [chunks] * 2, [chunks] * 3)
    scattered = [torch.tensor([6.0 * r]) for r in range(3)]
    check.assert_collective_result(scattered, scattered, "reduce_scatter")
    assert "shape" in fails(check.assert_collective_result, [torch.zeros(2)] * 3, scattered)
