"""The decision tree for one served finding, run in process: each step's verdict, evidence and command.

Steps, in the order a reader tries them (issue 48):

1. reproduce: the served run's own rounds (the witness's accept vector) replayed without the drafter; where
   they do not give the server's token back, the record's own reproduction (mlx-lm's speculative path rerun
   on a fresh cache with the drafter, its tokens and verify rounds replayed against classic decode); a
   finding that does not come back at its token lives in the server (its prompt cache, batching, processors,
   loop);
2. prefill: one-shot vs chunked (at the server's prefill step) vs token-by-token prefill of the prompt;
3. verify: the block at the served width and the depth of the round where the first difference landed,
   against the chain; where it differs, the smallest width and depth at which it does;
4. rollbacks: step 1's own rounds up to the one that emitted the first difference, replayed with every layer's
   whole cache (offset and rows) compared with classic decode's after each rollback: a stale or missing row, or
   a kept row the rollback changed, is a rollback defect; rows that differ because the verify block computed
   them otherwise (step 3) are said to be the block's;
5. bisect: that block's first divergent layer and sub-op;
6. control arms: the toggles this process can turn, each rerunning the smallest block that differs:
   mlx's compiled kernels off (``mx.disable_compile``, what MLX_DISABLE_COMPILE=1 does at start), KV
   quantization off and the rotating KV cache off (where the server ran them), the prompt prefilled in
   one call (where the server's prefill step cut it); whether each removes the difference;
7. the first difference: an exact tie in the model's dtype broken the other way, a near tie (its
   margin against the dtype's noise band, in ULPs), or neither;
8. across releases: step 1's own command rerun in each built pinned environment of mlx-lm (``--environment``,
   oldest release first): where it reproduces, where it does not, the first release that fails.

A finding whose reproduction is another engine's own loop (``replay --engine NAME``) runs the same eight steps as
that engine's commands, in its environment (:mod:`specparity.diagnose.own_loop`).

Each step's ``command`` is the ``specparity`` line that gives the step's verdict when run (its exit
code: 1 for ``divergent``, 0 for ``equal``). A step settled by an earlier one is ``skipped`` and
says by which; a step that could not run is ``not_run`` and says why, never left out.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specparity.diagnose.elsewhere import in_environment_of
from specparity.diagnose.findings import Finding
from specparity.diagnose.steps import (
    LENGTH, NOT_IN_THIS_VERSION, NOT_RUN, PREFILL, PROCESSORS, RAN, ROLLBACK, SERVER, SERVER_CACHE, SKIPPED, TIE,
    UNREPRODUCIBLE, VERIFY, Diagnosis, Step, first_difference, releases)
from specparity.verdicts import ReportMixin, Verdict



@dataclass
class ReplayRequest:
    """The record's reproduction command, read (``specparity replay --draft-model ...``).

    model / draft / trust_remote_code: the checkpoints and consent. num_draft_tokens: proposals per round
    (width = this + 1). max_tokens, stop_words (None: no stop at EOS), prompt_ids: the request as served.
    opts: the server's cache options (specparity.decode.CacheOptions); processors: its logits processors
    (specparity.processors.ProcessorOptions).
    """

    model: str
    draft: str
    trust_remote_code: bool
    num_draft_tokens: int
    max_tokens: int
    stop_words: list[str] | None
    prompt_ids: list[int]
    opts: Any
    processors: Any


@dataclass
class DiagnoseReport(ReportMixin):
    """``specparity diagnose``: one diagnosis per finding of one served record.

    record: the record read. diagnoses: one per finding (empty: nothing to diagnose). finding: the
    ``--finding`` asked for (None: all).
    """

    record: str
    diagnoses: list[Diagnosis] = field(default_factory=list)
    finding: str | None = None

    @property
    def verdict(self) -> Verdict:
        return Verdict.DIVERGED if self.diagnoses else Verdict.PASS

    def lines(self) -> list[str]:
        if not self.diagnoses:
            return [f"{self.record}: no finding to diagnose (no request diverged)"]
        out = [f"{self.record}: {len(self.diagnoses)} finding(s)"]
        for d in self.diagnoses:
            out += d.lines()
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "exit_code": self.exit_code, "served_record": self.record,
                "finding": self.finding, "diagnoses": [d.to_dict() for d in self.diagnoses]}


class Models:
    """Checkpoints loaded once per diagnose run (every step and every finding of a pairing shares them)."""

    def __init__(self) -> None:
        self.loaded: dict[tuple[str, bool], Any] = {}
        self.engines: dict[tuple[str, bool, str], Any] = {}
        self.references: dict[tuple[str, bool, str], Any] = {}

    def load(self, path: str, trust_remote_code: bool) -> Any:
        from specparity.checkpoint import load_checkpoint

        key = (path, trust_remote_code)
        if key not in self.loaded:
            self.loaded[key] = load_checkpoint(path, trust_remote_code=trust_remote_code)
        return self.loaded[key]

    def reference(self, path: str, trust_remote_code: bool, settings: Any) -> Any:
        """Classic decode as mlx_lm.server's tokenize step and flags give it (a sequence's server settings)."""
        from specparity.reference import ClassicReference

        key = (path, trust_remote_code, repr(settings))
        if key not in self.references:
            self.references[key] = ClassicReference(path, trust_remote_code=trust_remote_code, settings=settings)
        return self.references[key]

    def engine(self, path: str, trust_remote_code: bool, opts: Any) -> Any:
        """mlx-lm's adapter on the loaded target with the server's cache options."""
        from specparity.engines import DEFAULT, LoadRequest, get

        key = (path, trust_remote_code, repr(opts))
        if key not in self.engines:
            loaded = self.load(path, trust_remote_code)
            self.engines[key] = get(DEFAULT).load(LoadRequest(Path(loaded.path), trust_remote_code=trust_remote_code,
                                                              cache=opts, loaded=loaded))
        return self.engines[key]


def _ids(ids: list[int]) -> str:
    return ",".join(str(i) for i in ids)


def _model_flags(r: ReplayRequest) -> list[str]:
    flags = ["--model", r.model] + (["--trust-remote-code"] if r.trust_remote_code else [])
    from specparity.decode import CacheOptions

    d = CacheOptions()
    for flag, value, default in (("--prefill-step-size", r.opts.prefill_step_size, d.prefill_step_size),
                                 ("--kv-bits", r.opts.kv_bits, d.kv_bits),
                                 ("--kv-group-size", r.opts.kv_group_size, d.kv_group_size),
                                 ("--quantized-kv-start", r.opts.quantized_kv_start, d.quantized_kv_start),
                                 ("--max-kv-size", r.opts.max_kv_size, d.max_kv_size)):
        if value != default:
            flags += [flag, str(value)]
    return flags


def _probe_command(r: ReplayRequest, widths: list[int], depths: list[int], prefill: bool) -> str:
    return shlex.join(["specparity", "probe", *_model_flags(r), "--widths", _ids(widths), "--depths", _ids(depths),
                       "--walk", "0", "--no-aim", "--prefill" if prefill else "--no-prefill",
                       "--prompt-ids", _ids(r.prompt_ids)])


def _probe(engine: Any, r: ReplayRequest, widths: list[int], depths: list[int], prefill: bool) -> Any:
    """What ``_probe_command`` runs, in process (its ProbeRun)."""
    from specparity.probes.forward.probe import run_probe

    return run_probe(engine, widths, depths, [r.prompt_ids], walk_positions=0, prefill=prefill, aim=False)


def length_diagnosis(f: Finding) -> Diagnosis:
    """A length finding: the record alone settles it (nothing in a forward to locate)."""
    d = Diagnosis(f, LENGTH, {"max_tokens": f.max_tokens, "completion_tokens": f.completion_tokens})
    past = (f.completion_tokens or 0) - (f.max_tokens or 0)
    d.summary = (f"the server emitted {f.completion_tokens} tokens where max_tokens is {f.max_tokens}"
                 f" ({past} past it); its text up to there is classic decode's: the serving loop's stop, not a"
                 " forward")
    why = "settled by the record: a length finding (classic decode's text, then tokens past max_tokens)"
    d.steps = [Step(n, SKIPPED, evidence=[why]) for n in range(1, 9)]
    d.open = ["which check of the serving loop let the extra tokens out (its stop condition per round): the"
              " engine's loop, read at the round that crossed max_tokens"]
    return d


def diagnose_finding(f: Finding, r: ReplayRequest | None, models: Models,
                     read: Callable[[str], ReplayRequest | None] | None = None) -> Diagnosis:
    """Run the tree on ``f``; ``r``: its reproduction read (None: the record has no replay command for it).
    read: a ``specparity replay`` command line read as ``r`` is (a sequence finding's request alone, where the
    sequence replay reproduces it and the request alone on a fresh cache still differs)."""
    import time

    start = time.monotonic()
    from specparity.diagnose.own_loop import engine_of, own_loop_tree

    path = sequence_file(f)
    other = engine_of(f)
    if f.length:
        d = length_diagnosis(f)
    elif other is not None:
        d = own_loop_tree(f, other)
    elif r is None and path is not None:
        d = _sequence_tree(f, path, models, read)
    elif r is None:
        d = _unreproducible(f)
    else:
        d = _tree(f, r, models)
    d.seconds = time.monotonic() - start
    return d


def sequence_file(f: Finding) -> str | None:
    """The sequence file of a finding whose reproduction is ``specparity replay --sequence FILE`` (None: not one)."""
    argv = f.replay_argv() or []
    if "--sequence" in argv[:-1]:
        return argv[argv.index("--sequence") + 1]
    return None


def _sequence_tree(f: Finding, path: str, models: Models,
                   read: Callable[[str], ReplayRequest | None] | None) -> Diagnosis:
    """A finding that depends on the requests before it (its record's reproduction is a sequence replay).

    Step 1 replays the record's sequence file through one prompt cache as mlx_lm.server's loop served it
    (``specparity replay --sequence FILE``, the record's own command) and, where that reproduces the finding at its
    token, the same request alone through a fresh loop. Reproduced in sequence and equal alone: the state the
    earlier requests left (the prompt cache, or the processors seeing part of the prompt where the loop's record
    says so), located at the request, its place in the sequence and the cached prefix; the request's own steps
    (2-7) would run on a fresh cache, where it is equal, and are skipped for that reason. Different alone too: the
    request's own tree follows, on its own replay command. Not reproduced: it lives in the server."""
    from specparity.probes.replay.sequence import read_sequence, replay_sequence, request_command

    d = Diagnosis(f)
    header, entries = read_sequence(path)
    draft = models.load(header.draft_model, header.trust_remote_code).model if header.draft_model else None
    reference = models.reference(header.model, header.trust_remote_code, header.settings())
    report = replay_sequence(header, entries, reference, draft)
    ev = report.lines()
    i, rr = next(((n, x) for n, x in enumerate(report.requests) if x.id == f.request), (None, None))
    d.steps.append(Step(1, RAN, report.verdict, ev, f.reproduction,
                        {"first": report.first, "served_first": report.served_first, "request": f.request}))
    later = range(2, 8)
    got = rr.replay_vs_classic if rr is not None else None
    if rr is None or i is None or got is None or got.index != f.token_index or not rr.reproduced:
        d.phase = SERVER
        what = ("the record's sequence names no such request" if rr is None else
                "its in-process replay equals classic decode there" if got is None else
                f"its in-process replay leaves classic decode at token {got.index}, not {f.token_index}"
                if got.index != f.token_index else "its in-process replay answers otherwise than the server did")
        d.summary = (f"does not reproduce in process: the record's {len(entries)} requests replayed through one"
                     f" prompt cache as {header.engine}'s loop: {what}; the finding lives in serving-loop state the"
                     " replay does not rebuild (batching, timing, the server's own work between requests)")
        d.steps += [Step(n, SKIPPED, evidence=["settled by step 1: not reproducible in process"]) for n in later]
        d.steps.append(Step(8, SKIPPED, evidence=["settled by step 1: not reproducible in process"]))
        d.open = ["which part of the server: the arm comparison (cold vs warm, concurrent vs alone) says what it can"]
        return d
    entry = entries[i]
    alone = replay_sequence(header, [entry], reference, draft)
    fresh = alone.requests[0].replay_vs_classic if alone.requests else None
    s = rr.served
    d.location = {"request": f.request, "sequence_index": i + 1, "requests": len(entries), "token_index": got.index,
                  "cached": s.cached, "prompt_tokens": s.prompt_len, "held": s.held, "path": s.path}
    cached = (f"{s.cached} of its {s.prompt_len} prompt tokens taken from the prompt cache"
              + (f", the entry holding {s.held} positions" if s.held is not None else ""))
    ids = entry.prompt_ids or list(reference.prompt(entry.endpoint, entry.body, header.settings()).ids)
    alone_cmd = in_environment_of(f, request_command(
        header.model, entry.body, ids, draft_model=header.draft_model, settings=header.settings(),
        trust_remote_code=header.trust_remote_code).command)
    d.steps[0].evidence.append(
        f"request {f.request} (request {i + 1} of {len(entries)}) reproduced at token {got.index}, as served, with"
        f" {cached}; alone on a fresh cache it "
        + ("equals classic decode" if fresh is None else f"leaves classic decode at token {fresh.index} too")
        + (f" ({alone_cmd})" if alone_cmd else ""))
    d.steps[0].data.update({"alone_first": fresh.index if fresh is not None else None, "alone_command": alone_cmd,
                            "cached": s.cached, "held": s.held})
    own_first = fresh is not None and fresh.index == got.index
    if own_first and read is not None and alone_cmd is not None:
        r = read(alone_cmd)
        if r is not None:  # the request itself leaves classic decode there: its own tree, the sequence's step 1 kept
            own = _tree(f, r, models)
            own.steps[0].evidence[:0] = ev + d.steps[0].evidence[len(ev):]
            own.location.update({k: d.location[k] for k in ("request", "sequence_index", "requests", "cached")})
            return own
    if own_first:
        d.summary = (f"reproduces in process in the sequence and alone on a fresh cache (at token {got.index}):"
                     " the request's own replay command runs the rest of the tree")
        d.steps += [Step(n, NOT_RUN, evidence=["the request alone was not read as a replay here: run its command"])
                    for n in later]
        d.steps.append(releases(f.reproduction))
        d.open = [f"the request's own tree: specparity diagnose on its replay ({alone_cmd})"]
        return d
    processors = rr.cause is not None and "logits processors" in rr.cause
    d.phase = PROCESSORS if processors else SERVER_CACHE
    alone_says = ("equals classic decode" if fresh is None else
                  f"leaves classic decode only later, at token {fresh.index}")
    d.summary = (f"reproduces in process: the record's {len(entries)} requests replayed through one prompt cache as"
                 f" {header.engine}'s loop leave classic decode at request {f.request} token {got.index}, as served;"
                 f" the same request alone on a fresh cache {alone_says}: the state the earlier requests"
                 f" left ({cached})" + (f"; {rr.cause}" if rr.cause else ""))
    settled = (f"settled by step 1: the request alone on a fresh cache {alone_says}, so its prefill, verify blocks"
               f" and tokens up to token {got.index} there are classic decode's; the difference there is the state")
    d.steps += [Step(n, SKIPPED, evidence=[settled]) for n in later]
    d.steps.append(releases(f.reproduction))
    if fresh is not None:
        d.open.append(f"the request's own difference at token {fresh.index}, on a fresh cache: a finding of its"
                      f" own, its replay command runs it ({alone_cmd})")
    if rr.cause is None:
        d.open.append("which state: the loop's record names no cause (a cache entry short of its count, processors"
                      " that saw part of the prompt); a rollback of the cached entry's rows is the next suspect"
                      " (step 4)")
    return d


def _unreproducible(f: Finding) -> Diagnosis:
    d = Diagnosis(f)
    why = f.reproduction_reason or (
        f"the record's reproduction is not a request replay ({f.reproduction}); {NOT_IN_THIS_VERSION}"
        if f.reproduction else "the record has none")
    d.steps = [Step(1, NOT_RUN, evidence=[f"no in-process reproduction to run: {why}"], command=f.reproduction)]
    d.steps += [Step(n, SKIPPED, evidence=["no reproduction of the request to run it on (step 1)"])
                for n in range(2, 9)]
    d.summary = "not reproduced in process: the tree had no request to rerun"
    d.open = [f"step 1: {why}", "every later step needs the request's prompt ids and a drafter path to rerun"]
    tie = f.tie or {}
    if tie.get("kind") == "exact_tie":  # the record's judge settled step 7 from classic decode's own logprobs
        words = (f"an exact tie in {tie.get('dtype')}: classic decode kept token {tie.get('classic_token')} (the"
                 f" lower id), the server took {tie.get('other_token')}" if tie.get("other_token") is not None else
                 f"an exact tie in {tie.get('dtype')}: classic decode kept token {tie.get('classic_token')} (the"
                 " lower id), the server another")
        d.steps[6] = Step(7, RAN, Verdict.DIVERGENT, [words, "read from the record: the judge compared the served"
                                                              " answer with classic decode's logprobs there"],
                          data={"call": "exact_tie", "tie": tie})
        d.phase = TIE
        d.summary = (f"{words}: the record settles the first difference (step 7); with no in-process reproduction"
                     " of this arm, whether its forward or its pick breaks the tie is left open")
    return d


def _tree(f: Finding, r: ReplayRequest, models: Models) -> Diagnosis:
    d = Diagnosis(f)
    replay = _reproduce(d, f, r, models)
    bracket = (replay or {}).get("bracket") or {}
    if bracket.get("reproducible") is False:
        return _not_reproducible(d, r, models, bracket)
    if replay is None or replay.get("served_first_mismatch") != f.token_index:
        d.phase = SERVER
        d.summary = ("does not reproduce in process: mlx-lm's own speculative path on a fresh cache gives"
                     f" {'classic decode' if replay and replay.get('served_first_mismatch') is None else 'another'}"
                     " answer, so the finding lives in the server (its prompt cache, batching, processors, or its"
                     " loop's work between forwards)")
        d.steps += [Step(n, SKIPPED, evidence=["settled by step 1: not reproducible in process"]) for n in range(2, 8)]
        d.steps.append(Step(8, SKIPPED, evidence=["settled by step 1: not reproducible in process"]))
        d.open = ["which part of the server: the arm comparison (cold vs warm, concurrent vs alone) and a sequence"
                  " replay of the server's whole request history (specparity replay --sequence) would say"]
        d.steps.sort(key=lambda s: s.number)
        return d
    round_, row = replay.get("served_mismatch_at") or (0, 0)
    index = int(f.token_index or 0)
    depth = max(0, index - row)
    width = r.num_draft_tokens + 1
    engine = models.engine(r.model, r.trust_remote_code, r.opts)
    prompt_len = len(r.prompt_ids)
    d.location = {"width": width, "depth": depth, "position": prompt_len - 1 + depth, "round": round_, "row": row,
                  "token_index": index}
    pre = _prefill(d, r, engine)
    block = _verify(d, r, engine, width, depth)
    rewind = _rollbacks(d, r, engine, replay, round_, block is not None)
    if block is not None:
        _bisect(d, r, engine, block["width"], block["depth"])
    else:
        d.steps.append(Step(5, SKIPPED, evidence=["settled by step 3: the verify block equals the chain there,"
                                                  " nothing to bisect"]))
    if block is not None:
        _controls(d, r, models, block["width"], block["depth"])
    else:
        d.steps.append(Step(6, SKIPPED, evidence=["settled by step 3: the verify block equals the chain there;"
                                                  " the control arms rerun a block that differs"]))
    tie = first_difference(d, f, replay)
    d.steps.append(releases(f.reproduction))
    d.steps.sort(key=lambda s: s.number)
    _decide(d, pre, block, rewind, tie, r)
    return d


def _reproduce(d: Diagnosis, f: Finding, r: ReplayRequest, models: Models) -> dict[str, Any] | None:
    """Step 1: the served run's own rounds replayed (no drafter: :func:`_served_rounds`); where they do not give
    the served token back, mlx-lm's speculative path rerun with the drafter and replayed, as the record's command
    does."""
    served, tried = _served_rounds(d, f, r, models)
    if served is not None:
        return served
    from specparity.probes.replay.recorder import record_speculative
    from specparity.probes.replay.run import run_replays

    loaded = models.load(r.model, r.trust_remote_code)
    draft = models.load(r.draft, r.trust_remote_code)
    stops = None
    if r.stop_words is not None:
        from specparity.mlx_compat import stop_sequences

        stops = stop_sequences(loaded.tokenizer, r.stop_words)
    req = record_speculative(loaded.model, draft.model, r.prompt_ids, r.num_draft_tokens, r.max_tokens, r.opts,
                             processors=r.processors, stop_sequences=stops)
    engine = models.engine(r.model, r.trust_remote_code, r.opts)
    run = run_replays(engine, [req], [], r.prompt_ids, processors=r.processors)
    res = run.results[0]
    at = res.get("served_first_mismatch")
    res["accepts"] = list(req.accepts)
    ev = [f"mlx-lm's speculative path rerun on a fresh cache ({r.num_draft_tokens} proposals per round,"
          f" {len(req.accepts)} rounds): "
          + ("its tokens equal classic decode's" if at is None else f"its tokens first differ at index {at}")
          + f"; the server's answer first differed at token {f.token_index}"]
    if at is not None and at == f.token_index:
        rr, row = res.get("served_mismatch_at") or (0, 0)
        ev.append(f"reproduced: the same token index, emitted by round {rr}, row {row}")
    first = res.get("first")
    if first:
        ev.append(_first_words(first))
    d.steps.append(Step(1, RAN, Verdict(run.verdict), tried + ev, f.reproduction,
                        {"served_first_mismatch": at, "served_mismatch_at": res.get("served_mismatch_at"),
                         "rounds": len(req.accepts), "first": first, "source": "drafter",
                         "drafter_loaded": True}))
    return res


def _first_words(first: dict[str, Any]) -> str:
    return (f"the replayed verify rows first disagree with classic decode's chain at round {first['round']},"
            f" row {first['row']} (emitted index {first['emitted_index']}, position {first['position']})")


def _served_rounds(d: Diagnosis, f: Finding, r: ReplayRequest, models: Models
                   ) -> tuple[dict[str, Any] | None, list[str]]:
    """Step 1 from the served run's own rounds, without the drafter: the witness's accept vector up to the round
    that emitted the first difference, each block carrying classic decode's tokens as its accepted proposals (the
    server's own tokens up to that difference) and wrong ids in its rejected rows, rolled back as mlx-lm's
    speculative path does, against classic decode. Reproduced when that round's row gives the server's token at
    the finding's index where classic decode gives its own: the drafter is then never loaded (the diagnosis
    holds one copy of the target). Returns (the replay's result, None where it did not settle step 1; the
    evidence of what was tried, for the drafter's rerun to carry)."""
    from specparity.probes.replay.algebra import emitted_counts, locate
    from specparity.probes.replay.logs import AcceptLog
    from specparity.probes.replay.run import run_replays

    accepts, widths, tokens, index = f.served_accepts, f.served_widths, f.served_tokens, f.token_index
    width = r.num_draft_tokens + 1
    if not accepts or not widths or not tokens or index is None or len(accepts) != len(widths) \
            or index >= len(tokens) or sum(emitted_counts(accepts)) <= index:
        return None, ["the record holds no served rounds reaching that token (the witness's accept vector and"
                      " the answer's token ids): the drafter's own run replaces them"]
    round_, row = locate(emitted_counts(accepts), index)
    n = round_ + 1
    if any(w != width or not 0 <= a < w for a, w in zip(accepts[:n], widths[:n])):
        return None, [f"the served rounds up to round {round_} (widths {_ids(widths[:n])}) are not all {width}-row"
                      " rounds a replay at the record's width repeats: the drafter's own run replaces them"]
    engine = models.engine(r.model, r.trust_remote_code, r.opts)
    req = AcceptLog(accepts=list(accepts[:n]), widths=list(widths[:n]), tokens=list(tokens[:index + 1]),
                    prompt_ids=list(r.prompt_ids), source="the served rounds")
    run = run_replays(engine, [req], [], r.prompt_ids, processors=r.processors)
    res = run.results[0]
    got, want = list(res.get("target_tokens") or []), list(res.get("classic_tokens") or [])
    j = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), None)
    said = (f"the served run's own rounds replayed without the drafter (rounds 0..{round_} of {len(accepts)}, the"
            f" witness's accept vector {_ids(accepts[:n])} at {width} rows; accepted rows carry the server's tokens,"
            " rejected rows wrong ids; each rolled back as mlx-lm's speculative path does)")
    cmd = shlex.join(["specparity", "replay", *_model_flags(r), "--accepts", _ids(accepts[:n]), "--width", str(width),
                      "--prompt-ids", _ids(r.prompt_ids), *r.processors.flags()])
    bracket = res.get("bracket") or {}
    reproduced = (res.get("served_first_mismatch") == index and j == index and got[index] == tokens[index])
    if not reproduced and bracket.get("reproducible") is not False:
        return None, [said + ": " + (f"their rows give classic decode's tokens through index {len(got) - 1}"
                                      if j is None else f"their rows first leave classic decode at index {j}"
                                      + (f" with token {got[j]}" if j < len(got) else ""))
                      + f", not the server's token at {index}: the drafter's own run decides (the witness reads"
                      " the accept vector from cache offsets, so a rollback that leaves another offset than it says"
                      " also shifts the vector it reads)"]
    res["accepts"] = list(accepts[:n])
    ev = [said + f"; the server's answer first differed at token {index}"]
    if reproduced:
        ev.append(f"reproduced: round {round_}, row {row} gives token {got[index]} at index {index}, the server's,"
                  f" where classic decode gives {want[index]}; the drafter was not needed (the record's"
                  " command reruns it with the drafter)")
    first = res.get("first")
    if first and (first.get("emitted_index") != index):
        ev.append(_first_words(first) + ": logit bytes before a token")
    d.steps.append(Step(1, RAN, Verdict(run.verdict), ev, cmd,
                        {"served_first_mismatch": res.get("served_first_mismatch"),
                         "served_mismatch_at": res.get("served_mismatch_at"), "rounds": n, "first": first,
                         "source": "served rounds", "drafter_loaded": False}))
    return res, []


