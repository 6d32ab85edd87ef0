"""A model's weights as the engine runs them: one `Runner` per loaded model, shared by the member of every
example that decodes with it (adafuse/member/member.py).

It holds what is per weights, not per example: the backend of the model's device and the model as that
backend prepared it (adafuse/backend/), the shared prompt prefixes its examples read once (`PromptStore`),
and the ledger of the KV bytes their contexts hold (adafuse/member/cache.py). A request a member yields
(adafuse/member/passes.py) names its runner: the engine groups requests by runner and hands the passes to
the runner's backend.

What the engine asks of a runner is below, as a small API: the reads a prompt makes (its stored prefix read in
place, or nothing), what a prompt's read leaves as its context, the prefixes it keeps, and the KV bytes its examples
hold. Nothing outside adafuse/member/ touches the store, the ledger or a cache's layers.
"""

import torch
from transformers import DynamicCache

from adafuse.backend import Backend, Read, backend_for
from adafuse.member.cache import KVLedger, PromptStore, context_cache, fresh_cache, view_cache
from adafuse.member.passes import ReadPrompt


class Runner:
    def __init__(self, name: str, model, backend: Backend | None = None):
        """`backend`: the one to run the model's passes (default: the process's for the model's device type)."""
        self.name = name
        self.model = model
        self.device = model.device
        # what the backend changes in the model, once per model (adafuse/backend/)
        self.backend = backend or backend_for(model.device)
        self.prepared = self.backend.prepare(model)
        text = model.config.get_text_config()
        self.max_positions: int | None = getattr(text, "max_position_embeddings", None)
        self.vocab_size: int = model.get_output_embeddings().weight.shape[0]
        heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        # keys and values of one token over all layers; a pass's own grown view holds one layer's at a time
        self.kv_bytes_per_token = 2 * text.num_hidden_layers * heads * head_dim * model.dtype.itemsize
        self.layers: int = text.num_hidden_layers
        self.prompts = PromptStore()
        self.ledger = KVLedger()

    def input_embeddings(self) -> torch.Tensor:
        """The input embedding matrix, (vocab, hidden); read-only."""
        return self.model.get_input_embeddings().weight.detach()

    def describe(self, exact: bool) -> dict:
        """How its passes run, as its backend says (adafuse/backend/interface.py `Backend.describe`)."""
        return self.backend.describe(self.prepared, exact)

    @property
    def splits_attention(self) -> bool:
        """Can its reads share a packed pass, each attending on its own (adafuse/backend/split_pass.py)?"""
        return self.prepared.splits_attention

    # ---- prompts and their shared prefixes ----------------------------------------------------------------

    def prefix_stored(self, request: ReadPrompt) -> bool:
        """Is the prompt's shared prefix (none counts as stored) already read and kept?"""
        return not request.prefix_length or self.prompts.get(request.ids[: request.prefix_length]) is not None

    def prefix_read(self, request: ReadPrompt) -> Read:
        """The read of a prompt's shared prefix, from nothing, through the model's body alone (a prefix pass)."""
        return Read(DynamicCache(), torch.tensor([request.ids[: request.prefix_length]]))

    def keep_prefix(self, request: ReadPrompt, read: Read) -> None:
        """Keep the prefix a prefix pass read, frozen: every prompt that starts with it reads it in place."""
        self.prompts.add(request.ids[: request.prefix_length], context_cache(read.cache, self.ledger, frozen=True))

    def prompt_read(self, request: ReadPrompt) -> Read:
        """A prompt's read: its tail after its stored prefix (read in place, frozen, so the pass writes into a buffer
        of the prompt's own), or the whole prompt from nothing; its last position's logits. The context's buffer
        holds the positions the prompt's method may add (`room`) from the start: the context grows in place."""
        if request.prefix_length:
            cache = view_cache(self.prompts.get(request.ids[: request.prefix_length]), room=request.room)
        else:
            cache = fresh_cache(self.layers, self.ledger, request.room)
        return Read(cache, torch.tensor([request.ids[request.prefix_length :]]), last_only=True)

    def prompt_context(self, request: ReadPrompt, read: Read):
        """The context cache a prompt's read leaves, with the read's result: what `Member.start` receives."""
        return read.cache

    # ---- the KV its examples hold -------------------------------------------------------------------------

    def kv_held(self) -> int:
        """Bytes of KV its examples' contexts and forks hold now (the shared prefixes apart)."""
        return self.ledger.held

    def kv_peak(self) -> int:
        """The most they held at once since `reset_kv_peak`."""
        return self.ledger.peak

    def kv_prefixes(self) -> int:
        """Bytes its stored prompt prefixes hold."""
        return self.ledger.prefixes

    def reset_kv_peak(self) -> None:
        """Count the peak from what is held now (a new run over the same model)."""
        self.ledger.reset_peak()
