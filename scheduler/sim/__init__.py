"""Trace simulator: replays the openb traces against the scheduler engine (docs/simulator.md). Pure Python."""
