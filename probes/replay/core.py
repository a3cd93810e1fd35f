"""The replay core: one loop that replays an accept vector through any engine adapter, against classic decode.

Given a prompt and a per-round accept vector, :func:`replay_accepts` starts the
engine's session (:meth:`Engine.session`) and, for each round with accept ``a``
and width ``W``, runs one target forward over the verify block::

    [last emitted token, a accepted proposals, W - 1 - a rejected rows]

then rolls it back to ``a`` accepted the engine's own way. Classic decode is one
greedy chain (:class:`specparity.probes.replay.classic.ClassicChain`: mlx-lm's
sampler over logprobs in the model's dtype, logits processors as
``generate_step`` applies them). Inputs are the chain's own tokens (a full
accept of ``a`` means the drafter proposed the target's tokens), so every
position is compared on the history classic decode had and a flip does not
cascade. Each kept row's logits (rows ``0..a``) are compared as bytes with the
chain's row for the same position (:func:`specparity.compare.compare_arrays`),
and each emitted token with the chain's token.

What differs between engines is declared in :class:`RoundOptions`, chosen from
the adapter's features (:meth:`RoundOptions.for_adapter`):

- how round 0 starts (``start``): ``anchor`` (the session prefills all but the
  last prompt token, ``anchor-prefill``, and round 0's block starts with it, as
  mlx-lm's server does); ``anchor-then-emit`` (the same, then one single step
  over the last prompt token emits the first token before round 0, as mlxcel's
  DFlash does); ``engine-prefill`` (the engine's own prefill over the whole
  prompt, whose last row emits the first token: every other engine);
- what rejected rows carry (``fill``): ``wrong-id`` (a fixed wrong id per row,
  the next id where it equals that row's right token, so the chain runs ahead
  by the rejected rows), ``correct-token`` (each row's right token), or
  ``one-wrong-id`` (one wrong id for every rejected row, checked against the
  bonus token only: the chain never runs ahead);
- which checks run after each rollback (``checks``): ``layer-offsets`` (every
  layer's cache offset must equal prompt - 1 + tokens emitted; a rewind that
  silently did nothing, or left a stale row, is a :class:`RewindFinding` named
  by its round, and the replay stops there), ``state`` (the engine's whole
  state, :meth:`TargetSession.state`, against classic decode's cache at the same
  position, :class:`StateFinding`, counted over every round), or both;
- ``bracket``: the classic chain's first round repeated from the same
  post-prefill state first (a repeat that differs makes the replay inconclusive).

One :class:`RoundsResult` comes out, from which both reports are made:
:class:`ReplayReport` (:func:`replay_rounds`, the replay of a served run's vector
with rewind offsets: mlx-lm and any adapter with ``anchor-prefill``,
``layer-offsets`` and ``rewind-modes``) and
:class:`specparity.probes.replay.engine.EngineReplayReport`
(:func:`specparity.probes.replay.engine.replay_engine`, every adapter, its
whole state compared).

Caches that cannot be trimmed (linear-attention / SSM ``ArraysCache``) are
rewound by mlx-lm's adapter by snapshot-and-recompute: an exact copy of the cache
is taken before a round with rejected rows, and afterwards restored and fed only
the kept rows. The report says which rewind it used (``rewind-modes``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from specparity.completions import first_index
from specparity.compare import compare_arrays
from specparity.decode import CacheOptions, GreedyPick, state_arrays
from specparity.errors import Inconclusive, InputError, Name, UsageError
from specparity.probes.engines.base import EngineCannotRun
from specparity.probes.engines.mlx_lm import MODE_SNAPSHOT, MODE_TRIM
from specparity.probes.replay.algebra import emitted_counts, locate
from specparity.probes.replay.classic import ClassicChain
from specparity.probes.replay.findings import Disagreement, Findings, RewindFinding, StateFinding
from specparity.progress import NULL, Observer
from specparity.reproducibility import Bracket
from specparity.verdicts import ReportMixin, Verdict

if TYPE_CHECKING:
    from specparity.probes.engines.base import Engine

__all__ = ["Disagreement", "RewindFinding", "MODE_SNAPSHOT", "MODE_TRIM", "RoundOptions", "RoundsResult",
           "ReplayReport", "replay_accepts", "replay_rounds", "replay", "round_widths"]

log = logging.getLogger(__name__)

POLICY_WRONG, POLICY_CORRECT = "wrong-id", "correct-token"
POLICIES = (POLICY_WRONG, POLICY_CORRECT)
# what an adapter's session must do for an accept vector replayed with rewind offsets (base.FEATURES)
REPLAY_FEATURES = ("anchor-prefill", "layer-offsets", "rewind-modes")

START_ANCHOR, START_ANCHOR_EMIT, START_PREFILL = "anchor", "anchor-then-emit", "engine-prefill"
FILL_ONE = "one-wrong-id"  # the other two fills are the policies
CHECK_OFFSETS, CHECK_STATE = "layer-offsets", "state"


@dataclass(frozen=True)
class RoundOptions:
    """How :func:`replay_accepts` replays: the differences between engines, declared (module docstring).

    start: ``anchor`` | ``anchor-then-emit`` | ``engine-prefill``. fill: ``wrong-id`` |
    ``correct-token`` | ``one-wrong-id``. checks: after each rollback, ``layer-offsets`` and/or
    ``state``. bracket: repeat the classic chain's first round before the replay.
    """

    start: str = START_PREFILL
    fill: str = FILL_ONE
    checks: tuple[str, ...] = (CHECK_STATE,)
    bracket: bool = False

    @property
    def lead(self) -> int:
        """Tokens emitted before round 0 (the first token, from the prefill's step)."""
        return 0 if self.start == START_ANCHOR else 1

    def features(self) -> list[str]:
        """The adapter features these options need (:data:`specparity.probes.engines.base.FEATURES`)."""
        need = []
        if self.start in (START_ANCHOR, START_ANCHOR_EMIT):
            need.append("anchor-prefill")
        if CHECK_OFFSETS in self.checks:
            need += ["layer-offsets", "rewind-modes"]
        return need

    def marks(self, accepts: list[int]) -> set[int] | None:
        """The chain's step counts where the state check compares (after the lead, then after each
        round's ``a + 1`` tokens); None without the state check."""
        if CHECK_STATE not in self.checks:
            return None
        out, end = {self.lead}, self.lead
        for a in accepts:
            end += a + 1
            out.add(end)
        return out

    @classmethod
    def served(cls, prefill_emits: bool = False, policy: str = POLICY_WRONG, state: bool = False) -> RoundOptions:
        """A served run's vector with rewind offsets (:func:`replay_rounds`): anchor start (then the first
        token from the prefill's step when the server emits it there), rejected rows per ``policy``, each
        layer's offset checked (and with ``state`` the whole state after every rollback), the chain
        bracketed."""
        checks = (CHECK_OFFSETS, CHECK_STATE) if state else (CHECK_OFFSETS,)
        return cls(START_ANCHOR_EMIT if prefill_emits else START_ANCHOR, policy, checks, True)

    @classmethod
    def whole_state(cls) -> RoundOptions:
        """An engine's rounds with its whole state compared (:func:`replay_engine`): the engine's own
        prefill, one wrong id, the state after every rollback."""
        return cls(START_PREFILL, FILL_ONE, (CHECK_STATE,), False)

    @classmethod
    def for_adapter(cls, engine: Engine, prefill_emits: bool = False, policy: str = POLICY_WRONG) -> RoundOptions:
        """:meth:`served` where the adapter has :data:`REPLAY_FEATURES`, else :meth:`whole_state`."""
        if all(engine.supports(f) for f in REPLAY_FEATURES):
            return cls.served(prefill_emits, policy)
        return cls.whole_state()


@dataclass
class RoundsResult:
    """What :func:`replay_accepts` found; :meth:`ReplayReport.of` and ``EngineReplayReport.of`` present it.

    options: how it ran. rounds: rounds replayed (of rounds_total; fewer when a rewind finding or
    the engine's error stopped it). widths / prompt_len / wrong_id / opts: its inputs.
    positions: emitted tokens compared. forwards: verify forwards (the prefill's emitting step
    included). rewinds: rounds that rolled rejected rows back. disagreements / first: kept rows
    whose logits or token differ, and the first. findings: the first token, row and state findings.
    rewind_finding: a wrong layer offset (stops the replay). mode / mode_reason: how the session
    rewinds (``rewind-modes``; empty otherwise). dtype: of the verify logits. target_tokens /
    classic_tokens: the verify rows' picks and the chain's. served_*: the served tokens against the
    chain (:class:`ReplayReport`). tie_breaks / tie_breaks_total / tie_indices: the chain's exact
    logprob ties (every row it computed). bracket: the chain's repeat (None: not asked; when not
    reproducible the replay did not run). error: the engine could not run a call (the loop stopped
    there). seconds: wall time.
    """

    options: RoundOptions
    rounds_total: int
    widths: list[int]
    prompt_len: int
    wrong_id: int
    opts: dict[str, Any]
    rounds: int = 0
    positions: int = 0
    forwards: int = 0
    rewinds: int = 0
    disagreements: int = 0
    first: Disagreement | None = None
    findings: Findings = field(default_factory=Findings)
    rewind_finding: RewindFinding | None = None
    mode: str = ""
    mode_reason: str = ""
    dtype: str = ""
    target_tokens: list[int] = field(default_factory=list)
    classic_tokens: list[int] = field(default_factory=list)
    served_checked: int | None = None
    served_first_mismatch: int | None = None
    served_mismatch_at: tuple[int, int] | None = None
    served_token: int | None = None
    served_pick: GreedyPick | None = None
    tie_breaks: list[dict[str, Any]] = field(default_factory=list)
    tie_breaks_total: int = 0
    tie_indices: list[int] = field(default_factory=list)
    bracket: Bracket | None = None
    error: EngineCannotRun | None = None
    seconds: float = 0.0

    @property
    def reproducible(self) -> bool:
        return self.bracket is None or self.bracket.reproducible


def replay_accepts(engine: Engine, prompt: list[int], accepts: list[int], widths: list[int],
                   options: RoundOptions, wrong_id: int = 0, served_tokens: list[int] | None = None,
                   trace: list | None = None, observer: Observer = NULL,
                   processors: list[Any] | None = None, chain: ClassicChain | None = None) -> RoundsResult:
    """Replay ``accepts`` (``widths`` rows per round) through ``engine``'s session as ``options`` say;
    compare every kept row, emitted token and (per ``options.checks``) the state after each rollback with
    one classic chain. Inputs are checked by the callers (:func:`replay_rounds`, :func:`replay_engine`).

    ``served_tokens``: the server's logged tokens, compared with the chain over their whole length (even
    after a rewind finding stopped the replay: where the engine's own output first left classic decode is
    the user's symptom). ``trace``, when a list, receives every forward and rewind in order
    (``("chain", first, n)``, ``("block", tokens)``, ``("trim", n)``, ``("fork",)``,
    ``("restore", kept_tokens)``; ``("rollback", accepted)`` where the session does not say how it
    rewinds) so a benchmark can time the same forwards bare. ``observer`` gets progress per round (part
    ``rounds``). ``processors``: made logits processors, applied to the chain and every verify row as
    classic decode applies them. An engine call that raises :class:`EngineCannotRun` stops the loop
    (``error``). ``chain``: classic decode already stepped on this prompt along its own picks (a walk of
    the engine's run that matched it, :attr:`ClassicChain.own`), its rows kept and its states kept at
    ``options.marks(accepts)``: the replay goes on with it instead of decoding the same chain again.
    """
    import mlx.core as mx

    t0 = time.perf_counter()
    opts = engine.cache_options()
    res = RoundsResult(options, len(accepts), list(widths), len(prompt), wrong_id, opts.to_dict())
    lead, state_check = options.lead, CHECK_STATE in options.checks
    if chain is None or not chain.own or trace is not None or processors or options.bracket:
        # classic decode's state where each round ends is kept (the chain may run past it)
        chain = ClassicChain(engine.classic_model(), prompt, opts, trace, processors, engine.classic,
                             options.marks(accepts))
    if options.bracket:
        res.bracket = chain.bracket(widths[0] + lead)
        if not res.bracket.reproducible:
            log.warning("%s", res.bracket.line())
            res.seconds = time.perf_counter() - t0
            return res
    found = res.findings
    base = len(prompt) - 1  # the absolute position of the chain's row 0
    target = engine.session()
    try:
        if options.start == START_PREFILL:
            first_row = target.prefill(prompt)
        else:
            last = target.prefill_anchor(prompt)
            if last != chain.tokens[0]:  # both prefilled the same prompt
                raise AssertionError("prefill returned different last tokens")
        if engine.supports("rewind-modes"):
            res.mode, res.mode_reason = target.rewind()
            if res.mode == MODE_SNAPSHOT:
                log.info("replay by snapshot-and-recompute: %s", res.mode_reason)
        if options.start == START_ANCHOR_EMIT:
            # classic decode's first step over the last prompt token emits the first bonus
            if trace is not None:
                trace.append(("block", [last]))
            first_row = target.extend([last])
            res.forwards += 1
    except EngineCannotRun as err:
        res.error = err
        return _finish(res, chain, t0, served_tokens, accepts)
    emitted = 0
    if lead:
        chain.ensure(1)
        row = first_row[-1]
        tok = chain.pick(0, row)
        res.target_tokens.append(tok)
        d = compare_arrays(chain.rows[0][None], row[None], logits=True)
        found.row_at(-1, 0, base, d)
        if tok != chain.tokens[1]:
            found.token_at(0, -1, 0, tok, chain.picks[0], d)
        if not d.equal or tok != chain.tokens[1]:
            res.disagreements += 1
            res.first = Disagreement(-1, 0, 0, base, chain.tokens[1], tok, d, chain.picks.get(0))
        emitted = res.positions = 1
    if state_check:
        found.state_after(-1, 0, 1, base + emitted, chain.state_at(emitted), target.state())

    vocab: int | None = None
    ahead = options.fill != FILL_ONE  # per-row fills need each rejected row's right token
    for r, (a, w) in enumerate(observer.iterate("rounds", zip(accepts, widths), len(accepts))):
        rejected = w - 1 - a
        chain.ensure(emitted + (w if ahead else a + 1))
        if vocab is None:
            vocab = int(chain.rows[emitted].shape[-1])
            if not 0 <= wrong_id < vocab:
                raise InputError("wrong-id", f"{wrong_id}: outside the vocabulary (0..{vocab - 1})")
        block = chain.tokens[emitted: emitted + a + 1]
        for i in range(rejected):
            right = chain.tokens[emitted + a + 1 + (i if ahead else 0)]
            if options.fill == POLICY_CORRECT:
                block.append(right)
            else:
                block.append(wrong_token(right, wrong_id, vocab))
        if trace is not None:
            if res.mode == MODE_SNAPSHOT and rejected:
                trace.append(("fork",))
            trace.append(("block", list(block)))
        trimmed = 0
        try:
            # a full accept rolls nothing back: the block is the round (no snapshot taken for it)
            logits = target.verify(block) if rejected else target.extend(block)
            res.forwards += 1
            if rejected:
                trimmed = target.rollback(a) or 0
        except EngineCannotRun as err:
            res.error = err
            break
        if rejected:
            res.rewinds += 1
            if trace is not None:
                trace.append(("trim", rejected) if res.mode == MODE_TRIM else ("restore", list(block[: a + 1]))
                             if res.mode == MODE_SNAPSHOT else ("rollback", a))
        kept = logits[: a + 1]
        # each kept row sees classic decode's history: its inputs are the chain's own tokens
        picks = chain.picks_from(emitted, kept)
        ref = mx.stack([chain.rows[emitted + k] for k in range(a + 1)])
        after = target.state_unevaluated() if state_check else []
        mx.eval(kept, picks, ref, state_arrays(after))  # what this round compares, in one evaluation
        got = [int(p.item()) for p in picks]
        res.target_tokens.extend(got)
        res.dtype = str(logits.dtype).replace("mlx.core.", "")
        want = chain.tokens[emitted + 1: emitted + a + 2]
        whole = compare_arrays(ref, kept, logits=True)
        if not whole.equal or got != want:
            for k in range(a + 1):
                d = compare_arrays(ref[k: k + 1], kept[k: k + 1], logits=True)
                if d.equal and got[k] == want[k]:
                    continue
                res.disagreements += 1
                found.row_at(r, k, base + emitted + k, d)
                if got[k] != want[k]:
                    found.token_at(emitted + k, r, k, got[k], chain.picks[emitted + k], d)
                if res.first is None:
                    res.first = Disagreement(r, k, emitted + k, base + emitted + k, want[k], got[k], d,
                                             chain.picks.get(emitted + k))
                    log.info("first disagreement at round %d row %d", r, k)
        emitted += a + 1
        res.positions = emitted
        res.rounds = r + 1
        if state_check:
            found.state_after(r, a, w, base + emitted, chain.state_at(emitted), after)
        chain.drop_before(emitted)
        if CHECK_OFFSETS in options.checks:
            offsets = target.offsets()
            bad = [i for i, o in enumerate(offsets) if o is not None and o != base + emitted]
            if bad:
                res.rewind_finding = RewindFinding(r, rejected, trimmed, base + emitted, offsets, bad)
                log.info("%s", res.rewind_finding.describe())
                break
    return _finish(res, chain, t0, served_tokens, accepts)


def wrong_token(right: int, wrong_id: int, vocab: int) -> int:
    """A rejected proposal's id: ``wrong_id``, or the next id where that is the right token."""
    return wrong_id if wrong_id != right else (wrong_id + 1) % vocab


def _finish(res: RoundsResult, chain: ClassicChain, t0: float, served_tokens: list[int] | None,
            accepts: list[int]) -> RoundsResult:
    """The chain's tokens over what was emitted, the served tokens against the chain, its ties."""
    res.classic_tokens = chain.tokens[1: res.positions + 1]
    if served_tokens is not None:
        chain.ensure(len(served_tokens))
        chain.drop_before(len(chain.tokens))
        reference = chain.tokens[1: len(served_tokens) + 1]
        res.served_checked = len(served_tokens)
        i = first_index(served_tokens, reference)
        res.served_first_mismatch = i if i < len(served_tokens) else None
        if res.served_first_mismatch is not None:
            res.served_token = served_tokens[i]
            res.served_pick = chain.picks.get(i)
            lead = res.options.lead
            res.served_mismatch_at = (-1, 0) if i < lead else locate(emitted_counts(accepts), i - lead)
    res.tie_breaks, res.tie_breaks_total = chain.tie_breaks, chain.tie_breaks_total
    res.tie_indices = list(chain.tie_indices)
    res.seconds = time.perf_counter() - t0
    return res


@dataclass
class ReplayReport(ReportMixin):
    """One request replayed.

    rounds: rounds replayed (fewer than ``rounds_total`` when a rewind finding stopped it).
    rounds_total: rounds in the accept vector.
    prefill_emits: the first token came from the prefill's step, before round 0.
    rewinds: rounds that rewound rejected rows. positions: emitted tokens compared.
    disagreements: positions whose verify row differs from the chain (logit bytes or token).
    first: the first of them (None if none).
    rewind_finding: a rewind that did not take effect (None if every one did).
    mode: ``trim`` or ``snapshot-and-recompute``; mode_reason: why.
    widths: rows per round. policy / wrong_id: what the rejected rows carried.
    prompt_len: prompt tokens. dtype: dtype the logits were compared in.
    opts: the cache configuration. forwards: target verify forwards run.
    target_tokens: tokens the verify rows emitted. classic_tokens: the chain's tokens.
    served_checked / served_first_mismatch: the server's logged tokens compared
      with classic decode (None when the log carried none / when they agree);
      served_mismatch_at: that index's (round, row), round -1 = the prefill step.
    served_token: the served token at that index.
    served_pick: classic's greedy choice at the served mismatch (its top-2 logprob
      margin, and whether the served token is classic's runner-up: a near-tie flip).
    tie_breaks: emitted indices where classic's logprob argmax broke an exact tie
      the dtype made (raw-logit argmax picks another id there: a reference that
      skips the sampler would report a false divergence), first 20, with the pick;
      tie_breaks_total: how many in all.
    bracket: the reproducibility bracket (classic chain repeated over the first
      round); a repeat that differs makes the replay inconclusive.
    state_checked: every layer's whole cache was also compared with classic decode's after every
      round (``--state``); state: the first round whose state differed (None: none did, or not checked).
    seconds: wall time.
    """

    rounds: int
    rounds_total: int
    rewinds: int
    positions: int
    disagreements: int
    first: Disagreement | None
    rewind_finding: RewindFinding | None
    mode: str
    mode_reason: str
    widths: list[int]
    policy: str
    wrong_id: int
    prompt_len: int
    prefill_emits: bool = False
    dtype: str = ""
    opts: dict[str, Any] = field(default_factory=dict)
    forwards: int = 0
    target_tokens: list[int] = field(default_factory=list)
    classic_tokens: list[int] = field(default_factory=list)
    served_checked: int | None = None
    served_first_mismatch: int | None = None
    served_mismatch_at: tuple[int, int] | None = None
    served_token: int | None = None
    served_pick: GreedyPick | None = None
    tie_breaks: list[dict[str, Any]] = field(default_factory=list)
    tie_breaks_total: int = 0
    bracket: Bracket | None = None
    state_checked: bool = False
    state: StateFinding | None = None
    seconds: float = 0.0

    @classmethod
    def of(cls, res: RoundsResult) -> ReplayReport:
        """The report of a replay with rewind offsets (:meth:`RoundOptions.served`)."""
        common: dict[str, Any] = dict(
            rounds_total=res.rounds_total, widths=res.widths, policy=res.options.fill, wrong_id=res.wrong_id,
            prompt_len=res.prompt_len, prefill_emits=res.options.start == START_ANCHOR_EMIT, opts=res.opts,
            bracket=res.bracket, seconds=res.seconds, state_checked=CHECK_STATE in res.options.checks)
        if not res.reproducible:
            return cls(rounds=0, rewinds=0, positions=0, disagreements=0, first=None, rewind_finding=None,
                       mode="", mode_reason="not run: not reproducible", **common)
        return cls(rounds=res.rounds, rewinds=res.rewinds, positions=res.positions,
                   disagreements=res.disagreements, first=res.first, rewind_finding=res.rewind_finding,
                   mode=res.mode, mode_reason=res.mode_reason, dtype=res.dtype, forwards=res.forwards,
                   target_tokens=res.target_tokens, classic_tokens=res.classic_tokens,
                   served_checked=res.served_checked, served_first_mismatch=res.served_first_mismatch,
                   served_mismatch_at=res.served_mismatch_at, served_token=res.served_token,
                   served_pick=res.served_pick, tie_breaks=res.tie_breaks, tie_breaks_total=res.tie_breaks_total,
                   state=res.findings.state, **common)

    @property
    def verdict(self) -> Verdict:
        if self.bracket is not None and not self.bracket.reproducible:
            return Verdict.INCONCLUSIVE
        if self.rewind_finding is not None or self.disagreements or self.state is not None:
            return Verdict.DIVERGENT
        if self.served_first_mismatch is not None:
            return Verdict.DIVERGENT
        if self.positions == 0:
            return Verdict.NOT_RUN
        return Verdict.EQUAL

    def summary(self) -> str:
        """The one-line result."""
        if self.bracket is not None and not self.bracket.reproducible:
            return "inconclusive: " + self.bracket.line()
        head = f"{self.rounds} rounds, {self.rewinds} rewinds, {self.positions} positions: "
        tail = ""
        if self.rewind_finding is not None:
            tail = f"; rewind failed at round {self.rewind_finding.round} (replay stopped)"
        if self.state is not None:
            tail += f"; the state after round {self.state.round} differs from classic decode's"
        if self.served_first_mismatch is not None:
            tail += (f"; served tokens differ from classic at emitted index"
                     f" {self.served_first_mismatch}")
        if not self.disagreements:
            return head + f"target agrees with classic at all {self.positions}" + tail
        f = self.first
        assert f is not None
        where = f"round {f.round}, row {f.row}" if f.round >= 0 else "the prefill step"
        return head + (
            f"target disagrees with classic at {self.disagreements} (first at {where},"
            f" emitted index {f.emitted_index}, absolute position {f.position}:"
            f" {f.diff.differing_bytes} of {f.diff.total_bytes} logit bytes)"
        ) + tail

    def lines(self) -> list[str]:
        """The summary, then the details a reader needs."""
        if self.bracket is not None and not self.bracket.reproducible:
            return [self.summary()]
        out = [self.summary()]
        widths = sorted(set(self.widths))
        out.append(
            f"rewind: {self.mode} ({self.mode_reason}); width {'/'.join(map(str, widths))} rows;"
            f" rejected rows carry {self._policy_words()}"
            + ("; the first token came from the prefill step" if self.prefill_emits else "")
        )
        if self.bracket is not None:
            out.append(self.bracket.line())
        if self.first is not None:
            f = self.first
            out.append(
                f"first disagreement: classic token {f.token_classic}, target token"
                f" {f.token_target}; {f.diff.summary('logit bytes')}"
                + (f"; classic's pick there: {f.pick.describe()}" if f.pick else "")
            )
        if self.rewind_finding is not None:
            out.append(self.rewind_finding.describe())
        if self.state is not None:
            out.append(self.state.words())
        elif self.state_checked:
            out.append(f"state: every layer's cache after each of the {self.rounds} rounds equals classic decode's"
                       " at the same position")
        if self.served_checked is not None:
            if self.served_first_mismatch is None:
                out.append(f"served tokens: identical to classic over {self.served_checked}")
            else:
                r, k = self.served_mismatch_at or (-1, 0)
                where = f"round {r}, row {k}" if r >= 0 else "the prefill step"
                out.append(
                    f"served tokens: differ from classic first at emitted index"
                    f" {self.served_first_mismatch} ({where}; {self.served_checked} compared)"
                    + (f"; {self.near_tie_words()}" if self.served_pick else "")
                )
        if self.tie_breaks_total:
            t = self.tie_breaks[0]
            out.append(
                f"classic decode broke {self.tie_breaks_total} exact logprob tie(s) toward the lower id"
                f" (first at emitted index {t['emitted_index']}: {t['words']});"
                " the reference follows them, so they raise no false alarm")
        return out

    def near_tie_words(self) -> str:
        """How the served mismatch relates to classic's choice there."""
        p = self.served_pick
        assert p is not None
        runner = p.runner_up == self.served_token
        kind = ("a near-tie flip: the served token is classic's runner-up" if runner
                else "the served token is not classic's runner-up")
        return f"{kind}; {p.describe()}"


    def _policy_words(self) -> str:
        if self.policy == POLICY_CORRECT:
            return "the correct token"
        return f"wrong id {self.wrong_id}"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["first"] = self.first.to_dict() if self.first else None
        d["served_pick"] = self.served_pick.to_dict() if self.served_pick else None
        d["bracket"] = self.bracket.to_dict() if self.bracket else None
        d["state"] = self.state.to_dict() if self.state else None
        d["verdict"] = self.verdict
        d["exit_code"] = self.exit_code
        d["summary"] = self.summary()
        return d


def round_widths(accepts: list[int], width: int | None, widths: list[int] | None) -> list[int]:
    """Rows per round, checked against the accepts (UsageError naming the round)."""
    if widths is None:
        if width is None:
            raise UsageError("no width: pass ", Name("width"), " (verify rows per round)")
        widths = [width] * len(accepts)
    if len(widths) != len(accepts):
        raise UsageError(f"{len(widths)} widths for {len(accepts)} rounds")
    from specparity.inputs import check_limit, check_width

    check_limit(sum(a + 1 for a in accepts), "the accept vector's emitted tokens", "max_positions")
    for r, (a, w) in enumerate(zip(accepts, widths)):
        check_width(w, f"round {r}: width")
        if not 0 <= a <= w - 1:
            raise UsageError(
                f"round {r}: accept {a} does not fit width {w} (at most {w - 1} proposals)"
            )
    return list(widths)


def replay(
    model: Any,
    prompt: list[int],
    accepts: list[int],
    width: int | None = None,
    widths: list[int] | None = None,
    policy: str = POLICY_WRONG,
    wrong_id: int = 0,
    opts: CacheOptions | None = None,
    served_tokens: list[int] | None = None,
    trace: list | None = None,
    prefill_emits: bool = False,
    observer: Observer = NULL,
    processors: list[Any] | None = None,
) -> ReplayReport:
    """Replay ``accepts`` on ``model`` (mlx-lm's adapter over it) and compare with classic decode:
    :func:`replay_rounds` on :meth:`MlxLmEngine.of_model`."""
    from specparity.probes.engines.mlx_lm import MlxLmEngine

    return replay_rounds(MlxLmEngine.of_model(model, opts), prompt, accepts, width=width, widths=widths,
                         policy=policy, wrong_id=wrong_id, served_tokens=served_tokens, trace=trace,
                         prefill_emits=prefill_emits, observer=observer, processors=processors)


def replay_rounds(
    engine: Engine,
    prompt: list[int],
    accepts: list[int],
    width: int | None = None,
    widths: list[int] | None = None,
    policy: str = POLICY_WRONG,
    wrong_id: int = 0,
    served_tokens: list[int] | None = None,
    trace: list | None = None,
    prefill_emits: bool = False,
    observer: Observer = NULL,
    processors: list[Any] | None = None,
    state: bool = False,
) -> ReplayReport:
    """Replay a served run's ``accepts`` through ``engine``'s session with rewind offsets; compare with
    classic decode: :func:`replay_accepts` with :meth:`RoundOptions.served`.

    The engine's adapter runs the target side: its session prefills all but the last prompt
    token (``anchor-prefill``), verifies each block and rolls it back its own way, fixed for
    the request (``rewind-modes``: trim, or snapshot-and-recompute), and reports every layer's
    offset after it (``layer-offsets``); classic decode (:meth:`Engine.classic_model` with
    :meth:`Engine.cache_options`) is the chain. Rejected rows carry ``wrong_id`` or the right
    token, per ``policy``, row by row. ``state``: also every layer's whole cache after every round against
    classic decode's at the same position (the first round that differs is :attr:`ReplayReport.state`).

    ``prefill_emits``: the server emits its first token from the prefill (mlxcel's DFlash:
    round 0's bonus), so the replay runs classic decode's first single step before round 0 and
    counts that token as emitted index 0; otherwise (mlx-lm) round 0's block starts with the
    last prompt token. Raises Inconclusive for an empty accept vector and UsageError for an
    accept that does not fit its width. ``trace`` / ``observer`` / ``processors``: as
    :func:`replay_accepts`.
    """
    if policy not in POLICIES:
        raise InputError("policy", f"{policy!r}: choose from {', '.join(POLICIES)}")
    missing = sorted(f for f in REPLAY_FEATURES if not engine.supports(f))
    if missing:
        raise UsageError(f"engine {engine.info.name}: its adapter lacks {', '.join(missing)}"
                         " (an accept vector replayed with rewind offsets)")
    if not accepts:
        raise Inconclusive("the accept vector is empty: no round to replay")
    if not prompt:
        raise UsageError("empty prompt")
    widths = round_widths(accepts, width, widths)
    from specparity.inputs import check_token_ids, vocab_size

    check_token_ids(prompt, vocab_size(engine.classic_model()), "prompt")
    res = replay_accepts(engine, prompt, accepts, widths, RoundOptions.served(prefill_emits, policy, state),
                         wrong_id=wrong_id, served_tokens=served_tokens, trace=trace, observer=observer,
                         processors=processors)
    if res.error is not None:
        raise res.error
    return ReplayReport.of(res)
