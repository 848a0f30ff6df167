"""Throwaway patch targets for tests/test_registry.py (resolved by dotted path ``tests._targets.*``)."""

CALLS: list[str] = []


def plain(x):
    return x + 1


class Base:
    def method(self, x):
        return ("base", x)

    @staticmethod
    def static(x):
        return ("static", x)

    @classmethod
    def klass(cls, x):
        return (cls.__name__, x)

    def inherited(self, x):
        return ("inherited", x)

    @staticmethod
    def inherited_static(x):
        return ("inherited_static", x)


class Child(Base):
    def own(self, x):
        return ("own", x)


class Holder:
    value = 3


def scale(x):
    return x * 2


def offset(x):
    return x + 1


class UsesTargets:
    """A torch module (built lazily, no torch import at module level) calling patchable functions."""

    @staticmethod
    def build():
        import sys

        import torch

        module = sys.modules[__name__]

        class M(torch.nn.Module):
            def forward(self, x):
                return module.offset(module.scale(x))

        return M().eval()
