"""How a pass calls a prepared model, whichever backend runs it: what a backend's `prepare` leaves (`prepared_for`),
a read in a pass of its own (`alone_pass`), a prompt's shared prefix through the model's body (`prefix_pass`) and a
read's result from its logits (`finish`). (The memory a device has free is the backend interface's default.)"""

import inspect
import weakref
from dataclasses import replace

import torch

from adafuse.backend.forward import ForwardContext, forward_context
from adafuse.backend.install import route_attention
from adafuse.backend.interface import Pass, Prepared, Read
from adafuse.backend.live import on_device, packed_logits, padded_rows


def prepared_for(model) -> Prepared:
    """How a pass calls `model`, once its backend has installed what it changes in it (its attention routed through
    the per-request wrapper where it can be: adafuse/backend/install.py)."""
    params = inspect.signature(model.forward).parameters
    body = model.get_decoder()
    return Prepared(
        model=model,
        device=model.device,
        # transformers >= 5.24 names the argument `cache`; 5.23 and remote-code models `past_key_values`
        cache_arg="cache" if "cache" in params else "past_key_values",
        body=body,
        body_cache_arg="cache" if "cache" in inspect.signature(body.forward).parameters else "past_key_values",
        keeps_last="logits_to_keep" in params,
        splits_attention=route_attention(model),
    )


def kept_while_used() -> "weakref.WeakValueDictionary[int, Prepared]":
    """A backend's prepared models by id(model), each kept while something uses it (its runner): a backend lives as
    long as the process, and holding them itself would keep every model it ever prepared, so an in-process sweep
    would hold each pair it loaded. A Prepared holds its model, so an id here is never a dead model's."""
    return weakref.WeakValueDictionary()


def prefix_pass(p: Pass, context: ForwardContext) -> list[None]:
    """A PREFIX pass: its one read's ids into its empty cache, through the model's body alone (no logits)."""
    (read,) = p.reads
    with forward_context(context):
        ids = on_device(read.input_ids, p.model.device)
        p.model.body(input_ids=ids, use_cache=True, **{p.model.body_cache_arg: read.cache})
    return [None]


def alone_pass(model: Prepared, read: Read, context: ForwardContext) -> torch.Tensor:
    """One read's float32 logits from a pass of its own. `last_only` makes the vocabulary projection's logits
    for the last position alone (a 1,400-token prompt would otherwise materialise 1.5 GB of logits with a 262k
    vocabulary); `lengths` computes only each row's real ids (adafuse/backend/live.py)."""
    kwargs = {model.cache_arg: read.cache}
    if read.last_only and model.keeps_last:
        kwargs["logits_to_keep"] = 1
    width = read.input_ids.shape[1]
    live = padded_rows(read.lengths, width, model.device)
    with forward_context(replace(context, live=live)):
        logits = model.model(input_ids=on_device(read.input_ids, model.device), use_cache=True, **kwargs).logits
    return logits.float() if read.lengths is None else packed_logits(logits, read.lengths, width).float()


def finish(read: Read, logits: torch.Tensor) -> torch.Tensor:
    """A read's result from its logits: themselves, or their log-softmax with the `masked` ids at -inf (set in
    place: the pass's own logits, which nothing else reads; the ids, given on the host, moved to the logits)."""
    if not read.logprobs:
        return logits
    if read.masked is not None:
        logits.index_fill_(-1, on_device(read.masked, logits.device), float("-inf"))
    return torch.log_softmax(logits, dim=-1)
