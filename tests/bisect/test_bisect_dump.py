"""``bisect dump`` / ``bisect diff`` across processes, partner checks, and control arms."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import build, check_outputs

pytestmark = pytest.mark.model

PROMPT_IDS = "11,42,7,99,3,250,17,64"
FAULT = {"kind": "rows", "layer": 3, "subop": "mlp", "min_rows": 2}
# a real mlx variable that cannot touch CPU results (Metal command-buffer synchronisation)
INERT_VAR = "MLX_METAL_FAST_SYNCH"


@pytest.fixture(scope="session")
def dump_models(fixture_root):
    fault = build(fixture_root, "bisect-dump-llama-mlp-3", arch="llama", faults=[FAULT],
                  with_draft=False)
    clean = build(fixture_root, "bisect-dump-llama-clean", arch="llama", with_draft=False)
    bf16 = build(fixture_root, "bisect-dump-qwen-bf16", arch="qwen3_5", dtype="bfloat16",
                 faults=[{"kind": "rows", "layer": 0, "subop": "linear_attn", "min_rows": 2}],
                 with_draft=False)
    # fires only in a multi-row call past offset 0: the block, never prefill or a single step
    block_only = build(fixture_root, "bisect-dump-llama-block-3", arch="llama",
                       faults=[{**FAULT, "kind": "depth", "min_offset": 1}], with_draft=False)
    return {"fault": fault.target, "clean": clean.target, "bf16": bf16.target,
            "block_only": block_only.target}


def run_main(argv, capsys):
    from specparity.cli import main

    with pytest.raises(SystemExit) as exc:
        main(argv)
    out = capsys.readouterr()
    check_outputs(argv, out.out)
    return exc.value.code, out.out, out.err


def _rows(report: dict) -> list[tuple]:
    """The per-layer numbers a report must reproduce (labels aside)."""
    out = []
    for r in report["rows"]:
        d = r["output"]["diff"] if r["output"] else None
        cache = [(c["name"], c["diff"]["differing_bytes"]) for c in r["cache"]]
        out.append((r["label"], r["kind"], r["divergent"], d and d["differing_bytes"],
                    d and d["total_bytes"], d and d["max_abs_diff"], d and d["first_row"], cache))
    return out


def _dump_args(model, *extra):
    return ["bisect", "dump", "--model", model, "--trust-remote-code", "--width", "4",
            "--depth", "1", "--prompt-ids", PROMPT_IDS, *extra]


def test_dump_diff_across_processes_reproduces_in_process_report(dump_models, cli_bin,
                                                                  tmp_path, capsys):
    model = dump_models["fault"]
    a, b = tmp_path / "chain.safetensors", tmp_path / "block.safetensors"
    envs = [dict(os.environ), {**os.environ, INERT_VAR: "1"}]
    envs[0].pop(INERT_VAR, None)
    procs = [subprocess.Popen([cli_bin, *_dump_args(model, "--arm", arm, "--out", str(out))],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for arm, out, env in (("chain", a, envs[0]), ("block", b, envs[1]))]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    manifest_b = json.loads(b.with_suffix(".json").read_text())
    assert manifest_b["env"].get(INERT_VAR) == "1"
    assert INERT_VAR not in json.loads(a.with_suffix(".json").read_text())["env"]
    assert manifest_b["model"]["fingerprint"] and manifest_b["identity"]["host"]
    assert manifest_b["prompt"] == [int(x) for x in PROMPT_IDS.split(",")]

    code, out, _ = run_main(["bisect", "diff", str(a), str(b), "--json"], capsys)
    assert code == 1
    diffed = json.loads(out)
    code, out, _ = run_main(["bisect", "--model", model, "--trust-remote-code", "--width", "4",
                             "--depth", "1", "--prompt-ids", PROMPT_IDS, "--json"], capsys)
    assert code == 1
    inproc = json.loads(out)
    assert diffed["first_divergent"] == inproc["first_divergent"] == "3"
    assert diffed["drill"] == inproc["drill"]
    assert _rows(diffed) == _rows(inproc)
    assert diffed["logits_sha256"] == inproc["logits_sha256"]

    code, out, _ = run_main(["bisect", "diff", str(a), str(b)], capsys)
    assert code == 1 and "first divergent layer: layer 3" in out


def test_a_dump_never_writes_through_a_link_beside_it(dump_models, tmp_path, capsys):
    """Links at the names a dump's temporary files once had (``.NAME.tmp.safetensors``) reach files left as
    they were; the dump and its manifest are written, and nothing else is left in the folder."""
    victim = tmp_path / "victim.bin"
    victim.write_bytes(b"precious")
    out_dir = tmp_path / "dumps"
    out_dir.mkdir()
    (out_dir / ".a.safetensors.tmp.safetensors").symlink_to(victim)
    (out_dir / ".a.safetensors.tmp").symlink_to(victim)
    code, _, err = run_main(_dump_args(dump_models["clean"], "--arm", "chain", "--out",
                                       str(out_dir / "a.safetensors")), capsys)
    assert code == 0, err
    assert victim.read_bytes() == b"precious"
    assert sorted(p.name for p in out_dir.iterdir()) == [".a.safetensors.tmp", ".a.safetensors.tmp.safetensors",
                                                         "a.json", "a.safetensors"]


def test_bfloat16_dump_round_trips(dump_models, tmp_path, capsys):
    from specparity.bisect.dump import read_dump

    model, out = dump_models["bf16"], tmp_path / "both.safetensors"
    code, _, err = run_main(_dump_args(model, "--out", str(out)), capsys)
    assert code == 0, err
    dump = read_dump(out)
    assert str(dump.arms["block"].arrays["layers.0"].dtype).endswith("bfloat16")
    code, _, err = run_main(["bisect", "diff", str(out), str(out)], capsys)
    assert code == 2 and "--a-arm" in err
    code, out_d, _ = run_main(["bisect", "diff", str(out), str(out), "--a-arm", "chain",
                               "--b-arm", "block", "--json"], capsys)
    code2, out_i, _ = run_main(["bisect", "--model", model, "--trust-remote-code", "--width",
                                "4", "--depth", "1", "--prompt-ids", PROMPT_IDS, "--json"],
                               capsys)
    assert code == code2 == 1
    diffed, inproc = json.loads(out_d), json.loads(out_i)
    assert diffed["first_divergent"] == "0" and diffed["drill"]["subop"] == "linear_attn"
    assert _rows(diffed) == _rows(inproc)


def test_diff_refuses_other_model_width_or_non_dump(dump_models, tmp_path, capsys):
    fault_chain = tmp_path / "f.safetensors"
    for model, arm, width, out in (
        (dump_models["fault"], "chain", "4", fault_chain),
        (dump_models["clean"], "block", "4", tmp_path / "c.safetensors"),
        (dump_models["fault"], "block", "3", tmp_path / "w3.safetensors"),
    ):
        code, _, err = run_main(["bisect", "dump", "--model", model, "--trust-remote-code",
                                 "--width", width, "--prompt-ids", PROMPT_IDS, "--arm", arm,
                                 "--out", str(out)], capsys)
        assert code == 0, err
    code, _, err = run_main(["bisect", "diff", str(fault_chain), str(tmp_path / "c.safetensors")],
                            capsys)
    assert code == 2 and "different models" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_main(["bisect", "diff", str(fault_chain), str(tmp_path / "w3.safetensors")],
                            capsys)
    assert code == 2 and "width 4" in err and "width 3" in err
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not a safetensors file")
    code, _, err = run_main(["bisect", "diff", str(fault_chain), str(junk)], capsys)
    assert code == 2 and "junk.safetensors" in err
    code, _, err = run_main(["bisect", "diff", str(fault_chain), str(tmp_path / "none")], capsys)
    assert code == 2 and "no such dump" in err
    code, _, err = run_main(["bisect", "diff", str(fault_chain), str(fault_chain),
                             "--b-arm", "block"], capsys)
    assert code == 2 and "holds only chain" in err


@pytest.mark.slow
def test_control_that_changes_nothing_is_void_not_negative(dump_models, capsys, tmp_path):
    code, out, err = run_main(["bisect", "--model", dump_models["fault"], "--trust-remote-code",
                               "--width", "2", "--prompt-ids", PROMPT_IDS,
                               "--control", f"{INERT_VAR}=1", "--json",
                               "--record-dir", str(tmp_path)], capsys)
    assert code == 1, err
    ctrl = json.loads(out)["controls"]
    base, arm = ctrl["arms"]
    assert base["name"] == "baseline" and base["verdict"] == "divergent"
    assert arm["name"] == f"{INERT_VAR}=1" and arm["effect"] == "void"
    assert "void, not negative" in arm["sentence"]
    # classic in one group, the speculative width in the other, each across both processes
    groups = sorted(sorted(m) for m in ctrl["groups"].values())
    assert groups == [[f"{INERT_VAR}=1: classic", "baseline: classic"],
                      [f"{INERT_VAR}=1: width 2", "baseline: width 2"]]
    record = Path(json.loads(out)["record"]).read_text()
    assert "void, not negative" in record


def test_control_judgement_when_the_logits_change(dump_models, tmp_path, capsys):
    """Judge real dumps as control arms: same weights, one whose block alone is perturbed."""
    from specparity.bisect.controls import summarize_controls
    from specparity.bisect.dump import read_dump

    dumps = {}
    for key in ("clean", "block_only"):
        out = tmp_path / f"{key}.safetensors"
        code, _, err = run_main(_dump_args(dump_models[key], "--out", str(out)), capsys)
        assert code == 0, err
        dumps[key] = read_dump(out)
    rep = summarize_controls([("baseline", {}, dumps["clean"]), ("X=1", {"X": "1"},
                                                                  dumps["block_only"])], 4)
    arm = rep.arms[1]
    assert arm.effect == "introduces a divergence" and arm.first_changed == "3"
    assert sorted(sorted(m) for m in rep.groups.values()) == [
        ["X=1: classic", "baseline: classic", "baseline: width 4"], ["X=1: width 4"]]
    rep = summarize_controls([("baseline", {}, dumps["block_only"]), ("X=1", {"X": "1"},
                                                                       dumps["clean"])], 4)
    assert rep.arms[1].effect == "removes the divergence"
    assert "first row it changes against the baseline: 3" in rep.arms[1].sentence
