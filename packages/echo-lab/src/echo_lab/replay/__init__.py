"""Deterministic replay of recorded candidate pools: every arm, every cost model, eta and paired
intervals (``echo-sd sim --traces ...``; :mod:`echo_lab.replay.cli`)."""
