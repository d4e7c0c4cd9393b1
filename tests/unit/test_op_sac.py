"""torchtitan's op-level selective checkpointing (``cost.op_sac_saved``, ``cost.op_sac_recomputed_flops``),
measured: a small Llama block (the kit's ``models.hf.tiny_llama``: GQA, SwiGLU, SDPA) run in bf16 under
``torch.utils.checkpoint`` with a selective policy that follows torchtitan's rule (save every matmul's
output but every second one, and the attention kernel's outputs), and the bytes that stay alive between
forward and backward counted against the formula.

The rule, as torchtitan states it (torchtitan/parallelisms/parallelize_llama.py at 9dec370,
``_custom_policy``): count the block's ``aten.mm`` calls, separately in forward and in the recomputation;
save an mm's output unless the count is even; save SDPA's outputs.  On CPU SDPA runs
``_scaled_dot_product_flash_attention_for_cpu`` (output and fp32 logsumexp, as the GPU's flash kernel),
which the policy below saves in the GPU kernels' place.
"""
import gc

import pytest

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

torch = pytest.importorskip("torch")

from torch.multiprocessing.reductions import StorageWeakRef  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts  # noqa: E402

from parlab import cost  # noqa: E402
from parlab.models.hf import tiny_llama  # noqa: E402

B, S, H, HEADS, KV, FFN = 2, 32, 64, 4, 2, 160
ATTENTION = {torch.ops.aten._scaled_dot_product_flash_attention.default,
             torch.ops.aten._scaled_dot_product_efficient_attention.default,
             torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default}


def titan_like_policy():
    """Our own statement of torchtitan's op rule.  torchtitan counts forward and recomputation apart
    because the torch of its day asked the policy in both; torch 2.13 asks in forward only and replays
    the decisions, so one count serves."""
    matmuls = [0]

    def decide(ctx, op, *args, **kwargs):
        if op is torch.ops.aten.mm.default:
            matmuls[0] += 1
            keep = matmuls[0] % 2 == 1  # every second matmul is recomputed
        else:
            keep = op in ATTENTION
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE
    return lambda: create_selective_checkpoint_contexts(decide)


class _MatmulFlops(TorchDispatchMode):
    """The FLOPs of every ``aten.mm`` run under it, 2·m·k·n each."""

    def __init__(self):
        super().__init__()
        self.flops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.mm.default:
            (m, k), n = args[0].shape, args[1].shape[1]
            self.flops += 2 * m * k * n
        return func(*args, **(kwargs or {}))


class _Outputs(TorchDispatchMode):
    """Weak references to the storage of every tensor an op creates, to see which stay alive."""

    def __init__(self):
        super().__init__()
        self.storages = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(t, torch.Tensor):
                st = t.untyped_storage()
                self.storages[st._cdata] = (StorageWeakRef(st), st.nbytes())
        return out


def _kept_bytes(layer, x, rope, context_fn=None) -> tuple[int, torch.Tensor]:
    """Bytes the checkpointed block keeps alive after its forward: the storages its ops created that are
    still alive (the output aside), plus its input, which the checkpoint holds to rerun it (the rotary
    tables are the model's, shared by every block, not counted)."""
    before = {t.untyped_storage()._cdata for t in (*layer.parameters(), x, *rope)}  # weights and inputs
    watch = _Outputs()
    with watch:
        y = checkpoint(layer, x, position_embeddings=rope, attention_mask=None, use_reentrant=False,
                       **({"context_fn": context_fn} if context_fn else {}))
    gc.collect()
    out = y.untyped_storage()._cdata
    alive = sum(n for key, (ref, n) in watch.storages.items()
                if key not in before and key != out and not ref.expired())
    return alive + x.untyped_storage().nbytes(), y


@pytest.fixture(scope="module")
def block():
    model = tiny_llama(hidden_size=H, intermediate_size=FFN, num_attention_heads=HEADS, num_key_value_heads=KV,
                       num_hidden_layers=1, attn_implementation="sdpa").to(torch.bfloat16)
    layer = model.model.layers[0]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(B, S, H, generator=g).to(torch.bfloat16).requires_grad_()
    rope = model.model.rotary_emb(x, torch.arange(S)[None].expand(B, S))
    return layer, x, rope


def test_op_level_selective_checkpointing_keeps_the_bytes_the_formula_counts(block):
    layer, x, rope = block
    kept, y = _kept_bytes(layer, x, rope, titan_like_policy())
    parts = cost.op_sac_saved(S, B, H, HEADS, ffn=FFN, gated=True, kv_heads=KV)
    assert set(parts) == {"input", "wq", "wv", "w1", "w2", "attention", "logsumexp"}
    assert kept == sum(parts.values()) == cost.activation_bytes_per_layer(
        S, B, H, HEADS, recompute="op", scores=False, ffn=FFN, gated=True, kv_heads=KV, dropout=False)
    # its backward runs the formula's recomputed matmuls (wk, wo, w3) beyond a plain backward, and gives
    # the plain backward's gradients
    with _MatmulFlops() as selective:
        y.float().square().sum().backward()
    got = {n: p.grad.clone() for n, p in layer.named_parameters()}
    layer.zero_grad()
    y = layer(x, position_embeddings=rope, attention_mask=None)
    with _MatmulFlops() as plain:
        y.float().square().sum().backward()
    assert selective.flops - plain.flops == cost.op_sac_recomputed_flops(
        H, HEADS, ffn=FFN, gated=True, kv_heads=KV) * B * S
    for n, p in layer.named_parameters():
        assert torch.equal(got[n], p.grad), n
    # whole-block checkpointing keeps the input alone: "full"'s 2·sbh
    full, _ = _kept_bytes(layer, x, rope)
    assert full == cost.activation_bytes_per_layer(S, B, H, HEADS, recompute="full") == 2 * S * B * H


