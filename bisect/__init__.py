"""Per-layer bisection of a block-vs-chain divergence (``specparity bisect``).

    capture.py   wrap the model's layers and sub-ops; record every output
    arms.py      the probe's two arms (chain, block), each run once with capture on
    report.py    compare two arms' captures: first divergent layer, component, sub-op
    run.py       the in-process bisect (arms + report)
    dump.py      captures to safetensors + manifest and back (``bisect dump`` / ``diff``)
    controls.py  rerun in a fresh process per environment; group arms by logits sha256
    chart.py     terminal bars and the record's SVG chart
    render.py    the report as a terminal table and as record markdown

Nothing here imports mlx at import time.
"""