def _prefill(d: Diagnosis, r: ReplayRequest, engine: Any) -> Verdict:
    """Step 2: the probe's prefill parity on the request's prompt (its verdict alone is returned). The probe
    runs no prefill check without a block: the command's verdict also counts a 2-row block at depth 0, which
    the evidence states apart."""
    from specparity.verdicts import combine

    run = _probe(engine, r, [2], [0], prefill=True)
    pre = run.prefill[0] if run.prefill else None
    alone = combine([a.verdict for a in pre.arms]) if pre is not None else Verdict.NOT_RUN
    ev = []
    if pre is not None:
        for a in pre.arms:
            where = f" (layers {', '.join(map(str, a.layers_differing))} differ)" if a.layers_differing else ""
            ev.append(f"{a.name} prefill ({a.chunk} rows per call) vs one-shot ({pre.prompt_len} rows): {a.verdict}"
                      + where)
        ev.append(f"the server prefills the prompt but its last token in calls of up to {r.opts.prefill_step_size}"
                  " rows, as classic decode does; the last prompt token goes into its first verify block")
    cell = run.probe.cells[0]
    ev.append(f"the command also compares a 2-row block at depth 0 with 2 single steps: {cell.verdict}")
    d.steps.append(Step(2, RAN, Verdict(run.verdict), ev, _probe_command(r, [2], [0], prefill=True),
                        {"prefill_verdict": alone, "arms": [a.to_dict() for a in pre.arms] if pre is not None else [],
                         "block_verdict": cell.verdict}))
    return Verdict(alone)


