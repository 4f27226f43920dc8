# Stub of the Cython module ggml_py._reuse (src/ggml_py/_reuse.pyx): its functions are
# cimported by the scheduler's other modules; in Python, the fields its fingerprint
# leaves uncompared (tests/test_sched_reads.py).

NOT_COMPARED: dict[str, str]
