"""Backends of ggml_py, found by name.

The registry maps a backend name to the module and class that implement it;
a module is imported only when its backend is asked for, so optional
backends cost nothing until used (tinygrad's Device[...] pattern). It is the
one list of backend names: the command line's choices (`demo --device`,
`ops-check --backend`) come from it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, NamedTuple

from ggml_py.errors import ArgumentTypeError, BackendError, UnknownNameError

if TYPE_CHECKING:
    from ggml_py._backend import Backend


class Entry(NamedTuple):
    module: str
    cls: str
    computes: bool          # runs graphs (False: plans only, like the simulated backend)


_REGISTRY: dict[str, Entry] = {
    "cpu": Entry("ggml_py.backends.cpu", "CPUBackend", True),
    "numpy_device": Entry("ggml_py.backends.numpy_device", "NumpyDeviceBackend", True),
    "opencl": Entry("ggml_py.backends.opencl", "OpenCLBackend", True),
    "rpc": Entry("ggml_py.backends.rpc", "RPCBackend", True),
    "sim": Entry("ggml_py.backends.sim", "SimBackend", False),
}

# names this package exports lazily -> (module, attribute)
_EXPORTS = {
    "CPUBackend": ("ggml_py.backends.cpu", "CPUBackend"),
    "SimBackend": ("ggml_py.backends.sim", "SimBackend"),
    "SimBufferType": ("ggml_py.backends.sim", "SimBufferType"),
    "NumpyDeviceBackend": ("ggml_py.backends.numpy_device", "NumpyDeviceBackend"),
    "RPCBackend": ("ggml_py.backends.rpc", "RPCBackend"),
}

__all__ = ["register", "get_backend_class", "available", "create", *_EXPORTS]


def register(name: str, module: str, cls: str, computes: bool = True) -> None:
    """Register backend `name` as class `cls` of module `module` (imported on first use);
    `computes=False` for a backend that only plans."""
    for what, value in (("name", name), ("module", module), ("cls", cls)):
        if not isinstance(value, str):
            raise ArgumentTypeError(f"register: {what} must be a string, got {type(value).__name__}")
    _REGISTRY[name] = Entry(module, cls, bool(computes))


def available(computes: bool | None = None) -> list[str]:
    """Names of the registered backends; `computes=True`: those that run graphs."""
    return sorted(n for n, e in _REGISTRY.items() if computes is None or e.computes == computes)


def get_backend_class(name: str) -> type[Backend]:
    """The backend class registered as `name`; UnknownNameError (a KeyError) lists the
    known names, BackendError says why a registered one cannot be imported."""
    if not isinstance(name, str) or name not in _REGISTRY:
        raise UnknownNameError(f"unknown backend {name!r}; known: {', '.join(available())}")
    entry = _REGISTRY[name]
    try:
        cls: type[Backend] = getattr(importlib.import_module(entry.module), entry.cls)
    except (ImportError, AttributeError) as e:
        raise BackendError(f"backend {name!r} is registered as {entry.module}.{entry.cls}, "
                           f"which cannot be imported: {e}") from e
    return cls


def create(name: str, *args: Any, **kwargs: Any) -> Backend:
    """A new backend of the class registered as `name` (its defaults unless arguments
    are given): create('cpu'), create('opencl', 'pthread')."""
    return get_backend_class(name)(*args, **kwargs)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        module, attr = _EXPORTS[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
