"""help() and an editor's tooltips say what every public piece of ggml_py is: each public
module, and each class, function, method and property it defines (a method inherits
its base's docstring, as inspect.getdoc reads it), the compiled classes the package
exports included."""

import importlib
import inspect
import pkgutil

import ggml_py

# the command line's helpers are the CLI's (its --help says what they do)
PRIVATE_PACKAGES = ("ggml_py.tools",)


def public_modules():
    names = ["ggml_py"]
    for m in pkgutil.walk_packages(ggml_py.__path__, "ggml_py."):
        if any(part.startswith("_") for part in m.name.split(".")):
            continue
        if not m.name.startswith(PRIVATE_PACKAGES):
            names.append(m.name)
    return [importlib.import_module(n) for n in names]


def is_api_object(v):
    return inspect.isclass(v) or inspect.isroutine(v)


def members(cls):
    """(name, attribute) of what a class itself defines, public."""
    for k, raw in vars(cls).items():
        if k.startswith("_"):
            continue
        if isinstance(raw, property) or inspect.isroutine(raw) or \
                isinstance(raw, (staticmethod, classmethod)) or inspect.isdatadescriptor(raw):
            yield k, raw if isinstance(raw, property) else getattr(cls, k)


def undocumented():
    missing = []
    for m in public_modules():
        if not (m.__doc__ or "").strip():
            missing.append(m.__name__)
        names = m.__all__ if m.__name__ == "ggml_py" else vars(m)
        for n in names:
            v = getattr(m, n)
            if n.startswith("_") or not is_api_object(v):
                continue
            # a module documents what it defines; the package also what it exports
            if m.__name__ != "ggml_py" and getattr(v, "__module__", None) != m.__name__:
                continue
            if not (inspect.getdoc(v) or "").strip():
                missing.append(f"{m.__name__}.{n}")
            if inspect.isclass(v):
                for k, attr in members(v):
                    doc = attr.__doc__ if isinstance(attr, property) else inspect.getdoc(attr)
                    if not (doc or "").strip():
                        missing.append(f"{m.__name__}.{n}.{k}")
    return sorted(set(missing))


def test_the_public_api_is_documented():
    assert undocumented() == []


def test_the_check_sees_compiled_members():
    # the sweep reaches into the compiled classes (properties, methods, attributes)
    docs = {k: inspect.getdoc(a) for k, a in members(ggml_py.Tensor)}
    assert {"ne", "name", "set_src", "owner"} <= docs.keys()
    assert "Byte strides" in docs["nb"]
