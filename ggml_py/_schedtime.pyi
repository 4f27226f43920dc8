# Stub of the Cython module ggml_py._schedtime (src/ggml_py/_schedtime.pyx); checked
# against the built module by `python -m mypy.stubtest` (.ci/stubtest).
from typing import Sequence

from typing_extensions import Self, disjoint_base

from ggml_py._core import Graph, Tensor
from ggml_py._schedcore import SchedCore

@disjoint_base
class GraphSnapshot:
    def __new__(cls, graph: Graph) -> Self: ...
    def restore(self) -> None: ...

TIME_SPLIT: int
TIME_ALLOC: int
TIME_RESERVE: int
TIME_REUSE: int
TIME_SWEEP: int

def time_reps(s: SchedCore, graph: Graph, snap: GraphSnapshot,
              assignments: Sequence[tuple[Tensor, int]], reps: int, what: int) -> list[int]: ...
def time_rebuilt_reps(s: SchedCore, graph: Graph, other: Graph,
                      assignments: Sequence[tuple[Tensor, int]],
                      other_assignments: Sequence[tuple[Tensor, int]], reps: int) -> list[int]: ...
