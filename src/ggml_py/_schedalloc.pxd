# The scheduler's split and alloc steps (see _schedalloc.pyx).

from ggml_py._core cimport Graph
from ggml_py._schedcore cimport SchedCore

cdef int sched_split_graph(SchedCore s, Graph g) except -1
cdef int sched_alloc_splits(SchedCore s) except -1
cdef int sched_alloc_graph(SchedCore s, Graph graph) except -1
