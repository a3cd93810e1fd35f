"""Rollback replay: a served run's verify rounds, rebuilt in process, against classic decode.

Given a prompt and a per-round accept vector, the replay prefills as classic
decode does (:meth:`Decoder.prefill`) and, for each round with accept ``a`` and
width ``W``, runs one target forward over the verify block::

    [last emitted token, a accepted proposals, W - 1 - a rejected rows]

takes classic decode's greedy token of every row (mlx-lm's sampler over logprobs
in the model's dtype, :func:`specparity.decode.greedy_token`), and rewinds the cache by the ``W - 1 - a``
rejected rows with mlx-lm's ``trim_prompt_cache``. After every round each
layer's cache offset must equal the expected length (prompt - 1 + tokens
emitted so far): a rewind that silently did nothing, or left a stale row, is a
finding reported with its round, and the replay stops there.

Inputs are the classic greedy chain's own tokens (a full accept of ``a`` means
the drafter proposed the target's tokens), so every position is compared on
the history classic decode had and a flip does not cascade. Rejected rows
carry a fixed wrong id (the next id where it equals the right token, so the
first rejected proposal really is wrong) or the right token, per ``policy``.
Each kept row's logits (rows ``0..a``) are compared as bytes with the chain's
row for the same position (:func:`specparity.compare.compare_arrays`), and
each emitted token with the chain's token.

Caches that cannot be trimmed (linear-attention / SSM ``ArraysCache``) are
replayed by snapshot-and-recompute: an exact copy of the cache is taken before
a round with rejected rows, and afterwards restored and fed only the kept rows.
The report says which rewind it used.

The target side is an engine adapter's session (:func:`replay_rounds`; :func:`replay` takes
mlx-lm's, :class:`specparity.probes.engines.mlx_lm.MlxLmEngine`, over a bare model): its
``prefill_anchor``, ``verify`` / ``extend``, ``rollback``, ``rewind`` and ``offsets``
(adapter features ``anchor-prefill``, ``rewind-modes``, ``layer-offsets``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from specparity.completions import first_index
from specparity.compare import Diff, compare_arrays, index_ranges
from specparity.decode import CacheOptions, Decoder, GreedyPick, greedy_chain, greedy_pick, greedy_token
from specparity.errors import Inconclusive, InputError, Name, UsageError
from specparity.probes.engines.mlx_lm import MODE_SNAPSHOT, MODE_TRIM
from specparity.probes.replay.algebra import emitted_counts, locate
from specparity.processors import process_row
from specparity.progress import NULL, Observer
from specparity.reproducibility import Bracket, repeat_chain
from specparity.verdicts import ReportMixin, Verdict

if TYPE_CHECKING:
    from specparity.probes.engines.base import Engine

log = logging.getLogger(__name__)

POLICY_WRONG, POLICY_CORRECT = "wrong-id", "correct-token"
POLICIES = (POLICY_WRONG, POLICY_CORRECT)
# what an adapter's session must do for an accept vector replayed with rewind offsets (base.FEATURES)
REPLAY_FEATURES = ("anchor-prefill", "layer-offsets", "rewind-modes")


@dataclass
class Disagreement:
    """The first position where the target's verify row left the classic chain.

    round / row: the verify round (0-based) and the row inside its block; round -1
      is the prefill's single step (when the server emits its first token there).
    emitted_index: index of the token that row emits, over the whole output.
    position: the absolute cache position of the row that emitted it
      (prompt length - 1 + emitted_index, as the block-vs-chain probe counts).
    token_classic / token_target: the chain's token and the verify row's greedy token.
    diff: the row's logits, chain vs verify (bytes, max abs diff, ulp, margins).
    pick: classic's greedy choice at that row (top-2 logprob margin: a flip at a
      near tie reads differently from a flip at a confident token).
    """

    round: int
    row: int
    emitted_index: int
    position: int
    token_classic: int
    token_target: int
    diff: Diff
    pick: GreedyPick | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["diff"] = self.diff.to_dict()
        d["pick"] = self.pick.to_dict() if self.pick else None
        return d


@dataclass
class RewindFinding:
    """A rewind that did not take effect.

    round: the round whose rewind failed. rows: rejected rows it had to drop.
    trimmed: what ``trim_prompt_cache`` reported it dropped.
    expected_offset: the length every layer should hold after it.
    offsets: each layer's offset after it (None: a layer without one).
    layers: the layers whose offset is wrong.
    """

    round: int
    rows: int
    trimmed: int
    expected_offset: int
    offsets: list[int | None]
    layers: list[int]

    def describe(self) -> str:
        wrong = sorted({self.offsets[i] for i in self.layers}, key=lambda o: o or 0)
        stale = ", ".join(
            f"{o} ({'+' if (o or 0) > self.expected_offset else ''}"
            f"{(o or 0) - self.expected_offset} rows)" for o in wrong
        )
        return (
            f"rewind failed at round {self.round}: trimming {self.rows} rejected rows"
            f" (trim reported {self.trimmed}) left {len(self.layers)} of {len(self.offsets)}"
            f" layers at offset {stale} where {self.expected_offset} was expected"
            f" (layers {index_ranges(self.layers)}); replay stopped"
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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
    seconds: float = 0.0

    @property
    def verdict(self) -> Verdict:
        if self.bracket is not None and not self.bracket.reproducible:
            return Verdict.INCONCLUSIVE
        if self.rewind_finding is not None or self.disagreements:
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


class _Chain:
    """The classic greedy chain, extended on demand, old rows dropped.

    With logits processors each step's row is processed as ``generate_step``
    processes it (history = the prompt + every token emitted before the row)
    before the greedy pick; ``rows`` keep the raw logits, which are what a
    verify row must reproduce byte for byte.
    """

    def __init__(self, model: Any, prompt: list[int], opts: CacheOptions,
                 trace: list | None, processors: list[Any] | None = None):
        self.dec = Decoder(model, opts)
        self.prompt = list(prompt)
        self.tokens = [self.dec.prefill(prompt)]  # c_j: the token fed at step j
        self.rows: dict[int, Any] = {}  # j -> logits after feeding c_j
        self.picks: dict[int, GreedyPick] = {}  # j -> classic's greedy choice after c_j
        self.tie_breaks: list[dict[str, Any]] = []
        self.tie_breaks_total = 0
        self.trace = trace
        self.processors = processors or []

    def history(self, j: int) -> list[int]:
        """What classic decode's processors see at the row after feeding c_j."""
        return self.prompt + self.tokens[1: j + 1]

    def pick(self, j: int, row: Any) -> int:
        """The token classic decode emits from row ``j`` (processors, then the greedy pick)."""
        return greedy_token(process_row(self.processors, self.history(j), row))

    def _pick(self, j: int, row: Any) -> int:
        """Classic's own pick at chain row ``j``, kept with its tie information."""
        pick = self.picks[j] = greedy_pick(process_row(self.processors, self.history(j), row))
        if pick.tie_flip:
            self.tie_breaks_total += 1
            if len(self.tie_breaks) < 20:
                self.tie_breaks.append({"emitted_index": j, "pick": pick.to_dict(), "words": pick.describe()})
        return pick.token

    def ensure(self, n: int) -> None:
        """Compute rows up to index n - 1 (and so tokens up to n)."""
        have = len(self.tokens) - 1
        if n <= have:
            return
        if self.trace is not None:
            self.trace.append(("chain", self.tokens[have], n - have))
        if self.processors:
            for j in range(have, n):
                row = self.dec.forward([self.tokens[j]])[-1]
                self.rows[j] = row
                self.tokens.append(self._pick(j, row))
            return
        fed, logits = greedy_chain(self.dec, self.tokens[have], n - have)
        for i in range(n - have):
            self.rows[have + i] = logits[i]
            self._pick(have + i, logits[i])
        self.tokens.extend(fed[1:])
        self.tokens.append(greedy_token(logits[-1]))

    def drop_before(self, j: int) -> None:
        for k in [k for k in self.rows if k < j]:
            del self.rows[k]


