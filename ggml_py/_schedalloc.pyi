# Stub of the Cython module ggml_py._schedalloc (src/ggml_py/_schedalloc.pyx): no Python API (its
# functions are cimported by the scheduler's other modules); checked by .ci/stubtest.
