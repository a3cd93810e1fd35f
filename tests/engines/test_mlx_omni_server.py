"""mlx-omni-server 0.5.3 (issue 47): its chat path against classic decode, and why its server is not served here.

Its environment installs it without its declared dependencies (mflux, its image generation, needs mlx[cuda13] below
0.32 on Linux, the CUDA build, under the shared CPU mlx 0.32.4: ``env show`` says what is left out). A chat request
names its drafter (``draft_model``); its ``ChatGenerator`` generates with mlx-lm's ``stream_generate`` at 2 drafts
per round, behind its own prompt cache. What they pin, MLX's CPU backend, mlx-lm 0.31.3, the float32 llama pair:

- in process (``e2e --engine mlx-omni-server``: its own ``ChatGenerator``, prompt cache pool and the arguments its
  OpenAI adapter passes): every request, the first and the same one again through its prompt cache, emits one token
  fewer than asked (15 of 16): its ``generate_stream`` stops at mlx-lm's last response, which carries the last token,
  and drops it; every token it does emit equals classic decode's, with drafts accepted (an error, exit 3: never a
  pass);
- served: its server exits at start (its app downloads spaCy's ``en_core_web_sm`` at import, from outside the package
  registries), and a profile cannot name its per-request drafter: ``served --profile mlx-omni-server`` is an error
  with both causes (exit 4).
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from builds import REAL_CACHE, built
from conftest import run_cli
from fixture_cache import cached
from plain_columns import check_column
from specparity.environments import ENV_CACHE_VAR
from specparity.fixtures import build_pair

ENV = "mlx-omni-server"
FRESH = "ChatGenerator.generate_stream"
AGAIN = "ChatGenerator.generate_stream, the same request again"


def test_mlx_omni_server_is_one_package_of_its_own() -> None:
    from test_engine_packages import test_each_builtin_engine_is_one_package_of_its_own

    test_each_builtin_engine_is_one_package_of_its_own("mlx-omni-server")


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The project's plain float32 llama pair (``specparity fixtures make DIR``)."""
    return cached(build_pair, tmp_path_factory.mktemp("mlx-omni-server"), "mlx-omni-server-llama").to_dict()


@pytest.mark.build
def test_env_show_says_what_was_left_out_and_why(cli_bin: str) -> None:
    built(ENV)
    proc = run_cli(cli_bin, "env", "show", ENV, env={ENV_CACHE_VAR: str(REAL_CACHE)})
    assert proc.returncode == 0, proc.stderr
    assert "without its dependencies: mlx-omni-server==0.5.3" in proc.stdout
    assert ("left out: mflux (image generation): every release its pins allow needs mlx[cuda13]<0.32 on Linux"
            in proc.stdout)


@pytest.mark.build
@pytest.mark.model
def test_in_process_every_request_drops_its_last_token_and_the_rest_is_classic_decode(cli_bin: str,
                                                                                      pair: dict) -> None:
    """Its chat path for a request naming the drafter, 16 tokens asked: 15 come, each classic decode's (the chat's
    prompt as its tokenizer renders and encodes it), drafts accepted; the same request again through its prompt
    cache (31 of its 32 prompt tokens cached) the same. Each is an error, never a pass (exit 3)."""
    built(ENV)
    proc = run_cli(cli_bin, "e2e", "--engine", ENV, "--model", pair["target"], "--draft-model", pair["draft"],
                   "--max-tokens", "16", "--json", env={ENV_CACHE_VAR: str(REAL_CACHE)})
    assert proc.stdout.strip(), proc.stderr[-2000:]
    assert proc.returncode == 3, proc.stdout[-2000:]
    found = {e["entry"]: e for e in json.loads(proc.stdout)["entries"]}
    assert set(found) == {FRESH, AGAIN}
    for entry in found.values():
        drafter = entry["drafter"]
        assert len(drafter["tokens"]) == 15 and drafter["drafted"] > 0, drafter
        assert drafter["tokens"] == entry["classic"]["tokens"][:15]
        assert "stopped after 15 of 16 tokens without eos" in entry["reason"]
        assert "drops it" in entry["reason"]
    assert "its prompt cache said 31 of 32 prompt tokens were cached" in found[AGAIN]["reason"]


