"""A second real engine: llama.cpp's llama-server on the embedded pair, exported to GGUF.

llama-server is built from the llama.cpp that the pinned llama-cpp-python
source distribution vendors (scripts/build-llama-server), once per machine,
into a cache outside the repository. No test builds it: ``.ci/run`` runs the
script before pytest; without the binary the tests that need it skip ("run
scripts/build-llama-server"), and fail where ``CI`` is set (conftest's
``llama_server_bin``).

What they prove, on real server processes on 127.0.0.1:
- greedy llama-server (temperature 0, top_k 1) emits exactly the tokens and
  text of mlx-lm's greedy ``stream_generate`` for the same prompt tokens;
- with the drafter (``-md``, ``--spec-type draft-simple``) at two widths the
  completion is identical and ``timings.draft_n > 0`` (engagement evidence);
- a server without a drafter, and one given a drafter but not ``--spec-type``
  (llama.cpp's default type is ``none``), report no drafting (no ``draft_n``):
  a harness reading ``draft_n`` as evidence calls them not engaged;
- llama-server tokenizes text the way the fixture's tokenizer does.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

PROMPTS: dict[str, list[int]] = {
    "ids-a": [7, 30, 101, 250, 3, 64, 480, 12],
    "ids-b": [300, 301, 17, 9, 44, 120, 121, 122, 5, 260, 88, 42],
}
TEXT_PROMPTS = [
    "The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b  # 0123456789 (x) [y] {z}",
]
N_PREDICT = 48
WIDTHS = (4, 8)  # verify rows: --spec-draft-n-max 3 and 7


@pytest.fixture(scope="module")
def gguf_pair(llama_pair) -> tuple[str, str]:
    from specparity.fixtures import pair_gguf

    target, draft = pair_gguf(llama_pair)
    assert draft is not None
    return target, draft


@pytest.fixture(scope="module")
def mlx_greedy(llama_pair):
    """prompt ids -> (token ids, text) of mlx-lm's own greedy generation (stream_generate)."""
    from mlx_lm import load
    from mlx_lm.generate import stream_generate

    loaded = load(llama_pair.target)
    model, tokenizer = loaded[0], loaded[1]

    def run(prompt: list[int]) -> tuple[list[int], str]:
        ids, text = [], ""
        for r in stream_generate(model, tokenizer, prompt=prompt, max_tokens=N_PREDICT):
            if r.token in tokenizer.eos_token_ids:
                break
            ids.append(int(r.token))
            text += r.text
        return ids, tokenizer.decode(ids)

    return run, tokenizer


def _start(binary: str, model: str, tmp_path: Path, name: str, draft: str | None = None, n_max: int = 3,
           spec_type: str | None = "draft-simple"):
    from specparity.harness.lifecycle import Server
    from specparity.engines.llama_cpp.served import llama_server_argv

    argv = llama_server_argv(binary, model, draft=draft, n_max=n_max, spec_type=spec_type)
    srv = Server(argv, log_path=tmp_path / f"{name}.log",
                 ready_path="/health", start_timeout=120, name=name)
    return srv.start()


