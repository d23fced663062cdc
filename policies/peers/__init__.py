"""Peer harnesses' context policies, one module each.

Importing the package imports every module in it, and each module registers its policies
with `@register`: a new policy is one file with one registration (the package itself is
the `ctxsim.policies` entry point).
"""

from __future__ import annotations

import importlib
import pkgutil

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    importlib.import_module(f"{__name__}.{_module}")