def _verify(d: Diagnosis, r: ReplayRequest, engine: Any, width: int, depth: int) -> dict[str, Any] | None:
    """Step 3: the block at the served width and the round's depth; where it differs, the smallest
    width (2..width) and the smallest depth (0..depth) at which it does. None: the block equals the chain."""
    run = _probe(engine, r, [width], [depth], prefill=False)
    cell = run.probe.cells[0]
    ev = [f"a {width}-row block at depth {depth} (cache position {len(r.prompt_ids) - 1 + depth}) vs {width} single"
          f" steps: {cell.verdict}" + (f", {cell.diff.differing_bytes} of {cell.diff.total_bytes} logit bytes differ"
                                       f" from row {cell.first_row}" if cell.diff is not None else "")]
    data: dict[str, Any] = {"cell": cell.to_dict()}
    step = Step(3, RAN, Verdict(run.verdict), ev, _probe_command(r, [width], [depth], prefill=False), data)
    d.steps.append(step)
    if run.verdict != Verdict.DIVERGENT:
        return None
    widths = list(range(2, width + 1))
    scan = _probe(engine, r, widths, [depth], prefill=False)
    first_w = next((c.width for c in scan.probe.cells if c.verdict == Verdict.DIVERGENT), width)
    ev.append(f"widths {widths[0]}..{width} at depth {depth}: the smallest that differs is {first_w}")
    first_d = _first_depth(engine, r, first_w, depth)
    handoff = False
    if first_d == 0 and depth == 0:
        # depth 0's block carries the prompt's last token (mlx-lm's speculative path prefills all but it and
        # runs it in its first verify block; classic decode runs it alone): the same block one position on
        # says whether the kernel changes at the width or only where the block continues the prefill
        handoff = _probe(engine, r, [first_w], [1], prefill=False).verdict == Verdict.EQUAL
    if handoff:
        ev.append(f"at width {first_w} the block differs at depth 0, where it carries the prompt's last token"
                  f" (position {len(r.prompt_ids) - 1}) on from the prefill, and equals the chain at depth 1:"
                  " the verify path taken by the prefill's last token, not a kernel that changes at the width")
    elif first_d == 0:
        ev.append(f"at width {first_w} the block differs from depth 0 on")
    else:
        ev.append(f"at width {first_w} the block equals the chain at depth {first_d - 1} and differs from depth"
                  f" {first_d} (cache position {len(r.prompt_ids) - 1 + first_d}) on:"
                  " a kernel that changes past a depth")
    shown = [0, 1] if handoff else sorted({max(0, first_d - 1), first_d})
    data.update({"first_width": first_w, "first_depth": first_d, "prefill_handoff": handoff,
                 "scan_command": _probe_command(r, [first_w], shown, prefill=False)})
    ev.append(f"the smallest width and depth: {data['scan_command']}")
    return {"width": first_w, "depth": first_d, "prefill_handoff": handoff}


