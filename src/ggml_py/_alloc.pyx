"""Graph allocator (filled in by the ggml-alloc port)."""