def _complete(srv, prompt: list[int] | str) -> dict:
    import httpx

    body = {"prompt": prompt, "n_predict": N_PREDICT, "temperature": 0, "top_k": 1,
            "return_tokens": True, "cache_prompt": False}
    r = httpx.post(srv.url + "/completion", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.build
def test_build_script_is_idempotent(llama_server_bin, repo_root):
    """Once built, the script exits at once with the cached binary's path (no rebuild)."""
    from specparity.engines.llama_cpp.served import cached_binary

    if Path(llama_server_bin) != cached_binary():
        pytest.skip(f"llama-server came from {llama_server_bin}, not the build cache")
    t0 = time.perf_counter()
    r = subprocess.run([str(repo_root / "scripts" / "build-llama-server")], capture_output=True,
                       text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(cached_binary())
    assert time.perf_counter() - t0 < 30
    info = (cached_binary().parent.parent / "build-info.txt").read_text()
    assert "LLAMA_OPENSSL=OFF" in info and "CMAKE_BUILD_TYPE=Release" in info


@pytest.mark.build
def test_help_names_the_speculative_flags(llama_server_bin):
    """The flags the harness passes are the ones this llama-server documents."""
    r = subprocess.run([llama_server_bin, "--help"], capture_output=True, text=True, timeout=60, check=False)
    text = r.stdout + r.stderr
    for flag in ("--spec-draft-model", "-md", "--spec-type", "--spec-draft-n-max", "--spec-draft-n-min",
                 "--spec-draft-p-min", "draft-simple", "--no-webui"):
        assert flag in text, flag


@pytest.mark.model
@pytest.mark.server
@pytest.mark.build
def test_greedy_llama_server_equals_mlx_lm_and_drafting_keeps_it(llama_server_bin, gguf_pair, mlx_greedy,
                                                                  tmp_path):
    target, draft = gguf_pair
    run, _ = mlx_greedy
    want = {name: run(ids) for name, ids in PROMPTS.items()}
    assert all(len(ids) >= 8 for ids, _ in want.values()), want

    plain = _start(llama_server_bin, target, tmp_path, "plain")
    try:
        for name, ids in PROMPTS.items():
            resp = _complete(plain, ids)
            assert resp["tokens"] == want[name][0], name
            assert resp["content"] == want[name][1], name
            # a server without a drafter drafts nothing: no draft_n at all
            assert not resp["timings"].get("draft_n"), resp["timings"]
    finally:
        plain.stop()

    for width in WIDTHS:
        srv = _start(llama_server_bin, target, tmp_path, f"draft-w{width}", draft=draft, n_max=width - 1)
        try:
            for name, ids in PROMPTS.items():
                resp = _complete(srv, ids)
                assert resp["tokens"] == want[name][0], (width, name)
                assert resp["content"] == want[name][1], (width, name)
                timings = resp["timings"]
                assert timings.get("draft_n", 0) > 0, (width, name, timings)
                assert 0 <= timings["draft_n_accepted"] <= timings["draft_n"]
                print(f"width {width} {name}: draft_n {timings['draft_n']},"
                      f" accepted {timings['draft_n_accepted']}, {len(resp['tokens'])} tokens")
        finally:
            srv.stop()

    # the drafter loaded but --spec-type left at its default (none): same text, and no drafting
    idle = _start(llama_server_bin, target, tmp_path, "draft-idle", draft=draft, spec_type=None)
    try:
        resp = _complete(idle, PROMPTS["ids-a"])
        assert resp["tokens"] == want["ids-a"][0]
        assert not resp["timings"].get("draft_n"), resp["timings"]
    finally:
        idle.stop()


@pytest.mark.model
@pytest.mark.server
@pytest.mark.build
def test_llama_server_tokenizes_like_the_fixture_tokenizer(llama_server_bin, gguf_pair, mlx_greedy, tmp_path):
    import httpx

    _, tokenizer = mlx_greedy
    srv = _start(llama_server_bin, gguf_pair[0], tmp_path, "tokenize")
    try:
        for text in TEXT_PROMPTS:
            r = httpx.post(srv.url + "/tokenize", json={"content": text}, timeout=30)
            assert r.status_code == 200, r.text
            assert r.json()["tokens"] == tokenizer.encode(text), text
    finally:
        srv.stop()


def test_server_argv_without_a_drafter_has_no_spec_flags():
    from specparity.engines.llama_cpp.served import llama_server_argv

    plain = llama_server_argv("llama-server", "t.gguf")
    assert not any(a.startswith("--spec") or a == "-md" for a in plain)
    drafted = llama_server_argv("llama-server", "t.gguf", draft="d.gguf", n_max=7)
    assert drafted[drafted.index("-md") + 1] == "d.gguf"
    assert drafted[drafted.index("--spec-type") + 1] == "draft-simple"
    assert drafted[drafted.index("--spec-draft-n-max") + 1] == "7"


def test_find_llama_server_order(tmp_path, monkeypatch):
    """$SPECPARITY_LLAMA_SERVER first, then PATH, then the cache; a binary that fails --version is skipped."""
    from specparity.engines.llama_cpp import served as llama

    def fake(path: Path, ok: bool) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("#!/bin/sh\n" + ("echo 'version: 0 (fake)'\n" if ok else "exit 1\n"))
        path.chmod(0o755)
        return path

    cache = tmp_path / "cache"
    monkeypatch.setenv("SPECPARITY_LLAMA_CACHE", str(cache))
    monkeypatch.delenv("SPECPARITY_LLAMA_SERVER", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert llama.find_llama_server() is None
    cached = fake(cache / llama.LLAMA_CPP_PYTHON_VERSION / "bin" / "llama-server", ok=True)
    assert llama.find_llama_server() == str(cached)
    on_path = fake(tmp_path / "pathdir" / "llama-server", ok=True)
    monkeypatch.setenv("PATH", str(on_path.parent))
    assert llama.find_llama_server() == str(on_path)
    broken = fake(tmp_path / "broken" / "llama-server", ok=False)
    monkeypatch.setenv("SPECPARITY_LLAMA_SERVER", str(broken))
    assert llama.find_llama_server() == str(on_path)
    monkeypatch.setenv("SPECPARITY_LLAMA_SERVER", str(fake(tmp_path / "chosen" / "llama-server", ok=True)))
    assert llama.find_llama_server() == str(tmp_path / "chosen" / "llama-server")
    assert os.environ["SPECPARITY_LLAMA_CACHE"] == str(cache)


def test_ensure_without_toolchain_is_an_infrastructure_error(tmp_path, monkeypatch):
    from specparity.engines.llama_cpp import served as llama

    from specparity.errors import InfrastructureError

    monkeypatch.setenv("SPECPARITY_LLAMA_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("SPECPARITY_LLAMA_SERVER", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert "cmake" in (llama.missing_toolchain() or "")
    with pytest.raises(InfrastructureError, match="cannot be built"):
        llama.ensure_llama_server()


SERVED_PROMPTS = ["Speculative decoding drafts several tokens with a small model and verifies them"]


def _served(pair, tmp_path, profile: str, **kw):
    from specparity.harness.config import Job, Pairing
    from specparity.harness.run import ServedRun

    job = Job(pairings=[Pairing("llama.cpp", pair.target, pair.draft, profile)], widths=[2, 4],
              max_tokens=24, prompts=SERVED_PROMPTS, **kw)
    report = ServedRun(job, workdir=tmp_path / "served").run()
    return report, {a.name: a for a in report.pairings[0].arms}


@pytest.mark.model
@pytest.mark.server
@pytest.mark.build
def test_served_job_runs_on_llama_cpp_with_draft_n_as_evidence(llama_server_bin, llama_pair, tmp_path,
                                                                monkeypatch):
    """The served harness, unchanged but for the profile: every drafting arm matches, witnessed by draft_n."""
    monkeypatch.setenv("SPECPARITY_LLAMA_SERVER", llama_server_bin)
    report, arms = _served(llama_pair, tmp_path, "llama.cpp", sequence=["fresh", "repeat", "stream", "multi-turn"])
    for name in ("w2", "w4"):
        assert arms[name].verdict == "match", (name, arms[name].reason)
        for r in arms[name].requests:
            if r.kind != "stream":
                assert any(line.startswith("timings.draft_n: ") for line in r.evidence.lines), r.evidence
    assert arms["baseline-end"].verdict == "match"
    assert report.exit_code == 0, "\n".join(report.lines())
    # classic decode in MLX on the weights the GGUF was exported from, from the prompt tokens the
    # server says it decoded (its own chat template): every request compared; a difference, if any,
    # reported with both margins and called a near tie or a confident one
    p = report.pairings[0]
    assert p.reference_cost is not None and p.reference_cost["computed"] == 3  # one prompt, two chat turns
    for arm in p.arms:
        for r in arm.requests:
            assert r.reference is not None and r.reference["compared"] and r.reference["prompt_equal"], r.reference
            if r.classic is not None:
                assert r.tie is not None and r.tie["kind"] in ("near_tie", "confident", "unknown")
                assert "margin_a" in r.tie and "differs from classic decode in MLX" in r.reason


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.server
@pytest.mark.build
def test_served_llama_cpp_without_spec_type_is_not_engaged(llama_server_bin, llama_pair, tmp_path, monkeypatch):
    """The same drafter arms on a profile that forgets --spec-type: same text, no draft_n: not_engaged, exit 3."""
    import yaml

    monkeypatch.setenv("SPECPARITY_LLAMA_SERVER", llama_server_bin)
    profile = tmp_path / "llama-no-spec-type.yaml"
    profile.write_text(yaml.safe_dump({
        "extends": "llama.cpp", "name": "llama.cpp-no-spec-type",
        "draft_argv": ["-md", "{draft_model}", "--spec-draft-n-max", "{num_draft}"]}))
    report, arms = _served(llama_pair, tmp_path, str(profile), sequence=["fresh"], self_draft=False)
    assert arms["w2"].verdict == "not_engaged" and arms["w4"].verdict == "not_engaged"
    assert report.exit_code == 3


def test_llama_cpp_profile_loads_and_says_when_the_binary_is_missing(tmp_path, monkeypatch):
    from specparity.harness.profiles import load_profile

    from specparity.errors import InfrastructureError, UsageError

    p = load_profile("llama.cpp")
    assert p.engine == "llama_cpp" and p.response_field == "timings.draft_n" and p.width(4).setting == 3
    monkeypatch.setenv("SPECPARITY_LLAMA_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("SPECPARITY_LLAMA_SERVER", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert "scripts/build-llama-server" in (p.available() or "")
    with pytest.raises(InfrastructureError, match="llama-server not found"):
        p.render(p.argv, model="m.gguf", host="127.0.0.1", port=1)
    bad = tmp_path / "bad.yaml"
    bad.write_text("extends: llama.cpp\nengine: onnx\n")
    with pytest.raises(UsageError, match="engine .onnx."):
        load_profile(str(bad))
