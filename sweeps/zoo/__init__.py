"""The tiny-model zoo: every model class of the installed transformers, tiny and seeded.

    from sweeps.zoo import catalog, resolve_models, build_tiny, UnknownModelError, BlockedByPackage

See docs/CONTRACTS.md.  ``catalog()`` is cheap (name mappings only); ``build_tiny`` is
imported lazily so that importing this package does not import torch modeling code.
"""

from __future__ import annotations

from .catalog import CatalogEntry, UnknownModelError, catalog, resolve_models

# served lazily from .build (importing it imports torch and transformers' modeling code)
_FROM_BUILD = ("BlockedByPackage", "NoTensorForward", "NonFiniteOutputError", "TinyModel", "build_tiny", "run_eager",
               "tiny_config")

__all__ = ["CatalogEntry", "UnknownModelError", "catalog", "generate_setup", "resolve_models", *_FROM_BUILD]


def __getattr__(name):
    if name in _FROM_BUILD:
        from . import build

        return getattr(build, name)
    if name == "generate_setup":
        from .generate_call import generate_setup

        return generate_setup
    raise AttributeError(f"module 'sweeps.zoo' has no attribute {name!r}")