def test_the_op_rule_for_llama_3_8b_and_under_tensor_parallelism():
    m = dict(ffn=14336, gated=True, kv_heads=8)
    one = cost.op_sac_saved(8192, 1, 4096, 32, **m)
    assert sum(one.values()) / (8192 * 4096) == pytest.approx(8 + 2 * 8 / 32 + 2 * 14336 / 4096 + 4 * 32 / 4096)
    assert [n for n, *_, saved in cost.op_sac_matmuls(4096, 32, **m) if not saved] == ["wk", "wo", "w3"]
    forward = sum(2 * k * n for _, k, n, _, _ in cost.op_sac_matmuls(4096, 32, **m))
    assert cost.op_sac_recomputed_flops(4096, 32, **m) / forward == pytest.approx(0.365, abs=5e-4)
    # under TP (with torchtitan's SP) the colwise outputs split, w2's partial sum is kept whole, and the two
    # reduce-scattered outputs are saved
    tp = cost.op_sac_saved(8192, 1, 4096, 32, t=8, **m)
    assert tp["w2"] == one["w2"] and tp["wq"] == one["wq"] / 8 and tp["reduce-scatter"] == 2 * one["input"] / 8
    with pytest.raises(ValueError, match="torchtitan"):
        cost.activation_bytes_per_layer(8192, 1, 4096, 32, t=8, sp=False, recompute="op", scores=False, **m)


def test_the_planner_prices_torchtitans_modes_and_docs_state_the_figures():
    from dataclasses import replace
    from pathlib import Path

    from parlab import planner as P
    from parlab.planner import band as B, frameworks as F
    doc = " ".join((Path(__file__).resolve().parents[2] / "docs" / "planner.md").read_text().split())
    m = dict(ffn=14336, gated=True, kv_heads=8)
    units = sum(cost.op_sac_saved(8192, 1, 4096, 32, **m).values()) / (8192 * 4096)
    forward = sum(2 * k * n for _, k, n, _, _ in cost.op_sac_matmuls(4096, 32, **m))
    assert f"{units:.2f}·sbh for Llama 3 8B" in doc
    assert f"{cost.op_sac_recomputed_flops(4096, 32, **m) / forward:.1%}".replace("%", " %") in doc
    # each framework runs its own modes
    titan = P.Plan(dp=8, tp=1, pp=1, zero=3, micro_batch=1, accum=1)
    megatron = P.Plan(dp=8, tp=1, pp=1, zero=1, micro_batch=1, accum=1)
    for plan, framework in ((titan, "torchtitan"), (megatron, "Megatron-LM")):
        for mode in P.RECOMPUTE_MODES:
            runs = not F.unrunnable(replace(plan, recompute=mode))
            assert runs == (mode in F.RECOMPUTE_BY_FRAMEWORK[framework]), (framework, mode)
    assert F.unrunnable(replace(megatron, recompute="full", recompute_every=2))
    assert 'selective_ac_option = "op"' in F.configuration(replace(titan, recompute="op"), P.SCENARIOS["7B on 8 H100s"])
    assert 'selective_ac_option = "2"' in F.configuration(replace(titan, recompute="full", recompute_every=2),
                                                          P.SCENARIOS["7B on 8 H100s"])
    with pytest.raises(ValueError, match="recompute_every=2 .* needs recompute=\"full\""):
        P.Plan(dp=8, tp=1, pp=1, recompute_every=2)
    stored = P.Workload(P.ModelSpec("GPT", 1.3e9, 24, 2048, 16, 2048, scores=True), P.Cluster(8), 8)
    with pytest.raises(ValueError, match="stored attention scores"):  # torchtitan runs SDPA
        P.predict(replace(titan, recompute="op"), stored)
    # the search tries "op" only when asked; asked, it changes the 70B-on-15T scenario's best plan
    work = P.SCENARIOS["70B on 15T tokens (2048 H100s)"]
    old, new = P.search(work), P.search(replace(work, op_sac=True))
    assert old.plan.recompute != "op" and new.plan.recompute == "op" and F.runs_on(new.plan) == "torchtitan"
    assert (f"dp {new.plan.dp} × tp {new.plan.tp} with FSDP and op-level checkpointing, "
            f"{new.tokens_per_second / old.tokens_per_second - 1:.1%} faster than dp {old.plan.dp} × "
            f"tp {old.plan.tp} × pp {old.plan.pp}").replace("%", " %") in doc
    for name in ("70B on 64 H100s", "7B, 32k-token sequences (64 H100s)"):
        w = P.SCENARIOS[name]
        assert len(B.band(replace(w, op_sac=True)).choices) == len(B.band(w).choices) + 1, name
