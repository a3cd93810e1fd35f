"""The exact classic reference, frozen captures, boundary-aimed blocks,
and the reproducibility bracket, each shown both ways on real fixtures."""

from __future__ import annotations

import pytest

from conftest import ROWS4, build, run_cli
from specparity.checkpoint import load_checkpoint
from specparity.decode import CacheOptions, Decoder
from specparity.identity import device

# 20 tokens; on the bf16 and fp16 llama fixtures classic decode breaks an exact
# logprob tie toward the lower id at emitted index 4 of this prompt
TIE_PROMPT = list(range(100, 140, 2))
PROMPT = list(range(20, 36))
cpu_only = pytest.mark.skipif(device() != "cpu", reason="pins the CPU backend's measured exactness")
NOISE = [{"kind": "noise", "layer": 2, "subop": "mlp"}]


def _model(info, trust=False):
    return load_checkpoint(info.target, trust_remote_code=trust).model


def _raw_argmax_chain(model, prompt, n):
    """The old reference: argmax of raw logits (no logprobs, no sampler)."""
    import mlx.core as mx

    dec = Decoder(model)
    y, out = dec.prefill(prompt), []
    for _ in range(n):
        y = int(mx.argmax(dec.forward([y])[-1]))
        out.append(y)
    return out


# -- item 1: the classic reference is mlx-lm's own greedy decode ----------------------------

@pytest.mark.model
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_reference_follows_classic_ties_no_false_alarm_and_real_divergence_caught(fixture_root, dtype):
    from mlx_lm.generate import generate_step

    import mlx.core as mx

    from specparity.probes.replay.core import replay
    from specparity.probes.replay.recorder import record_speculative

    model = _model(build(fixture_root, f"llama-{dtype}-solo", arch="llama", dtype=dtype,
                         with_draft=False))
    n = 32
    classic = [t for t, _ in generate_step(mx.array(TIE_PROMPT), model, max_tokens=n)]
    old = _raw_argmax_chain(model, TIE_PROMPT, n)
    assert old != classic, "the fixture must hold a logprob tie that raw argmax breaks the other way"
    flip = next(i for i, (a, b) in enumerate(zip(old, classic)) if a != b)

    # mlx-lm's own speculative decoding (the target drafting for itself: every proposal verified)
    served = record_speculative(model, model, TIE_PROMPT, 3, n)
    assert served.tokens == classic
    report = replay(model, TIE_PROMPT, served.accepts, widths=served.widths, served_tokens=served.tokens)
    assert report.verdict == "equal" and report.exit_code == 0  # the old reference alarmed here
    assert report.classic_tokens == classic
    assert report.tie_breaks_total >= 1 and report.tie_breaks[0]["emitted_index"] == flip
    pick = report.tie_breaks[0]["pick"]
    assert pick["margin"] == 0.0 and pick["raw_argmax"] == old[flip] and pick["token"] < pick["raw_argmax"]
    assert any("exact logprob tie" in line for line in report.lines())

    # a real divergence: the served stream takes the raw-argmax token at the tie
    bad = list(served.tokens)
    bad[flip] = old[flip]
    report = replay(model, TIE_PROMPT, served.accepts, widths=served.widths, served_tokens=bad)
    assert report.verdict == "divergent" and report.served_first_mismatch == flip
    assert "a near-tie flip: the served token is classic's runner-up" in "\n".join(report.lines())


@pytest.mark.model
@cpu_only
def test_bf16_rows_fault_still_divergent_and_clean_bf16_equal(fixture_root):
    from specparity.probes.forward.blockchain import probe_block_vs_chain

    clean = _model(build(fixture_root, "llama-bfloat16-solo", arch="llama", dtype="bfloat16",
                         with_draft=False))
    report = probe_block_vs_chain(clean, [2, 4], [0, 8], [TIE_PROMPT], walk_positions=32)
    assert report.verdict == "equal"
    faulty = _model(build(fixture_root, "llama-bfloat16-rows4", arch="llama", dtype="bfloat16",
                          with_draft=False,
                          faults=[ROWS4]), True)
    report = probe_block_vs_chain(faulty, [2, 4], [0, 8], [TIE_PROMPT])
    assert [c.verdict for c in report.cells] == ["equal", "divergent", "equal", "divergent"]


