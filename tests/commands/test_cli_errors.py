"""No code runs without consent, --debug changes no exit
code, and every error is one line that names the right flag."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import run_cli
from specparity.fixtures import FixtureInfo

FAST = ("--widths", "2", "--depths", "0", "--walk", "0", "--no-prefill")


# ---------------------------------------------------------------- --debug


@pytest.mark.parametrize("args,code", [
    (("probe", "--model", "/nonexistent"), 2),
    (("probe", "--widths", "x"), 2),
    (("replay", "--accepts", "x"), 2),
    (("dist", "--rule", "nope"), 2),
])
def test_debug_keeps_the_exit_code_and_adds_only_a_traceback(cli_bin, args, code):
    plain = run_cli(cli_bin, *args)
    flag = run_cli(cli_bin, "--debug", *args)
    env = run_cli(cli_bin, *args, env={"SPECPARITY_DEBUG": "1"})
    assert plain.returncode == flag.returncode == env.returncode == code, flag.stderr
    assert plain.stderr.count("\n") == 1 and "Traceback" not in plain.stderr
    assert "Traceback (most recent call last)" in flag.stderr
    last = plain.stderr.strip().splitlines()[-1]
    assert flag.stderr.strip().splitlines()[-1] == last  # the same Error: line, after it
    off = run_cli(cli_bin, *args, env={"SPECPARITY_DEBUG": "0"})
    assert off.returncode == code and "Traceback" not in off.stderr


def _exiting_checkpoint(info: FixtureInfo, tmp_path: Path, code: int) -> Path:
    ck = tmp_path / f"exits-{code}"
    shutil.copytree(info.target, ck)
    (ck / "specparity_fixture.py").write_text(f"import sys\nsys.exit({code})\n")
    return ck


@pytest.mark.slow
@pytest.mark.model
def test_a_model_file_raising_systemexit_is_a_bug_not_a_verdict(cli_bin: str, rows4_pair: FixtureInfo,
                                                                 tmp_path: Path) -> None:
    code = 0  # the worst case: it used to read as "all pass"
    ck = _exiting_checkpoint(rows4_pair, tmp_path, code)
    for debug in ((), ("--debug",)):
        r = run_cli(cli_bin, *debug, "probe", "--model", str(ck), "--trust-remote-code", *FAST)
        assert r.returncode == 70, (debug, r.returncode, r.stderr)
        assert f"SystemExit({code})" in r.stderr


def test_a_rule_raising_systemexit_is_a_bug(cli_bin, tmp_path):
    rules = tmp_path / "exits.py"
    rules.write_text("def rule(p, q, draft, rng):\n    raise SystemExit(0)\n")
    r = run_cli(cli_bin, "dist", "--rule", f"{rules}:rule", "--samples", "200")
    assert r.returncode == 70 and "SystemExit(0)" in r.stderr


# ---------------------------------------------------------------- one line, the right flag


@pytest.mark.slow
@pytest.mark.model
def test_loader_failures_are_one_line(cli_bin, llama_pair, tmp_path):
    ck = tmp_path / "missing-layers"
    shutil.copytree(llama_pair.target, ck)
    cfg = json.loads((ck / "config.json").read_text())
    cfg["num_hidden_layers"] = 8  # mlx-lm lists every missing parameter, one a line
    (ck / "config.json").write_text(json.dumps(cfg))
    r = run_cli(cli_bin, "probe", "--model", str(ck), *FAST)
    assert r.returncode == 4
    assert r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"Error: --model {ck}: would not load (ValueError: Missing")
    assert "more lines with --debug" in r.stderr
    d = run_cli(cli_bin, "--debug", "probe", "--model", str(ck), *FAST)
    assert d.returncode == 4 and "model.layers.7" in d.stderr  # the detail, behind --debug


@pytest.mark.model
@pytest.mark.parametrize("command", [("probe", *FAST), pytest.param(("replay", "--accepts", "1,2", "--width", "3"),
                                                                     marks=pytest.mark.slow)])
def test_a_kv_group_size_the_head_does_not_take_is_named_with_one_that_fits(cli_bin, llama_pair, command):
    # the fixture's heads are 32 wide; mlx quantizes the KV cache in groups of 64 by default (it was exit 70);
    # one quantization step (decode.quantize_if_due) serves probe, bisect and replay: probe catches its chain's
    # failures, replay does not
    r = run_cli(cli_bin, *command, "--model", llama_pair.target, "--kv-bits", "8", "--quantized-kv-start", "0")
    assert r.returncode == 2, r.stderr
    errors = [line for line in r.stderr.splitlines() if "Error" in line or "Traceback" in line]
    assert len(errors) == 1 and errors[0].startswith("Error: --kv-group-size 64: does not divide the KV cache's"
                                                     " head size 32"), r.stderr
    assert errors[0].endswith("pass --kv-group-size 32") and r.stderr.rstrip().endswith(errors[0]), r.stderr
    ok = run_cli(cli_bin, *command, "--model", llama_pair.target, "--kv-bits", "8", "--quantized-kv-start", "0",
                 "--kv-group-size", "32")
    assert ok.returncode in (0, 1), ok.stderr  # a verdict, either way


@pytest.mark.model
@pytest.mark.slow
def test_a_bad_draft_model_is_named_draft_model(cli_bin, llama_pair, tmp_path):
    r = run_cli(cli_bin, "replay", "--model", llama_pair.target, "--draft-model",
                str(tmp_path / "nope"), "--max-tokens", "8")
    assert r.returncode == 2 and r.stderr.startswith("Error: --draft-model "), r.stderr
    r = run_cli(cli_bin, "accept", "--model", llama_pair.target, "--draft-model",
                str(tmp_path), "--positions", "4")
    assert r.returncode == 2 and r.stderr.startswith("Error: --draft-model "), r.stderr


@pytest.mark.model
def test_the_gate_decision_line_is_printed_once(cli_bin: str, rows4_pair: FixtureInfo, isolated_home: Path) -> None:
    r = run_cli(cli_bin, "gate", "check", "--model", rows4_pair.target, "--trust-remote-code",
                "--width", "4", env={"SPECPARITY_HOME": str(isolated_home)})
    assert r.returncode == 1
    assert r.stderr.count("specparity-gate: DECLINE") == 1, r.stderr


# ---------------------------------------------------------------- --trust-remote-code


def _auto_map_checkpoint(src: str, dst: Path, marker: Path, extra: str = "") -> Path:
    shutil.copytree(src, dst)
    (dst / "tok.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\n"
        "from transformers import PreTrainedTokenizerFast\n\n\n"
        f"class MyTok(PreTrainedTokenizerFast):\n    pass\n{extra}")
    cfg = json.loads((dst / "tokenizer_config.json").read_text())
    cfg["auto_map"] = {"AutoTokenizer": [None, "tok.MyTok"]}
    cfg["tokenizer_class"] = "MyTok"
    (dst / "tokenizer_config.json").write_text(json.dumps(cfg))
    return dst


@pytest.mark.model
def test_tokenizer_code_never_runs_without_the_flag(cli_bin, llama_pair, tmp_path):
    marker = tmp_path / "ran"
    ck = _auto_map_checkpoint(llama_pair.target, tmp_path / "automap", marker)
    r = run_cli(cli_bin, "probe", "--model", str(ck), *FAST)
    assert r.returncode == 2, r.stderr
    assert "tokenizer_config.json has an auto_map" in r.stderr and "--trust-remote-code" in r.stderr
    assert r.stdout == ""  # transformers' y/N prompt never appears
    assert not marker.exists()
    ok = run_cli(cli_bin, "probe", "--model", str(ck), "--trust-remote-code", *FAST)
    assert ok.returncode == 0, ok.stderr
    assert marker.exists()  # with consent it does run: the detector is not vacuous


@pytest.mark.model
def test_tokenizer_files_are_in_the_fingerprint(llama_pair, tmp_path):
    from specparity.checkpoint import fingerprint

    a = _auto_map_checkpoint(llama_pair.target, tmp_path / "a", tmp_path / "m")
    b = _auto_map_checkpoint(llama_pair.target, tmp_path / "b", tmp_path / "m", "# other code\n")
    c = _auto_map_checkpoint(llama_pair.target, tmp_path / "c", tmp_path / "m")
    fa, fb, fc = fingerprint(a), fingerprint(b), fingerprint(c)
    assert fa.digest == fc.digest and "tok.py" in fa.weight_files
    assert fa.digest != fb.digest
    (c / "tokenizer.json").write_text((c / "tokenizer.json").read_text().replace("Ġ", "G", 1))
    assert fingerprint(c).digest != fa.digest
