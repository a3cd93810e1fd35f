"""The served harness (``specparity served``), read as a pipeline from its file names.

    job.py          the job as data: pairings, widths, prompts, params, sequence, controls,
                    the distribution spec
    config.py       a job read from YAML and the command line's overrides, checked (names
                    against the plan's arms)
    profiles.py     server profiles (YAML in profiles/): argv, width setting, readiness, evidence
    profiles/       the packaged profiles; mlx-lm.yaml documents every key a profile may hold
    engines/        the evidence an engine's served hooks return (EngineEvidence); the hooks themselves
                    live in each engine's package (specparity/engines/<name>/served.py)
    plan.py         arms in run order (ArmKind, the built-in arm names, Width carried whole),
                    each arm's request sequence
    shard.py        --shard i/n: which planned arms a runner takes
    lifecycle.py    the one server lifecycle: spawn, ready, stop with the process group
    watchdog.py     what kills a server when the harness dies, even by SIGKILL (run by lifecycle)
    transport.py    HTTP with a total deadline per request, bodies read boundedly (below client and lifecycle)
    client.py       one OpenAI-style request (streamed or not) read into a Completion
    witness.py      checkpoints wrapped so their forwards are logged (engine-agnostic evidence)
    evidence.py     what shows a request ran the drafter: witness, log, response, metrics
    run.py          the runner: sessions, requests, arms, pairings (public API for new arms)
    session.py      a running server (Session) and one request's exchange with it (Exchange)
    reference_worker.py  the reference's worker process (specparity.reference, the classic decode every
                    served request is judged by, + the replay's serving loop for cold answers)
    oracle.py       the reference's worker process, in the pairing's environment, reached by the runner
                    (loaded only while no server is, unless the job opts in)
    memory.py       what the job's processes hold (peak RSS, the sampled sum) and the budget it states
                    before it starts
    limits.py       each request's time limit, derived from what the job measured (or one for all: the override)
    timing.py       where a pairing's wall time goes, by phase (the record's ``time``)
    judge.py        request, arm and pairing verdicts (public: merge judges with it too)
    reproduce.py    the in-process command that reproduces a finding, or why there is none
    results.py      typed results with to_dict / from_dict, and the report's text
    distribution.py temperature > 0 arms: seeded draws, homogeneity and fit, controls

The record a served run writes lives in specparity.records.served (the one
module that writes and reads its layout).

    gated/          a product of its own: ``specparity serve``, mlx-lm's server behind the
                    exactness gate (map in gated/__init__.py)

Add a server: one profile YAML (profiles/mlx-lm.yaml documents every key; a
user's file is passed by path with --profile). Add an engine that needs code
(placeholders such as its binary, a checkpoint export, its own evidence, a
pinned environment): its package (specparity/engines/<name>/: served.py and its
profile YAML), named by the profile's ``engine`` key; specparity/engines/__init__.py
lists the hooks.
"""
