"""Where a model's layers run: llama.cpp's placement over devices and the CPU.

`split_layers` gives the assignment of llama.cpp's load_tensors (`-ngl N`: the last N of
the n_layer + 1 layers, the output layer counting as the last, go to the devices;
`--tensor-split`: consecutive runs of layers sized in proportion to the shares);
`place_model` places a Model's weights by it; `flash_attn_off_layers` is how llama.cpp's
`-fa auto` decides.
The token embeddings stay on the CPU, as llama.cpp keeps its input layer there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from ggml_py._backend import Backend
from ggml_py._core import Graph, instance_arg, items_arg
from ggml_py.errors import ArgumentError, BackendError
from ggml_py.models.model import Model

if TYPE_CHECKING:
    from ggml_py.sched import Scheduler

__all__ = ["split_layers", "place_model", "flash_attn_off_layers"]


def split_layers(n_layer: int, devices: Sequence[Backend], cpu: Backend,
                 n_gpu_layers: int | None = None,
                 tensor_split: Sequence[float] | None = None) -> tuple[list[Backend], Backend]:
    """Which backend runs each layer, and the output layer, as llama.cpp assigns them:
    the last `n_gpu_layers` of the n_layer + 1 layers (the output layer last; default and
    any negative count: all) go to `devices`, cut
    into consecutive runs in proportion to `tensor_split` (default: each device's free
    memory where every device reports it, else equal shares); the rest stay on `cpu`.
    Returns (per-layer backends, output backend)."""
    devices = list(devices)
    n_gpu = n_layer + 1 if n_gpu_layers is None or n_gpu_layers < 0 else int(n_gpu_layers)
    if not devices:
        return [cpu] * n_layer, cpu
    if tensor_split is None:
        try:
            memory = [d.device_memory() for d in devices]  # type: ignore[attr-defined]
        except AttributeError:
            memory = [(1, 1)] * len(devices)
        if sum(free for free, _ in memory) <= 0:
            reports = ", ".join(f"{d.name}: {free} of {total} bytes free"
                                for d, (free, total) in zip(devices, memory))
            raise BackendError(f"split_layers: no device reports free memory to share the "
                               f"layers by ({reports}); pass tensor_split")
        tensor_split = [free for free, _ in memory]
    shares = [float(x) for x in tensor_split]
    if len(shares) != len(devices) or any(x < 0 for x in shares) or sum(shares) <= 0:
        raise ArgumentError(f"tensor_split needs {len(devices)} non-negative shares, not all "
                            f"0, got {shares}")
    total = sum(shares)
    bounds: list[float] = []
    acc = 0.0
    for x in shares:
        acc += x
        bounds.append(acc / total)
    i_gpu_start = max(n_layer + 1 - n_gpu, 0)
    act_gpu_layers = min(n_gpu, n_layer + 1)

    def backend_of(il: int) -> Backend:
        if il < i_gpu_start or il - i_gpu_start >= act_gpu_layers:
            return cpu
        f = (il - i_gpu_start) / act_gpu_layers
        i = next((k for k, b in enumerate(bounds) if f < b), len(devices) - 1)  # upper_bound
        return devices[i]

    return [backend_of(il) for il in range(n_layer)], backend_of(n_layer)


def place_model(model: Model, backends: Sequence[Backend], n_gpu_layers: int | None = None,
                tensor_split: Sequence[float] | None = None) -> Model:
    """Place a Model's weights over `backends` ([dev0, dev1, ..., cpu], the CPU last) with
    split_layers; the token embeddings stay on the CPU (llama.cpp's input layer)."""
    model = instance_arg(model, Model, "model")
    backends = items_arg(backends, "backends", Backend)
    if not backends:
        raise ArgumentError("place_model needs at least the CPU backend")
    cpu = backends[-1]
    layers, output = split_layers(model.config.n_layer, backends[:-1], cpu, n_gpu_layers,
                                  tensor_split)
    return model.place(layers, host=cpu, output_backend=output)


def flash_attn_off_layers(sched: Scheduler, graph: Graph,
                          layers: Sequence[Backend]) -> list[int]:
    """The layers whose FLASH_ATTN_EXT `sched` would not run on the layer's own backend
    (`layers[il]`), from a split of `graph` (a one-token graph with flash attention, one
    FLASH_ATTN_EXT per layer); the scheduler is reset after. llama.cpp's -fa auto keeps
    flash attention only where there is none."""
    from ggml_py.sched import Scheduler
    instance_arg(sched, Scheduler, "sched")
    instance_arg(graph, Graph, "graph")
    layers = items_arg(layers, "layers", Backend)
    sched.split_graph(graph)
    try:
        fa = [node for node in graph.nodes if node.op == "FLASH_ATTN_EXT"]
        if len(fa) != len(layers):
            raise ArgumentError(f"the graph has {len(fa)} FLASH_ATTN_EXT nodes for "
                                f"{len(layers)} layers (one per layer)")
        return [il for il, node in enumerate(fa)
                if sched.get_tensor_backend(node) is not layers[il]]
    finally:
        sched.reset()
