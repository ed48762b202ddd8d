"""relm: reinforcement-learning post-training for causal language models."""

__version__ = "0.1.0"
