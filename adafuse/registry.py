"""A registry is a mapping of name -> object, filled by a decorator or, lazily, by a packaging
entry-point group (loaded on first lookup, so the package that reads a registry never imports the
packages that add to it), and whose misses explain themselves."""

from collections.abc import Callable, Iterator, Mapping
from importlib.metadata import EntryPoint, entry_points

from adafuse.errors import UnknownNameError


class Registry(Mapping):
    """`REG = Registry("task")`; `@REG.register("nq")` adds an entry; `REG["nq"]` looks one up.

    With `entry_points="group"`, the group's entry points are entries too, each loaded when it is
    first looked up.
    """

    def __init__(self, kind: str, entry_points: str | None = None):
        self.kind = kind
        self.group = entry_points
        self._loaded: dict[str, object] = {}
        self._points: dict[str, EntryPoint] | None = None

    def _lazy(self) -> dict[str, EntryPoint]:
        if self._points is None:
            self._points = {p.name: p for p in entry_points(group=self.group)} if self.group else {}
        return self._points

    def register(self, name: str) -> Callable:
        def add(obj):
            if name in self:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._loaded[name] = obj
            return obj

        return add

    def __getitem__(self, name: str):
        if name not in self._loaded:
            point = self._lazy().get(name)
            if point is None:
                raise UnknownNameError(self.kind, name, list(self))
            self._loaded[name] = point.load()
        return self._loaded[name]

    def __contains__(self, name) -> bool:
        return name in self._loaded or name in self._lazy()

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys([*self._loaded, *self._lazy()]))

    def __len__(self) -> int:
        return len(dict.fromkeys([*self._loaded, *self._lazy()]))
