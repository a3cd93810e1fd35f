"""``specparity serve``: mlx-lm's server, gated and instrumented."""

from __future__ import annotations

import click

from specparity.harness.gated import DEFAULT_MAX_DRAFT_TOKENS


@click.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True,
                                 "help_option_names": ["-h", "--help"]})
@click.option("--gate", type=click.Choice(["on", "off"]), default="on", show_default=True,
              help="Consult the exactness gate before each drafting request.")
@click.option("--env-prefix", "env_prefixes", multiple=True,
              help="Env var prefixes the gate key includes (default: MLX_).")
@click.option("--allow-request-models", is_flag=True,
              help="Let requests name other checkpoints, drafters and adapters (model,"
                   " draft_model, adapters). Off: only what --model, --draft-model and"
                   " --adapter-path name is served.")
@click.option("--max-draft-tokens", type=click.IntRange(min=0, max=1023),
              default=DEFAULT_MAX_DRAFT_TOKENS, show_default=True,
              help="The largest num_draft_tokens a request may ask for (each new width is a"
                   " gate probe and a /metrics series).")
@click.argument("server_args", nargs=-1, type=click.UNPROCESSED)
def serve(gate: str, env_prefixes: tuple[str, ...], allow_request_models: bool,
          max_draft_tokens: int, server_args: tuple[str, ...]) -> int:
    """mlx-lm's OpenAI-compatible server with the exactness gate and per-request counts.

    Every other flag is mlx_lm.server's own (`mlx_lm.server --help`): --model,
    --draft-model, --num-draft-tokens, --port, --kv-bits, ... Endpoints are
    mlx-lm's, plus GET /metrics (Prometheus, vLLM's spec_decode_* names).

    A request that would draft (a --draft-model; num_draft_tokens K, per request
    or from the flag) verifies K + 1 rows: the memoized gate decides for that
    width. Allow: speculative decoding. Decline: classic decode, the same text a
    server without a drafter returns, and one DECLINE line per width (plus a
    DECLINED marker per request). SPECPARITY_ALLOW_INEXACT=1 engages anyway and
    logs FORFEIT. Each drafting request logs one line:

    \b
        specparity-serve: SPEC request=cmpl-... rule=greedy-argmax decision=ALLOW
          width=4 rounds=5 proposed=15 positions_tested=12 accepted=9
          per_position_acceptance=0.7500 ... accepts=[3,1,2,0,3] ...

    and each response carries `speculative` (a specparity.accepts/1 object when
    engaged: `specparity replay` reads it, or the log) and llama.cpp's
    `timings.draft_n` / `timings.draft_n_accepted`.

    Logits processors see the whole prompt and every emitted token on every
    path. The prompt cache follows the checkpoint's policy, said at start-up:
    reuse (one-shot and chunked prefill agree) or re-prefill (they differ: a
    cached prefix is reused only where it was computed as a fresh prefill
    computes it). Ctrl-C exits 130; a port in use exits 4; a client that
    leaves cancels its request.

    \b
    Examples:
        specparity fixtures make ./fx                  # a pair to try: ./fx/target, ./fx/draft
        specparity serve --model ./fx/target --draft-model ./fx/draft --num-draft-tokens 3 --port 8080   # until Ctrl-C
    """
    from specparity.harness.gated.gate import ServeConfig
    from specparity.harness.gated.server import serve as run_server

    run_server(list(server_args), ServeConfig(
        gate=gate == "on", env_prefixes=env_prefixes or None,
        allow_request_models=allow_request_models, max_draft_tokens=max_draft_tokens))
    return 0
