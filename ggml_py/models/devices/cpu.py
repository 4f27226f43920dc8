"""The `cpu` device kind: ggml-cpu's backend (llama.cpp's `CPU`).

Its supports_op is ggml-cpu's rule (a MUL_MAT whose src1 is neither f32 nor the weight
type's vec_dot type is not for it: the `cpu` rule of ggml_py._supports);
its buffers are host memory at ggml's TENSOR_ALIGNMENT (32), unbounded. Beside them, its
extra buffer type CPU_REPACK (ggml-cpu/repack.cpp: not host memory, same alignment) holds
the weights ggml-cpu re-lays out for its matrix kernels: those read by a MUL_MAT (2-D) or
MUL_MAT_ID (3-D experts) whose type it repacks for the instruction set it was built for."""

from __future__ import annotations

import functools
import platform
from typing import Sequence

from ggml_py._backend import Backend, BufferType
from ggml_py.backends.sim import RPC_SERVER_OPS, SimBackend, SimBufferType
from ggml_py.errors import ModelError

KIND = "cpu"
PREFIX = "CPU"
NUMBERED = False
ALIGNMENT = 32
REPACK = "CPU_REPACK"
# the types repack.cpp's ggml_repack_get_optimal_repack_type repacks on x86, and the
# instruction set each needs (ggml-cpu built for this host, as llama-cpp-python builds it);
# every one interleaves 8 rows, so ne[1] must be a multiple of 8
X86_REPACKED = {"q4_0": "avx2", "q4_K": "avx2", "iq4_nl": "avx2", "mxfp4": "avx2",
                "q2_K": "avx512f"}
REPACK_ROWS = 8
# those it repacks on Arm (NEON dot product / i8mm, SVE), whose rules are not ported
ARM_REPACKED = ("q1_0", "q4_0", "q4_K", "q5_K", "q6_K", "iq4_nl", "mxfp4", "q8_0")


def backend(name: str) -> SimBackend:
    """A simulated ggml-cpu backend named `name`, with its host buffer type `CPU` and its
    extra buffer type `CPU_REPACK`."""
    buft = SimBufferType("CPU", ALIGNMENT, None, True, device=name)
    repack = SimBufferType(REPACK, ALIGNMENT, None, False, device=name)
    return SimBackend(name, buft, "cpu", RPC_SERVER_OPS, supported_buffer_types=[buft, repack])


def repack_buffer_type(cpu: Backend) -> BufferType:
    """The CPU_REPACK buffer type of a backend this module made."""
    return next(b for b in cpu.supported_buffer_types if b.name == REPACK)


@functools.lru_cache(maxsize=None)
def _x86_flags() -> frozenset[str] | None:
    """This host's x86 instruction set flags (/proc/cpuinfo); None off x86."""
    if platform.machine().lower() not in ("x86_64", "amd64", "i686", "i386"):
        return None
    try:
        with open("/proc/cpuinfo") as f:
            return frozenset(next((line.split(":", 1)[1].split() for line in f
                                   if line.startswith("flags")), []))
    except OSError:
        return frozenset()


def repacks(name: str, type_name: str, ne: Sequence[int]) -> bool:
    """Whether ggml-cpu puts the weight `name` of this type and shape (read by a MUL_MAT
    or MUL_MAT_ID) in CPU_REPACK; ModelError off x86, where the rules are not ported."""
    flags = _x86_flags()
    if flags is None:
        if type_name in ARM_REPACKED:
            raise ModelError(f"{name} ({type_name}) may go to ggml-cpu's CPU_REPACK buffer, "
                             f"whose rules on {platform.machine()} are not planned yet "
                             "(--no-repack plans without it)")
        return False
    isa = X86_REPACKED.get(type_name)
    return isa is not None and isa in flags and ne[1] % REPACK_ROWS == 0
