"""Backends of ggml_py, found by name: one package per device kind (cpu/, numpy_device/,
opencl/, rpc/, sim/), each with its backend, buffers and kernels.

The registry maps a kind's name to the module and class that implement it;
a module is imported only when its backend is asked for, so optional
backends cost nothing until used (tinygrad's Device[...] pattern). It is the
one list of backend names: the command line's choices (`demo --device`,
`ops-check --backend`) and `demo --device auto`'s candidates come from it.
Adding a kind (the README's recipe): its package, the function that picks its backend
when auto may, one entry here (or `register` from outside).

`--device auto` (choose_auto) tries the entries with an `auto` rank, lowest first; each
such entry names its module's `auto_backend` function, which returns the backend auto
should use or raises a BackendError saying why not here (OpenCL refuses a CPU-emulated
OpenCL device such as PoCL's: the numpy device, ranked next, is faster on the same CPU).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, NamedTuple

from ggml_py.errors import ArgumentError, ArgumentTypeError, BackendError, UnknownNameError

if TYPE_CHECKING:
    from ggml_py._backend import Backend


class Entry(NamedTuple):
    module: str
    cls: str
    computes: bool          # runs graphs (False: plans only, like the simulated backend)
    needs: str = ""         # the argument create() cannot do without, in words ("": none)
    auto: int = 0           # --device auto's order (1 tried first); 0: auto never picks it
    auto_backend: str = ""  # with a rank: the module's function giving auto's backend here


_REGISTRY: dict[str, Entry] = {
    "cpu": Entry("ggml_py.backends.cpu", "CPUBackend", True),
    "numpy_device": Entry("ggml_py.backends.numpy_device", "NumpyDeviceBackend", True, auto=2,
                          auto_backend="auto_backend"),
    "opencl": Entry("ggml_py.backends.opencl", "OpenCLBackend", True, auto=1,
                    auto_backend="auto_backend"),
    "rpc": Entry("ggml_py.backends.rpc", "RPCBackend", True,
                 needs="the server's endpoint, 'HOST:PORT'"),
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

__all__ = ["register", "get_backend_class", "available", "needs", "auto_order", "create",
           "choose_auto", *_EXPORTS]


def register(name: str, module: str, cls: str, computes: bool = True, needs: str = "",
             auto: int = 0, auto_backend: str = "") -> None:
    """Register backend `name` as class `cls` of module `module` (imported on first use);
    `computes=False` for a backend that only plans; `needs`: in words, the argument it
    cannot be created without (create() then refuses to call it bare); `auto`: its place
    in --device auto's order (0: never), given with `auto_backend`, the name of the
    module's function that returns the backend auto should use or raises why not here."""
    for what, value in (("name", name), ("module", module), ("cls", cls), ("needs", needs),
                        ("auto_backend", auto_backend)):
        if not isinstance(value, str):
            raise ArgumentTypeError(f"register: {what} must be a string, got {type(value).__name__}")
    if isinstance(auto, bool) or not isinstance(auto, int) or auto < 0:
        raise ArgumentError(f"register: auto must be a rank >= 0, got {auto!r}")
    if bool(auto) != bool(auto_backend):
        raise ArgumentError(f"register: an auto rank and its auto_backend function go together, "
                            f"got auto={auto!r}, auto_backend={auto_backend!r}")
    _REGISTRY[name] = Entry(module, cls, bool(computes), needs, auto, auto_backend)


def available(computes: bool | None = None) -> list[str]:
    """Names of the registered backends; `computes=True`: those that run graphs."""
    return sorted(n for n, e in _REGISTRY.items() if computes is None or e.computes == computes)


def needs(name: str) -> str:
    """What backend `name` cannot be created without, in words ('' when nothing)."""
    _entry(name)
    return _REGISTRY[name].needs


def auto_order() -> list[str]:
    """The backends --device auto tries, in order."""
    return sorted((n for n, e in _REGISTRY.items() if e.auto), key=lambda n: _REGISTRY[n].auto)


def _entry(name: str) -> Entry:
    if not isinstance(name, str) or name not in _REGISTRY:
        raise UnknownNameError(f"unknown backend {name!r}; known: {', '.join(available())}")
    return _REGISTRY[name]


def get_backend_class(name: str) -> type[Backend]:
    """The backend class registered as `name`; UnknownNameError (a KeyError) lists the
    known names, BackendError says why a registered one cannot be imported."""
    entry = _entry(name)
    try:
        cls: type[Backend] = getattr(importlib.import_module(entry.module), entry.cls)
    except (ImportError, AttributeError) as e:
        raise BackendError(f"backend {name!r} is registered as {entry.module}.{entry.cls}, "
                           f"which cannot be imported: {e}") from e
    return cls


def create(name: str, *args: Any, **kwargs: Any) -> Backend:
    """A new backend of the class registered as `name` (its defaults unless arguments
    are given): create('cpu'), create('opencl', 'pthread'), create('rpc', 'host:50052').
    ArgumentError when the backend needs an argument (its registry `needs`) and none is
    given."""
    cls = get_backend_class(name)
    entry = _REGISTRY[name]
    if entry.needs and not args and not kwargs:
        raise ArgumentError(f"backend {name!r} needs {entry.needs}: "
                            f"create({name!r}, ...)")
    return cls(*args, **kwargs)


def choose_auto() -> tuple[Backend | None, str]:
    """--device auto: (the backend, why it in one line), trying auto_order() in turn; each
    entry's auto_backend function gives its backend or raises why not here (no device, a
    CPU-emulated OpenCL device, ...). (None, why) when none is usable: the CPU alone."""
    skipped = []
    for name in auto_order():
        entry = _REGISTRY[name]
        try:
            get_backend_class(name)
            backend: Backend = getattr(importlib.import_module(entry.module), entry.auto_backend)()
        except Exception as e:      # not built, no library, no device, only CPU-emulated ...
            skipped.append(f"{name}: {e}")
            continue
        if not skipped:
            return backend, (f"{name} ({backend.name}), the first of "
                             f"{', '.join(auto_order())} that works here")
        return backend, f"{name} ({backend.name}); skipped {'; '.join(skipped)}"
    return None, f"no device, the CPU alone; skipped {'; '.join(skipped)}"


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        module, attr = _EXPORTS[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
