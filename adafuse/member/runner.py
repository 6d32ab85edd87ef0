"""A model's weights as the engine runs them: one `Runner` per loaded model, shared by the member of every
example that decodes with it (adafuse/member/member.py).

It holds what is per weights, not per example: the backend of the model's device and the model as that
backend prepared it (adafuse/backend/), the shared prompt prefixes its examples read once (`PromptStore`),
and the ledger of the KV bytes their contexts hold (adafuse/member/cache.py). A request a member yields
(adafuse/member/passes.py) names its runner: the engine groups requests by runner and hands the passes to
the runner's backend.
"""

import torch

from adafuse.backend import Backend, backend_for
from adafuse.member.cache import KVLedger, PromptStore


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
