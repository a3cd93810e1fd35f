"""mlx-openai-server 1.8.1 (issue 47): its server and request path against classic decode, in its pinned environment.

Its environment installs the server without its declared dependencies (mflux, its image generation, needs
mlx[cuda13], which has no Linux build: ``env show`` says so). Its server drafts with a plain mlx-lm drafter
(``launch --model-type lm --draft-model-path D --num-draft-tokens K``: mlx-lm's ``stream_generate`` with the
drafter, its own prompt cache around it) and says nothing of its drafts: the witness wrappers are the evidence.
What they pin, MLX's CPU backend, mlx-lm 0.31.3, the project's float32 llama pair:

- served (``served --profile mlx-openai-server``, 16 tokens, widths 2 and 4 and the target drafting for itself):
  the drafter-less baselines (its continuous batcher) equal classic decode on every request; every first request
  of a drafted server equals it; the target drafting for itself leaves it on every request that reuses its prompt
  cache (the repeat at token 0: the cache it says held 33 of the 34 prompt tokens was at offset 32). That job is
  docs/engines.md's own line, run once by the docs' tier and checked on its record by ``tests/openai_served.py``;
- in process (``e2e --engine mlx-openai-server``: its own model wrapper, prompt cache and handler steps): a first
  request equals classic decode; the same request again leaves it at token 0 after 24 tokens (its cache served 15
  of 16 prompt tokens from a target cache at offset 14), and equals it after 16 (the stream ended inside a round);
- its evidence hook: the response's cached prompt tokens as cold / warm, silent on a response without them.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from builds import REAL_CACHE, built
from conftest import own_tmpdir, run_cli
from fixture_cache import cached
from plain_columns import check_column
from specparity.environments import ENV_CACHE_VAR
from specparity.fixtures import build_pair

ENV = "mlx-openai-server"
AGAIN = "MLX_LM, the same request again"


def test_mlx_openai_server_is_one_package_of_its_own() -> None:
    from test_engine_packages import test_each_builtin_engine_is_one_package_of_its_own

    test_each_builtin_engine_is_one_package_of_its_own("mlx-openai-server")


def test_its_evidence_is_the_cache_state_and_silent_without_it() -> None:
    """Whether a request drafted is the witness's to say (engaged None); the response's cached prompt tokens say
    cold or warm; a response without them gives no evidence at all."""
    from specparity.engines.mlx_openai_server import served

    def completion(usage: dict) -> SimpleNamespace:
        return SimpleNamespace(usage=usage)

    def cached(n: int) -> SimpleNamespace:
        return completion({"prompt_tokens": 34, "prompt_tokens_details": {"cached_tokens": n}})

    cold, warm = served.evidence(None, cached(0), None), served.evidence(None, cached(33), None)
    assert cold is not None and warm is not None
    assert (cold.engaged, cold.cache, cold.cached_tokens) == (None, "cold", 0)
    assert (warm.engaged, warm.cache, warm.cached_tokens) == (None, "warm", 33)
    assert served.evidence(None, completion({"prompt_tokens": 34}), None) is None
    assert served.evidence(None, completion({}), None) is None


def test_its_chat_template_is_mlx_lm_servers_prompt(tmp_path: Path) -> None:
    """The template the profile hands it renders what mlx_lm.server's ``convert_chat`` builds for a tokenizer without
    a chat template (what classic decode is computed from), the one-turn, system and two-turn chats alike."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from mlx_lm.server import convert_chat

    from specparity.engines.mlx_openai_server import served

    argv = served.extra_argv(True, tmp_path / "server")
    template = Path(argv[argv.index("--chat-template-file") + 1]).read_text()
    render = ImmutableSandboxedEnvironment().from_string(template).render
    chats = [[{"role": "user", "content": "The quick brown fox"}],
             [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "def add(a, b):\n"}],
             [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b "},
              {"role": "user", "content": "c"}]]
    for messages in chats:
        assert render(messages=messages, add_generation_prompt=True) == convert_chat(messages), messages
    assert argv[argv.index("--prompt-cache-dir") + 1] == str(tmp_path / "server" / "prompt-cache")


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The project's plain float32 llama pair (``specparity fixtures make DIR``)."""
    return cached(build_pair, tmp_path_factory.mktemp("mlx-openai-server"), "mlx-openai-server-llama").to_dict()


@pytest.mark.build
def test_env_show_says_what_was_left_out_and_why(cli_bin: str) -> None:
    built(ENV)
    proc = run_cli(cli_bin, "env", "show", ENV, env={ENV_CACHE_VAR: str(REAL_CACHE)})
    assert proc.returncode == 0, proc.stderr
    assert "without its dependencies: mlx-openai-server==1.8.1" in proc.stdout
    assert "left out: mflux (image generation): every release its pins allow needs mlx[cuda13] on Linux" in proc.stdout


