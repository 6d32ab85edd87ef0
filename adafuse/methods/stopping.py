"""Stopping (spec §5), the same for every method: a stop string, end-of-sequence, or the token budget."""

from collections.abc import Iterable

from adafuse.errors import ConfigError


def stop_strings(stop: str | Iterable[str] | None) -> tuple[str, ...]:
    """Stop strings as a tuple: one string is one stop string (not its characters); an empty one is an error."""
    if stop is None:
        return ()
    strings = (stop,) if isinstance(stop, str) else tuple(stop)
    for s in strings:
        if not isinstance(s, str):
            raise ConfigError(f"a stop string must be a string, got {s!r}")
        if not s:
            raise ConfigError("an empty stop string would stop before the first word; remove it")
    return strings


def cut_at_stop(text: str, new: str, stop: tuple[str, ...]) -> tuple[str, bool]:
    """Append `new` to `text`; if a stop string now occurs, cut before its first occurrence."""
    whole = text + new
    start = max(0, len(text) - max((len(s) for s in stop), default=0) + 1)
    hits = [i for i in (whole.find(s, start) for s in stop) if i >= 0]
    return (whole[: min(hits)], True) if hits else (whole, False)


def settled_length(text: str, stop: tuple[str, ...]) -> int:
    """How much of the start of `text` (G so far) no later append can cut: `cut_at_stop` cuts no earlier than
    the longest stop string's length minus one before G's end. All of it without stop strings."""
    return max(0, len(text) - max((len(s) for s in stop), default=1) + 1)


def check_budget(max_new_tokens: int) -> int:
    if max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    return max_new_tokens


def settled_cut(text: str, new: str, stop: tuple[str, ...], final: bool) -> str | None:
    """Where `text + new` is cut (`cut_at_stop`), if a stop string in it already settles that: the cut
    text, else None. With `final=False`, `new` may still grow: the cut is settled only when no text
    appended later can complete a stop string that starts before the one found (stops "XYZ" and "Y"
    after "...XY": a "Z" would move the cut one character earlier)."""
    cut, hit = cut_at_stop(text, new, stop)
    if not hit:
        return None
    if not final:
        whole = text + new
        for s in stop:
            for start in range(max(len(whole) - len(s) + 1, 0), len(cut)):
                if s.startswith(whole[start:]):
                    return None
    return cut
