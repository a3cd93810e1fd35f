"""Impossible outputs of a user rule are a usage error naming the
rule and the draw, never a verdict (dist and accept)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import run_cli
from specparity.probes.sampling.rules import check_tokens

from specparity.errors import UsageError

RULES = '''
import numpy as np

def always999(p, q, draft, rng):
    return 999

def minus1(p, q, draft, rng):
    return -1

def frac(p, q, draft, rng):
    return 2.7

def nan(p, q, draft, rng):
    return float("nan")

def text(p, q, draft, rng):
    return "3"

def vec_big(P, Q, d, rng):
    out = d.copy()
    out[5] = 8
    return out
vec_big.vectorized = True

def chain_after_pad(P, Q, D, rng):
    out = np.full((len(D), D.shape[1] + 1), -1)
    out[:, 0] = 0
    out[3, 2] = 1
    return out
chain_after_pad.vectorized = True

def fine(p, q, draft, rng):
    return int(draft)
'''


def test_check_tokens_both_ways():
    assert check_tokens("r", 3, 8, 0) == 3
    assert check_tokens("r", 3.0, 8, 0) == 3
    assert check_tokens("r", np.array([[0, 1, -1]]), 8, 0, padded=True).tolist() == [[0, 1, -1]]
    for value, msg in ((8, "emitted token 8 at draw 5, outside the vocabulary \\(0..7\\)"),
                       (-1, "emitted token -1 at draw 5"),
                       (2.7, "returned 2.7 at draw 5, not an integer"),
                       (float("nan"), "returned nan at draw 5"),
                       (float("inf"), "returned inf at draw 5"),
                       ("3", "not token ids"), (True, "not token ids"), (None, "not token ids"),
                       ([1, [2]], "not token ids")):
        with pytest.raises(UsageError, match=msg):
            check_tokens("r", value, 8, 5)
    with pytest.raises(UsageError, match="at draw 7: emitted|emitted token 9 at draw 7"):
        check_tokens("r", np.array([0, 0, 9]), 8, 5)
    with pytest.raises(UsageError, match="at draw 6 a token follows the -1 padding"):
        check_tokens("r", np.array([[0, -1, -1], [0, -1, 2]]), 8, 5, padded=True)


@pytest.mark.parametrize("name,msg,extra", [
    ("always999", "emitted token 999 at draw 0, outside the vocabulary (0..7)", ()),
    ("minus1", "emitted token -1 at draw 0, outside the vocabulary", ()),
    ("frac", "returned 2.7 at draw 0, not an integer token id", ()),
    ("nan", "returned nan at draw 0, not an integer token id", ()),
    ("text", "returned '3' at draw 0, not token ids", ()),
    ("vec_big", "emitted token 8 at draw 5, outside the vocabulary", ()),
    ("chain_after_pad", "at draw 3 a token follows the -1 padding", ("--num-draft", "2")),
])
def test_dist_reports_impossible_outputs_as_usage_errors(cli_bin, tmp_path, name, msg, extra):
    rules = tmp_path / "rules.py"
    rules.write_text(RULES)
    r = run_cli(cli_bin, "dist", "--rule", f"{rules}:{name}", "--samples", "200",
                "--sweep-draws", "0", *extra)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert r.stderr.strip().splitlines()[-1].startswith(f"Error: --rule {rules}:{name}: {msg}")


def test_dist_still_judges_a_possible_rule(cli_bin, tmp_path):
    rules = tmp_path / "rules.py"
    rules.write_text(RULES)
    r = run_cli(cli_bin, "dist", "--rule", f"{rules}:fine", "--samples", "2000",
                "--sweep-draws", "0")
    assert r.returncode == 1, r.stderr  # always-accept is wrong, and is judged as such


@pytest.mark.model
@pytest.mark.slow
def test_accept_reports_an_impossible_rule_output(cli_bin, llama_pair, tmp_path):
    rules = tmp_path / "rules.py"
    rules.write_text(RULES)
    r = run_cli(cli_bin, "accept", "--model", llama_pair.target, "--draft-model",
                llama_pair.draft, "--rule", f"{rules}:always999", "--positions", "8",
                "--draws", "10")
    assert r.returncode == 2, r.stderr
    assert "emitted token 999 at draw 0, outside the vocabulary (0..511)" in r.stderr


def test_dist_names_why_controls_did_not_run(cli_bin):
    r = run_cli(cli_bin, "dist", "--rule", "mrs", "--top-k", "1", "--samples", "1000")
    assert r.returncode == 0, r.stderr
    assert "temperature 0.7 but the filters leave one token" in r.stdout
    assert "not run (temperature 0:" not in r.stdout