# -- item 2: captures are frozen; layer labels from each block ------------------------------

@pytest.mark.model
@cpu_only
def test_bisect_under_quantized_kv_names_o_proj_not_rope(fixture_root):
    from specparity.bisect.run import bisect_model

    loaded = load_checkpoint(build(fixture_root, "llama-float32", arch="llama").target)
    # the chain quantizes its cache after position 17, inside the 4-row block at 15..18
    opts = CacheOptions(kv_bits=8, kv_group_size=32, quantized_kv_start=17)
    _, report = bisect_model(loaded, PROMPT, 4, 0, opts)
    assert report.verdict == "divergent" and report.first_divergent == "0"
    drill = report.drill
    assert drill is not None and drill.subop == "self_attn" and drill.child == "o_proj"
    # quantized attention scales its queries in place after capture: a reference, not a
    # copy, made the chain's later rope rows the scale times the block's
    assert {"rope", "rope#1"} <= set(drill.children)
    # clean control: no quantization, nothing differs
    _, report = bisect_model(loaded, PROMPT, 4, 0, CacheOptions())
    assert report.verdict == "equal"


@pytest.mark.model
def test_layer_kinds_come_from_each_block_of_a_hybrid():
    import mlx.core as mx
    from mlx_lm.models import nemotron_h

    from specparity.bisect.capture import layer_kind

    args = nemotron_h.ModelArgs.from_dict(dict(
        model_type="nemotron_h", vocab_size=64, hidden_size=32, intermediate_size=64,
        num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
        hybrid_override_pattern="M*-E", mamba_num_heads=2, mamba_head_dim=16, ssm_state_size=8,
        conv_kernel=4, n_groups=1, layer_norm_epsilon=1e-5, n_routed_experts=2, num_experts_per_tok=1,
        moe_intermediate_size=16, moe_shared_expert_intermediate_size=16, n_group=1, topk_group=1,
        max_position_embeddings=128, attention_bias=False, mlp_bias=False, use_bias=False,
        use_conv_bias=True, mamba_proj_bias=False, residual_in_fp32=False, rms_norm_eps=1e-5,
        tie_word_embeddings=False, mamba_hidden_act="silu", time_step_limit=(0.0, float("inf")),
        chunk_size=8, routed_scaling_factor=1.0, norm_topk_prob=True, mlp_hidden_act="relu2"))
    model = nemotron_h.Model(args)
    mx.eval(model.parameters())
    assert [layer_kind(layer, None) for layer in model.layers] == [
        "linear attention / SSM", "full attention", "MLP only (no attention)", "MoE only (no attention)"]


# -- item 3: blocks aimed at every cache boundary -------------------------------------------

@pytest.mark.model
@cpu_only
def test_quantized_kv_start_missed_by_plain_cells_caught_by_aimed_ones(fixture_root):
    from specparity.probes.forward.blockchain import probe_block_vs_chain
    from specparity.probes.gate import gate_check

    info = build(fixture_root, "llama-float32", arch="llama")
    model = _model(info)
    opts = CacheOptions(kv_bits=4, kv_group_size=32, quantized_kv_start=20)
    plain = probe_block_vs_chain(model, [2], [0], [PROMPT], opts)  # block at 15..16: misses 20
    assert plain.verdict == "equal"
    aimed = probe_block_vs_chain(model, [2], [0], [PROMPT], opts, aim=True)
    assert aimed.verdict == "divergent"
    (cell,) = [a for a in aimed.aimed if a.boundary["kind"] == "quantized_kv_start"]
    assert cell.start == 19 and cell.absolute_position == 20 and cell.verdict == "divergent"
    assert cell.walk is not None and cell.walk.first_position == 20
    assert any("prefill_step_size 2048" in n and "aim limit" in n for n in aimed.notes)
    # the gate runs them before it allows; without --kv-bits the same gate allows
    d = gate_check(info.target, 2, opts, depths=(0,), walk=0)
    assert not d.allow and "across quantized_kv_start 20" in d.reason
    assert gate_check(info.target, 2, CacheOptions(), depths=(0,), walk=0).allow


