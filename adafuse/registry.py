"""A registry is a plain dict of name -> object, filled by a decorator, whose misses explain themselves."""

from collections.abc import Callable

from adafuse.errors import UnknownNameError


class Registry(dict):
    """`REG = Registry("task")`; `@REG.register("nq")` adds an entry; `REG["nq"]` looks one up."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind

    def register(self, name: str) -> Callable:
        def add(obj):
            if name in self:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self[name] = obj
            return obj

        return add

    def __missing__(self, name):
        raise UnknownNameError(self.kind, name, self.keys())
