# Stub of the Cython module ggml_py._reuse (src/ggml_py/_reuse.pyx): no Python API (its
# functions are cimported by the scheduler's other modules); checked by .ci/stubtest.
