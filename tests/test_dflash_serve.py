"""dflash-mlx's server (``dflash serve``) live, from its environment, as the dflash-mlx profile starts it.

What these pin (the evidence the served harness reads; /work/team/dflash-serve-notes.md):
readiness on /health after both checkpoints load; ``logprobs`` without
``top_logprobs`` carries token ids with a constant 0.0 logprob, and
``top_logprobs`` empties every entry; per request prefix-cache state in
``usage.prompt_tokens_details.cached_tokens`` and /metrics ``last_request``;
per verify round evidence (rows, accepted, DFlash-drafted or copied from the
history) in ``--diagnostics full``'s cycle_events.jsonl.

The checkpoints: a plain qwen3 target and a DFlash drafter for it, random
weights, made here in the environment. TEMPORARY: the DFlash drafter
fixtures of specparity.fixtures replace this maker when they land.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from specparity.environments import Environment
from specparity.harness.lifecycle import Server, ServerStartError
from specparity.harness.profiles import PROFILE_DIR, load_profile

from test_environments import built

pytestmark = [pytest.mark.build, pytest.mark.server]

PROMPT = "The quick brown fox jumps over"
MAX_TOKENS = 24
BLOCK = 8

_MAKE_PAIR = '''
import json, sys
from pathlib import Path
import mlx.core as mx
from mlx.utils import tree_flatten
from dflash_mlx.model import DFlashDraftModel, DFlashDraftModelArgs
from specparity.fixtures import VOCAB_SIZE, build_pair, build_tokenizer

out, arch, block = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
if arch == "qwen3":
    from mlx_lm.models import qwen3
    cfg = {"model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 4, "intermediate_size": 128,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "rms_norm_eps": 1e-5,
           "vocab_size": VOCAB_SIZE, "max_position_embeddings": 4096, "rope_theta": 10000.0,
           "tie_word_embeddings": False}
    mx.random.seed(0)
    model = qwen3.Model(qwen3.ModelArgs.from_dict(cfg))
    mx.eval(model.parameters())
    (out / "target").mkdir(parents=True)
    mx.save_safetensors(str(out / "target" / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (out / "target" / "config.json").write_text(json.dumps(cfg))
    build_tokenizer(out / "target")
    target = out / "target"
else:
    target = Path(build_pair(out / "pair", arch=arch, with_draft=False).target)
tc = json.loads((target / "config.json").read_text())
draft = {"model_type": "qwen3", "hidden_size": tc["hidden_size"], "num_hidden_layers": 1,
         "intermediate_size": tc["intermediate_size"], "num_attention_heads": tc["num_attention_heads"],
         "num_key_value_heads": tc["num_key_value_heads"], "head_dim": tc["head_dim"],
         "rms_norm_eps": tc["rms_norm_eps"], "vocab_size": tc["vocab_size"],
         "max_position_embeddings": tc["max_position_embeddings"], "rope_theta": 10000.0,
         "tie_word_embeddings": False, "num_target_layers": tc["num_hidden_layers"], "block_size": block,
         "dflash_config": {"target_layer_ids": [1, 2], "mask_token_id": tc["vocab_size"] - 1}}
mx.random.seed(1)
drafter = DFlashDraftModel(DFlashDraftModelArgs.from_dict(draft))
mx.eval(drafter.parameters())
(out / "draft").mkdir(parents=True)
mx.save_safetensors(str(out / "draft" / "model.safetensors"), dict(tree_flatten(drafter.parameters())))
(out / "draft" / "config.json").write_text(json.dumps(draft))
print(json.dumps({"target": str(target), "draft": str(out / "draft")}))
'''

# classic decode in process, with the environment's own mlx-lm (the server's): greedy argmax, one token a step
_CLASSIC = '''
import json, sys
import mlx.core as mx
from mlx_lm import load
from mlx_lm.models.cache import make_prompt_cache
model, tok = load(sys.argv[1])
cache = make_prompt_cache(model)
logits = model(mx.array(tok.encode(sys.argv[2]))[None], cache=cache)
out = []
for _ in range(int(sys.argv[3])):
    y = int(mx.argmax(logits[0, -1]).item())
    out.append(y)
    logits = model(mx.array([[y]]), cache=cache)
print(json.dumps(out))
'''


def in_env(env: Environment, code: str, *args: str) -> Any:
    out = subprocess.run([str(env.python), "-P", "-c", code, *args], env=env.environ(), capture_output=True,
                         text=True, timeout=600, cwd=tempfile.gettempdir())
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def dflash_env() -> Environment:
    return built("dflash-mlx")


@pytest.fixture(scope="module")
def qwen3_pair(dflash_env: Environment, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return in_env(dflash_env, _MAKE_PAIR, str(tmp_path_factory.mktemp("dflash-qwen3")), "qwen3", str(BLOCK))


def start(env: Environment, pair: dict[str, str], out: Path, role: str, width: int | None = BLOCK) -> Server:
    """dflash serve as the profile starts it: a drafted arm at ``width`` rows, or (None) the baseline."""
    profile = load_profile("dflash-mlx")
    raw = yaml.safe_load((PROFILE_DIR / "dflash-mlx.yaml").read_text())  # the keys profiles.py does not read yet
    items = profile.argv + (profile.draft_argv + raw["evidence_argv"] if width else raw["baseline_argv"])
    argv = profile.render(items, python=env.python, model=pair["target"], draft_model=pair["draft"],
                          host="127.0.0.1", port="{port}", width=width, server_dir=out / role)
    return Server(argv, log_path=out / f"{role}.log", ready_path=profile.ready_path, fail_regex=profile.fail_regex,
                  name=role).start()


def complete(client: httpx.Client, **extra: Any) -> dict[str, Any]:
    r = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0, **extra})
    assert r.status_code == 200, r.text
    return dict(r.json())


def rounds(server_dir: Path, request_id: int) -> list[dict[str, Any]]:
    """The verify rounds of one request, from --diagnostics full's cycle_events.jsonl."""
    rows = [json.loads(ln) for ln in (server_dir / "dflash-diagnostics" / "cycle_events.jsonl").open()]
    return [r for r in rows if r.get("request_id") == request_id and "cycle" in r and "memory_phase" not in r]