def _first_depth(engine: Any, r: ReplayRequest, width: int, depth: int) -> int:
    """The smallest depth in 0..depth where the width-row block differs (it does at ``depth``): by halving."""
    def differs(at: int) -> bool:
        return bool(_probe(engine, r, [width], [at], prefill=False).verdict == Verdict.DIVERGENT)

    if differs(0):
        return 0
    lo, hi = 0, depth  # equal at lo, differs at hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if differs(mid):
            hi = mid
        else:
            lo = mid
    return hi


def _not_reproducible(d: Diagnosis, r: ReplayRequest, models: Models, bracket: dict[str, Any]) -> Diagnosis:
    """Step 1's replay found classic decode's own forward not reproducible (its chain repeated from the same
    state gave other logit bytes): no byte comparison of a later step could be trusted, so they are skipped;
    step 5's bisect of a 2-row block names the first capture (layer, sub-op) where a repeat differs."""
    from specparity.bisect.run import run_bisect

    d.phase = UNREPRODUCIBLE
    d.location = {"position": bracket.get("position"), "row": bracket.get("first_row"), "rows": bracket.get("rows")}
    engine = models.engine(r.model, r.trust_remote_code, r.opts)
    found = run_bisect(engine, r.prompt_ids, 2, 0)
    cmd = shlex.join(["specparity", "bisect", *_model_flags(r), "--width", "2", "--depth", "0",
                      "--prompt-ids", _ids(r.prompt_ids)])
    where = found.bracket.where if found.bracket is not None else ""
    capture = where.split("first differing capture: ", 1)[1] if "first differing capture: " in where else None
    if capture is not None:
        d.location["capture"] = capture
    ev = [found.bracket.line() if found.bracket is not None else "the bisect ran no repeat",
          (f"the first capture whose repeat differs: {capture}" if capture is not None else
           "every capture of the repeat equals the first run's: the difference enters after the last capture")]
    d.steps[0].evidence[0] = ("the replay did not run: " + str(bracket.get("line", ""))
                              + f"; the server's answer first differed at token {d.finding.token_index}")
    settled = ("settled by step 1: classic decode's own forward from the same state gives other bytes, so no"
               " comparison of bytes here could be laid at the speculative path")
    d.steps += [Step(n, SKIPPED, evidence=[settled]) for n in (2, 3, 4, 6, 7, 8)]
    d.steps.append(Step(5, RAN, Verdict(found.verdict), ev, cmd, {"capture": capture,
                                                                "bracket": found.bracket.to_dict()
                                                                if found.bracket is not None else None}))
    d.steps.sort(key=lambda s: s.number)
    d.summary = ("the target's forward is not reproducible in process: classic decode's chain repeated from the"
                 f" same state gives other logit bytes (row {bracket.get('first_row')}, position"
                 f" {bracket.get('position')})" + (f"; a repeat first differs at {capture}" if capture else "")
                 + "; the served difference cannot be laid at the speculative path until the forward is")
    d.open = ["what makes the forward not reproducible there (a kernel that is not deterministic, a buffer read"
              " before it is written, a reduction order that follows the thread count): the engine's to name"]
    return d


