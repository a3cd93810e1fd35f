"""mlx-lm's private names are reached from one place only: :mod:`specparity.mlx_compat` (and its ``server``).

The scan reads every module of the package with ``ast`` and finds, outside the
compatibility module:

- an import of a private name from mlx-lm (``from mlx_lm.utils import _download``);
- a private name reached through a name bound to mlx-lm (``mlx_lm.utils._parse_size``,
  ``server.ResponseGenerator._tokenize``, ``getattr(server, "_image_parts")``), a module
  imported with ``importlib.import_module("mlx_lm...")`` included;
- a rebinding of an mlx-lm module's global (``up.run = ...``, ``setattr(gen, ...)``):
  a name the module looks up at call time is its internals too;
- in a class built on an mlx-lm class: ``super()._x``, and a method or ``self._x`` that
  is one of that class's private names (an override of its internals);
- ``obj._x`` on any object where ``_x`` is a private name of an mlx-lm class and no module
  of the package defines a private name so spelled (an mlx-lm object's internals read from
  outside, e.g. a cache's ``_temporal_order``).

The rules are self-tested on a synthetic source; the version table is checked
against the installed mlx-lm.
"""

from __future__ import annotations

import ast
import functools
import inspect
import logging
import re
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest
import sources
from builds import built  # the real environment cache, read at collection, before any test's home

