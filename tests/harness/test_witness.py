"""The witness wraps a checkpoint that ships its own model_file (a trust-remote-code model)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import httpx
import pytest

from specparity.errors import UsageError
from specparity.harness.lifecycle import PORT_ARG, Server
from specparity.harness.evidence import evidence_from_calls, read_calls
from specparity.harness.witness import WITNESS_ENV, wrap_checkpoint

OWN_MODEL = '''"""A checkpoint's own architecture file: llama under another name, with a marker."""
from mlx_lm.models.llama import Model as _Llama
from mlx_lm.models.llama import ModelArgs  # noqa: F401  (mlx-lm reads it from this module)


class Model(_Llama):
    own_model_file = True
'''


def _own_model_checkpoint(src: str, dst: Path) -> Path:
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**cfg, "model_file": "modeling_own.py"}))
    (dst / "modeling_own.py").write_text(OWN_MODEL)
    return dst


@pytest.mark.model
@pytest.mark.server
def test_witness_wraps_a_checkpoint_with_its_own_model_file(llama_pair, tmp_path, monkeypatch):
    import mlx.core as mx

    from specparity.checkpoint import load_checkpoint

    own = _own_model_checkpoint(llama_pair.target, tmp_path / "own")
    with pytest.raises(UsageError, match="--trust-remote-code"):
        wrap_checkpoint(own, tmp_path / "refused", "target")
    wrapped = wrap_checkpoint(own, tmp_path / "wrapped", "target", trust_remote_code=True)
    witness = tmp_path / "witness.log"
    monkeypatch.setenv(WITNESS_ENV, str(witness))
    plain = load_checkpoint(own, trust_remote_code=True).model
    model = load_checkpoint(wrapped, trust_remote_code=True).model
    # the checkpoint's own module was loaded and wrapped, and computes what it computes unwrapped
    assert getattr(model.inner, "own_model_file", False)
    x = mx.array([[5, 17, 99, 3]])
    assert mx.array_equal(model(x), plain(x)).item()
    assert read_calls(witness) and read_calls(witness)[0].rows == 4
    # served: mlx_lm.server runs the wrapped checkpoint (with the consent) and the witness sees drafting
    witness.unlink()
    argv = [sys.executable, "-m", "mlx_lm", "server", "--model", str(wrapped), "--port", PORT_ARG,
            "--trust-remote-code", "--draft-model", llama_pair.draft, "--num-draft-tokens", "3"]
    with Server(argv, log_path=tmp_path / "server.log", env={WITNESS_ENV: str(witness)}) as srv:
        r = httpx.post(srv.url + "/v1/completions", timeout=300,
                       json={"prompt": "Speculative decoding drafts several tokens", "max_tokens": 16})
        assert r.status_code == 200, r.text
        usage = r.json()["usage"]
    ev = evidence_from_calls(read_calls(witness), usage["prompt_tokens"], usage["completion_tokens"])
    assert ev.verify_calls > 0 and max(ev.widths) == 4, ev.lines
    assert Path(wrapped / "modeling_own.py").resolve() == (own / "modeling_own.py").resolve()


@pytest.mark.model
@pytest.mark.server
@pytest.mark.slow
def test_served_runs_on_a_checkpoint_with_its_own_model_file(llama_pair, tmp_path, cli_bin):
    """The served job on a trust-remote-code checkpoint: witnessed, judged against classic decode (which
    runs the same model_file), a match; without the consent, one line and exit 2 before any server."""
    import json

    from conftest import run_cli

    own = _own_model_checkpoint(llama_pair.target, tmp_path / "own")
    args = ["served", "--model", str(own), "--draft-model", llama_pair.draft, "--widths", "3", "--max-tokens", "12"]
    r = run_cli(cli_bin, *args, "--json", "--trust-remote-code", cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr[-2000:]
    arms = {a["name"]: a for a in json.loads(r.stdout)["pairings"][0]["arms"]}
    assert arms["w3"]["verdict"] == "match"
    refused = run_cli(cli_bin, *args, cwd=str(tmp_path))
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "--trust-remote-code" in refused.stderr