def _rollbacks(d: Diagnosis, r: ReplayRequest, engine: Any, replay: dict[str, Any], round_: int,
               block_differs: bool) -> dict[str, Any] | None:
    """Step 4: step 1's rounds before the one that emitted the first difference (their rollbacks are the ones
    that came before it), replayed with every layer's whole cache compared with classic decode's after each.
    Returns the rollback defect (None: none): a layer left at another offset than classic decode's (stale rows
    kept, or kept rows dropped), or rows that differ where step 3 found the verify block equal to the chain (the
    rollback changed what it kept). Rows that differ where the block differs too are the block's (step 3)."""
    from specparity.probes.replay.core import replay_rounds

    accepts = list(replay.get("accepts") or [])[:max(round_, 0)]
    width = r.num_draft_tokens + 1
    rolled = sum(1 for a in accepts if a < width - 1)
    if not rolled:
        d.steps.append(Step(4, SKIPPED, evidence=[
            f"no rollback came before the first difference: it was emitted by round {round_}, and"
            + (" the rounds before it accepted every proposal" if accepts else " no round came before it")],
            data={"rounds": len(accepts), "rollbacks": 0}))
        return None
    report = replay_rounds(engine, r.prompt_ids, accepts, width=width, processors=r.processors.make(), state=True)
    cmd = shlex.join(["specparity", "replay", *_model_flags(r), "--accepts", _ids(accepts), "--width", str(width),
                      "--prompt-ids", _ids(r.prompt_ids), *r.processors.flags(), "--state"])
    state, offsets = report.state, report.rewind_finding
    ev = [f"rounds 0..{len(accepts) - 1} of step 1's run ({rolled} rollback{'s' * (rolled != 1)}), each rolled back"
          f" as mlx-lm's speculative path does ({report.mode}); after each, every layer's cache against classic"
          " decode's at the same position"]
    found = _rollback_defect(state, offsets, block_differs, ev) if (state or offsets) else None
    if state is None and offsets is None:
        ev.append(f"the state after every one of the {report.rounds} rounds equals classic decode's: offsets and"
                  " every row held, byte for byte")
    if found is not None:
        ev.append(found["words"])
        d.location.update({k: v for k, v in found.items() if k not in ("words", "layers")})
    d.steps.append(Step(4, RAN, Verdict(report.verdict), ev, cmd,
                        {"rounds": len(accepts), "rollbacks": rolled, "state": state.to_dict() if state else None,
                         "rewind_finding": offsets.to_dict() if offsets else None, "defect": found}))
    return found


