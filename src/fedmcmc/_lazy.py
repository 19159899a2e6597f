"""Names of a package imported on first use (PEP 562), so that importing the package imports no
JAX by itself: ``__getattr__, __dir__ = exports(__name__, globals(), {name: (module, attribute)})``."""

import importlib


def exports(package: str, namespace: dict, homes: dict[str, tuple[str, str]]):
    """The package's ``__getattr__`` and ``__dir__`` for the names of ``homes``: each is imported
    from its module on first use and kept in ``namespace``."""

    def __getattr__(name: str):
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, attribute = homes[name]
        value = getattr(importlib.import_module(module), attribute)
        namespace[name] = value
        return value

    def __dir__():
        return sorted(set(namespace) | set(homes))

    return __getattr__, __dir__
