"""The member: one causal LM as a decoder sees it, for one example: its weights and tokenisation (shared with
every other example's clone of it) and its own context (adafuse/member/context.py).

Decoders (adafuse/methods/adafuse.py, adafuse/methods/greedy.py, baselines/) talk only to this API and never touch tensors
inside a cache. The operations that read tokens are programs (adafuse/member/passes.py): they yield the forward
pass they need and are run with `yield from`; the engine runs the passes.

- `start(prompt, prefix=...)`: set the context to a prompt; its declared shared prefix (the few-shot
  exemplars that all examples of a task share) is read once per model and kept (`prompt_reading`).
- `append_ids(ids, shared, text)`: read ids the model chose itself; the generated text `shared` grows by `text`.
- `fork(n)`: n rows that continue the committed context as one batch (branches, candidates to score).
- `commit(rows, i, shared, text)`: make row i of a fork the committed context, without reading its tokens again.
- `align(shared, text)`, `read(alignments)`, `append_text(shared, text)`: text that another model chose,
  encoded in this model's context with the bounded cut-back of spec §4 (adafuse/text/align.py).

`shared` is always the generated text G before the operation: the session keeps G (adafuse/methods/session.py).
"""

import copy
import functools
import inspect
import logging
from dataclasses import replace

import torch
from transformers import DynamicCache

from adafuse.backend import backend_for
from adafuse.backend.invariance import live_positions, packed_logits
from adafuse.member.cache import GrowingLayer, PromptStore, common_prefix, derive_cache
from adafuse.member.context import Context, Rows
from adafuse.member.passes import Forward, ReadPrompt
from adafuse.text.align import Alignment, Reading, align, last_word_start
from adafuse.text.tokenisation import Tokenisation
from adafuse.text.tokens import TokenBytes

log = logging.getLogger(__name__)