def _rollback_defect(state: Any, offsets: Any, block_differs: bool, ev: list[str]) -> dict[str, Any] | None:
    """What the first state that differs after a rollback says (step 4): a defect of the rollback, or None
    where the differing rows are the verify block's own (step 3 found the block differs)."""
    rnd = state.round if state is not None else offsets.round
    pos = state.position if state is not None else offsets.expected_offset
    ev.append(state.words() if state is not None else offsets.describe())
    first = state.first if state is not None else None
    where = {"rollback_round": rnd, "rollback_position": pos}
    if offsets is not None and (state is None or state.round >= offsets.round):
        # the replay checks every layer's offset after each round and stops at the first wrong one
        rnd, pos = offsets.round, offsets.expected_offset
        where = {"rollback_round": rnd, "rollback_position": pos}
        held = max(o for o in offsets.offsets if o is not None)
        extra = held - pos
        what = (f"kept {extra} stale row{'s' * (extra != 1)} (a rejected proposal's)" if extra > 0
                else f"dropped {-extra} row{'s' * (extra != -1)} it should have kept")
        return {**where, "tensor": "offset", "held": held, "stale_rows": extra,
                "layers": state.layers if state is not None else offsets.layers,
                "words": f"the rollback after round {rnd} {what}: the layers hold {held} positions where classic"
                         f" decode holds {pos}"}
    assert first is not None and state is not None  # no offset finding: the state one
    at = first.diff.first_row if first.diff is not None else None  # a snapshot's rows are absolute positions
    start = pos - (state.accepted + 1)  # the first position this round's block wrote
    in_block = at is not None and at >= start
    if state.accepted >= state.width - 1:  # nothing rolled back there: what differs is what the block wrote
        ev.append(f"round {rnd} accepted every proposal and rolled nothing back: the differing rows (from position"
                  f" {at}) are its verify block's, not a rollback's")
        return None
    if in_block and block_differs:
        ev.append(f"the first differing row (position {at}) is one round {rnd}'s verify block wrote, and step 3"
                  " found the block differs from the chain: the block's rows, not the rollback")
        return None
    why = ("a row from before the round: the rollback changed what it kept" if not in_block else
           "a row the block wrote, where step 3 found the block equal to the chain: the rollback changed what it"
           " kept")
    return {**where, "layer": first.layer, "tensor": first.name, "row_position": at, "layers": state.layers,
            "words": f"after the rollback of round {rnd}, layer {first.layer}'s {first.name} differs from classic"
                     f" decode's at position {at}: {why}"}


