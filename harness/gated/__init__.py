"""``specparity serve``: mlx-lm's server behind the exactness gate (a product of its own, not the harness).

    server.py   the swapped-in subclasses of mlx_lm.server and :func:`serve`
    cache.py    serving-loop cache state: entries hold exactly the tokens they are filed under
    stats.py    per-request speculative counts, the log line, /metrics (prometheus-client)
"""
