"""Multi-turn rollouts with tools: the model calls tools, reads their output and goes on, token in and
token out (docs/multi_turn.md)."""