def _bisect(d: Diagnosis, r: ReplayRequest, engine: Any, width: int, depth: int) -> None:
    """Step 5: that block's first divergent layer and sub-op."""
    from specparity.bisect.run import run_bisect

    found = run_bisect(engine, r.prompt_ids, width, depth)
    rep = found.report
    sub = rep.drill.subop if rep.drill is not None else None
    child = rep.drill.child if rep.drill is not None else None
    row = rep.first_row()
    # a decoder layer's index, else the capture's label past the layers (``logits``, ``final_norm``, ``embed``)
    layer = (row.index if row.index is not None else row.label) if row is not None else None
    d.location.update({"layer": layer, "subop": sub, "child": child, "bisected_width": width,
                       "bisected_depth": depth})
    cmd = shlex.join(["specparity", "bisect", *_model_flags(r), "--width", str(width), "--depth", str(depth),
                      "--prompt-ids", _ids(r.prompt_ids)])
    d.steps.append(Step(5, RAN, Verdict(found.verdict), [rep.headline()]
                        + ([rep.drill.sentence] if rep.drill is not None else []), cmd,
                        {"first_divergent": rep.first_divergent, "layer": layer, "subop": sub, "child": child}))


# the compile toggle: what mlx reads at start, and what this process turns instead
COMPILE_ENV = "MLX_DISABLE_COMPILE"