def _bracket(chain: _Chain, n: int, start_position: int) -> Bracket:
    """Repeat the classic chain's first ``n`` steps from a copy of its post-prefill state."""
    import mlx.core as mx

    start = chain.dec.fork()
    chain.ensure(n)
    return repeat_chain(start, chain.tokens[:n], mx.stack([chain.rows[j] for j in range(n)]),
                        start_position, f"the first {n} classic steps after prefill")


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
) -> ReplayReport:
    """Replay ``accepts`` through ``engine``'s session and compare with classic decode.

    The engine's adapter runs the target side: its session prefills all but the last prompt
    token (``anchor-prefill``), verifies each block and rolls it back its own way, fixed for
    the request (``rewind-modes``: trim, or snapshot-and-recompute), and reports every layer's
    offset after it (``layer-offsets``); classic decode (:meth:`Engine.classic_model` with
    :meth:`Engine.cache_options`) is the chain.

    ``trace``, when a list, receives every forward and rewind in order
    (``("chain", first, n)``, ``("block", tokens)``, ``("trim", n)``,
    ``("fork",)``, ``("restore", kept_tokens)``) so a benchmark can time the
    same forwards bare. ``prefill_emits``: the server emits its first token
    from the prefill (mlxcel's DFlash: round 0's bonus), so the replay runs
    classic decode's first single step before round 0 and counts that token
    as emitted index 0; otherwise (mlx-lm) round 0's block starts with the
    last prompt token. Raises Inconclusive for an empty accept vector and
    UsageError for an accept that does not fit its width. ``observer`` gets
    progress per round (part ``rounds``).
    """
    import mlx.core as mx

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

    model = engine.classic_model()
    check_token_ids(prompt, vocab_size(model), "prompt")
    opts = engine.cache_options()
    t0 = time.perf_counter()

    chain = _Chain(model, prompt, opts, trace, processors)
    bracket = _bracket(chain, widths[0] + int(prefill_emits), len(prompt) - 1)
    if not bracket.reproducible:
        log.warning("%s", bracket.line())
        return ReplayReport(rounds=0, rounds_total=len(accepts), rewinds=0, positions=0, disagreements=0,
                            first=None, rewind_finding=None, mode="", mode_reason="not run: not reproducible",
                            widths=widths, policy=policy, wrong_id=wrong_id, prompt_len=len(prompt),
                            prefill_emits=prefill_emits, opts=opts.to_dict(), bracket=bracket,
                            seconds=time.perf_counter() - t0)
    target = engine.session()
    last = target.prefill_anchor(prompt)
    if last != chain.tokens[0]:  # both prefilled the same prompt
        raise AssertionError("prefill returned different last tokens")
    mode, reason = target.rewind()
    if mode == MODE_SNAPSHOT:
        log.info("replay by snapshot-and-recompute: %s", reason)

    expected = len(prompt) - 1
    emitted = 0
    rewinds = forwards = disagreements = 0
    first: Disagreement | None = None
    finding: RewindFinding | None = None
    target_tokens: list[int] = []
    dtype = ""
    rounds_done = 0
    if prefill_emits:
        # classic decode's first step over the last prompt token emits the first bonus
        chain.ensure(1)
        if trace is not None:
            trace.append(("block", [last]))
        row = target.extend([last])
        forwards += 1
        target_tokens.append(chain.pick(0, row[-1]))
        d = compare_arrays(chain.rows[0][None], row[-1:], logits=True)
        if not d.equal or target_tokens[0] != chain.tokens[1]:
            disagreements += 1
            first = Disagreement(-1, 0, 0, len(prompt) - 1, chain.tokens[1], target_tokens[0], d,
                                 chain.picks.get(0))
        emitted, expected = 1, len(prompt)
    for r, (a, w) in enumerate(observer.iterate("rounds", zip(accepts, widths), len(accepts))):
        chain.ensure(emitted + w)
        vocab = int(chain.rows[emitted].shape[-1])
        if not 0 <= wrong_id < vocab:
            raise InputError("wrong-id", f"{wrong_id}: outside the vocabulary (0..{vocab - 1})")
        block = chain.tokens[emitted: emitted + a + 1]
        rejected = w - 1 - a
        for i in range(rejected):
            right = chain.tokens[emitted + a + 1 + i]
            if policy == POLICY_CORRECT:
                block.append(right)
            else:
                block.append(wrong_id if wrong_id != right else (wrong_id + 1) % vocab)
        if trace is not None:
            if mode == MODE_SNAPSHOT and rejected:
                trace.append(("fork",))
            trace.append(("block", list(block)))
        # a full accept rolls nothing back: the block is the round (no snapshot taken for it)
        logits = target.verify(block) if rejected else target.extend(block)
        forwards += 1
        kept = logits[: a + 1]
        # each kept row sees classic decode's history: its inputs are the chain's own tokens
        got = [chain.pick(emitted + k, kept[k]) for k in range(a + 1)]
        target_tokens.extend(got)
        dtype = str(logits.dtype).replace("mlx.core.", "")

        trimmed = 0
        if rejected:
            rewinds += 1
            trimmed = target.rollback(a) or 0
            if trace is not None:
                trace.append(("trim", rejected) if mode == MODE_TRIM else ("restore", list(block[: a + 1])))
        expected += a + 1

        want = chain.tokens[emitted + 1: emitted + a + 2]
        ref = mx.stack([chain.rows[emitted + k] for k in range(a + 1)])
        whole = compare_arrays(ref, kept, logits=True)
        if not whole.equal or got != want:
            for k in range(a + 1):
                d = compare_arrays(ref[k: k + 1], kept[k: k + 1], logits=True)
                if d.equal and got[k] == want[k]:
                    continue
                disagreements += 1
                if first is None:
                    first = Disagreement(r, k, emitted + k, len(prompt) - 1 + emitted + k,
                                         want[k], got[k], d, chain.picks.get(emitted + k))
                    log.info("first disagreement at round %d row %d", r, k)
        emitted += a + 1
        chain.drop_before(emitted)
        rounds_done = r + 1

        offsets = target.offsets()
        bad = [i for i, o in enumerate(offsets) if o is not None and o != expected]
        if bad:
            finding = RewindFinding(r, rejected, trimmed, expected, offsets, bad)
            log.info("%s", finding.describe())
            break

    classic = chain.tokens[1: emitted + 1]
    served_checked = served_mismatch = served_token = None
    served_pick: GreedyPick | None = None
    served_at: tuple[int, int] | None = None
    if served_tokens is not None:
        # Even after a rewind finding stopped the replay, the served tokens are compared
        # with the classic reference over their whole length: where the engine's own
        # output first left classic decode is the user's symptom.
        chain.ensure(len(served_tokens))
        chain.drop_before(len(chain.tokens))
        reference = chain.tokens[1: len(served_tokens) + 1]
        served_checked = len(served_tokens)
        i = first_index(served_tokens, reference)
        served_mismatch = i if i < len(served_tokens) else None
        if served_mismatch is not None:
            served_token = served_tokens[served_mismatch]
            served_pick = chain.picks.get(served_mismatch)
            lead = 1 if prefill_emits else 0
            served_at = (-1, 0) if served_mismatch < lead else locate(
                emitted_counts(accepts), served_mismatch - lead)
    return ReplayReport(
        rounds=rounds_done,
        rounds_total=len(accepts),
        rewinds=rewinds,
        positions=emitted,
        disagreements=disagreements,
        first=first,
        rewind_finding=finding,
        mode=mode,
        mode_reason=reason,
        widths=widths,
        policy=policy,
        wrong_id=wrong_id,
        prompt_len=len(prompt),
        prefill_emits=prefill_emits,
        dtype=dtype,
        opts=opts.to_dict(),
        forwards=forwards,
        target_tokens=target_tokens,
        classic_tokens=classic,
        served_checked=served_checked,
        served_first_mismatch=served_mismatch,
        served_mismatch_at=served_at,
        served_token=served_token,
        served_pick=served_pick,
        tie_breaks=chain.tie_breaks,
        tie_breaks_total=chain.tie_breaks_total,
        bracket=bracket,
        seconds=time.perf_counter() - t0,
    )
