"""rocmfix: safe, reversible, version-aware fixes for MinerU's slow paths on AMD GPUs."""

__version__ = "0.1.0"