class Member:
    def __init__(self, name: str, tokenizer, model, chat_template: bool = False):
        self.name = name
        self.model = model
        # row tiles, the split attention, the CPU's blocked head (adafuse/backend/__init__.py); once per model
        self.backend = backend_for(model.device)
        self.installed = self.backend.install(model)
        generation_eos = getattr(model.generation_config, "eos_token_id", None)
        vocab = model.get_output_embeddings().weight.shape[0]
        self.tokenisation = Tokenisation(name, tokenizer, vocab, generation_eos, chat_template)
        self.device = model.device
        self.max_positions = getattr(model.config.get_text_config(), "max_position_embeddings", None)
        params = inspect.signature(model.forward).parameters
        # transformers >= 5.24 names the argument `cache`; 5.23 and remote-code models `past_key_values`.
        self.cache_arg = "cache" if "cache" in params else "past_key_values"
        self.body = model.get_decoder()  # the layers under the vocabulary projection (`read_without_logits`)
        self.body_cache_arg = (
            "cache" if "cache" in inspect.signature(self.body.forward).parameters else "past_key_values"
        )
        self._can_keep_last = "logits_to_keep" in params
        self.context = Context()
        self.prompts = PromptStore()  # shared by all clones (see `prompt_reading`)
        self.forward_passes = 0
        self.tokens_fed = 0

    def clone(self) -> "Member":
        """A member over the same weights and tokenisation with a context of its own (one per example in flight)."""
        twin = copy.copy(self)
        twin.context = Context()
        twin.reset_counters()
        return twin

    def release(self) -> None:
        """Drop the context and its cache (a finished example's slot: its cache may be a view that keeps a
        merged buffer alive, and the next example takes its prefix from `prompts`)."""
        self.context = Context()

    def reset_counters(self) -> None:
        self.forward_passes = 0
        self.tokens_fed = 0

    # ---- the tokenisation (adafuse/text/tokenisation.py) ------------------------------------------------

    @property
    def tokenizer(self):
        """The model's tokenizer (the oracles and tests read it; decoders go through the methods below)."""
        return self.tokenisation.tokenizer

    @property
    def detokenizer(self):
        return self.tokenisation.detokenizer

    @property
    def eos_ids(self) -> frozenset[int]:
        return self.tokenisation.eos_ids

    @property
    def control_ids(self) -> frozenset[int]:
        return self.tokenisation.control_ids

    @property
    def tokens(self) -> TokenBytes:
        """Every id's bytes, and which ids may extend a word (adafuse/text/tokens.py: text stays Unicode)."""
        return self.tokenisation.tokens

    @property
    def chat_template(self) -> bool:
        return self.tokenisation.chat_template

    @property
    def eos_token(self) -> str | None:
        return self.tokenisation.eos_token

    @property
    def bos_token(self) -> str | None:
        return self.tokenisation.bos_token

    @property
    def sequence_start_id(self) -> int:
        return self.tokenisation.sequence_start_id

    def render(self, prompt: str) -> str:
        return self.tokenisation.render(prompt)

    def encode(self, text: str, add_special_tokens: bool | None = None) -> list[int]:
        return self.tokenisation.encode(text, add_special_tokens)

    def decode(self, ids: list[int]) -> str:
        return self.tokenisation.decode(ids)

    def encode_text(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self.tokenisation.encode_text(text, add_special_tokens)

    def vocabulary_bytes(self) -> tuple[str, list[bytes | None]]:
        return self.tokenisation.vocabulary_bytes()

    def text_of(self, span: list[int], context: list[int] | None = None) -> str:
        """The text `span` adds after `context` (default: the committed ids)."""
        return self.tokenisation.text_of(span, self.ids if context is None else context)

    @property
    def vocab_size(self) -> int:
        return self.tokenisation.vocab_size

    def input_embeddings(self) -> torch.Tensor:
        """The input embedding matrix, (vocab, hidden); read-only."""
        return self.model.get_input_embeddings().weight.detach()

    def eos_logprob(self, logprobs: torch.Tensor) -> float:
        """Log-probability of the most probable end-of-sequence id (spec §4)."""
        return max(logprobs[e].item() for e in self.eos_ids)

    # ---- the context (adafuse/member/context.py) -----------------------------------------------------------

    @property
    def ids(self) -> list[int]:
        return self.context.ids

    @property
    def cache(self) -> DynamicCache | None:
        return self.context.cache

    @property
    def logprobs(self) -> torch.Tensor | None:
        return self.context.logprobs

    @property
    def prompt_len(self) -> int:
        return self.context.prompt_len

    @property
    def generated_ids(self) -> list[int]:
        return self.context.generated_ids

    def prompt_ids(self, prompt: str, reserve: int = 0) -> list[int]:
        """The prompt's ids; raises if they leave fewer than `reserve` positions of the model's context."""
        return self.tokenisation.prompt_ids(prompt, reserve, self.max_positions)

    def start(self, prompt: str, reserve: int = 0, mask_control: bool = True, prefix: str = ""):
        """Make `prompt` the context (a program: yields the prompt's read). `prefix`, a start of the prompt that
        other prompts share (a task's instruction and exemplars: `Request.prefix`), is read once and kept for
        them (`prompt_reading`).

        `reserve` is how many more positions decoding may need (see `prompt_ids`). `mask_control=False`
        keeps control tokens in the distribution (`single`, which must equal `generate()`).
        """
        ids = self.prompt_ids(prompt, reserve)
        shared = self.shared_length(prompt, prefix, ids)
        self.forward_passes += 1
        self.tokens_fed += len(ids) - shared
        cache, logits = yield ReadPrompt(self, ids, shared)
        cache = self.growing(cache)
        rendered = self.render(prompt)
        last = logits[0, -1]
        context = Context(ids, cache, None, rendered, len(ids), 0, mask_control, last)
        context.logprobs = self.log_softmax(last, mask_control)
        # A cut-back may re-read the prompt's last word, but never a control token (a chat template's
        # markers) and never the first token, whose logits nothing computes.
        after_control = max((i + 1 for i, t in enumerate(ids) if t in self.control_ids), default=0)
        context.anchor = last_word_start(self.tokenisation, ids, rendered, max(after_control, 1))
        self.context = context

    def back_to_prompt(self, snapshot: Context, mask_control: bool) -> None:
        """Make `snapshot`, this member's context as `start` left it (`Context.snapshot`), the context again,
        its distribution after the prompt under `mask_control` (from the prompt's raw logits)."""
        self.context = replace(snapshot, logprobs=self.log_softmax(snapshot.prompt_logits, mask_control))
        self.context.mask_control = mask_control

    def shared_length(self, prompt: str, prefix: str, ids: list[int]) -> int:
        """How many of the prompt's `ids` belong to its shared `prefix`: the ids they start with of the prompt
        as this model reads it (`render`) cut where `prefix` ends, so a token that spans the cut stays with
        the rest. At least one id is left after them (its logits are the prompt's); 0 without a prefix."""
        if not prefix:
            return 0
        rendered = self.render(prompt)
        at = rendered.find(prompt)  # a chat template wraps the prompt in its markers
        return 0 if at < 0 else min(common_prefix(self.encode(rendered[: at + len(prefix)]), ids), len(ids) - 1)

    def prompt_reading(self, ids: list[int], shared: int = 0) -> tuple[DynamicCache, torch.Tensor, bool]:
        """The cache a read of prompt `ids` starts from, the ids it reads after it, and whether the prefix
        in that cache was read now (a pass of its own, without logits).

        Where a prompt is split depends on the prompt alone, never on what was read before it: a position's
        bits depend on the pass that read it (attention rounds by its number of queries), and a prompt's
        numbers must not depend on the batch or the order of examples. Its first `shared` ids (its declared
        prefix, `shared_length`) are always read in a pass of their own, from nothing, the first time and
        stored (`prompts`), and the rest after them; with no prefix the whole prompt is read from nothing.
        """
        if shared == 0:
            return DynamicCache(), torch.tensor([ids], device=self.device), False
        prefix = ids[:shared]
        stored = self.prompts.get(prefix)
        fresh = stored is None
        if fresh:
            stored = DynamicCache()
            self.read_without_logits(stored, prefix)
            self.prompts.add(prefix, stored)
        return derive_cache(stored, lambda t: t), torch.tensor([ids[shared:]], device=self.device), fresh

    def read_without_logits(self, cache: DynamicCache, ids: list[int]) -> None:
        """Read `ids` into `cache` through the model's body alone (no vocabulary projection): a pass whose
        predictions nobody asks for. Not counted in the example's passes: a shared prefix is read for all."""
        with torch.inference_mode():
            self.body(input_ids=torch.tensor([ids], device=self.device), use_cache=True, **{self.body_cache_arg: cache})

    @staticmethod
    def growing(cache: DynamicCache) -> DynamicCache:
        """A prompt's cache as a context keeps it: layers that grow in place (adafuse/member/cache.py)."""
        if all(isinstance(layer, GrowingLayer) for layer in cache.layers):
            return cache
        return derive_cache(cache, lambda t: t)  # read from an empty cache: the model's own layers

    def feed(self, ids: list[int]):
        """Append ids to the committed context and read them (a program)."""
        cache = self.cache
        logits = yield from self.forward(cache, torch.tensor([ids], device=self.device), last_only=True)
        self.context = replace(self.context, ids=self.ids + list(ids), logprobs=self.log_softmax(logits[0, -1]))

    def append_ids(self, ids: list[int], shared: str, text: str):
        """Read ids this model chose itself (a program); the generated text `shared` grows by `text`."""
        yield from self.feed(ids)
        self.context.anchor = self._last_word_start(shared + text)

    def _last_word_start(self, generated: str) -> int:
        """Where the last word of the context's text starts, once its generated text is `generated`."""
        context = self.context
        return last_word_start(self.tokenisation, context.ids, context.prompt_text + generated, context.anchor)

    # ---- text that another model chose (spec §4) --------------------------------------------------

    def align(self, shared: str, text: str) -> Alignment:
        """How this model reads `text` after its context, whose generated text is `shared` (adafuse/text/align.py)."""
        return align(self.tokenisation, self.context, shared, text)

    def read(self, alignments: list[Alignment]):
        """Read every alignment in one batched forward pass (a program; none if all are empty and need no
        cut-back): a Reading each."""
        n = len(self.ids)
        lowest = min(a.base for a in alignments)
        # A cut-back row must re-read the token before its kept context: its logits predict the first new id.
        start = n if lowest == n else lowest - 1
        rows = self.fork(len(alignments), upto=start)
        inputs = [self.ids[start : a.base] + a.ids for a in alignments]
        step = (yield from rows.extend(inputs)) if any(inputs) else None

        def predicting(row: int, position: int) -> torch.Tensor:
            """The distribution over the token at `position` of row `row`."""
            return self.logprobs if position == start == n else step[row, position - 1 - start]

        readings = []
        for i, a in enumerate(alignments):
            scored = [predicting(i, a.base + j)[t].item() for j, t in enumerate(a.ids) if j >= a.skip]
            readings.append(Reading(a, scored, predicting(i, a.base + len(a.ids)), (rows, i)))
        return readings

    def append_text(self, shared: str, text: str):
        """Advance by `text`, which another model chose (a program): align, read and commit it."""
        (reading,) = yield from self.read([self.align(shared, text)])
        self.commit(*reading.home, shared, text)
        return reading

    # ---- forks ----------------------------------------------------------------------------------

    def fork(self, n: int, upto: int | None = None) -> Rows:
        """n rows continuing the committed ids[:upto] (default: all of them); they share its KV."""
        upto = len(self.ids) if upto is None else upto
        last = self.logprobs if upto == len(self.ids) else None
        return Rows(self, self.ids[:upto], self.context.forked_cache(n, upto), n, last)

    def commit(self, rows: Rows, row: int, shared: str, text: str) -> None:
        """The context becomes row `row` of a fork, whose tokens have been read; the generated text `shared`
        grows by `text`."""
        if rows.last[row] is None:
            raise AssertionError(f"model {self.name!r}: row {row} has not been read")
        ids = rows.prefix + rows.tokens[row]
        self.context = self.context.committed(ids, rows.cache_of_row(row), rows.last[row], self.context.anchor)
        self.context.anchor = self._last_word_start(shared + text)

    def check_invariant(self) -> None:
        self.context.check_invariant(self.name)

    # ---- passes ---------------------------------------------------------------------------------

    def forward(self, cache, input_ids: torch.Tensor, last_only=False, lengths=None, logprobs=False):
        """A program: the pass `Forward` describes, counted as this example's (see `Forward` for its result)."""
        self.forward_passes += 1
        self.tokens_fed += input_ids.numel()
        return (yield Forward(self, cache, input_ids, last_only, lengths, logprobs))

    def log_softmax(self, logits: torch.Tensor, mask_control: bool | None = None, owned: bool = False) -> torch.Tensor:
        """Log-softmax over the vocabulary (last dim), control tokens removed when masking is on (spec §2):
        the context's setting unless `mask_control` says otherwise. `owned`: nothing else reads `logits` (a
        pass's own output), so the control tokens are set in place rather than in a copy of every logit."""
        mask = self.context.mask_control if mask_control is None else mask_control
        if mask and self.control_ids:
            index = self.tokenisation.control_index(logits.device)
            if owned:
                with torch.inference_mode():  # a pass's logits are inference tensors: written in its mode
                    logits.index_fill_(-1, index, float("-inf"))
            else:
                logits = logits.index_fill(-1, index, float("-inf"))
        return torch.log_softmax(logits, dim=-1)

    @torch.inference_mode()
    def forward_alone(
        self, cache: DynamicCache, input_ids: torch.Tensor, last_only: bool = False, lengths: list[int] | None = None
    ) -> torch.Tensor:
        """One forward pass of this member's rows only.

        `last_only` computes the vocabulary projection for the last position alone (length 1): a
        1,400-token prompt would otherwise materialise 1.5 GB of logits with a 262k vocabulary.
        `lengths`: only the first lengths[i] positions of row i are computed by the linear layers, and
        their logits are returned packed, (sum(lengths), vocab) (adafuse/backend/invariance.py `live_positions`).
        """
        kwargs = {self.cache_arg: cache}
        if last_only and self._can_keep_last:
            kwargs["logits_to_keep"] = 1
        width = input_ids.shape[1]
        with live_positions(lengths, width, self.device):
            logits = self.model(input_ids=input_ids, use_cache=True, **kwargs).logits
        return logits.float() if lengths is None else packed_logits(logits, lengths, width).float()

    @functools.cached_property
    def kv_bytes_per_token(self) -> int:
        """Bytes of keys and values one token takes in the cache, over all layers (the planner reads it for
        every request: computed once per member, and kept by its clones)."""
        text = self.model.config.get_text_config()
        heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        return 2 * text.num_hidden_layers * heads * head_dim * self.model.dtype.itemsize
