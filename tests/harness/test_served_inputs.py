"""Job and profile files checked by type and bounded before use.

Each case is a file (or flag) that exited 70, hung, or was read as something else
before: now one UsageError naming the file, the key path and what was expected,
raised before anything is expanded or started (the CLI: one ``Error:`` line, exit 2).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import run_cli

from specparity.errors import UsageError
from specparity.harness.config import Overrides, apply_overrides, load_job
from specparity.harness.profiles import load_profile

# a profile that loads: the cases below add one bad key to it
PROFILE = {"name": "p", "argv": ["{python}", "-c", "pass", "{model}", "--port", "{port}"]}


def _job(tmp_path: Path, text: str | bytes) -> Path:
    cfg = tmp_path / "job.yaml"
    if isinstance(text, bytes):
        cfg.write_bytes(text)
    else:
        cfg.write_text(text)
    return cfg


@pytest.mark.parametrize("text, message", [
    # class 1: every key checked by type, named by its path
    ("env: [1, 2]", "env: expected a mapping of environment variable to a string or number, got [1, 2]"),
    ("env: {'A=B': '1'}", "env: key 'A=B': expected an environment variable name"),
    ("controls: 5", "controls: expected a list, each item a mapping, got 5 (an integer)"),
    ("controls: [{env: {A: '1'}, colour: red}]", "controls[0]: unknown key 'colour'"),
    ("prompts_file: 5", "prompts_file: expected a file name, got 5 (an integer)"),
    ("pairings: [{target: 5}]", "pairings[0].target: expected a checkpoint path or hub id (a string), got 5"),
    ("pairings: [{draft: ./d}]", "pairings[0].target: missing"),
    ("pairings: [{target: ./t, name: ../up}]", "pairings[0].name: expected a name (no /, not . or ..)"),
    ("self_draft: 'no'", "self_draft: expected true or false, got 'no' (a string)"),
    ("params: {stop: !!binary aGk=}", "params.stop: expected a JSON value"),
    ("params: {seed: 2020-01-01}", "params.seed: expected a JSON value"),
    # the rules specparity serve and replay --sequence apply to a request's fields (issue 30)
    ("params: {seed: -1}", "params.seed: expected an integer in [0, 18446744073709551615], got -1"),
    ("params: {logit_bias: {'-1': 1}}", "params.logit_bias['-1']: token -1 is outside the vocabulary (>= 0)"),
    ("params: {repetition_penalty: -0.5}", "params.repetition_penalty: expected a finite number >= 0"),
    ("{1: 2, x: 3}", "unknown key 1 (known: "),
    ("distribution: {1: 2, x: 3}", "distribution: unknown key 1"),
    ("distribution: {temperature: hot}", "distribution.temperature: expected a finite number, got 'hot'"),
    ("widths: []\ncontrols: [{env: {A: '1'}}]", "widths: expected a list (not empty)"),
    ("sequence: [fresh, [1]]", "sequence[1]: expected one of fresh,"),
    # class 2: counts bounded before anything is expanded
    ("repeats: 100000000", "repeats: expected an integer in [0, 64], got 100000000"),
    ("concurrency: 100000", "concurrency: expected an integer in [0, 64]"),
    ("widths: [1000000000]", "widths[0]: 1000000000 is above the maximum 1024 (raise it: specparity --max-width N"),
    ("controls: [{env: {A: '1'}, width: 5000}]", "controls[0].width: 5000 is above the maximum 1024"),
    ("max_tokens: 100000000000", "max_tokens: 100000000000 is above the maximum 16384 (raise it: specparity"
                                 " --max-positions N"),
    # YAML 1.1 reads 1e11 as a string (refused before and after): 1.0e+11 is the number
    ("max_tokens: 1.0e+11", "max_tokens: expected an integer >= 1, got 100000000000.0 (a number)"),
    ("max_tokens: 8.0", "max_tokens: expected an integer >= 1, got 8.0 (a number)"),
    ("distribution: {width: 100000}", "distribution.width: 100000 is above the maximum 1024"),
    # class 3: a timeout is a finite, positive number of seconds (true was read as 1 s)
    ("request_timeout: true", "request_timeout: expected a number of seconds in (0, 604800], got True"),
    ("start_timeout: .nan", "start_timeout: expected a number of seconds in (0, 604800], got nan"),
    ("request_timeout: .inf", "request_timeout: expected a number of seconds"),
    ("request_timeout: 1e300", "request_timeout: expected a number of seconds"),
])
def test_a_bad_job_key_is_named_with_its_path_and_type(tmp_path: Path, text: str, message: str) -> None:
    cfg = _job(tmp_path, text)
    with pytest.raises(UsageError) as err:
        load_job(cfg)
    assert str(err.value).startswith(f"--config {cfg}: ") and message in str(err.value), str(err.value)
    assert "\n" not in str(err.value)


_P = "pairings: [{name: a, target: /t, draft: /d}"
BUILTIN = "the name of a built-in arm"


@pytest.mark.parametrize("text, message", [
    # a control named as a built-in arm shares its server key (w2: the width's server, without the
    # control's env: its match tested nothing) or its record file; dist-*: the distribution arms'
    ("controls: [{name: w2, env: {A: '1'}}]", f"controls[0].name: 'w2' is {BUILTIN}"),
    ("controls: [{name: W16, env: {A: '1'}}]", f"controls[0].name: 'W16' is {BUILTIN}"),
    ("controls: [{name: baseline-start, env: {A: '1'}}]", f"controls[0].name: 'baseline-start' is {BUILTIN}"),
    ("controls: [{name: 'baseline end', env: {A: '1'}}]", f"controls[0].name: 'baseline end' is {BUILTIN}"),
    ("controls: [{name: self-draft, env: {A: '1'}}]", f"controls[0].name: 'self-draft' is {BUILTIN}"),
    ("controls: [{name: concurrent, env: {A: '1'}}]", f"controls[0].name: 'concurrent' is {BUILTIN}"),
    ("controls: [{name: ok, env: {A: '1'}}, {name: repeat7, env: {A: '1'}}]",
     f"controls[1].name: 'repeat7' is {BUILTIN}"),
    ("controls: [{name: drafter, env: {A: '1'}}]", f"controls[0].name: 'drafter' is {BUILTIN}"),
    ("controls: [{name: dist-baseline, env: {A: '1'}}]", f"controls[0].name: 'dist-baseline' is {BUILTIN}"),
    # two of one name share a work dir, a server key and record files
    ("controls: [{name: c, env: {A: '1'}}, {name: c, env: {B: '1'}}]", "controls[1].name: 'c' is named twice"),
    ("controls: [{env: {A: '1'}}, {name: control0, env: {B: '1'}}]", "controls[1].name: 'control0' is named twice"),
    (_P + ", {name: a, target: /t2}]", "pairings[1].name: 'a' is named twice: give each a name of its own"),
    (_P + ", {name: A, target: /t2}]", "pairings[1].name: 'A' and 'a' name the same files ('A', compared"
                                       " case-blind)"),
    (_P + ", {name: 'a!', target: /t2}]", "pairings[1].name: 'a!' and 'a' name the same files"),
    (_P + ", {target: /t2}, {name: pairing1, target: /t3}]", "pairings[2].name: 'pairing1' is named twice"),
    # <pairing>-<arm>.jsonl: pairing a-b's w2 and pairing a's control b-w2 would write one file
    ("pairings: [{name: a-b, target: /t, draft: /d}, {name: a, target: /t, draft: /d}]\nwidths: [2]\n"
     "controls: [{name: b-w2, env: {A: '1'}}]", "pairing 'a' arm 'b-w2' and pairing 'a-b' arm 'w2' would write one"
                                                " record file (a-b-w2.jsonl)"),
    # class 2: every count capped (specparity --max-items, 3 here) before anything is expanded
    (_P + ", {name: b, target: /t}, {name: c, target: /t}, {name: d, target: /t}]",
     "pairings: 4 items are above the maximum 3 (raise it: specparity --max-items N ..., or SPECPARITY_MAX_ITEMS=N)"),
    ("controls: [" + ", ".join(f"{{name: c{i}, env: {{A: '1'}}}}" for i in range(4)) + "]",
     "controls: 4 items are above the maximum 3"),
    ("prompts: [a, b, c, d]", "prompts: 4 items are above the maximum 3"),
    ("sequence: [fresh, fresh, fresh, fresh]", "sequence: 4 items are above the maximum 3"),
    ("params: {stop: [a, b, c, d]}", "params.stop: 4 items are above the maximum 3"),
    ("extra_args: {'*': [a, b, c, d]}", "extra_args['*']: 4 items are above the maximum 3"),
    # ~user with no home: pathlib's RuntimeError was exit 70
    ("pairings: [{target: '~nosuchuser/x'}]", "pairings[0].target ~nosuchuser/x: cannot expand '~nosuchuser':"
                                              " user 'nosuchuser' has no home directory here"),
    ("pairings: [{target: /t, draft: '~nosuchuser/d'}]", "pairings[0].draft ~nosuchuser/d: cannot expand"),
])
def test_names_and_counts_of_a_job_are_checked(tmp_path: Path, text: str, message: str) -> None:
    from specparity.inputs import Limits, set_limits

    # a pairing of its own: no build of the embedded pair the built-in job runs on
    cfg = _job(tmp_path, text if text.startswith("pairings") else f"{_P}]\n{text}")
    set_limits(Limits(max_items=3))
    try:
        with pytest.raises(UsageError) as err:
            load_job(cfg)
    finally:
        set_limits(None)
    assert str(err.value).startswith(f"--config {cfg}: ") and message in str(err.value), str(err.value)
    assert "\n" not in str(err.value)


def test_a_prompts_file_is_capped_and_names_held_by_no_arm_pass(tmp_path: Path) -> None:
    from specparity.inputs import Limits, set_limits

    (tmp_path / "p.txt").write_text("a\nb\n\nc\nd\n")
    set_limits(Limits(max_items=3))
    try:
        with pytest.raises(UsageError, match=r"prompts_file .*p.txt: 4 items are above the maximum 3"):
            load_job(_job(tmp_path, f"{_P}]\nprompts_file: p.txt"))
        # near a built-in name is not one; a control of the same name in two pairings is fine
        job = load_job(_job(tmp_path, "pairings: [{name: p, target: /t, draft: /d}, {name: q, target: /t}]\n"
                                      "controls: [{name: w2x, env: {A: '1'}}, {name: baseline, env: {A: '1'}},"
                                      " {name: repeat, env: {A: '1'}}]"))
    finally:
        set_limits(None)
    assert [c.name for c in job.controls] == ["w2x", "baseline", "repeat"]


def test_every_arm_the_plan_names_is_reserved_from_controls(tmp_path: Path) -> None:
    """The reserved names come from harness.plan itself: an arm it adds later is refused too."""
    from specparity.harness.config import DistSpec
    from specparity.harness.plan import plan_arms
    from specparity.harness.profiles import Profile

    job = load_job(_job(tmp_path, f"{_P}]\nwidths: [2, 5]\nself_draft: true\nconcurrency: 2\nrepeats: 2\n"
                                  "controls: [{name: c, env: {A: '1'}}]"))
    job.distribution = DistSpec(width=3)
    arms, _ = plan_arms(job, Profile("p", ["x"]), True, True)
    builtin = [a.name for a in arms if a.name != "c"]
    assert {"dist-baseline", "dist-w3"} <= set(builtin)
    assert {"baseline-start", "w2", "w5", "self-draft", "concurrent", "baseline-end", "repeat2"} <= set(builtin)
    for name in builtin:
        with pytest.raises(UsageError, match=f"controls\\[0\\].name: '{name}' is {BUILTIN}"):
            load_job(_job(tmp_path, f"{_P}]\ncontrols: [{{name: {name}, env: {{A: '1'}}}}]"))


@pytest.mark.parametrize("args, message", [
    (["served", "--model", "~nosuchuser/x"], "Error: --model ~nosuchuser/x: cannot expand '~nosuchuser': user"
                                             " 'nosuchuser' has no home directory here"),
    (["probe", "--model", "~nosuchuser/x"], "Error: --model ~nosuchuser/x: cannot expand '~nosuchuser'"),
    pytest.param(["records", "show", "~nosuchuser/r"], "Error: ~nosuchuser/r: cannot expand '~nosuchuser'",
                 marks=pytest.mark.slow),
    pytest.param(["served", "--record-dir", "~nosuchuser/r"], "Error: --record-dir ~nosuchuser/r: cannot expand",
                 marks=pytest.mark.slow),
    pytest.param(["fixtures", "make", "~nosuchuser/f"], "Error: OUT_DIR ~nosuchuser/f: cannot expand",
                 marks=pytest.mark.slow),
    pytest.param(["dist", "--rule", "~nosuchuser/r.py:rule"], "Error: --rule ~nosuchuser/r.py: cannot expand",
                 marks=pytest.mark.slow),
    pytest.param(["env", "list"], "Error: SPECPARITY_HOME ~nosuchuser/h: cannot expand", marks=pytest.mark.slow),
])
def test_an_unknown_users_home_is_one_line_and_exit_2(cli_bin: str, args: list[str], message: str) -> None:
    """Path.expanduser raises RuntimeError for a user with no home: every command exited 70 (a
    SPECPARITY_HOME of such a user too: the last case sets it)."""
    env = {"SPECPARITY_HOME": "~nosuchuser/h"} if args == ["env", "list"] else None
    r = run_cli(cli_bin, *args, env=env)
    assert r.returncode == 2 and r.stderr.startswith(message), r.stderr
    assert r.stderr.strip().count("\n") == 0, r.stderr


def test_an_unknown_users_home_is_a_usage_error_in_process(tmp_path: Path) -> None:
    from specparity.errors import InputError
    from specparity.outputs import check_new_file, check_record_dir
    from specparity.records.writer import RecordWriter
    from specparity.resolve import resolve_checkpoint

    for call, words in ((lambda: check_record_dir("~nosuchuser/r"), "--record-dir ~nosuchuser/r: cannot expand"),
                        (lambda: check_new_file("~nosuchuser/j.xml", "--out"), "--out ~nosuchuser/j.xml: cannot"),
                        (lambda: resolve_checkpoint("~nosuchuser/m"), "checkpoint ~nosuchuser/m: cannot expand"),
                        (lambda: RecordWriter("~nosuchuser/r", "s", {}), "record-dir ~nosuchuser/r: cannot expand")):
        with pytest.raises(UsageError) as err:
            call()
        assert str(err.value).startswith(words), str(err.value)
    assert not isinstance(err.value, InputError) or err.value.param == "record-dir"


def test_non_utf8_config_and_prompts_files_are_named(tmp_path: Path, isolated_home: Path) -> None:
    """A job file without pairings runs the built-in job; a bad one is refused before its pair is built."""
    cfg = _job(tmp_path, b'prompts: ["\xff\xfe"]\n')
    with pytest.raises(UsageError, match=r"job.yaml: not UTF-8 text \(byte 0xff at offset 11\)"):
        load_job(cfg)
    (tmp_path / "p.txt").write_bytes(b"fine\n\xfe\n")
    cfg = _job(tmp_path, "prompts_file: p.txt")
    with pytest.raises(UsageError, match=r"prompts_file .*p.txt: not UTF-8 text \(byte 0xfe at offset 5\)"):
        load_job(cfg)
    cfg = _job(tmp_path, "prompts_file: .")
    with pytest.raises(UsageError, match="prompts_file .*: not a regular file"):
        load_job(cfg)
    assert not (isolated_home / "fixtures").exists()


BOMB = "env:\n  A: &a [x, x, x, x, x, x, x, x, x]\n" + "\n".join(
    f"  {c.upper()}: &{c} [{', '.join([f'*{p}'] * 9)}]" for p, c in zip("abcdefg", "bcdefgh"))


@pytest.mark.parametrize("text, message", [
    (BOMB, "more than 200000 values once its aliases are expanded"),
    ("params: {stop: &a [x, *a]}", "a recursive alias"),
    ("params: {stop: " + "[" * 80 + "]" * 80 + "}", "nested deeper than 64 levels"),
    ("prompts: ['" + "x" * (5 << 20) + "']", "more than the 4194304 bytes a file may hold here"),
    # one long string aliased many times: few values, a 66 KB file, 6.5 MB of stop strings (the audit's
    # 3 MiB x 100,000 was 314 GB once serialized)
    ("params: {stop: [&s '" + "x" * (64 << 10) + "', " + ", ".join(["*s"] * 100) + "]}",
     "more than 4194304 characters once its aliases are expanded"),
    ("prompts: [&s '" + "x" * (64 << 10) + "', " + ", ".join(["*s"] * 100) + "]",
     "more than 4194304 characters once its aliases are expanded"),
    ("env: {A: &k " + "k" * (1 << 20) + "}\nparams: {logit_bias: {*k : 1, 'x': *k, 'y': [*k, *k]}}",
     "more than 4194304 characters once its aliases are expanded"),
])
def test_yaml_is_bounded_before_it_is_walked(tmp_path: Path, text: str, message: str) -> None:
    """An alias bomb hung (str() of 9^8 items); a subprocess with a timeout turns a hang into a failure."""
    cfg = _job(tmp_path, text)
    code = ("import sys\nfrom specparity.harness.config import load_job\nfrom specparity.errors import UsageError\n"
            f"try:\n    load_job({str(cfg)!r})\nexcept UsageError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=120)
    assert message in out.stdout, (out.stdout, out.stderr[-2000:])


@pytest.mark.parametrize("key, value, message", [
    ("width", {"rows_offset": "abc"}, "width.rows_offset: expected an integer in [-16, 16], got 'abc'"),
    ("width", [1, 2], "width: expected a mapping, got [1, 2] (a list)"),
    ("evidence", [1], "evidence: expected a mapping, got [1] (a list)"),
    ("evidence", {"log_engaged": "("}, "evidence.log_engaged: '(' is not a regular expression (missing )"),
    ("fail_regex", "(", "fail_regex: '(' is not a regular expression (missing ), unterminated subpattern"),
    ("logprobs", {"request": [1, 2]}, "logprobs.request: expected a mapping of request field to a JSON value"),
    ("requires_module", 5, "requires_module: expected a module name (dotted identifiers), got 5"),
    ("requires_module", "a..b", "requires_module: expected a module name (dotted identifiers), got 'a..b'"),
    ("colour", "red", "unknown key 'colour' (known: argv, "),
    ("draft_argv", ["--x", True], "draft_argv[1]: expected a string or a number, got True"),
    ("draft_argv", "--draft {draft_model}", "draft_argv: expected a list of arguments (strings or numbers; no shell)"),
    ("ready_path", "health", "ready_path: expected a URL path (/health), got 'health'"),
    ("witness", ["drafter"], "witness[0]: expected one of target, draft, got 'drafter'"),
    ("exercised", "yes", "exercised: expected true or false, got 'yes'"),
    # the dry render at load: a bad template fails now, not when a server starts
    ("argv", ["{python}", "{0}"], "placeholder {0} in '{0}' has no value here"),
    ("argv", ["x", "{model"], "'{model': expected '}' before end of string"),
    ("draft_argv", ["--n", "{num_draft!z}"], "draft_argv: placeholder {num_draft!z} in '{num_draft!z}': no format"
                                             " spec or conversion"),
    # a format spec pads a value to any size: {model:>99999999999} was a MemoryError (70), 300000000 took 300 MB
    ("argv", ["{python}", "{model:>99999999999}"], "argv: placeholder {model:>99999999999} in"
                                                   " '{model:>99999999999}': no format spec or conversion"
                                                   " (a placeholder is its whole value: {model})"),
    ("argv", ["{python}", "--m={model:>300000000}"], "argv: placeholder {model:>300000000} in"),
    ("argv", ["{python}", "{model!r}"], "argv: placeholder {model!r} in '{model!r}': no format spec"),
    ("argv", ["{python}", "--port", "{port:d}"], "argv: placeholder {port:d} in '{port:d}': no format spec"),
    ("version_command", ["{python}", "{model!s:>5}"], "version_command: placeholder {model!s:>5} in"),
    ("draft_argv", ["--n", "{modle}"], "placeholder {modle} in '{modle}' has no value here"),
    ("version_command", ["{python}", "{width}"], "placeholder {width} in '{width}' has no value here"),
])
def test_a_bad_profile_key_is_named_with_its_path_and_type(tmp_path: Path, key: str, value: Any, message: str) -> None:
    prof = tmp_path / "prof.yaml"
    prof.write_text(yaml.safe_dump({**PROFILE, key: value}))
    with pytest.raises(UsageError) as err:
        load_profile(str(prof))
    assert str(prof) in str(err.value) and message in str(err.value), str(err.value)
    assert "\n" not in str(err.value)


def test_a_profile_that_extends_names_the_file_holding_the_bad_key(tmp_path: Path) -> None:
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump({**PROFILE, "width": {"rows_offset": "one"}}))
    child = tmp_path / "child.yaml"
    child.write_text(yaml.safe_dump({"extends": str(base), "description": "d"}))
    with pytest.raises(UsageError, match=r"base.yaml: width.rows_offset: expected an integer"):
        load_profile(str(child))


@pytest.mark.parametrize("overrides, message", [
    (Overrides(widths=[2, 100000]), "widths: 100000 is above the maximum 1024"),
    (Overrides(max_tokens=100_000_000), "max_tokens: 100000000 is above the maximum 16384"),
    (Overrides(repeats=100_000_000), "repeats: expected an integer in [0, 64]"),
    (Overrides(start_timeout=float("nan")), "start_timeout: expected a number of seconds"),
    (Overrides(request_timeout=float("inf")), "request_timeout: expected a number of seconds"),
])
def test_overrides_are_bounded_as_job_keys_are(overrides: Overrides, message: str, isolated_home: Path) -> None:
    """No job: the built-in one. A bad value is refused before its embedded pair is built."""
    with pytest.raises(UsageError) as err:
        apply_overrides(None, overrides)
    assert message in str(err.value)
    assert not (isolated_home / "fixtures").exists()


@pytest.mark.parametrize("args, message", [
    (["served", "--widths", "2-100000"], "Error: --widths '2-100000': 100000 is above the maximum 1024"),
    # the same checks as the overrides above, through the flags: refused before the embedded pair is built
    (["served", "--start-timeout", "nan"], "Error: --start-timeout: expected a number of seconds in"
     " (0, 604800], got nan"),
    (["served", "--request-timeout", "nan"], "Error: --request-timeout: expected a number of seconds"),
    (["served", "--max-tokens", "100000000"], "Error: --max-tokens: 100000000 is above the maximum 16384"),
    (["e2e", "--max-tokens", "100000000"], "Error: --max-tokens 100000000: 100000000 is above the maximum 16384"),
    (["e2e", "--num-draft-tokens", "5000"], "Error: --num-draft-tokens 5000: 5001 is above the maximum 1024"),
])
def test_flags_are_bounded_on_every_command(cli_bin: str, args: list[str], message: str,
                                            isolated_home: Path) -> None:
    r = run_cli(cli_bin, *args)
    assert r.returncode == 2 and r.stderr.strip().startswith(message), r.stderr
    assert not (isolated_home / "fixtures").exists()  # nothing built for a command that refuses its flags
    assert r.stderr.strip().count("\n") == 0


def test_a_bad_config_is_one_line_and_exit_2_from_the_cli(cli_bin: str, tmp_path: Path) -> None:
    cfg = _job(tmp_path, "env: [1, 2]")
    r = run_cli(cli_bin, "served", "--config", str(cfg))
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == (f"Error: --config {cfg}: env: expected a mapping of environment variable to a"
                                " string or number, got [1, 2] (a list)")
    prof = tmp_path / "prof.yaml"
    prof.write_text(yaml.safe_dump({**PROFILE, "fail_regex": "("}))
    r = run_cli(cli_bin, "served", "--profile", str(prof))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "fail_regex: '(' is not a regular" in r.stderr


@pytest.mark.parametrize("config, message", [("{}", "config.json has no model_type"),
                                             ("[1]", "config.json has no model_type"),
                                             ("{not json", "config.json is not readable JSON")])
def test_a_checkpoint_whose_config_is_not_mlx_lm_s_is_named(tmp_path: Path, config: str, message: str) -> None:
    """served --model DIR with such a config.json exited 70 (KeyError 'model_type') wrapping it for the witness."""
    from specparity.harness.witness import wrap_checkpoint

    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "config.json").write_text(config)
    with pytest.raises(UsageError, match=message):
        wrap_checkpoint(tmp_path / "ck", tmp_path / "w", "target")


@pytest.mark.parametrize("key, value", [("start_timeout", float("nan")), ("start_timeout", 0),
                                        ("stop_timeout", float("inf")), ("stop_timeout", True)])
def test_a_server_refuses_a_timeout_that_is_no_deadline(key: str, value: Any) -> None:
    """lifecycle.Server itself (every caller, not only served's flags): a nan start timeout waited forever."""
    from specparity.harness.lifecycle import Server

    with pytest.raises(UsageError, match=f"srv: {key}: .* is not a number of seconds"):
        Server(["x"], name="srv", **{key: value})
