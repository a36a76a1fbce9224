"""craft-eval: benchmarks, baseline compressors, efficiency measurement and reports for CRAFT."""

__version__ = "0.6.0"
