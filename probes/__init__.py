"""The probes, in three families that share little: find one by what it checks.

forward/    forward-pass checks at temperature 0 (specparity.probes.forward)
    blockchain.py  block vs chain for every (width, depth), and the long walk
    prefill.py     one-shot vs chunked vs token-by-token prefill, logits and cache state
    render.py      probe, walk and prefill results as terminal text and record markdown
    probe.py       the probe run (block vs chain + walk + prefill) as one report
gate.py     the memoized verdict a server asks before it speculates (``gate_check``)
engines/    the engine adapter interface (base.py) and mlx-lm's adapter (the one others build on); each
            engine's own adapter lives in its package (specparity/engines/)
engine_e2e.py  every other engine's e2e: its own loops (its package's loops.py) or its adapter's own loop
            against classic decode's one arm (Classic), located to a round
e2e.py      mlx-lm's own entry points (stream_generate, generate, the CLI) with vs
            without the drafter: outputs, dropped options, changed defaults (``specparity e2e``)
replay/     a served run's rounds rebuilt in process (specparity.probes.replay)
    logs.py        accept vectors from every log format; the specparity JSONL read and written
    algebra.py     round algebra without a model: emitted counts, locate, transcript checks
    recorder.py    record an accept vector by running mlx-lm's speculative decoding
    core.py        the replay: one loop of verify blocks and rollbacks through any engine's session,
                   its differences per engine declared (RoundOptions), one result, two reports
    classic.py     the classic chain every replay compares with (its own picks, or tokens fed)
    findings.py    what a replay finds: disagreements, rewinds, the first token, row and state
    engine.py      an engine's accept vector replayed, and its own run walked, round by round
    run.py         every request of a log replayed, as one report
sampling/   exactness at temperature > 0 (specparity.probes.sampling)
    rules.py       acceptance rules: lossless references, known-wrong controls, user rules,
                   and their closed-form acceptance
    stats.py       chi-square goodness of fit, total variation and its noise floor
    problem.py     the problem: p and q from logits, temperature and filters (chains too)
    montecarlo.py  vectorized draws of a rule, with the zero-tolerance checks
    dist.py        one dist run beside its controls, its report
    accept.py      measured acceptance of mlx-lm (and rules) on real models vs closed forms
    accept_e2e.py  mlx-lm's emitted stream against a known p (constant-logits fixtures)

Nothing here imports mlx at import time.
"""
