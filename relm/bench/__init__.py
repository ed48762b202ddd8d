"""Benchmarks: `relm bench rollout` and `relm bench step`."""