@pytest.mark.build
def test_its_server_exits_at_start_downloading_a_spacy_model() -> None:
    """Its app, started as its console script starts it, runs misaki's English G2P at import, which asks spaCy to
    download en_core_web_sm: no network here, so it exits before it listens (the cause its hooks give)."""
    env = built(ENV)
    proc = subprocess.run([str(env.python), "-m", "mlx_omni_server.main", "--host", "127.0.0.1", "--port", "0"],
                          capture_output=True, text=True, timeout=120, env=dict(env.environ()))
    assert proc.returncode != 0
    assert "_initialize_kokoro_g2p" in proc.stderr and "spacy/cli/download.py" in proc.stderr, proc.stderr[-2000:]
    assert "ConnectionError" in proc.stderr.splitlines()[-1]


@pytest.mark.build
@pytest.mark.model
def test_served_is_an_error_with_both_causes(cli_bin: str, pair: dict, tmp_path) -> None:
    """``served --profile mlx-omni-server`` as a user types it: the pairing is an error naming both causes, no
    server started (exit 4)."""
    from specparity.engines.mlx_omni_server.served import G2P_CAUSE, PER_REQUEST_CAUSE

    built(ENV)
    proc = run_cli(cli_bin, "served", "--profile", ENV, "--model", pair["target"], "--draft-model", pair["draft"],
                   "--widths", "3", "--max-tokens", "16", "--concurrency", "0", "--json", cwd=str(tmp_path),
                   env={ENV_CACHE_VAR: str(REAL_CACHE)})
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]
    pairing = json.loads(proc.stdout)["pairings"][0]
    assert pairing["verdict"] == "error"
    assert G2P_CAUSE in pairing["reason"] and PER_REQUEST_CAUSE in pairing["reason"], pairing["reason"]


# the findings table's plain columns (docs/engines.md): (architecture, dtype) -> entry point -> what it finds
COLUMNS: dict[tuple[str, str], dict[str, tuple[Any, ...]]] = {
    ("llama", "bfloat16"): {"ChatGenerator.generate_stream": ("error", "stopped after 31 of 32 tokens without eos"),
                            "ChatGenerator.generate_stream, the same request again":
                                ("error", "stopped after 31 of 32 tokens without eos")},
    ("qwen3_5", "float32"): {"ChatGenerator.generate_stream": ("error", "requires a trimmable prompt cache"),
                             "ChatGenerator.generate_stream, the same request again":
                                 ("error", "requires a trimmable prompt cache")},
    ("gemma3_text", "float32"): {"ChatGenerator.generate_stream": ("diverged", 5, 3, 0, 508, 77),
                                 "ChatGenerator.generate_stream, the same request again":
                                     ("diverged", 5, 3, 0, 508, 77)},
    ("gemma3_text", "bfloat16"): {"ChatGenerator.generate_stream": ("diverged", 5, 3, 0, 508, 77),
                                  "ChatGenerator.generate_stream, the same request again":
                                      ("diverged", 5, 3, 0, 508, 77)},
    ("qwen3_moe", "float32"): {"ChatGenerator.generate_stream": ("error", "stopped after 31 of 32 tokens without eos"),
                               "ChatGenerator.generate_stream, the same request again":
                                   ("diverged", 3, 2, 0, 323, 290)},
}


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.build
@pytest.mark.parametrize("column", sorted(COLUMNS), ids=lambda c: ":".join(c))
def test_the_findings_tables_plain_columns(column: tuple[str, str], tmp_path_factory: pytest.TempPathFactory) -> None:
    """The findings table's other plain columns (the float32 llama one: the test above): llama in bfloat16 drops its
    last token as in float32 (an error, never a pass); the qwen3_5 hybrid is refused by mlx-lm's own check, as the
    stream's error; gemma3_text leaves classic decode at token 5 (its chat prompt is 32 tokens: past the sliding
    window at once), float32 and bfloat16; qwen3_moe drops its last token, and its repeat leaves at token 3. The
    qwen3_5 bfloat16 cell is the float32 one's refusal, the qwen3_moe bfloat16 one MLX's missing bfloat16 GatherMM
    (test_nunspark)."""
    check_column(ENV, *column, tmp_path_factory.mktemp("columns"), COLUMNS[column])
