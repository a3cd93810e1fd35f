"""GGUF export of the embedded fixtures, checked without llama.cpp.

A numpy forward pass that follows GGML's llama graph (interleaved "normal"
rope, GQA, RMSNorm, SwiGLU) reads the exported GGUF and must reproduce
mlx-lm's logits for the same tokens: that proves the tensor names, shapes,
head sizes and the q/k rope permutation. The same forward on an export whose
permutation is switched off must disagree, so the check can fail.
tests/engines/test_llama_cpp.py then proves it on the real llama-server.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import run_cli

pytestmark = pytest.mark.model

TOKENS = [7, 30, 101, 250, 3, 64, 480, 12, 99, 200, 5, 311, 42, 17, 260, 88]


def _ggml_forward(path: str, tokens: list[int]) -> np.ndarray:
    """Logits [len(tokens), vocab] of a GGUF llama, computed as GGML's graph does (float64)."""
    import gguf

    r = gguf.GGUFReader(path)
    t = {x.name: np.asarray(x.data, dtype=np.float64) for x in r.tensors}

    def field(key):
        f = r.fields[key]
        return f.parts[f.data[0]][0]

    n_layer = int(field("llama.block_count"))
    n_head = int(field("llama.attention.head_count"))
    n_kv = int(field("llama.attention.head_count_kv"))
    hd = int(field("llama.attention.key_length"))
    eps = float(field("llama.attention.layer_norm_rms_epsilon"))
    base = float(field("llama.rope.freq_base"))

    def rms(x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w

    def rope_norm(x):  # x [T, heads, hd]: GGML_ROPE_TYPE_NORM rotates adjacent pairs
        pos = np.arange(x.shape[0])[:, None, None]
        theta = pos * base ** (-np.arange(0, hd, 2) / hd)[None, None, :]
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x0 * np.cos(theta) - x1 * np.sin(theta)
        out[..., 1::2] = x0 * np.sin(theta) + x1 * np.cos(theta)
        return out

    n = len(tokens)
    h = t["token_embd.weight"][tokens]
    mask = np.triu(np.full((n, n), -np.inf), 1)
    for i in range(n_layer):
        p = f"blk.{i}."
        x = rms(h, t[p + "attn_norm.weight"])
        q = rope_norm((x @ t[p + "attn_q.weight"].T).reshape(n, n_head, hd))
        k = rope_norm((x @ t[p + "attn_k.weight"].T).reshape(n, n_kv, hd))
        v = (x @ t[p + "attn_v.weight"].T).reshape(n, n_kv, hd)
        k = np.repeat(k, n_head // n_kv, axis=1)
        v = np.repeat(v, n_head // n_kv, axis=1)
        s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd) + mask
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        o = np.einsum("hqk,khd->qhd", a, v).reshape(n, n_head * hd)
        h = h + o @ t[p + "attn_output.weight"].T
        x = rms(h, t[p + "ffn_norm.weight"])
        g = x @ t[p + "ffn_gate.weight"].T
        u = x @ t[p + "ffn_up.weight"].T
        h = h + ((g / (1 + np.exp(-g))) * u) @ t[p + "ffn_down.weight"].T
    return rms(h, t["output_norm.weight"]) @ t["output.weight"].T


def _mlx_logits(model_dir: str, tokens: list[int]) -> np.ndarray:
    import mlx.core as mx
    from mlx_lm import load

    model = load(model_dir)[0]
    return np.array(model(mx.array(tokens)[None])[0].astype(mx.float32), dtype=np.float64)


@pytest.mark.parametrize("role", ["target", "draft"])
def test_gguf_forward_matches_mlx_lm_logits(llama_pair, tmp_path, role):
    from specparity.gguf_export import export_gguf

    src = getattr(llama_pair, role)
    out = tmp_path / f"{role}.gguf"
    info = export_gguf(src, out)
    assert info.n_tensors == 2 + 1 + 6 * 9 and info.eos_id == 0
    ref = _mlx_logits(src, TOKENS)
    got = _ggml_forward(str(out), TOKENS)
    assert np.abs(got - ref).max() < 1e-3, np.abs(got - ref).max()
    assert (got.argmax(-1) == ref.argmax(-1)).all()


def test_gguf_without_the_rope_permutation_disagrees(llama_pair, tmp_path, monkeypatch):
    """The detector fires: skip the q/k permutation and GGML's rope computes another model."""
    from specparity import gguf_export

    monkeypatch.setattr(gguf_export, "permute_rope", lambda w, n_head, n_head_kv=None: w)
    out = tmp_path / "unpermuted.gguf"
    gguf_export.export_gguf(llama_pair.target, out)
    ref = _mlx_logits(llama_pair.target, TOKENS)
    got = _ggml_forward(str(out), TOKENS)
    # position 0 has no rotation, so only later positions can tell
    assert np.abs(got[1:] - ref[1:]).max() > 1e-2


def test_gguf_f16_is_close(llama_pair, tmp_path):
    from specparity.gguf_export import export_gguf

    f16 = export_gguf(llama_pair.target, tmp_path / "t16.gguf", outtype="f16")
    f32 = export_gguf(llama_pair.target, tmp_path / "t32.gguf")
    assert f16.bytes < 0.6 * f32.bytes
    ref = _mlx_logits(llama_pair.target, TOKENS)
    assert np.abs(_ggml_forward(f16.path, TOKENS) - ref).max() < 5e-2


def test_gguf_vocabulary_is_the_tokenizers(llama_pair, tmp_path):
    import gguf

    from specparity.gguf_export import export_gguf

    out = tmp_path / "t.gguf"
    export_gguf(llama_pair.target, out)
    r = gguf.GGUFReader(str(out))

    def strings(key):
        f = r.fields[key]
        return [bytes(f.parts[i]).decode() for i in f.data]

    def scalar(key):
        f = r.fields[key]
        return f.parts[f.data[0]][0]

    from pathlib import Path

    tok = json.loads((Path(llama_pair.target) / "tokenizer.json").read_text())
    tokens = strings("tokenizer.ggml.tokens")
    for text, i in tok["model"]["vocab"].items():
        assert tokens[i] == text
    assert strings("tokenizer.ggml.merges") == [" ".join(m) for m in tok["model"]["merges"]]
    assert strings("tokenizer.ggml.model") == ["gpt2"] and strings("tokenizer.ggml.pre") == ["gpt-2"]
    assert int(scalar("tokenizer.ggml.eos_token_id")) == 0
    assert not bool(scalar("tokenizer.ggml.add_bos_token"))
    types = r.fields["tokenizer.ggml.token_type"]
    assert int(types.parts[types.data[0]][0]) == int(gguf.TokenType.CONTROL)  # <|endoftext|>


def test_fixture_gguf_pair_is_cached(llama_pair, monkeypatch):
    from specparity import fixtures, gguf_export

    target, draft = fixtures.pair_gguf(llama_pair)
    assert target.endswith("target-f32.gguf") and draft is not None and draft.endswith("draft-f32.gguf")

    def boom(*a, **k):
        raise AssertionError("exported again")

    monkeypatch.setattr(gguf_export, "export_gguf", boom)
    assert fixtures.pair_gguf(llama_pair) == (target, draft)


def test_cli_fixtures_gguf(cli_bin, llama_pair, tmp_path):
    out = tmp_path / "t.gguf"
    r = run_cli(cli_bin, "fixtures", "gguf", llama_pair.target, str(out), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["path"] == str(out) and out.stat().st_size > 1_000_000


@pytest.mark.parametrize("case", ["missing", "not-a-checkpoint", "fault"])
def test_cli_fixtures_gguf_refuses_bad_input(cli_bin, llama_pair, tmp_path, case, request):
    if case == "missing":
        src, code, words = str(tmp_path / "nope"), 2, "SRC_DIR"
    elif case == "not-a-checkpoint":
        src, code, words = str(tmp_path), 2, "no config.json"  # as e2e and probe say (issue 20)
    else:  # the shared rows-4 fault pair, built once per session
        src, code, words = request.getfixturevalue("rows4_pair").target, 2, "fault fixture"
    r = run_cli(cli_bin, "fixtures", "gguf", src, str(tmp_path / "o.gguf"))
    assert r.returncode == code, (r.returncode, r.stderr)
    assert r.stderr.startswith("Error: ") and words in r.stderr and "Traceback" not in r.stderr


def test_cached_gguf_is_keyed_by_checkpoint_content(llama_pair, monkeypatch):
    from specparity import gguf_export

    t = gguf_export.cached_gguf(llama_pair.target)
    d = gguf_export.cached_gguf(llama_pair.draft)
    assert t != d and t.endswith("-f32.gguf")

    def boom(*a, **k):
        raise AssertionError("exported again")

    monkeypatch.setattr(gguf_export, "export_gguf", boom)
    assert gguf_export.cached_gguf(llama_pair.target) == t