def test_dflash_serve_reports_ids_cache_state_and_its_rounds(dflash_env: Environment, qwen3_pair: dict[str, str],
                                                            tmp_path: Path) -> None:
    srv = start(dflash_env, qwen3_pair, tmp_path, "w8")
    try:
        client = httpx.Client(base_url=srv.url, timeout=120)
        cold = complete(client, logprobs=True)
        last = client.get("/metrics").json()["last_request"]
        warm = complete(client, logprobs=True)
        warm_last = client.get("/metrics").json()["last_request"]
        top = complete(client, logprobs=True, top_logprobs=2)
    finally:
        srv.stop()
    entries = cold["choices"][0]["logprobs"]["content"]
    ids = [e["id"] for e in entries]
    assert len(ids) == cold["usage"]["completion_tokens"] == MAX_TOKENS and all(isinstance(i, int) for i in ids)
    assert {e["logprob"] for e in entries} == {0.0}, "dflash's logprob values are a constant, not real numbers"
    assert [e["id"] for e in warm["choices"][0]["logprobs"]["content"]] == ids
    assert top["choices"][0]["logprobs"]["content"] == [{}] * MAX_TOKENS, "top_logprobs drops the ids"
    # per request prefix-cache state: cold first, then warm on the same prompt
    prompt_tokens = cold["usage"]["prompt_tokens"]
    assert cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] == prompt_tokens
    assert (last["request_id"], last["mode_used"], last["cache_status"]) == (1, "dflash", "COLD")
    assert (warm_last["request_id"], warm_last["cache_status"], warm_last["cache_hit_tokens"]) == (
        2, "WARM", prompt_tokens)
    # every round of request 1: rows at most the width, commits adding up to the completion
    seen = rounds(tmp_path / "w8", 1)
    assert sum(r["commit_count"] for r in seen) == MAX_TOKENS
    assert all(r["commit_count"] == r["acceptance_len"] + 1 for r in seen)
    assert max(r["verify_token_count"] for r in seen) == BLOCK
    assert {r["draft_source"] for r in seen} <= {"dflash", "copyspec", "none"} and any(
        r["draft_source"] == "dflash" for r in seen)
    assert last["cycles"] == len(seen) and last["copyspec_hits"] == sum(r["draft_source"] == "copyspec" for r in seen)