ROOT = Path(__file__).resolve().parents[2]
COMPAT = "specparity.mlx_compat"
MLX = "mlx_lm"
# the mlx-lm modules whose classes' private names the scan knows (the ones the toolkit builds on)
MLX_MODULES = ("mlx_lm.server", "mlx_lm.generate", "mlx_lm.models.cache", "mlx_lm.tokenizer_utils",
               "mlx_lm.utils", "mlx_lm.sample_utils")


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package: dotted name -> file (pyproject's package-dir applied)."""
    dirs = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    out: dict[str, Path] = {}
    for package, folder in dirs.items():
        for f in sorted((root / folder).rglob("*.py")):
            parts = f.relative_to(root / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            name = ".".join((package, *parts))
            if name in out or any(p.startswith(".") for p in parts):
                continue
            out[name] = f
    return out


def _chain(node: ast.expr) -> tuple[str | None, list[str]]:
    """(root name, attributes) of ``a.b.c`` -> ("a", ["b", "c"]); root None for anything else."""
    attrs: list[str] = []
    while isinstance(node, ast.Attribute):
        attrs.append(node.attr)
        node = node.value
    attrs.reverse()
    return (node.id if isinstance(node, ast.Name) else None), attrs


def _aliases(tree: ast.AST) -> dict[str, str]:
    """Names bound to mlx-lm (anywhere in the module) -> the dotted mlx-lm name they stand for."""
    out: dict[str, str] = {}
    for node in sources.nodes(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == MLX or a.name.startswith(MLX + "."):
                    if a.asname:
                        out[a.asname] = a.name
                    else:
                        out[a.name.split(".")[0]] = a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                (node.module == MLX or node.module.startswith(MLX + ".")):
            for a in node.names:
                out[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            call = node.value
            root, attrs = _chain(call.func)
            if root == "importlib" and attrs == ["import_module"] and call.args and \
                    isinstance(call.args[0], ast.Constant) and str(call.args[0].value).startswith(MLX):
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        out[t.id] = str(call.args[0].value)
    return out


def reaches(source: str | ast.Module, privates_of: Callable[[str], frozenset[str] | set[str]] = lambda _: set(),
            foreign: set[str] | frozenset[str] = frozenset()) -> list[tuple[int, str]]:
    """(line, what) for each reach into mlx-lm's private names in ``source``.

    privates_of(dotted): the private names of the mlx-lm class ``dotted`` (its methods and
    ``self._x`` attributes, its mlx-lm bases' included). foreign: private names of mlx-lm
    classes that no module of the package defines itself (read on any object, they are a reach).
    """
    tree = sources.parse(source) if isinstance(source, str) else source
    aliases = _aliases(tree)
    found: set[tuple[int, str]] = set()

    def dotted(root: str, attrs: list[str]) -> str:
        return ".".join([aliases[root], *attrs])

    for node in sources.nodes(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                (node.module == MLX or node.module.startswith(MLX + ".")):
            for a in node.names:
                if _private(a.name) or any(_private(p) for p in node.module.split(".")):
                    found.add((node.lineno, f"imports {node.module}.{a.name}"))
        elif isinstance(node, ast.Attribute):
            root, attrs = _chain(node)
            if root in aliases and any(_private(a) for a in attrs):
                found.add((node.lineno, f"reaches {dotted(root, attrs)}"))
            elif root not in ("self", "cls") and node.attr in foreign and \
                    not (isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name)
                         and node.value.func.id == "super"):
                found.add((node.lineno, f"reads {node.attr}, an mlx-lm object's private name"))
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                root, attrs = _chain(t) if isinstance(t, ast.Attribute) else (None, [])
                if root in aliases and attrs:
                    found.add((t.lineno, f"rebinds {dotted(root, attrs)}"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args and \
                node.func.id in ("getattr", "hasattr", "setattr", "delattr"):
            root, attrs = _chain(node.args[0])
            if root in aliases:
                name = node.args[1].value if len(node.args) > 1 and isinstance(node.args[1], ast.Constant) else None
                if node.func.id in ("setattr", "delattr"):
                    found.add((node.lineno, f"{node.func.id} on {dotted(root, attrs)}"))
                elif isinstance(name, str) and _private(name):
                    found.add((node.lineno, f"{node.func.id} {dotted(root, attrs)}.{name}"))
        elif isinstance(node, ast.ClassDef):
            bases = [_chain(b) for b in node.bases]
            mlx_bases = [dotted(r, a) for r, a in bases if r in aliases]
            if not mlx_bases:
                continue
            names: set[str] = set().union(*(privates_of(b) for b in mlx_bases))
            for sub in ast.walk(node):
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)) and sub.name in names:
                    found.add((sub.lineno, f"overrides {node.name}.{sub.name} of {', '.join(mlx_bases)}"))
                elif isinstance(sub, ast.Attribute) and _private(sub.attr):
                    v = sub.value
                    if isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id == "super":
                        found.add((sub.lineno, f"calls super().{sub.attr} of {', '.join(mlx_bases)}"))
                    elif isinstance(v, ast.Name) and v.id == "self" and sub.attr in names:
                        found.add((sub.lineno, f"reads self.{sub.attr} of {', '.join(mlx_bases)}"))
    return sorted(found)


@functools.cache
def mlx_privates(dotted: str) -> frozenset[str]:
    """The private names of the installed mlx-lm's class ``dotted`` (empty: not an mlx-lm class); read once
    per class (each reads the class's source)."""
    import importlib

    module, _, name = dotted.rpartition(".")
    try:
        obj = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return frozenset()
    if not inspect.isclass(obj):
        return frozenset()
    out: set[str] = set()
    for cls in obj.__mro__:
        if not cls.__module__.startswith(MLX):
            continue
        out |= {n for n in vars(cls) if _private(n)}
        try:
            file = inspect.getsourcefile(cls)
            text = sources.class_sources(file)[cls.__qualname__] if file else inspect.getsource(cls)
        except KeyError:  # a class the file's parse does not name so (built at run time): inspect's way
            text = inspect.getsource(cls)
        except (OSError, TypeError):
            continue
        out |= {m for m in re.findall(r"self\.(_\w+)", text) if _private(m)}
    return frozenset(out)


def _own_privates(modules: dict[str, Path]) -> set[str]:
    """Every private name the package's modules define (functions, classes, attributes they set)."""
    out: set[str] = set()
    for path in modules.values():
        for node in sources.nodes(sources.tree(path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and _private(node.name):
                out.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _private(node.attr):
                out.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and _private(node.id):
                out.add(node.id)
    return out


def _foreign(modules: dict[str, Path]) -> set[str]:
    import importlib

    names: set[str] = set()
    for m in MLX_MODULES:
        mod = importlib.import_module(m)
        for obj in vars(mod).values():
            if inspect.isclass(obj) and obj.__module__ == m:
                names |= mlx_privates(f"{m}.{obj.__name__}")
    return names - _own_privates(modules)


SYNTHETIC = '''
import importlib
import mlx_lm.server as up
from mlx_lm import utils
from mlx_lm.utils import _download
from mlx_lm.models.cache import LRUPromptCache

up.ResponseGenerator._tokenize(None)
utils._parse_size("1G")
getattr(up, "_image_parts", None)
up.run = None
g = importlib.import_module("mlx_lm.generate")
setattr(g, "generate_step", None)

class Mine(LRUPromptCache):
    def fetch(self):
        self._own = 1
        return self._trie, super()._private_helper()

    def _own_helper(self):
        return self._own

def outside(c):
    return c._temporal_order(c)

def clean(x):
    return up.stream_generate, utils.load, x._mine, getattr(up, "ModelProvider")
'''


def test_scan_finds_every_kind_of_reach_and_nothing_else():
    found = reaches(SYNTHETIC, privates_of=lambda d: {"_trie"} if d.endswith("LRUPromptCache") else set(),
                    foreign={"_temporal_order"})
    lines = SYNTHETIC.splitlines()
    got = {(lines[n - 1].strip(), what) for n, what in found}
    assert got == {
        ("from mlx_lm.utils import _download", "imports mlx_lm.utils._download"),
        ("up.ResponseGenerator._tokenize(None)", "reaches mlx_lm.server.ResponseGenerator._tokenize"),
        ('utils._parse_size("1G")', "reaches mlx_lm.utils._parse_size"),
        ('getattr(up, "_image_parts", None)', "getattr mlx_lm.server._image_parts"),
        ("up.run = None", "rebinds mlx_lm.server.run"),
        ('setattr(g, "generate_step", None)', "setattr on mlx_lm.generate"),
        ("return self._trie, super()._private_helper()", "reads self._trie of mlx_lm.models.cache.LRUPromptCache"),
        ("return self._trie, super()._private_helper()",
         "calls super()._private_helper of mlx_lm.models.cache.LRUPromptCache"),
        ("return c._temporal_order(c)", "reads _temporal_order, an mlx-lm object's private name"),
    }


def test_scan_sees_an_override_of_a_private_method():
    src = "import mlx_lm.server as up\nclass G(up.ResponseGenerator):\n    def _serve_single(self, r, s):\n" \
          "        pass\n    def _mine(self):\n        pass\n"
    found = reaches(src, privates_of=lambda d: {"_serve_single"})
    assert found == [(3, "overrides G._serve_single of mlx_lm.server.ResponseGenerator")]


def test_no_module_outside_the_compat_module_reaches_mlx_lm_private_names():
    modules = _modules()
    assert COMPAT in modules and "specparity.reference" in modules and "specparity.harness.gated.server" in modules
    foreign = _foreign(modules)
    bad = [f"{path.relative_to(ROOT)}:{line}: {what}"
           for name, path in modules.items() if name != COMPAT and not name.startswith(COMPAT + ".")
           for line, what in reaches(sources.tree(path), mlx_privates, foreign)]
    assert not bad, ("reaches into mlx-lm's private names outside specparity/mlx_compat.py (move each"
                     " there, with the versions it was checked against):\n" + "\n".join(bad))


def test_the_compat_module_reaches_what_its_table_names():
    """The scan run on the compat module itself finds its reaches (the guard is not blind there)."""
    modules = _modules()
    found = {what for m in (COMPAT, COMPAT + ".server") for _, what in reaches(modules[m].read_text(), mlx_privates)}
    for name in ("_parse_size", "_get_classes", "_download", "_tokenize", "_make_state_machine", "_load",
                 "_serve_single", "_set_completion_headers", "setattr on mlx_lm.server"):
        assert any(name in w for w in found), name
    doc = __import__(COMPAT, fromlist=["_"]).__doc__ or ""
    for name in ("_parse_size", "_get_classes", "_download", "_image_parts", "_tokenize", "_make_state_machine",
                 "_temporal_order", "_trie", "_serve_single", "_set_completion_headers"):
        assert name in doc, f"{name} not in mlx_compat's table"


def test_the_installed_mlx_lm_is_a_checked_version():
    from specparity import mlx_compat

    assert mlx_compat.mlx_lm_version() in mlx_compat.CHECKED_VERSIONS
    assert mlx_compat.check_version() is True


def test_an_unchecked_mlx_lm_is_one_warning_naming_it_not_a_crash(monkeypatch, caplog):
    import mlx_lm

    from specparity import mlx_compat

    monkeypatch.setattr(mlx_lm, "__version__", "9.9.9", raising=False)
    monkeypatch.setattr(mlx_compat, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="specparity.mlx_compat"):
        assert mlx_compat.check_version() is False
        assert mlx_compat.check_version() is False
    lines = [r.getMessage() for r in caplog.records if r.name == "specparity.mlx_compat"]
    assert len(lines) == 1 and "mlx-lm 9.9.9" in lines[0] and "0.32.2" in lines[0]


def test_a_reach_that_moved_names_the_version(monkeypatch):
    """A later mlx-lm without the server's tokenize step: one InfrastructureError naming the version."""
    import mlx_lm.server as up

    from specparity import mlx_compat
    from specparity.errors import InfrastructureError

    monkeypatch.delattr(up.ResponseGenerator, "_tokenize")
    with pytest.raises(InfrastructureError, match=r"mlx-lm \S+: its server's tokenize step moved"):
        mlx_compat.server_tokenize(None, None, {}, None)


# Run in a pinned environment's interpreter: every reach the table lists, as that mlx-lm has it.
_PROBE = r'''
import json, sys, tempfile
import mlx_lm.server as up
from mlx_lm.models.cache import LRUPromptCache, RotatingKVCache
from specparity import mlx_compat as c

out = {"version": c.mlx_lm_version(), "checked": c.check_version(), "server_031": c.server_031()}
out["parse_size"] = c.parse_size("2M")
out["model_classes"] = [k.__name__ for k in c.model_classes({"model_type": "llama"})]
with tempfile.TemporaryDirectory() as d:
    out["download"] = str(c.download(d)) == d
out["has_image_parts"] = c.has_image_parts([{"role": "user", "content": "hi"}])
out["image_parts"] = hasattr(up, "_image_parts")
out["tokenize"] = callable(getattr(up.ResponseGenerator, "_tokenize", None))
out["make_state_machine"] = callable(getattr(up.ResponseGenerator, "_make_state_machine", None))
out["temporal_order"] = callable(getattr(RotatingKVCache, "_temporal_order", None))
out["trie"] = hasattr(LRUPromptCache(2), "_trie")
g = c.generate_module()
out["generate_steps"] = all(callable(getattr(g, n, None)) for n in
                            ("generate_step", "speculative_generate_step", "maybe_quantize_kv_cache"))
from specparity.mlx_compat.server import missing_hooks
out["server_hooks"] = missing_hooks()
out["server_globals"] = all(hasattr(up, n) for n in ("argparse", "ModelProvider", "run", "stream_generate", "main"))
from mlx_lm.sample_utils import make_logits_processors
bias, penalty = make_logits_processors(logit_bias={3: 1.0}, repetition_penalty=1.5)
out["ignores_history"] = [c.ignores_history(bias), c.ignores_history(penalty)]
print(json.dumps(out))
'''


@pytest.mark.build
@pytest.mark.slow
@pytest.mark.parametrize("name, version", [("mlx-lm-0.31.3", "0.31.3"), ("mlx-lm-0.32.2", "0.32.2")])
def test_every_reach_of_the_table_is_there_in_each_checked_version(name, version):
    """The table's columns, read in the pinned environments: what it says is present is present (0.31.3
    lacks the image step, has 0.31's state machine, and lacks two of the server hooks specparity serve
    uses: serve runs on 0.32 only)."""
    import json
    import subprocess

    env = built(name)
    run = subprocess.run([str(env.python), "-P", "-c", _PROBE], env=env.environ(), capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["version"] == version and got["checked"] is True
    assert got["parse_size"] == 2_000_000 and got["model_classes"] == ["Model", "ModelArgs"] and got["download"]
    assert got["tokenize"] and got["make_state_machine"] and got["temporal_order"] and got["trie"]
    assert got["generate_steps"] and got["server_globals"] and got["has_image_parts"] is False
    assert got["ignores_history"] == [True, False]  # the logit bias is known by its name; a penalty is not
    if version == "0.31.3":
        assert got["server_031"] is True and got["image_parts"] is False
        assert got["server_hooks"] == ["ResponseGenerator._await_response", "ResponseGenerator._run_generate"]
    else:
        assert got["server_031"] is False and got["image_parts"] is True and got["server_hooks"] == []


@pytest.mark.build
@pytest.mark.model
@pytest.mark.slow
def test_serve_on_mlx_lm_031_refuses_in_one_line(llama_pair):
    """mlx-lm 0.31.3's server lacks two of serve's hooks: serve says so and exits 4 at once, where it
    used to answer 503 "starting" for ever (its generation thread's hook is never called there)."""
    import subprocess

    env = built("mlx-lm-0.31.3")
    run = subprocess.run(env.specparity_argv("serve", "--model", str(llama_pair.target), "--port", "0"),
                         env=env.environ(), capture_output=True, text=True, timeout=120)
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 4, run.stderr[-2000:]
    assert "Traceback" not in run.stderr and lines[-1].startswith("Error: specparity serve needs mlx-lm 0.32")
    assert "mlx-lm 0.31.3's server has no ResponseGenerator._await_response, ResponseGenerator._run_generate" \
        in lines[-1]


@pytest.mark.model
def test_mlx_lm_031s_stop_rule_ends_where_032s_stop_sequences_do(llama_pair):
    """0.31 has no ``make_stop_sequences`` (a replay with stops on 0.31 was exit 70, an ImportError); its server's
    own rule (an EOS id, or a stop word's ids just emitted) stands in. On the fixture's tokenizer it ends every
    stream where 0.32's ``StopSequences`` does: at the stop word, at EOS, and never on a stream with neither."""
    from mlx_lm.generate import make_stop_sequences
    from mlx_lm.utils import load_tokenizer

    from specparity.mlx_compat import _TokenStops, stop_sequences

    tok = load_tokenizer(Path(llama_pair.target))
    words = [" the dog", "mat"]
    old = _TokenStops([(int(t),) for t in tok.eos_token_ids]
                      + [tuple(tok.encode(w, add_special_tokens=False)) for w in words])
    new = make_stop_sequences(tok, words)
    assert type(stop_sequences(tok, words)) is type(new)  # 0.32 installed: its own
    eos = next(iter(tok.eos_token_ids))
    def ids(text: str) -> list[int]:
        return list(tok.encode(text, add_special_tokens=False))

    streams = [ids(" a cat sat on the dog and more"), ids(" sat on the") + ids("mat") + [7, 8],
               ids(" a cat") + [int(eos), 5], ids(" nothing here at all")]

    def end(stops, ids):
        m = stops.matcher()
        return next((i for i, t in enumerate(ids) if m.advance(int(t))), None)

    got = [(end(old, s), end(new, s)) for s in streams]
    assert all(a == b for a, b in got), got
    assert [a is None for a, _ in got] == [False, False, False, True], got
