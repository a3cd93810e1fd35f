"""The per-layer report: compare two arms' captures and name where they first part.

Both the in-process bisect (chain against block) and ``bisect diff`` (any two
dumps) end here, so they print the same report. Every comparison goes through
:func:`specparity.compare.compare_arrays`; cache states through
:func:`specparity.compare.compare_states`, as prefill parity compares them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from specparity.bisect.arms import ArmCapture
from specparity.bisect.capture import EMBED, FINAL_NORM, LOGITS
from specparity.compare import Compared, compare_named, compare_states, sha256_of
from specparity.verdicts import ReportMixin, Verdict

_LAYER_RE = re.compile(r"^layers\.(\d+)(?:\.(.+))?$")


@dataclass
class LayerReport:
    """One row of the report: a decoder layer, or the embeddings / final norm / logits.

    label: ``embed``, the layer index as text, ``final_norm`` or ``logits``.
    index: the decoder layer index (None for the others).
    kind: the layer type (``full attention + dense MLP``...; ``embedding``...).
    output: the row's output (the residual stream after the layer).
    subops: the layer's sub-op captures, in execution order.
    cache: the layer's cache arrays after the arm (``keys``, ``values``, ``state.0``...).
    cache_kind / offsets: cache class and each arm's offset.
    """

    label: str
    index: int | None
    kind: str
    output: Compared | None
    subops: list[Compared] = field(default_factory=list)
    cache: list[Compared] = field(default_factory=list)
    cache_kind: str | None = None
    offsets: tuple[int | None, int | None] = (None, None)

    @property
    def output_differs(self) -> bool:
        return self.output is not None and self.output.differs

    @property
    def cache_differs(self) -> bool:
        return any(c.differs for c in self.cache) or self.offsets[0] != self.offsets[1]

    @property
    def divergent(self) -> bool:
        return self.output_differs or self.cache_differs or any(s.differs for s in self.subops)

    def components(self) -> list[str]:
        """What differs in this row: ``output``, ``cache keys``..., ``sub-ops``."""
        out = []
        if self.output_differs:
            out.append("output hidden state" if self.index is not None else "output")
        if self.offsets[0] != self.offsets[1]:
            out.append("cache offset")
        out += [f"cache {c.name.split('.', 2)[2]}" for c in self.cache if c.differs]
        if not out and any(s.differs for s in self.subops):
            out.append("sub-ops only")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label, "index": self.index, "kind": self.kind,
            "divergent": self.divergent, "components": self.components(),
            "output": self.output.to_dict() if self.output else None,
            "subops": [s.to_dict() for s in self.subops],
            "cache": [c.to_dict() for c in self.cache],
            "cache_kind": self.cache_kind, "offsets": list(self.offsets),
        }


@dataclass
class Drill:
    """Where inside the first divergent layer the difference starts.

    subop: the first differing direct sub-op in execution order (``mlp``,
      ``linear_attn``...), or None when every sub-op is equal and only the
      layer's own combination (or its cache) differs.
    child: the first differing sub-op inside ``subop`` (``o_proj``,
      ``rope#1``...), or None when all of ``subop``'s children are equal.
    equal_before: the sub-ops that ran before ``subop`` and are equal.
    children: ``subop``'s children that were compared.
    sentence: the finding in words.
    """

    subop: str | None
    child: str | None
    equal_before: list[str]
    children: list[str]
    sentence: str


@dataclass
class BisectReport(ReportMixin):
    """Which layer, component and sub-op first differ between two arms.

    a / b: the two arms' labels (``chain`` / ``block``, or dump names).
    width / depth: the probe coordinates.
    rows: embeddings, every decoder layer, final norm, logits, in model order.
    logits: the logits comparison (argmax and margins at the first differing row).
    logits_sha256: each arm's logits sha256.
    first_divergent: label of the first divergent row, None when every row is equal.
    first_components: what differs in it.
    drill: the sub-op drill-down in that row (decoder layers only).
    meta: model, fingerprint, dtype, prompt length and anything the caller adds.
    """

    a: str
    b: str
    width: int
    depth: int
    rows: list[LayerReport]
    logits: Compared | None
    logits_sha256: tuple[str, str]
    first_divergent: str | None
    first_components: list[str]
    drill: Drill | None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def verdict(self) -> Verdict:
        return Verdict.DIVERGENT if self.first_divergent is not None else Verdict.EQUAL

    def lines(self) -> list[str]:
        """The headline, the sub-op drill-down and the logits outcome, one sentence each."""
        out = [self.headline()]
        if self.drill is not None:
            out.append(self.drill.sentence)
        if self.logits is not None and self.logits.diff is not None:
            out.append(f"logits: {self.logits.diff.summary('logit bytes')}")
        return out

    def first_row(self) -> LayerReport | None:
        return next((r for r in self.rows if r.label == self.first_divergent), None)

    def headline(self) -> str:
        if self.first_divergent is None:
            return (f"no divergent layer: all {len(self.rows)} captures ({self.a} vs {self.b},"
                    f" width {self.width}, depth {self.depth}) are byte-identical")
        row = self.first_row()
        assert row is not None
        where = f"layer {row.label} ({row.kind})" if row.index is not None else row.label
        before = [r.label for r in self.rows[: self.rows.index(row)]]
        s = (f"first divergent layer: {where}, {', '.join(self.first_components)};"
             f" everything before it ({', '.join(before) or 'nothing'}) is byte-identical")
        return s

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict, "exit_code": self.exit_code, "a": self.a, "b": self.b,
            "width": self.width, "depth": self.depth,
            "first_divergent": self.first_divergent,
            "first_components": self.first_components,
            "drill": None if self.drill is None else self.drill.__dict__,
            "headline": self.headline(),
            "logits": self.logits.to_dict() if self.logits else None,
            "logits_sha256": list(self.logits_sha256),
            "rows": [r.to_dict() for r in self.rows],
            "meta": self.meta,
        }


def compare_arms(a: ArmCapture, b: ArmCapture, width: int, depth: int,
                 layer_kinds: list[str], a_label: str | None = None,
                 b_label: str | None = None, meta: dict[str, Any] | None = None) -> BisectReport:
    """Compare every capture and cache array of two arms; name the first divergence."""
    names = [n for n in a.order if n in b.arrays]
    comps: dict[str, Compared] = {}
    for n in names:
        axis = a.row_axes.get(n)
        comps[n] = compare_named(n, a.arrays[n], b.arrays[n], axis, logits=(n == LOGITS))
    states = compare_states(a.cache, b.cache, (a_label or a.arm, b_label or b.arm))
    rows: list[LayerReport] = []
    if EMBED in comps:
        rows.append(LayerReport(EMBED, None, "embedding", comps[EMBED]))
    for i, kind in enumerate(layer_kinds):
        subops = [comps[n] for n in names
                  if (m := _LAYER_RE.match(n)) and int(m.group(1)) == i and m.group(2)]
        for s in subops:
            s.name = s.name.split(".", 2)[2]
        row = LayerReport(str(i), i, kind, comps.get(f"layers.{i}"), subops)
        if i < len(a.cache) and i < len(b.cache):
            row.cache_kind, row.offsets = a.cache[i].kind, (a.cache[i].offset, b.cache[i].offset)
            row.cache = [Compared(f"cache.{i}.{d.name}", d.diff, d.row_axis, d.note)
                         for d in states if d.layer == i and d.name != "offset"]
        rows.append(row)
    if FINAL_NORM in comps:
        rows.append(LayerReport(FINAL_NORM, None, "final norm", comps[FINAL_NORM]))
    logits = comps.get(LOGITS)
    if logits is not None:
        rows.append(LayerReport(LOGITS, None, "lm head", logits))
    first = next((r for r in rows if r.divergent), None)
    drill = _drill(first) if first is not None and first.index is not None else None
    shas = (sha256_of(a.arrays[LOGITS]) if LOGITS in a.arrays else "",
            sha256_of(b.arrays[LOGITS]) if LOGITS in b.arrays else "")
    return BisectReport(
        a=a_label or a.arm, b=b_label or b.arm, width=width, depth=depth, rows=rows,
        logits=logits, logits_sha256=shas,
        first_divergent=first.label if first else None,
        first_components=first.components() if first else [],
        drill=drill, meta=dict(meta or {}),
    )


def _drill(row: LayerReport) -> Drill:
    direct = [s for s in row.subops if "." not in s.name]
    equal_before: list[str] = []
    for s in direct:
        if s.differs:
            prefix = s.name.split("#")[0] + "."
            kids = [c for c in row.subops if c.name.startswith(prefix)]
            child = next((c for c in kids if c.differs), None)
            names = [c.name[len(prefix):] for c in kids]
            if child is not None:
                cname = child.name[len(prefix):]
                before = names[: names.index(cname)]
                sentence = (f"first differing sub-op: {s.name}; inside it the first differing"
                            f" call is {cname}")
                if before:
                    sentence += (f", after {', '.join(before)}, which are equal (the difference"
                                 " arises between them)")
            elif kids:
                sentence = (f"first differing sub-op: {s.name} (its own computation: its"
                            f" {len(kids)} sub-calls {', '.join(names)} are equal)")
            else:
                sentence = f"first differing sub-op: {s.name}"
            if equal_before:
                sentence += f"; equal before it: {', '.join(equal_before)}"
            return Drill(s.name, child.name[len(prefix):] if child else None,
                         equal_before, names, sentence)
        equal_before.append(s.name)
    if row.output_differs:
        sentence = (f"every sub-op ({', '.join(equal_before) or 'none captured'}) is equal:"
                    " the layer's own combination of them differs")
    else:
        sentence = "every sub-op and the output are equal: only the cache differs"
    return Drill(None, None, equal_before, [], sentence)
