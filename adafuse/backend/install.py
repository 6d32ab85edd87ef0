"""What a backend changes in a model, in one place, and how it is taken back.

transformers gives no hook to run a layer another way for one pass, so a backend changes a loaded model twice over:

- a layer's class is swapped for a subclass of its own (`swap`): the row-tiled linear layers and the blocked
  vocabulary projection of the CPU backend (adafuse/backend/cpu/), the kernel-aware linear layers and RMS norms of
  the CUDA backend (adafuse/backend/cuda/layers.py). The module keeps its type (isinstance, deep copies, state
  dicts) and its weights; the subclass reads how to run from the pass's forward context
  (adafuse/backend/forward.py), never from state of its own, and outside any pass it computes what a pass alone
  computes;
- the model's attention is routed through the per-request wrapper (`route_attention`), registered in
  transformers' attention and mask registries under the original's name with our prefix (a registration for the
  process, made once per attention function; the model's setting names it).

Each change is recorded on the model (`_adafuse_installed`), so that `restore` puts the model back as it was
loaded: every swapped class its original, its attention the original implementation. Nothing else in the project
swaps a class or registers with transformers.
"""

from adafuse.backend.attention import PREFIX, wrapped_attention

RECORD = "_adafuse_installed"  # on the model: {module: its original class} and the attention's original name


def _record(model) -> dict:
    if not hasattr(model, RECORD):
        setattr(model, RECORD, {"classes": {}, "attention": None})
    return getattr(model, RECORD)


def swap(model, module, cls: type) -> None:
    """Make `module` (one of `model`'s) an instance of `cls`, a subclass of its class as loaded, which is kept to
    restore. A module already of `cls` stays."""
    classes = _record(model)["classes"]  # keyed by the module itself: a deep copy of the model maps them
    original = classes.get(module, type(module))
    if not issubclass(cls, original):
        raise TypeError(f"{cls.__name__} is not a subclass of {original.__name__}")
    classes[module] = original
    module.__class__ = cls


def route_attention(model) -> bool:
    """Route the model's attention through the per-request wrapper (idempotent); False if its implementation is not
    a registered attention function that can be wrapped (e.g. "eager"): then its reads never share a pass."""
    name = model.config._attn_implementation
    if name.startswith(PREFIX):
        return True
    wrapped = wrapped_attention(name)
    if wrapped is None:
        return False
    _record(model)["attention"] = name
    model.set_attn_implementation(wrapped)
    return True


def restore(model) -> None:
    """Take back every change `swap` and `route_attention` made to `model`."""
    record = getattr(model, RECORD, None)
    if record is None:
        return
    for module, original in record["classes"].items():
        module.__class__ = original
    if record["attention"] is not None:
        model.set_attn_implementation(record["attention"])
    delattr(model, RECORD)
