"""One parse of a GGUF file per conversion (adafuse/loading/pretrained.py converts the bundled models once)."""

import contextlib
import os
import threading

from adafuse.backend import check_transformers

_GGUF_SWAP = threading.Lock()


@contextlib.contextmanager
def shared_gguf_reader():
    """transformers parses the GGUF afresh for the tokenizer, the config and the weights; parsing a 262k
    vocabulary's metadata takes most of a conversion, so the three share one read-only reader. The swap is
    module-wide, so conversions in one process take turns (threads converting two models would otherwise
    restore each other's swap). `check_transformers` checks that transformers imports the reader when a
    checkpoint loads, where the swap reaches it."""
    import gguf

    check_transformers()
    with _GGUF_SWAP:
        original, readers = gguf.GGUFReader, {}

        def shared(path, mode="r"):
            key = (os.fspath(path), mode)
            if key not in readers:
                readers[key] = original(path, mode)
            return readers[key]

        gguf.GGUFReader = shared
        try:
            yield
        finally:
            gguf.GGUFReader = original
