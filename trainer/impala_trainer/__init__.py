"""ImpalaJob trainer: IMPALA in PyTorch on Ray, driven by an ImpalaJob manifest."""

__version__ = "0.1.0"