@pytest.mark.slow
def test_the_baseline_arm_is_target_only_and_both_equal_classic_decode(dflash_env: Environment,
                                                                      qwen3_pair: dict[str, str],
                                                                      tmp_path: Path) -> None:
    """On this pair (qwen3, float32, a random drafter) the DFlash path and the target-only path both
    emit exactly classic decode's tokens (mlx-lm 0.31.3 in process, same environment)."""
    classic = in_env(dflash_env, _CLASSIC, qwen3_pair["target"], PROMPT, str(MAX_TOKENS))
    got = {}
    for role, width in (("baseline", None), ("w8", BLOCK)):
        srv = start(dflash_env, qwen3_pair, tmp_path, role, width)
        try:
            client = httpx.Client(base_url=srv.url, timeout=120)
            entries = complete(client, logprobs=True)["choices"][0]["logprobs"]["content"]
            mode = client.get("/metrics").json()["last_request"]["mode_used"]
        finally:
            srv.stop()
        got[role] = [e["id"] for e in entries]
        if width is None:
            assert mode == "ar_fastpath"
            assert all(e["logprob"] < 0 for e in entries), "the target-only path reports real logprobs"
        else:
            assert mode == "dflash"
    assert got["baseline"] == classic and got["w8"] == classic


@pytest.mark.slow
def test_a_hybrid_target_with_more_value_than_key_heads_is_reported_as_not_run(dflash_env: Environment,
                                                                              tmp_path: Path) -> None:
    """dflash-mlx 0.1.8 on the CPU backend cannot verify on the qwen3_5 fixture (linear-attention value
    heads 4, key heads 2, as the published Qwen3.5 configs have more value than key heads): its tape
    recording (target_qwen_gdn.py, the non-Metal branch) does not repeat the key heads. The request
    gets no response at all; the log holds the engine's error."""
    pair = in_env(dflash_env, _MAKE_PAIR, str(tmp_path / "pair"), "qwen3_5", str(BLOCK))
    srv = start(dflash_env, pair, tmp_path, "w8")
    try:
        client = httpx.Client(base_url=srv.url, timeout=120)
        with pytest.raises(httpx.RemoteProtocolError):
            client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 8, "temperature": 0})
        assert srv.alive() and client.get("/health").status_code == 200
    finally:
        srv.stop()
    assert "ValueError: [broadcast_shapes] Shapes (1,8,4,32,32) and (1,8,2,1,32)" in srv.tail(200)


@pytest.mark.slow
def test_a_target_it_cannot_load_fails_the_start_at_once(dflash_env: Environment, qwen3_pair: dict[str, str],
                                                        tmp_path: Path) -> None:
    """A llama target (the embedded default pair): dflash's loader raises on its worker thread and the
    process keeps waiting (300 s); the profile's fail_regex ends the start with the engine's error."""
    from specparity.fixtures import default_pair

    pair = {"target": default_pair().target, "draft": qwen3_pair["draft"]}
    t0 = time.perf_counter()
    with pytest.raises(ServerStartError) as err:
        start(dflash_env, pair, tmp_path, "llama")
    assert time.perf_counter() - t0 < 120
    assert "Unsupported target architecture for DFlash target ops: model_type=llama" in err.value.log_tail
