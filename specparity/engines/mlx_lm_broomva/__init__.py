"""mlx-lm-broomva 0.31.3: a fork of mlx-lm 0.31.3 (it imports as ``mlx_lm``) with Gemma 4 multi-token prediction.

Its claim (``mlx_lm.generate.mtp_speculative_generate_step``'s docstring): "The yielded output is identical to
non-speculative generation from the target — the drafter only changes latency, never the tokens." What that
rests on: a ``gemma4_assistant`` drafter (``mlx_lm/models/gemma4_assistant.py``, no KV cache of its own)
cross-attends to the target's last K/V of each attention type (``return_shared_kv_states=True``, the fork's
change to ``gemma4_text``) and drafts ``num_draft_tokens`` (2) tokens from the target's last hidden state; the
target verifies [last, drafts] in one forward, accepts the drafts equal to its sampler's tokens and trims the
rejected rows with ``cache.trim_prompt_cache``. ``stream_generate(draft_model=...)``, ``generate`` and the
``mlx_lm generate --draft-model`` CLI take that loop when the drafter is an MTP drafter (``is_mtp_drafter``); its
server (``mlx_lm server --draft-model``) is mlx-lm 0.31.3's, unchanged.

Which mlx_lm is the fork: the distribution ``mlx-lm-broomva`` (``importlib.metadata``) and the module only it
has, ``mlx_lm.models.gemma4_assistant`` (mlx-lm 0.31.3 and 0.32.2 have none); its loops refuse any other
``mlx_lm`` (:func:`specparity.engines.mlx_lm_broomva.loops.check_fork`), naming its environment. The registry's
``module`` stays None: any module of the fork lives in the package ``mlx_lm``, which the tree test of "an engine
is one package" takes as this engine's name and finds in every engine-agnostic use of mlx-lm (the default
engine's). So a command does not re-run in its environment by itself: ``--environment mlx-lm-broomva`` (every
command below, and the served profile's ``environment:``) runs it there.

Its environment: mlx-lm 0.31.3 (what specparity's own ``mlx-lm`` dependency resolves to), then the fork over it
with ``pip --no-deps`` (both distributions write ``mlx_lm/``: installed in one pip run, which one's files land
last is pip's order; installed after, the fork's always do). The fork declares ``mlx`` for macOS only; the
environment's ``mlx[cpu]`` pin stands in on Linux. Its other dependencies are mlx-lm 0.31.3's, already there.

Its fixtures: ``specparity fixtures make DIR --dflash gemma4-e2b --drafter-format gemma4-assistant``
(:mod:`specparity.engines.mlx_lm_broomva.fixtures`): a Gemma 4 target and a ``gemma4_assistant`` drafter in the
shapes the published ones have, loadable by the fork's own ``load``.
"""

from __future__ import annotations

from pathlib import Path

from specparity.engines import DrafterFormat, EngineSpec, PinnedEnv
from specparity.engines.mlx_lm_broomva.loops import ENTRY_NAMES

NAME = "mlx-lm-broomva"
# the module only the fork has (mlx-lm's own releases have no gemma4_assistant)
FORK_MODULE = "mlx_lm.models.gemma4_assistant"
FORMAT = "gemma4-assistant"


def default_checkpoints() -> tuple[Path, Path | None]:
    """The default Gemma 4 pair (an E2B-shaped target and its assistant, float32), built once."""
    from specparity.engines.mlx_lm_broomva.fixtures import build_gemma4_pair
    from specparity.fixtures import fixtures_home

    info = build_gemma4_pair(fixtures_home() / "gemma4-assistant-gemma4-e2b-float32")
    return Path(info.target), Path(info.draft) if info.draft else None


ENGINE = EngineSpec(
    name=NAME,
    description="mlx-lm-broomva 0.31.3: mlx-lm's fork with Gemma 4 MTP drafting (gemma4_assistant drafters)",
    # None, not FORK_MODULE: see the module docstring (the tree test reads a module's top-level package as the
    # engine's name, and the fork's is mlx_lm); its loops check the fork themselves
    module=None,
    environments=(
        PinnedEnv(NAME, ("mlx-lm==0.31.3",),
                  "mlx-lm-broomva 0.31.3 (mtp_speculative_generate_step, stream_generate, generate CLI, server)"
                  " installed over mlx-lm 0.31.3",
                  imports=("mlx_lm", FORK_MODULE),
                  no_deps=("mlx-lm-broomva==0.31.3",),
                  left_out=("nothing of its own: its dependencies are mlx-lm 0.31.3's (installed first); its mlx"
                            " is declared for macOS only, the environment's mlx[cpu] stands in",)),
    ),
    # its loops only: its verify and trim live inside mtp_speculative_generate_step
    e2e_entry_points=ENTRY_NAMES,
    loops="specparity.engines.mlx_lm_broomva.loops:loops",
    # its server is mlx-lm 0.31.3's, run in the fork's environment: every drafted request fails (its drafter has no
    # cache of its own), which the served job reports with the server's own error
    profiles=("mlx-lm-broomva",),
    default_checkpoints=default_checkpoints,
    drafter_format=DrafterFormat(FORMAT, "specparity.engines.mlx_lm_broomva.fixtures:gemma4_format",
                                 "a Gemma 4 target with a gemma4_assistant MTP drafter (mlx-lm-broomva's)",
                                 shapes=("gemma4-e2b", "gemma4-31b")),
)
