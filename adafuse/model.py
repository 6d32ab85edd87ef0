"""The member wrapper: one causal LM with its tokenizer, its committed token ids and their KV cache.

Decoders (adafuse/decode.py, adafuse/greedy.py, baselines/) talk only to this API and never touch
tensors inside a cache:

- `start(prompt)`: set the context to a prompt, reusing every cached token it shares with the
  previous context (the few-shot prefix that all examples of a task share is read once).
- `feed(ids)`: append ids to the committed context.
- `fork(n)`: n rows that continue the committed context as one batch (branches, candidates to score).
- `commit(rows, i)`: make row i of a fork the committed context, without reading its tokens again.

Invariant: the cache holds exactly the KV of `ids`, and `logprobs` is the next-token distribution
after `ids` (float32 log-softmax over the full vocabulary).
"""

import inspect
import logging

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from adafuse.errors import ConfigError, ContextLengthError, DataError
from adafuse.words import Detokenizer

log = logging.getLogger(__name__)


def _derive(cache: DynamicCache, view) -> DynamicCache:
    """A new cache whose every key and value tensor, shape (batch, heads, length, head_dim), is `view(tensor)`.

    Views (slices, expand) copy nothing; the next forward pass concatenates onto them anyway.

    All layers are full-length `DynamicLayer`s, also for sliding-window models (Gemma 3): the model
    still applies its window through the attention mask, and a full layer can be cropped anywhere,
    which rolling back a rejected word needs (a sliding layer refuses once the window is full).
    """
    derived = DynamicCache()
    for source in cache.layers:
        layer = DynamicLayer()
        keys, values = view(source.keys), view(source.values)
        layer.lazy_initialization(keys, values)
        layer.keys, layer.values = keys, values
        derived.layers.append(layer)
    return derived


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two id lists (list slices compare in C; bisect on a miss)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class Member:
    def __init__(self, name: str, tokenizer, model, chat_template: bool = False):
        self.name = name
        self.tokenizer = tokenizer
        self.model = model
        self.chat_template = chat_template
        self.device = model.device
        self.detokenizer = Detokenizer(tokenizer)
        self.eos_ids = self._eos_ids()
        self.max_positions = getattr(model.config.get_text_config(), "max_position_embeddings", None)
        params = inspect.signature(model.forward).parameters
        # transformers >= 5.24 names the argument `cache`; 5.23 and remote-code models `past_key_values`.
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        self._can_keep_last = "logits_to_keep" in params
        if chat_template and not tokenizer.chat_template:
            raise ConfigError(f"model {name!r} has no chat template; set chat_template: false for it")
        self.ids: list[int] = []
        self.cache: DynamicCache | None = None
        self.logprobs: torch.Tensor | None = None
        self.prompt_text = ""  # the prompt as this model reads it (see `render`)
        self.prompt_len = 0
        self.forward_passes = 0
        self.tokens_fed = 0

    def _eos_ids(self) -> frozenset[int]:
        """The tokenizer's eos id plus any in the generation config (spec §4)."""
        ids = {self.tokenizer.eos_token_id}
        gen_eos = getattr(self.model.generation_config, "eos_token_id", None)
        ids.update(gen_eos if isinstance(gen_eos, list) else [gen_eos])
        ids.discard(None)
        if not ids:
            raise ConfigError(f"model {self.name!r} defines no end-of-sequence token")
        return frozenset(ids)

    # ---- tokens ---------------------------------------------------------------------------------

    def render(self, prompt: str) -> str:
        """The prompt as this model reads it: plain text, or wrapped in its own chat template."""
        if not self.chat_template:
            return prompt
        messages = [{"role": "user", "content": prompt}]
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def encode(self, text: str) -> list[int]:
        # Plain prompts take the tokenizer's default special tokens (Gemma's <bos>); a rendered chat
        # template already holds its own, so adding them again would double the BOS.
        return self.tokenizer.encode(text, add_special_tokens=not self.chat_template)

    def text_of(self, span: list[int], context: list[int] | None = None) -> str:
        """The text `span` adds after `context` (default: the committed ids)."""
        return self.detokenizer.text(self.ids if context is None else context, span)

    @property
    def generated_ids(self) -> list[int]:
        return self.ids[self.prompt_len :]

    def eos_logprob(self, logprobs: torch.Tensor) -> float:
        """Log-probability of the most probable end-of-sequence id (spec §4)."""
        return max(logprobs[e].item() for e in self.eos_ids)

    # ---- the committed context ------------------------------------------------------------------

    def prompt_ids(self, prompt: str, reserve: int = 0) -> list[int]:
        """The prompt's ids; raises if they leave fewer than `reserve` positions of the model's context."""
        ids = self.encode(self.render(prompt))
        if not ids:
            raise DataError(f"model {self.name!r}: the prompt encodes to no tokens (an empty prompt?)")
        if self.max_positions and len(ids) + reserve > self.max_positions:
            raise ContextLengthError(
                f"model {self.name!r}: a prompt has {len(ids)} tokens and decoding may add {reserve}, "
                f"but the model's context holds {self.max_positions}"
            )
        return ids

    def start(self, prompt: str, reserve: int = 0) -> None:
        """Make `prompt` the context; tokens shared with the previous context are not read again.

        `reserve` is how many more positions decoding may need (see `prompt_ids`).
        """
        ids = self.prompt_ids(prompt, reserve)
        self.prompt_text = self.render(prompt)
        keep = min(common_prefix(self.ids, ids), len(ids) - 1)  # re-read >= 1 token for its logits
        if keep == 0:
            self.cache = DynamicCache()
        else:
            self.cache = _derive(self.cache, lambda t: t[:, :, :keep])
        self.ids = ids[:keep]
        self.prompt_len = len(ids)
        self.feed(ids[keep:])

    def feed(self, ids: list[int]) -> None:
        """Append ids to the committed context and read them."""
        logits = self._forward(self.cache, torch.tensor([ids], device=self.device), last_only=True)
        self.ids = self.ids + list(ids)
        self.logprobs = torch.log_softmax(logits[0, -1], dim=-1)

    def reset_counters(self) -> None:
        self.forward_passes = 0
        self.tokens_fed = 0

    # ---- forks ----------------------------------------------------------------------------------

    def fork(self, n: int, upto: int | None = None) -> "Rows":
        """n rows continuing the committed ids[:upto] (default: all of them); they share its KV."""
        upto = len(self.ids) if upto is None else upto
        return Rows(self, self.ids[:upto], _derive(self.cache, lambda t: t[:, :, :upto].expand(n, -1, -1, -1)), n)

    def commit(self, rows: "Rows", row: int) -> None:
        """The committed context becomes row `row` of a fork, whose tokens have already been read."""
        self.ids, self.cache, self.logprobs = rows.prefix + rows.tokens[row], rows.cache_of_row(row), rows.last[row]

    def check_invariant(self) -> None:
        length = self.cache.get_seq_length()
        if length != len(self.ids):
            raise AssertionError(
                f"model {self.name!r}: cache holds {length} tokens but the context has {len(self.ids)}"
            )

    @torch.inference_mode()
    def _forward(self, cache: DynamicCache, input_ids: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """Logits (batch, length, vocab) in float32 for `input_ids` read after the cached tokens.

        `last_only` computes the vocabulary projection for the last position alone (length 1): a
        1,400-token prompt would otherwise materialise 1.5 GB of logits with a 262k vocabulary.
        """
        kwargs = {self._cache_arg: cache}
        if last_only and self._can_keep_last:
            kwargs["logits_to_keep"] = 1
        out = self.model(input_ids=input_ids, use_cache=True, **kwargs)
        self.forward_passes += 1
        self.tokens_fed += input_ids.numel()
        return out.logits.float()


class Rows:
    """A batch of continuations of one shared prefix, read together.

    Row i's context is `prefix + tokens[i]`. Rows are right-padded, so a row that stopped early
    (a finished word, a short candidate) keeps padding after its real tokens; causal attention never
    lets a real token see padding, and `cache_of_row` crops it away.
    """

    def __init__(self, member: Member, prefix: list[int], cache: DynamicCache, n: int):
        self.member = member
        self.prefix = prefix
        self.cache = cache
        self.tokens: list[list[int]] = [[] for _ in range(n)]
        self.last: list[torch.Tensor | None] = [member.logprobs if len(prefix) == len(member.ids) else None] * n
        self.width = 0  # positions read after the prefix, padding included

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, new: list[list[int]]) -> torch.Tensor:
        """Read `new[i]` after row i; returns log-probabilities (rows, longest, vocab) at each new position.

        A row that gets tokens must not have stopped early before (it would read after its padding).
        """
        longest = max(len(t) for t in new)
        for i, t in enumerate(new):
            if t and len(self.tokens[i]) != self.width:
                raise AssertionError(f"row {i} stopped early and cannot be extended")
        pad = [t + [t[-1] if t else 0] * (longest - len(t)) for t in new]
        logits = self.member._forward(self.cache, torch.tensor(pad, device=self.member.device))
        logprobs = torch.log_softmax(logits, dim=-1)
        for i, t in enumerate(new):
            if t:
                self.tokens[i] = self.tokens[i] + t
                self.last[i] = logprobs[i, len(t) - 1]
        self.width += longest
        return logprobs

    def select(self, rows: list[int]) -> "Rows":
        """New rows that copy the given rows, in that order (beam search); this object stays as it was."""
        index = torch.tensor(rows, device=self.member.device)
        chosen = Rows(self.member, self.prefix, _derive(self.cache, lambda t: t[index]), 0)
        chosen.tokens = [self.tokens[r] for r in rows]
        chosen.last = [self.last[r] for r in rows]
        chosen.width = self.width
        return chosen

    def fork(self, row: int, n: int) -> "Rows":
        """n new rows that continue row `row` (its real tokens, not its padding)."""
        end = len(self.prefix) + len(self.tokens[row])
        view = _derive(self.cache, lambda t: t[row : row + 1, :, :end].expand(n, -1, -1, -1))
        child = Rows(self.member, self.prefix + self.tokens[row], view, n)
        child.last = [self.last[row]] * n
        return child

    def cache_of_row(self, row: int) -> DynamicCache:
        end = len(self.prefix) + len(self.tokens[row])
        return _derive(self.cache, lambda t: t[row : row + 1, :, :end])