def _controls(d: Diagnosis, r: ReplayRequest, models: Models, width: int, depth: int) -> None:
    """Step 6: each toggle that applies, the smallest differing block rerun with it; whether it removes the
    difference. Its command runs the compile toggle as bisect's control arms do (a fresh process each);
    each control's own command is a probe that exits 0 where the toggle removes the difference."""
    import dataclasses
    import os

    import mlx.core as mx

    at = f"the {width}-row block at depth {depth}"
    ev = [f"{at}, rerun with each toggle this process can turn (it differs without them: step 3)"]
    controls: list[dict[str, Any]] = []

    def run(name: str, toggle: str, req: ReplayRequest, env: dict[str, str] | None = None) -> None:
        verdict = Verdict(_probe(models.engine(req.model, req.trust_remote_code, req.opts), req, [width], [depth],
                                 prefill=False).verdict)
        effect = {Verdict.EQUAL: "removes the difference", Verdict.DIVERGENT: "does not remove it"}.get(
            verdict, f"gives {verdict}")
        cmd = _probe_command(req, [width], [depth], prefill=False)
        if env:
            cmd = " ".join(f"{k}={v}" for k, v in env.items()) + " " + cmd
        controls.append({"name": name, "toggle": toggle, "verdict": verdict, "effect": effect, "command": cmd})
        ev.append(f"{name} ({toggle}): {verdict}: {effect}")

    if os.environ.get(COMPILE_ENV, "0") not in ("", "0"):
        ev.append(f"compile off: not run: {COMPILE_ENV} is set in this process, every arm already ran uncompiled")
    else:
        mx.disable_compile()
        try:
            run("compile off", f"mx.disable_compile, as {COMPILE_ENV}=1", r, {COMPILE_ENV: "1"})
        finally:
            mx.enable_compile()
    opts = r.opts
    if opts.kv_bits is not None:
        run("KV quantization off", f"kv_bits None where the server ran {opts.kv_bits}",
            dataclasses.replace(r, opts=dataclasses.replace(opts, kv_bits=None)))
    else:
        ev.append("KV quantization off: not applicable: the server ran an unquantized KV cache")
    if opts.max_kv_size is not None:
        run("rotating KV cache off", f"max_kv_size None where the server ran {opts.max_kv_size}",
            dataclasses.replace(r, opts=dataclasses.replace(opts, max_kv_size=None)))
    prompt = len(r.prompt_ids) - 1  # the last prompt token goes into the first block
    if prompt > opts.prefill_step_size:
        run("prefill in one call", f"prefill_step_size {prompt} where the server's is {opts.prefill_step_size}",
            dataclasses.replace(r, opts=dataclasses.replace(opts, prefill_step_size=prompt)))
    else:
        ev.append(f"prefill in one call: not applicable: the prompt's {prompt} prefilled tokens fit in one call of"
                  f" the server's step ({opts.prefill_step_size})")
    removed = [c["name"] for c in controls if c["verdict"] == Verdict.EQUAL]
    ev.append(("the difference goes away with " + ", ".join(removed)) if removed
              else "no toggle removes it: the difference is in the computation itself, not in a kernel choice"
              " these toggles make")
    toggles = [(COMPILE_ENV, "1"), *[(k, v) for k, v in d.finding.env_controls if k != COMPILE_ENV]]
    for k, v in toggles[1:]:
        ev.append(f"{k}={v} (a control arm of the job): not run in process (read when mlx starts): the command"
                  " runs it in a process of its own")
    ev.append("another environment toggle: add --control NAME=VALUE to the command (one process per toggle)")
    cmd = shlex.join(["specparity", "bisect", *_model_flags(r), "--width", str(width), "--depth", str(depth),
                      "--prompt-ids", _ids(r.prompt_ids), *[a for k, v in toggles for a in ("--control", f"{k}={v}")]])
    if removed:
        d.location["removed_by"] = removed
    d.steps.append(Step(6, RAN, Verdict.DIVERGENT, ev, cmd, {"controls": controls, "removed_by": removed}))


def _layer_words(loc: dict[str, Any]) -> str:
    """"; first divergent layer L, sub-op S" of a location bisected to its layer, else ""."""
    sub = f", sub-op {loc['subop']}" if loc.get("subop") else ""
    return f"; first divergent layer {loc.get('layer')}{sub}" if loc.get("layer") is not None else ""


def _decide(d: Diagnosis, pre: Verdict, block: dict[str, Any] | None, rewind: dict[str, Any] | None, tie: str,
            r: ReplayRequest) -> None:
    loc = d.location
    if rewind is not None:  # the state before the emitting round was already not classic decode's
        d.phase = ROLLBACK
        d.summary = rewind["words"] + f"; the first difference is emitted after it, at round {loc.get('round')}"
        d.open = ([f"the verify block also differs from the chain (width {block['width']}, depth {block['depth']}):"
                   " a second difference, on a fresh cache, that step 3 located"] if block is not None else [])
        d.open.append("which line of the engine's rollback: its trim of the cache (or its restore of the state),"
                      " read at that round")
        return
    if block is not None and block.get("prefill_handoff") and tie != "exact_tie":
        loc["width"], loc["depth"] = block["width"], 0
        loc["position"] = len(r.prompt_ids) - 1
        d.phase = PREFILL
        layer, removed = _layer_words(loc), loc.get("removed_by")
        d.summary = (f"the prefill takes the verify path: the prompt's last token (position {loc['position']}) is"
                     f" run in the first {block['width']}-row verify block, on from the prefill, where classic"
                     f" decode runs it alone, and that block differs from the chain while the same block one"
                     f" position on equals it{layer}"
                     + (f"; it goes away with {', '.join(removed)}" if removed else "; no control arm removes it"))
        d.open = ["which kernel the engine runs for a block that continues the prefill is the engine's to name"]
        return
    if block is not None:
        loc["width"], loc["depth"] = block["width"], block["depth"]
        loc["position"] = len(r.prompt_ids) - 1 + block["depth"]
        d.phase = TIE if tie == "exact_tie" else VERIFY
        at = (f"from depth {block['depth']} (cache position {loc['position']})" if block["depth"]
              else "at every depth")
        layer, removed = _layer_words(loc), loc.get("removed_by")
        d.summary = (f"the verify block differs from the chain at width {block['width']} and up, {at}{layer};"
                     f" the flip is {tie.replace('_', ' ')}"
                     + (f"; it goes away with {', '.join(removed)}" if removed else
                        "; no control arm removes it"))
        d.open = ["which kernel the width or depth selects is the engine's to name"]
        return
    if pre == Verdict.DIVERGENT and loc.get("token_index") == 0:
        d.phase = PREFILL
        d.summary = "the first token already differs and the prompt's prefill depends on how it is chunked"
    elif r.processors is not None and getattr(r.processors, "active", False):
        d.phase = PROCESSORS
        d.summary = ("the verify block equals the chain, yet the speculative path's tokens differ: its logits"
                     " processors see another history than classic decode's")
    else:
        d.summary = ("the verify block at that width and depth equals the chain and every rollback before it"
                     " restores classic decode's state; the tree does not place it")
    d.open = ["step 6's control arms rerun a differing block, so they did not run here"]
