"""llama.cpp's ``llama-server``: where to find it, how to build it, how to start it.

The binary comes from ``scripts/build-llama-server``, which builds the
llama.cpp vendored by the pinned llama-cpp-python source distribution once
per machine into a cache outside the repository:
``${SPECPARITY_LLAMA_CACHE:-~/.cache/specparity/llama.cpp}/<version>/bin/llama-server``.
:func:`find_llama_server` looks, in order, at ``$SPECPARITY_LLAMA_SERVER``,
``llama-server`` on PATH, then that cache.

Speculative decoding in this llama.cpp (read from its ``--help``):
``-md/--spec-draft-model FILE`` with ``--spec-type draft-simple`` (the default
type is ``none``: a drafter alone does not draft), ``--spec-draft-n-max N``
drafts N tokens, so a verify block has N + 1 rows; each completion's
``timings.draft_n`` / ``timings.draft_n_accepted`` appear only when it drafted.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from specparity.errors import InfrastructureError
from specparity.tied import run_tied

log = logging.getLogger(__name__)

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
BUILD_SCRIPT = Path(__file__).resolve().parent.parent.parent / "scripts" / "build-llama-server"
# the C++ toolchain the build needs; without it the build cannot run here
TOOLCHAIN = ("cmake", "c++")


def cache_root() -> Path:
    """``$SPECPARITY_LLAMA_CACHE``, else ``~/.cache/specparity/llama.cpp``."""
    env = os.environ.get("SPECPARITY_LLAMA_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "specparity" / "llama.cpp"


def cached_binary(version: str = LLAMA_CPP_PYTHON_VERSION) -> Path:
    """Where ``scripts/build-llama-server`` puts the binary for ``version``."""
    return cache_root() / version / "bin" / "llama-server"


def _runs(path: str | os.PathLike) -> bool:
    try:
        subprocess.run([str(path), "--version"], capture_output=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return False
    return True


def find_llama_server() -> str | None:
    """The llama-server to use: $SPECPARITY_LLAMA_SERVER, PATH, then the build cache (None: none).

    A candidate counts only if it answers ``--version``.
    """
    candidates: list[str] = []
    if os.environ.get("SPECPARITY_LLAMA_SERVER"):
        candidates.append(os.environ["SPECPARITY_LLAMA_SERVER"])
    on_path = shutil.which("llama-server")
    if on_path:
        candidates.append(on_path)
    candidates.append(str(cached_binary()))
    for c in candidates:
        if Path(c).is_file() and os.access(c, os.X_OK) and _runs(c):
            return c
    return None


def missing_toolchain() -> str | None:
    """None when the build can run here, else which tool is missing."""
    missing = [t for t in TOOLCHAIN if shutil.which(t) is None]
    if missing:
        return f"no {' or '.join(missing)} on PATH: building llama-server needs cmake and a C++ compiler"
    if not BUILD_SCRIPT.exists():
        return f"{BUILD_SCRIPT} is missing (an installed package ships no build script: use a checkout)"
    return None


def ensure_llama_server(log_path: str | os.PathLike | None = None, timeout: float = 5400.0) -> str:
    """Find llama-server, or build it with ``scripts/build-llama-server`` (slow, once per machine).

    The build's output goes to ``log_path`` (default: inherited stderr).
    Raises InfrastructureError when it can be neither found nor built.
    """
    found = find_llama_server()
    if found:
        return found
    why = missing_toolchain()
    if why:
        raise InfrastructureError(f"llama-server not found and cannot be built: {why}")
    log.info("building llama-server with %s (once per machine)", BUILD_SCRIPT)
    out = open(log_path, "ab") if log_path else None  # noqa: SIM115 (closed below)
    try:
        # the script's pip download runs with this interpreter (a venv always has pip)
        env = {**os.environ, "PYTHON": sys.executable}
        # tied: a build stopped with this process leaves no compiler running
        with tempfile.TemporaryFile() as printed:
            code = run_tied([str(BUILD_SCRIPT)], "llama-server's build", timeout=timeout, env=env,
                            stdin=subprocess.DEVNULL, stdout=printed, stderr=out)
            printed.seek(0)
            stdout = printed.read().decode()
    except subprocess.TimeoutExpired:
        raise InfrastructureError(f"building llama-server took more than {timeout:g} s") from None
    finally:
        if out is not None:
            out.close()
    if code != 0:
        where = f"; log {log_path}" if log_path else ""
        raise InfrastructureError(f"{BUILD_SCRIPT} exited with code {code}{where}")
    path = stdout.strip().splitlines()[-1]
    if not _runs(path):
        raise InfrastructureError(f"{BUILD_SCRIPT} reported {path}, which does not answer --version")
    return path


def server_version(binary: str | os.PathLike) -> str:
    """The first line ``llama-server --version`` prints (e.g. ``version: 1 (abc123)``)."""
    r = subprocess.run([str(binary), "--version"], check=False, capture_output=True, text=True,
                       timeout=30)
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.startswith("version")]
    return lines[0] if lines else (r.stdout + r.stderr).strip().splitlines()[0]


# By default llama-server keeps its KV cache in float16 and its CPU flash attention
# computes in float16: a float32 model's logprobs then move by ~2e-4 and near-tie greedy
# tokens flip against mlx-lm (measured on the embedded pair; with these, ~1e-6)
FULL_PRECISION_KV = ("-ctk", "f32", "-ctv", "f32", "-fa", "off")
FULL_PRECISION_KV_DRAFT = ("-ctkd", "f32", "-ctvd", "f32")


def llama_server_argv(binary: str, model: str, draft: str | None = None, n_max: int = 3,
                ctx: int = 1024, threads: int = 1, spec_type: str | None = "draft-simple") -> list[str]:
    """argv for one llama-server on the lifecycle's host and port (``HOST_ARG`` / ``PORT_ARG``, filled at spawn).

    With ``draft`` it drafts ``n_max`` tokens per step with ``--spec-type draft-simple``
    and a minimum draft probability of 0 (a tiny drafter is rarely confident, and the
    default would be free to stop drafting). ``spec_type=None`` leaves the type at
    llama-server's default (``none``): the drafter loads but never drafts. One slot, no prompt-cache reuse across
    slots, and ``threads`` CPU threads: the same computation every run.
    """
    from specparity.harness.lifecycle import HOST_ARG, PORT_ARG

    argv = [binary, "-m", model, "--host", HOST_ARG, "--port", PORT_ARG, "-c", str(ctx),
            "-np", "1", "-t", str(threads), "-tb", str(threads), "--no-webui", *FULL_PRECISION_KV]
    if draft is not None:
        argv += ["-md", draft, *FULL_PRECISION_KV_DRAFT]
        if spec_type is not None:
            argv += ["--spec-type", spec_type]
        argv += ["--spec-draft-n-max", str(n_max), "--spec-draft-n-min", "0", "--spec-draft-p-min", "0"]
    return argv


# -- the engine hooks (harness.engines): a module-level function named like a hook IS that hook,
# so helpers above have names no hook has (llama_server_argv) ----------------------------------
LLAMA_SERVER_MISSING = ("llama-server not found ($SPECPARITY_LLAMA_SERVER, PATH, or the cache that"
                        " scripts/build-llama-server fills): run scripts/build-llama-server")


def unavailable() -> str | None:
    return LLAMA_SERVER_MISSING if find_llama_server() is None else None


def placeholders() -> dict[str, str]:
    """``{llama_server}``: the binary to run."""
    found = find_llama_server()
    if found is None:
        raise InfrastructureError(LLAMA_SERVER_MISSING)
    return {"llama_server": found}


def prepare_checkpoint(path: str, role: str) -> str:
    """llama-server loads GGUF: the mlx-lm checkpoint exported once (specparity.gguf_export)."""
    from specparity.gguf_export import cached_gguf

    return cached_gguf(path)


PROMPT_IDS_TIMEOUT = 30.0


def prompt_ids(client: Any, url: str, request: Any) -> list[int] | None:
    """The prompt tokens llama-server decodes ``request`` from: its own chat template (``/apply-template``,
    chatml where the GGUF carries none) and tokenizer (``/tokenize``, special tokens added and parsed).
    None when the server will not say."""
    from specparity.harness.transport import fetch, parse_json

    def ask(path: str, payload: dict[str, Any], key: str) -> Any:
        # PROMPT_IDS_TIMEOUT in total, not per read: an answer that trickles in is no answer
        status, data = fetch(client, "POST", url + path, PROMPT_IDS_TIMEOUT, json_body=payload)
        answer = parse_json(data) if status == 200 else None
        return answer.get(key) if isinstance(answer, dict) else None

    body = request.body
    try:
        if request.endpoint == "chat":
            prompt = ask("/apply-template", {"messages": body.get("messages")}, "prompt")
        else:
            prompt = body.get("prompt")
        if not isinstance(prompt, str):
            return None
        tokens = ask("/tokenize", {"content": prompt, "add_special": True, "parse_special": True}, "tokens")
    except Exception as err:  # any transport or format trouble, or the deadline: the server did not say
        log.debug("llama-server prompt ids: %s", err)
        return None
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        return None
    return list(tokens)
