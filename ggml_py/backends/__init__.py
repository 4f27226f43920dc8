"""Backends of ggml_py, found by name.

The registry maps a backend name to the module and class that implement it;
a module is imported only when its backend is asked for, so optional
backends cost nothing until used (tinygrad's Device[...] pattern).
"""

import importlib

from ggml_py.errors import ArgumentTypeError, BackendError, UnknownNameError

# name -> (module, class)
_REGISTRY = {
    "sim": ("ggml_py.backends.sim", "SimBackend"),
    "numpy_device": ("ggml_py.backends.numpy_device", "NumpyDeviceBackend"),
}

# names this package exports lazily -> (module, attribute)
_EXPORTS = {
    "SimBackend": ("ggml_py.backends.sim", "SimBackend"),
    "SimBufferType": ("ggml_py.backends.sim", "SimBufferType"),
    "NumpyDeviceBackend": ("ggml_py.backends.numpy_device", "NumpyDeviceBackend"),
}

__all__ = ["register", "get_backend_class", "available", *_EXPORTS]


def register(name, module, cls):
    """Register backend `name` as class `cls` of module `module` (imported on first use)."""
    for what, value in (("name", name), ("module", module), ("cls", cls)):
        if not isinstance(value, str):
            raise ArgumentTypeError(f"register: {what} must be a string, got {type(value).__name__}")
    _REGISTRY[name] = (module, cls)


def available():
    """Names of the registered backends."""
    return sorted(_REGISTRY)


def get_backend_class(name):
    """The backend class registered as `name`; UnknownNameError (a KeyError) lists the
    known names, BackendError says why a registered one cannot be imported."""
    if not isinstance(name, str) or name not in _REGISTRY:
        raise UnknownNameError(f"unknown backend {name!r}; known: {', '.join(available())}")
    module, cls = _REGISTRY[name]
    try:
        return getattr(importlib.import_module(module), cls)
    except (ImportError, AttributeError) as e:
        raise BackendError(f"backend {name!r} is registered as {module}.{cls}, which cannot "
                           f"be imported: {e}") from e


def __getattr__(name):
    if name in _EXPORTS:
        module, attr = _EXPORTS[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