@pytest.mark.model
def test_sliding_window_aimed_and_max_kv_size_stated_ignored(fixture_root):
    from specparity.probes.forward.blockchain import probe_block_vs_chain
    from specparity.probes.forward.boundaries import describe_cache, find_boundaries

    model = _model(build(fixture_root, "gemma3-float32-solo", arch="gemma3_text", with_draft=False))
    opts = CacheOptions(max_kv_size=64, prefill_step_size=8)
    found, notes = find_boundaries(model, opts)
    kinds = {(b.kind, b.position) for b in found}
    assert ("sliding_window", 32) in kinds and ("prefill_step_size", 8) in kinds
    assert not any(b.kind == "max_kv_size" for b in found)
    assert notes == ["--max-kv-size 64: ignored by this architecture (it builds its own cache;"
                     " mlx-lm does not pass the option on)"]
    assert "ignored by this architecture" in describe_cache(model, opts)
    report = probe_block_vs_chain(model, [4], [0], [PROMPT], opts, aim=True)
    sw = [a for a in report.aimed if a.boundary["kind"] == "sliding_window"]
    assert sw and sw[0].start < 32 <= sw[0].start + 3 and sw[0].verdict in ("equal", "divergent")
    pre = [a for a in report.aimed if a.boundary["kind"] == "prefill_step_size"]
    assert pre and pre[0].prompt_len == 10  # two prefill chunks whatever the prompt


# -- item 4: reproducibility before blame ---------------------------------------------------

@pytest.mark.model
def test_not_reproducible_forward_is_inconclusive_in_probe_replay_bisect_and_gate(fixture_root, cli_bin):
    from specparity.bisect.run import run_bisect
    from specparity.probes.forward.blockchain import probe_block_vs_chain
    from specparity.probes.gate import gate_check
    from specparity.probes.replay.core import replay

    info = build(fixture_root, "llama-noise", arch="llama", faults=NOISE, with_draft=False)
    loaded = load_checkpoint(info.target, trust_remote_code=True)
    probe = probe_block_vs_chain(loaded.model, [2, 4], [0, 8], [PROMPT], walk_positions=16)
    assert probe.verdict == "inconclusive" and probe.exit_code == 3
    assert probe.bracket is not None
    assert not probe.bracket.reproducible and probe.bracket.position == 15
    assert all(c.verdict == "not_run" for c in probe.cells) and not probe.walks
    rep = replay(loaded.model, PROMPT, [1, 2, 0], width=4)
    assert rep.verdict == "inconclusive" and rep.exit_code == 3 and rep.disagreements == 0
    bis = run_bisect(loaded, PROMPT, 4, 0, CacheOptions())
    assert bis.verdict == "inconclusive" and bis.exit_code == 3
    assert "first differing capture: layers.2" in bis.lines()[0]
    d = gate_check(info.target, 4, trust_remote_code=True, depths=(0,), walk=0)
    assert not d.allow and d.verdict == "inconclusive" and "not reproducible" in d.reason
    r = run_cli(cli_bin, "probe", "--model", info.target, "--trust-remote-code", "--widths", "2",
                "--depths", "0", "--walk", "0")
    assert r.returncode == 3, r.stderr
    assert "not reproducible: the chain arm repeated from the same state" in r.stdout

    # clean control: the same bracket on the clean fixture is byte-identical
    clean = load_checkpoint(build(fixture_root, "llama-float32", arch="llama").target)
    probe = probe_block_vs_chain(clean.model, [2, 4], [0], [PROMPT])
    assert probe.bracket is not None and probe.bracket.reproducible and probe.bracket.rows == 4
    bracket = replay(clean.model, PROMPT, [1, 2, 0], width=4).bracket
    assert bracket is not None and bracket.reproducible