def e2e(cli_bin: str, pair: dict, tokens: int) -> tuple[int, dict[str, dict]]:
    built(ENV)
    tmp = own_tmpdir(Path(tempfile.mkdtemp(prefix="openai-e2e-tmp-")))  # its TMPDIR: the run leaves nothing there
    proc = run_cli(cli_bin, "e2e", "--engine", ENV, "--model", pair["target"], "--draft-model", pair["draft"],
                   "--max-tokens", str(tokens), "--json", env={ENV_CACHE_VAR: str(REAL_CACHE), "TMPDIR": str(tmp)})
    assert proc.stdout.strip(), proc.stderr[-2000:]
    # its prompt cache's pickles went with the run (`mlx` is MLX's own kernel cache, kept across runs by design)
    assert {p.name for p in tmp.iterdir()} <= {"mlx"}, list(tmp.iterdir())
    shutil.rmtree(tmp)
    return proc.returncode, {e["entry"]: e for e in json.loads(proc.stdout)["entries"]}


@pytest.mark.build
@pytest.mark.model
def test_in_process_a_repeated_request_is_decoded_from_a_cache_one_token_short(cli_bin: str, pair: dict) -> None:
    """Its handler stores the target + drafter cache under the prompt and every emitted token; after mlx-lm's
    speculative loop ended its 24 tokens on the target's own token, the target cache held one token less than that
    key. The same request again: its cache says it served 15 of 16 prompt tokens, the target's cache is at 14, and
    the first token differs (exit 1). After 16 tokens (the stream ended inside a round) the same steps equal
    classic decode (exit 0): the detector is silent where the cache is whole."""
    rc, found = e2e(cli_bin, pair, 24)
    assert rc == 1, found
    assert found["MLX_LM"]["verdict"] == "match" and found["MLX_LM"]["drafter"]["drafted"] > 0
    again = found[AGAIN]
    assert again["verdict"] == "diverged"
    assert again["difference"]["token_index"] == 0, again["difference"]
    assert ("its prompt cache served 15 of 16 prompt tokens; the target's cache it decoded from was at offset 14"
            in again["reason"])
    rc, found = e2e(cli_bin, pair, 16)
    assert rc == 0, found
    assert {e["verdict"] for e in found.values()} == {"match"}


@pytest.mark.build
@pytest.mark.model
def test_a_hybrid_target_is_refused_by_mlx_lms_own_check_not_by_the_adapter(cli_bin: str,
                                                                             tmp_path_factory: pytest.TempPathFactory
                                                                             ) -> None:
    """A gated-delta hybrid (qwen3_5: its layer 0 a linear-attention ArraysCache, which keeps no offset): the
    request path reaches mlx-lm's speculative loop, whose own check refuses a cache it cannot trim. The row is that
    error (not_run, exit 3: not a pass), never the adapter's own AttributeError reading the cache's offset."""
    hybrid = cached(build_pair, tmp_path_factory.mktemp("mlx-openai-server-hybrid"), "mlx-openai-server-qwen3_5",
                    arch="qwen3_5").to_dict()
    rc, found = e2e(cli_bin, hybrid, 8)
    assert rc == 3, found  # nothing ran to a verdict: not run
    for entry in ("MLX_LM", AGAIN):
        assert found[entry]["verdict"] == "not_run", found[entry]
        assert "Speculative decoding requires a trimmable prompt cache (got {'ArraysCache'})" in found[entry][
            "reason"], found[entry]


# the findings table's plain columns (docs/engines.md): (architecture, dtype) -> entry point -> what it finds
COLUMNS: dict[tuple[str, str], dict[str, tuple[Any, ...]]] = {
    ("llama", "bfloat16"): {"MLX_LM": ("match", 17, 32), "MLX_LM, the same request again": ("match", 18, 30)},
    ("gemma3_text", "float32"): {"MLX_LM": ("diverged", 20, 8, 0, 285, 505),
                                 "MLX_LM, the same request again": ("diverged", 20, 8, 0, 285, 505)},
    ("gemma3_text", "bfloat16"): {"MLX_LM": ("diverged", 17, 8, 0, 428, 451),
                                  "MLX_LM, the same request again": ("diverged", 17, 8, 0, 428, 451)},
    ("qwen3_moe", "float32"): {"MLX_LM": ("match", 15, 34),
                               "MLX_LM, the same request again": ("diverged", 5, 3, 2, 233, 271)},
}


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.build
@pytest.mark.parametrize("column", sorted(COLUMNS), ids=lambda c: ":".join(c))
def test_the_findings_tables_plain_columns(column: tuple[str, str], tmp_path_factory: pytest.TempPathFactory) -> None:
    """The findings table's other plain columns (the float32 llama one and the hybrid's refusal: the tests above): in
    bfloat16 on llama both requests match (the repeat's cache at offset 15); gemma3_text leaves classic decode where
    mlx-lm's own speculative loop does (its sliding window), float32 and bfloat16; on qwen3_moe the first request
    matches and the repeat, decoded from a cache one token short, leaves at token 5. The qwen3_5 bfloat16 cell is
    the float32 one's refusal, the qwen3_moe bfloat16 one MLX's missing bfloat16 GatherMM (test_nunspark pins it)."""
    check_column(ENV, *column, tmp_path_factory.mktemp("columns"), COLUMNS[column])
