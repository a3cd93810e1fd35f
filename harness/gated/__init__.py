"""``specparity serve``: mlx-lm's server behind the exactness gate (a product of its own, not the harness).

    server.py   the swapped-in subclasses of mlx_lm.server and :func:`serve` (on specparity.mlx_server,
                the toolkit's one rebuild of that server: its settings, fresh caches, processor
                history; mlx-lm's private hooks through specparity.mlx_compat.server)
    cache.py    serving-loop cache state: entries hold exactly the tokens they are filed under
    stats.py    per-request speculative counts, the log line, /metrics (prometheus-client)
    cancel.py   a client that leaves cancels its generation
"""

DEFAULT_MAX_DRAFT_TOKENS = 16  # the largest num_draft_tokens a request may ask for
