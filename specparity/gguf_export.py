"""Export an mlx-lm llama checkpoint (the embedded fixtures) to GGUF for llama.cpp.

So the same tiny target and drafter run on a second engine: llama.cpp's
``llama-server`` loads the GGUF files this module writes with the ``gguf``
package. What makes llama.cpp compute the same model:

- tokenizer: model ``gpt2`` (byte-level BPE) with the tokens, token types and
  merges of ``tokenizer.json``; the pre-tokenizer ``gpt-2``, whose split regex
  is exactly the one of the HF ``ByteLevel`` pre-tokenizer the fixtures use
  (llama.cpp's ``default`` adds punctuation and digit splits of its own, so
  text prompts would tokenize differently); no BOS is added (mlx-lm adds none
  for these fixtures);
- q and k projections permuted from the HF / mlx-lm rotate-half rope layout to
  GGML's interleaved one (the same permutation as llama.cpp's
  ``convert_hf_to_gguf.py``);
- head size written explicitly (the fixtures' head_dim 32 times 4 heads is not
  the hidden size 64).

Only the llama architecture is exported, unquantized (float32, or float16
for the matrices); a fault fixture's defects live in Python (``model_file``)
and cannot travel in a GGUF, so it is refused.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from specparity.errors import CheckpointError, InputError, UsageError

log = logging.getLogger(__name__)

OUTTYPES = ("f32", "f16")
# GGUF's tokenizer.ggml.pre names: see the module docstring
PRE_TOKENIZER = "gpt-2"


@dataclass
class GGUFInfo:
    """What ``export_gguf`` wrote.

    path: the GGUF file.
    source: the mlx-lm checkpoint directory it came from.
    outtype: f32 or f16 (float16 matrices; norms stay float32).
    n_tensors: tensors written.
    vocab_size: tokens in the vocabulary (padded to the model's vocab_size).
    eos_id: the end-of-sequence token id.
    bytes: file size in bytes.
    """

    path: str
    source: str
    outtype: str
    n_tensors: int
    vocab_size: int
    eos_id: int
    bytes: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def permute_rope(w, n_head: int, n_head_kv: int | None = None):
    """Reorder a q or k projection's rows from rotate-half to GGML's interleaved rope layout.

    Within each head the rows (first half, second half) become (pair 0, pair 1, ...):
    row ``i`` of the half-split layout moves so that rope rotates adjacent rows.
    """
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    rows = w.shape[0]
    return (w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2)
            .reshape(w.shape))


def _vocab(src: Path, vocab_size: int) -> tuple[list[str], list[int], list[str], int]:
    """tokens, token types, merges and the eos id from tokenizer.json (+ tokenizer_config.json)."""
    import gguf

    path = src / "tokenizer.json"
    try:
        tok = json.loads(path.read_text())
    except OSError as err:
        raise CheckpointError(f"{path}: {err.strerror}") from None
    except ValueError as err:
        raise CheckpointError(f"{path}: not JSON ({err})") from None
    model = tok.get("model") or {}
    if model.get("type") != "BPE":
        raise UsageError(f"{path}: tokenizer model {model.get('type')!r}: only byte-level BPE exports")
    by_id: dict[int, str] = {i: t for t, i in model["vocab"].items()}
    special: set[int] = set()
    for added in tok.get("added_tokens") or []:
        by_id[added["id"]] = added["content"]
        if added.get("special"):
            special.add(added["id"])
    if max(by_id) >= vocab_size:
        raise CheckpointError(f"{path}: token id {max(by_id)} is past the model's vocab_size {vocab_size}")
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in by_id:
            tokens.append(f"[PAD{i}]")
            types.append(int(gguf.TokenType.UNUSED))
        else:
            tokens.append(by_id[i])
            types.append(int(gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL))
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
    eos_text = None
    cfg_path = src / "tokenizer_config.json"
    if cfg_path.exists():
        eos = json.loads(cfg_path.read_text()).get("eos_token")
        eos_text = eos.get("content") if isinstance(eos, dict) else eos
    ids = {t: i for i, t in by_id.items()}
    if eos_text not in ids:
        if not special:
            raise CheckpointError(f"{src}: no eos_token in tokenizer_config.json and no special token")
        eos_text = by_id[min(special)]
    return tokens, types, merges, ids[eos_text]


def _weights(src: Path) -> dict[str, Any]:
    """The checkpoint's tensors as float32 numpy arrays (mlx reads bfloat16 too)."""
    import mlx.core as mx
    import numpy as np

    files = sorted(src.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{src}: no *.safetensors file")
    out: dict[str, Any] = {}
    for f in files:
        loaded = mx.load(str(f))
        assert isinstance(loaded, dict)  # a .safetensors file loads as {name: array}
        for name, arr in loaded.items():
            out[name] = np.array(arr.astype(mx.float32))
    return out


def export_gguf(src: str | os.PathLike, out: str | os.PathLike, outtype: str = "f32",
                force: bool = False) -> GGUFInfo:
    """Write the mlx-lm llama checkpoint ``src`` as the new GGUF file ``out`` (an existing one only with
    ``force``: :func:`specparity.store.new_files`)."""
    import gguf
    import numpy as np

    src, out = Path(src), Path(out)
    if outtype not in OUTTYPES:
        raise InputError("outtype", f"{outtype!r}: choose from {', '.join(OUTTYPES)}")
    cfg_path = src / "config.json"
    if not cfg_path.is_file():
        # a usage error, as every command says for a directory that is not a checkpoint
        raise UsageError(f"checkpoint {src}: not a checkpoint (no config.json)")
    cfg = json.loads(cfg_path.read_text())
    if cfg.get("model_type") != "llama":
        raise UsageError(f"{src}: model_type {cfg.get('model_type')!r}: only llama checkpoints export to GGUF")
    if cfg.get("model_file") or cfg.get("specparity"):
        raise UsageError(f"{src}: a fault fixture (model_file {cfg.get('model_file')!r}): its defects are"
                         " Python code and cannot travel in a GGUF")
    if cfg.get("quantization"):
        raise UsageError(f"{src}: quantized checkpoints are not exported; build the fixture without --bits")

    n_layer = int(cfg["num_hidden_layers"])
    n_embd = int(cfg["hidden_size"])
    n_head = int(cfg["num_attention_heads"])
    n_head_kv = int(cfg.get("num_key_value_heads") or n_head)
    head_dim = int(cfg.get("head_dim") or n_embd // n_head)
    vocab_size = int(cfg["vocab_size"])
    tokens, types, merges, eos_id = _vocab(src, vocab_size)
    weights = _weights(src)

    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    per_layer = {
        "input_layernorm.weight": "attn_norm.weight",
        "self_attn.q_proj.weight": "attn_q.weight",
        "self_attn.k_proj.weight": "attn_k.weight",
        "self_attn.v_proj.weight": "attn_v.weight",
        "self_attn.o_proj.weight": "attn_output.weight",
        "post_attention_layernorm.weight": "ffn_norm.weight",
        "mlp.gate_proj.weight": "ffn_gate.weight",
        "mlp.up_proj.weight": "ffn_up.weight",
        "mlp.down_proj.weight": "ffn_down.weight",
    }
    for i in range(n_layer):
        for hf, gg in per_layer.items():
            names[f"model.layers.{i}.{hf}"] = f"blk.{i}.{gg}"
    unknown = sorted(set(weights) - set(names))
    if unknown:
        raise CheckpointError(f"{src}: tensors with no GGUF name: {', '.join(unknown[:5])}")

    from specparity.store import new_files

    out.parent.mkdir(parents=True, exist_ok=True)
    with new_files([out], force=force, flag="OUT") as (tmp,):
        w = gguf.GGUFWriter(str(tmp), "llama")
        w.add_name(f"specparity fixture {src.parent.name}/{src.name}")
        w.add_file_type(gguf.LlamaFileType.ALL_F32 if outtype == "f32" else gguf.LlamaFileType.MOSTLY_F16)
        w.add_context_length(int(cfg.get("max_position_embeddings", 4096)))
        w.add_embedding_length(n_embd)
        w.add_block_count(n_layer)
        w.add_feed_forward_length(int(cfg["intermediate_size"]))
        w.add_head_count(n_head)
        w.add_head_count_kv(n_head_kv)
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
        w.add_rope_dimension_count(head_dim)
        w.add_rope_freq_base(float(cfg.get("rope_theta", 10000.0)))
        w.add_layer_norm_rms_eps(float(cfg.get("rms_norm_eps", 1e-5)))
        w.add_vocab_size(vocab_size)
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(PRE_TOKENIZER)
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(merges)
        w.add_bos_token_id(eos_id)
        w.add_eos_token_id(eos_id)
        w.add_add_bos_token(False)
        w.add_add_eos_token(False)
        for hf_name in sorted(weights, key=lambda n: list(names).index(n)):
            arr = weights[hf_name]
            if hf_name.endswith("q_proj.weight"):
                arr = permute_rope(arr, n_head, n_head)
            elif hf_name.endswith("k_proj.weight"):
                arr = permute_rope(arr, n_head, n_head_kv)
            if outtype == "f16" and arr.ndim == 2:
                arr = arr.astype(np.float16)
            w.add_tensor(names[hf_name], np.ascontiguousarray(arr))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    log.info("exported %s to %s (%s, %d tensors)", src, out, outtype, len(weights))
    return GGUFInfo(path=str(out), source=str(src), outtype=outtype, n_tensors=len(weights),
                    vocab_size=vocab_size, eos_id=eos_id, bytes=out.stat().st_size)


# bump when export_gguf changes what it writes, so cached files are made anew
EXPORT_VERSION = 1


def cached_gguf(src: str | os.PathLike, outtype: str = "f32") -> str:
    """``src`` as GGUF, exported once per checkpoint content into ``$SPECPARITY_HOME/gguf/``.

    The file is named after the checkpoint's fingerprint (config and weights) and its
    tokenizer files, so a changed checkpoint gets a new file and a moved one reuses it.
    """
    import hashlib

    from specparity.checkpoint import fingerprint
    from specparity.paths import home

    src = Path(src)
    if not (src / "config.json").is_file():
        raise CheckpointError(f"{src}: no config.json (not an mlx-lm checkpoint directory)")
    h = hashlib.sha256(fingerprint(src).digest.encode())
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (src / name).exists():
            h.update((src / name).read_bytes())
    out = home() / "gguf" / f"{h.hexdigest()[:16]}-v{EXPORT_VERSION}-{outtype}.gguf"
    if not out.exists():
        export_gguf(src, out, outtype=outtype, force=True)  # named by its content: a concurrent export is the same
    return str(out)
