"""The CPU backend: ggml 0.10.1's CPU numerics, computed by compiled execution plans
(cplans) over C kernels (its module _executor, over src/ggml_py/backends/cpu/kernels) with
numpy kernels where those have none.

    backend.py        CPUBackend, the kernel policy (KERNELS), compute_nodes
    memory.py         which buffers a thread may use; numpy views of tensors
    numpy_kernels.py  the kernels in numpy (reference numerics, and the ops C lacks)
    blas.py           MUL_MAT of large batches through BLAS, weights converted in tiles
"""

from ggml_py.backends.cpu._executor import default_threads, isa, isa_supported, set_isa
from ggml_py.backends.cpu.backend import (CPUBackend, CPU_ALIGNMENT, KERNELS, KernelTable,
                                          SUPPORTED_OPS, compute_node, compute_nodes)
from ggml_py.backends.cpu.memory import open_device_memory, memory_of, tensor_array
from ggml_py.backends.cpu.numpy_kernels import (NUMPY_KERNELS, values, store,
                                                rope_cache, gelu, gelu_quick, gelu_erf)

__all__ = ["CPUBackend", "CPU_ALIGNMENT", "KERNELS", "KernelTable", "NUMPY_KERNELS",
           "SUPPORTED_OPS", "compute_node", "compute_nodes", "default_threads",
           "open_device_memory", "memory_of", "tensor_array",
           "values", "store", "rope_cache", "gelu", "gelu_quick", "gelu_erf",
           "isa", "isa_supported", "set_isa"]
