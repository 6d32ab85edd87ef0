"""Named exceptions, so a bad input fails early with a message that names the problem."""

import difflib


class AdaFuseError(Exception):
    """Base class of every error this project raises on purpose."""


class ConfigError(AdaFuseError, ValueError):
    """A setting is out of range or inconsistent (e.g. a negative tau, B < 1)."""


class UnknownNameError(ConfigError, KeyError):
    """A registry lookup missed; the message lists close matches and every valid name."""

    def __init__(self, kind: str, name: str, choices):
        choices = sorted(choices)
        close = difflib.get_close_matches(str(name), choices, n=3)
        hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        self.message = f"unknown {kind} {name!r}.{hint} Valid choices: {', '.join(choices)}"
        super().__init__(self.message)

    def __str__(self) -> str:  # KeyError would otherwise print the message with quotes around it
        return self.message


class ModelFileError(AdaFuseError, FileNotFoundError):
    """A model file or directory is missing, unreadable, or does not match its pinned hash."""


class DataError(AdaFuseError, ValueError):
    """A benchmark file is missing, empty, or has a malformed record (the message names file and line)."""


class ContextLengthError(AdaFuseError, ValueError):
    """A prompt does not fit in a model's context window."""


class NumericsError(AdaFuseError, ArithmeticError):
    """A score or margin is NaN or infinite (e.g. a half-precision overflow); names the model and the round."""


class BatchMemoryError(AdaFuseError, MemoryError):
    """A batched forward pass cannot fit in memory; lower batch_size."""


class ShardBusyError(AdaFuseError, RuntimeError):
    """Another process is already decoding this shard of the run directory."""


class ResumeMismatchError(ConfigError):
    """A run directory holds predictions made with other settings, or on another device, dtype or torch
    version: resuming there would mix them in one run. The message says what differs."""


class ResultsDirError(AdaFuseError, OSError):
    """The run directory cannot be created or written (a parent that is a file, no permission, a
    read-only file system); raised before any model loads."""


class BackendError(AdaFuseError, RuntimeError):
    """The installed transformers or a model lacks a feature the engine relies on (adafuse/backend/__init__.py); the
    message names what is missing."""
