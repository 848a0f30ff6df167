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
