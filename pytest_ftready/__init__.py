"""pytest-ftready: readiness checks for local LLM fine-tuning, as a pytest plugin.

Importing this package does not import torch or transformers."""

__version__ = "0.1.0"
