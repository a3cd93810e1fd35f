"""The in-process bisect on real fixture models: fault fixtures name layer k and the
faulty sub-op, clean fixtures name nothing, capture leaves the numbers untouched."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conftest import assert_report, build, check_outputs

# 8 prompt tokens: prefill leaves 7 positions in the cache, so the block runs at offset 7 + depth
PROMPT = [11, 42, 7, 99, 3, 250, 17, 64]
DEPTH_FAULT_OFFSET = 12  # fires once 7 + depth >= 12, i.e. from depth 5

FAULTS = {
    "llama-attn-1": ("llama", {"kind": "rows", "layer": 1, "subop": "self_attn", "min_rows": 2}),
    "llama-mlp-4": ("llama", {"kind": "rows", "layer": 4, "subop": "mlp", "min_rows": 2}),
    "llama-depth-2": ("llama", {"kind": "depth", "layer": 2, "subop": "self_attn",
                                "min_offset": DEPTH_FAULT_OFFSET, "min_rows": 2}),
    "qwen-linear-2": ("qwen3_5", {"kind": "rows", "layer": 2, "subop": "linear_attn",
                                  "min_rows": 2}),
    "qwen-mlp-1": ("qwen3_5", {"kind": "rows", "layer": 1, "subop": "mlp", "min_rows": 2}),
    "moe-mlp-1": ("qwen3_moe", {"kind": "rows", "layer": 1, "subop": "mlp", "min_rows": 2}),
}
CLEAN = {"llama": "llama", "qwen3_5": "qwen3_5", "gemma3_text": "gemma3_text"}


@pytest.fixture(scope="session")
def bisect_models(fixture_root):
    """Loaded fixture targets (one fault each, so 'first divergent layer' means the fault)."""
    from specparity.checkpoint import load_checkpoint

    out = {}
    for name, (arch, fault) in FAULTS.items():
        info = build(fixture_root, f"bisect-{name}", arch=arch, faults=[fault], with_draft=False)
        out[name] = load_checkpoint(info.target, trust_remote_code=True)
    for name, arch in CLEAN.items():
        info = build(fixture_root, f"bisect-clean-{name}", arch=arch, with_draft=False)
        out[f"clean-{name}"] = load_checkpoint(info.target)
    return out


def _bisect(loaded, width=4, depth=1):
    from specparity.bisect.run import bisect_model

    return bisect_model(loaded, PROMPT, width, depth)[1]


def run_main(argv, capsys):
    from specparity.cli import main

    with pytest.raises(SystemExit) as exc:
        main(argv)
    out = capsys.readouterr()
    check_outputs(argv, out.out)
    return exc.value.code, out.out, out.err


@pytest.mark.model
@pytest.mark.parametrize("name,layer,subop", [
    ("llama-attn-1", 1, "self_attn"),
    ("llama-mlp-4", 4, "mlp"),
    ("qwen-linear-2", 2, "linear_attn"),
    ("qwen-mlp-1", 1, "mlp"),
    ("moe-mlp-1", 1, "mlp"),
])
def test_fault_names_layer_and_subop(bisect_models, name, layer, subop):
    report = _bisect(bisect_models[name])
    assert report.verdict == "divergent"
    assert report.first_divergent == str(layer)
    row = report.first_row()
    assert row.index == layer and row.output_differs
    assert report.drill is not None and report.drill.subop == subop
    # the fault scales the sub-op's output: everything it computed inside is equal
    assert report.drill.child is None and report.drill.children
    before = report.rows[: report.rows.index(row)]
    assert before and not any(r.divergent for r in before)
    # an attention-side fault cannot reach its own layer's cache, only the next layer's
    assert not row.cache_differs
    if layer + 1 < len([r for r in report.rows if r.index is not None]):
        assert report.rows[report.rows.index(row) + 1].cache_differs
    assert report.logits.diff is not None and not report.logits.diff.equal
    assert assert_report(report)["exit_code"] == 1


@pytest.mark.model
def test_linear_attention_layer_is_typed_and_its_state_compared(bisect_models):
    report = _bisect(bisect_models["qwen-linear-2"])
    kinds = [r.kind for r in report.rows if r.index is not None]
    assert kinds == ["linear attention (gated delta) + dense MLP", "full attention + dense MLP"] * 2
    row = report.first_row()
    assert row.cache_kind == "ArraysCache"
    assert {c.name for c in row.cache} == {"cache.2.state.0", "cache.2.state.1"}


@pytest.mark.model
def test_layer_type_table(bisect_models):
    gemma = _bisect(bisect_models["clean-gemma3_text"], depth=0)
    kinds = [r.kind.split(" + ")[0] for r in gemma.rows if r.index is not None]
    assert kinds == ["sliding attention", "sliding attention", "full attention"] * 2
    moe = _bisect(bisect_models["moe-mlp-1"])
    assert all(r.kind == "full attention + MoE" for r in moe.rows if r.index is not None)


@pytest.mark.model
@pytest.mark.parametrize("name", ["clean-llama", "clean-qwen3_5", "clean-gemma3_text"])
def test_clean_fixture_reports_no_divergent_layer(bisect_models, name):
    report = _bisect(bisect_models[name], width=4, depth=2)
    assert report.verdict == "equal" and report.first_divergent is None and report.drill is None
    assert assert_report(report)["exit_code"] == 0
    assert all(not r.divergent for r in report.rows)
    # the comparison really covered every layer's output and cache
    layers = [r for r in report.rows if r.index is not None]
    assert layers and all(r.output is not None and r.cache for r in layers)
    assert report.rows[0].label == "embed" and report.rows[-1].label == "logits"
    assert report.rows[-2].label == "final_norm"


@pytest.mark.model
def test_depth_fault_located_only_past_its_threshold(bisect_models):
    loaded = bisect_models["llama-depth-2"]
    below = _bisect(loaded, depth=4)  # block at offset 11 < 12
    assert below.verdict == "equal"
    past = _bisect(loaded, depth=5)  # block at offset 12
    assert past.first_divergent == "2" and past.drill.subop == "self_attn"
    idx = past.rows.index(past.first_row())
    assert [r.label for r in past.rows[:idx]] == ["embed", "0", "1"]
    assert not any(r.divergent for r in past.rows[:idx])
    assert "everything before it (embed, 0, 1) is byte-identical" in past.headline()


@pytest.mark.model
@pytest.mark.parametrize("name", ["clean-llama", "qwen-linear-2", "clean-gemma3_text",
                                  "moe-mlp-1"])
def test_capture_does_not_change_the_numbers(bisect_models, name):
    """Logits (and caches) with capture on are byte-identical to plain forwards."""
    from specparity.bisect.capture import capture
    from specparity.compare import compare_arrays
    from specparity.decode import advance_to_depth, greedy_chain, snapshot

    model = bisect_models[name].model
    dec, first, _ = advance_to_depth(model, PROMPT, 2)
    plain_chain = dec.fork()
    tokens, plain_logits = greedy_chain(plain_chain, first, 3)
    plain_block = dec.fork().forward(tokens)
    classes = [type(m) for _, m in model.named_modules()]
    model_class = type(model)
    with capture(model) as (rec, cmap):
        cap_chain = dec.fork()
        cap_tokens, cap_logits = greedy_chain(cap_chain, first, 3)
        cap_block = dec.fork().forward(tokens)
        assert len(rec.pop_calls()) == 4  # the wrappers really recorded every call
        assert type(model).__name__ == model_class.__name__ and type(model) is not model_class
    assert cmap.n_layers == len(model.layers) and cmap.wrapped > 3 * cmap.n_layers
    assert [type(m) for _, m in model.named_modules()] == classes  # classes restored
    assert cap_tokens == tokens
    assert compare_arrays(plain_logits, cap_logits).equal
    assert compare_arrays(plain_block, cap_block).equal
    for a, b in zip(snapshot(plain_chain.cache), snapshot(cap_chain.cache)):
        assert all(compare_arrays(a.arrays[k], b.arrays[k]).equal for k in a.arrays)


@pytest.mark.model
def test_capture_restores_classes_on_error(bisect_models):
    from specparity.bisect.capture import capture

    model = bisect_models["clean-llama"].model
    classes = [type(m) for _, m in model.named_modules()]
    with pytest.raises(RuntimeError):
        with capture(model):
            raise RuntimeError("boom")
    assert [type(m) for _, m in model.named_modules()] == classes


@pytest.mark.model
def test_cli_table_json_exit_codes_and_record(bisect_models, capsys, tmp_path):
    path = str(bisect_models["llama-mlp-4"].path)
    code, out, err = run_main(["bisect", "--model", path, "--trust-remote-code",
                               "--width", "4", "--depth", "1"], capsys)
    assert code == 1
    assert "first divergent layer: layer 4 (full attention + dense MLP)" in out
    assert "first differing sub-op: mlp" in out
    assert "differing output bytes per row:" in out and "█" in out

    code, out, _ = run_main(["bisect", "--model", path, "--trust-remote-code", "--width", "4",
                             "--json", "--record-dir", str(tmp_path / "rec")], capsys)
    assert code == 1
    data = json.loads(out)
    assert data["first_divergent"] == "4" and data["drill"]["subop"] == "mlp"
    md = Path(data["record"])
    text = md.read_text()
    assert "first divergent layer: layer 4" in text
    data_dir = md.parent / "data" / md.stem
    svg = data_dir / "layers.svg"
    assert f"data/{md.stem}/layers.svg" in text
    root = ET.parse(svg).getroot()
    assert root.tag.endswith("svg") and len(root.findall("{http://www.w3.org/2000/svg}rect")) > 1
    lines = (data_dir / "layers.jsonl").read_text().splitlines()
    assert [json.loads(x)["label"] for x in lines][:2] == ["embed", "0"]
    assert json.loads((data_dir / "report.json").read_text())["verdict"] == "divergent"

    clean = str(bisect_models["clean-llama"].path)
    code, out, _ = run_main(["bisect", "--model", clean, "--width", "3"], capsys)
    assert code == 0 and "no divergent layer" in out


@pytest.mark.model
def test_cli_usage_and_load_errors(bisect_models, capsys, tmp_path):
    clean = str(bisect_models["clean-llama"].path)
    code, _, err = run_main(["bisect", "--model", clean], capsys)
    assert code == 2 and "--width is required" in err
    code, _, err = run_main(["bisect", "--model", clean, "--width", "2", "--control", "novalue"],
                            capsys)
    assert code == 2 and "--control 'novalue'" in err
    code, _, err = run_main(["bisect", "--model", clean, "--width", "2", "--prompt-ids", "1,x"],
                            capsys)
    assert code == 2 and "--prompt-ids" in err
    code, _, err = run_main(["bisect", "--model", str(tmp_path / "nope"), "--width", "2"], capsys)
    assert code == 2 and "no such file" in err
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    (broken / "model.safetensors").write_bytes(b"")
    code, _, err = run_main(["bisect", "--model", str(broken), "--width", "2"], capsys)
    assert code == 4 and err.startswith("Error:") and len(err.strip().splitlines()) == 1


def test_terminal_bars_scale():
    from specparity.bisect.chart import bar

    assert bar(0.0) == "" and bar(1e-9) == "▏" and bar(1.0, 10) == "█" * 10
    assert len(bar(0.5, 10)) == 5
