"""Backends of ggml_py that compute (the numpy CPU backend)."""
