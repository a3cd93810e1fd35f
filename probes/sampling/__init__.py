"""Exactness at temperature > 0: rules, statistics, Monte Carlo, dist, accept (see ``probes/__init__``)."""
