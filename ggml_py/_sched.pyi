# Stub of the Cython module ggml_py._sched (src/ggml_py/_sched.pyx): its functions are
# cimported by the scheduler's other modules; in Python, the reads it declares
# (tests/test_sched_reads.py).

CALLEE_READS: dict[str, tuple[str, ...]]
TENSOR_READS: dict[str, tuple[str, ...]]
