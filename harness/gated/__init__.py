"""``specparity serve``: mlx-lm's server behind the exactness gate (a product of its own, not the harness).

    server.py   :func:`serve`: binds the port, swaps the subclasses in, runs mlx_lm.server's main
    classes.py  the subclasses of mlx_lm.server's provider, generator and handler (on
                specparity.mlx_server, the toolkit's one rebuild of that server: its settings, fresh
                caches, processor history; mlx-lm's private hooks through specparity.mlx_compat.server);
                importing it imports mlx-lm
    gate.py     ServeConfig (what serve adds to mlx-lm's flags) and GateMemo (the gate's decisions)
    cache.py    serving-loop cache state: entries hold exactly the tokens they are filed under
    stats.py    per-request speculative counts, the log line, /metrics (prometheus-client)
    cancel.py   a client that leaves cancels its generation
"""

DEFAULT_MAX_DRAFT_TOKENS = 16  # the largest num_draft_tokens a request may ask for
