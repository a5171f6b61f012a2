"""Package names that load on first use (PEP 562), so that importing a package stays cheap.

`tradewind --help` imports the packages that register commands; if their `__init__` imported every
module, it would load pydantic, fsspec or JAX before printing a line. A package instead assigns its
module `__getattr__` from `lazy_getattr`, which imports a name's module only when the name is used.
This module imports nothing but the standard library, since `tradewind.core` itself loads this way.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_getattr(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """A module `__getattr__` for `package` that loads each name of `exports` from its module on first use.

    The value is then kept on the package, so later look-ups cost nothing.

    Args:
        package: the package's `__name__`.
        exports: each exported name and the module that defines it.

    Returns:
        The function to assign to the package's `__getattr__`; it raises `AttributeError` for any name not
        in `exports`, as a module without the name would.

    Example (in a package's `__init__.py`):
        __getattr__ = lazy_getattr(__name__, {"LocalBackend": "tradewind.cluster.local"})
    """

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(exports[name]), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
