"""Backends of ggml_py, found by name.

The registry maps a backend name to the module and class that implement it;
a module is imported only when its backend is asked for, so optional
backends cost nothing until used (tinygrad's Device[...] pattern).
"""

import importlib

# name -> (module, class)
_REGISTRY = {
    "sim": ("ggml_py.backends.sim", "SimBackend"),
    "numpy_device": ("ggml_py.backends.numpy_device", "NumpyDeviceBackend"),
    "rpc": ("ggml_py.backends.rpc", "RPCBackend"),
}

# names this package exports lazily -> (module, attribute)
_EXPORTS = {
    "SimBackend": ("ggml_py.backends.sim", "SimBackend"),
    "SimBufferType": ("ggml_py.backends.sim", "SimBufferType"),
    "NumpyDeviceBackend": ("ggml_py.backends.numpy_device", "NumpyDeviceBackend"),
    "RPCBackend": ("ggml_py.backends.rpc", "RPCBackend"),
}

__all__ = ["register", "get_backend_class", "available", *_EXPORTS]


def register(name, module, cls):
    """Register backend `name` as class `cls` of module `module` (imported on first use)."""
    _REGISTRY[name] = (module, cls)


def available():
    """Names of the registered backends."""
    return sorted(_REGISTRY)


def get_backend_class(name):
    """The backend class registered as `name`; KeyError lists the known names."""
    try:
        module, cls = _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown backend {name!r}; known: {', '.join(available())}") from None
    return getattr(importlib.import_module(module), cls)


def __getattr__(name):
    if name in _EXPORTS:
        module, attr = _EXPORTS[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
