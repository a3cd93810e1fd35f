"""Replay of a served run's verify rounds: logs, round algebra, recorder, the replay (see ``probes/__init__``)."""
