"""craft-adapters: CRAFT inside Hugging Face transformers VLMs (work in progress, issue 3)."""

__version__ = "0.1.0"
