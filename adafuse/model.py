"""The member wrapper: one causal LM with its tokenizer, its committed token ids and their KV cache.

Decoders (adafuse/decode.py, adafuse/greedy.py, baselines/) talk only to this API and never touch
tensors inside a cache:

- `start(prompt, prefix=...)`: set the context to a prompt; its declared shared prefix (the few-shot
  exemplars that all examples of a task share) is read once and kept (`prompt_reading`).
- `append_ids(ids, text)`: read ids the model chose itself; the generated text grows by `text`.
- `fork(n)`: n rows that continue the committed context as one batch (branches, candidates to score).
- `commit(rows, i, text)`: make row i of a fork the committed context, without reading its tokens again.
- `align(text)`, `read(alignments)`, `append_text(text)`: text that another model chose, encoded in
  this model's context with the bounded cut-back of spec §4 (see `align`).

The cache mechanics under it (views of a cache, the prompts clones share, a fork's `Rows`) live in
adafuse/cache.py.

Invariant: the cache holds exactly the KV of `ids`, and `logprobs` is the next-token distribution
after `ids` (float32 log-softmax; the model's control tokens (spec §2) at -inf unless a method such
as `single` asks for the raw distribution).
"""

import copy
import inspect
import logging
import re
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from adafuse.cache import GrowingLayer, PromptStore, Rows, common_prefix, derive_cache
from adafuse.errors import ConfigError, ContextLengthError, DataError
from adafuse.invariance import live_positions, packed_logits, tile_linear_layers
from adafuse.projection import block_output_projection
from adafuse.tokens import TokenBytes, token_bytes, vocabulary_bytes
from adafuse.words import Detokenizer, ends_inside_char

log = logging.getLogger(__name__)

# The last word of a text (spec §2: whitespace, then non-whitespace), with any whitespace after it.
_LAST_WORD = re.compile(r"\s*\S+\s*$")


@dataclass
class Alignment:
    """Text that another model chose, as this model reads it after its context (see `Member.align`)."""

    base: int  # context ids kept: all of them, or fewer where the boundary re-tokenises
    ids: list[int]  # ids read after the kept context
    skip: int  # leading ids that lie wholly before the text's first character: context, fed but never scored


@dataclass
class Reading:
    """An alignment read in a batch: the log-probability of each scored id, and where its KV lives."""

    alignment: Alignment
    logprobs: list[float]  # log p of alignment.ids[skip:], each in context
    after: torch.Tensor  # the next-token distribution after the last id
    home: tuple["Rows", int]  # the fork row that holds its KV: commit(*home, text) adopts it


class Member:
    def __init__(self, name: str, tokenizer, model, chat_template: bool = False):
        self.name = name
        self.tokenizer = tokenizer
        self.model = model
        block_output_projection(model)  # the same logits, faster on the CPU (adafuse/projection.py)
        tile_linear_layers(model)  # row tiles: a row's bits never depend on its batch (adafuse/invariance.py)
        self.chat_template = chat_template
        self.device = model.device
        self.detokenizer = Detokenizer(tokenizer)
        self.eos_ids = self._eos_ids()
        self.control_ids = self._control_ids()
        self._control_index = torch.tensor(sorted(self.control_ids), dtype=torch.long, device=self.device)
        self.max_positions = getattr(model.config.get_text_config(), "max_position_embeddings", None)
        params = inspect.signature(model.forward).parameters
        # transformers >= 5.24 names the argument `cache`; 5.23 and remote-code models `past_key_values`.
        self.cache_arg = "cache" if "cache" in params else "past_key_values"
        self.body = model.get_decoder()  # the layers under the vocabulary projection (`read_without_logits`)
        self.body_cache_arg = (
            "cache" if "cache" in inspect.signature(self.body.forward).parameters else "past_key_values"
        )
        self._can_keep_last = "logits_to_keep" in params
        if chat_template and not tokenizer.chat_template:
            raise ConfigError(f"model {name!r} has no chat template; set chat_template: false for it")
        self.ids: list[int] = []
        self.cache: DynamicCache | None = None
        self.logprobs: torch.Tensor | None = None
        self.prompt_text = ""  # the prompt as this model reads it (see `render`)
        self.prompt_len = 0  # ids before the first one that carries generated text
        self.text = ""  # the generated text this model has read after its prompt
        self.anchor = 0  # where the last committed word starts in `ids`: a cut-back never reaches before it
        self.mask_control = True
        self.scheduler = None  # adafuse/batching.py merges this member's forward passes with other examples'
        self.slot = None  # this clone's place in a pass's row order: its batch slot, then its member index
        self.prompts = PromptStore()  # shared by all clones (see `start`)
        self.forward_passes = 0
        self.tokens_fed = 0

    def clone(self) -> "Member":
        """A member over the same weights and tokenizer with a context of its own (one per example in flight)."""
        twin = copy.copy(self)
        twin.ids, twin.cache, twin.logprobs = [], None, None
        twin.prompt_text, twin.prompt_len, twin.text, twin.anchor = "", 0, "", 0
        twin.reset_counters()
        return twin

    def release(self) -> None:
        """Drop the context and its cache (a finished example's slot in a batch: its cache may be a view
        that keeps a merged buffer alive, and the next example takes its prefix from `prompts`)."""
        self.ids, self.cache, self.logprobs = [], None, None

    def _eos_ids(self) -> frozenset[int]:
        """The tokenizer's eos id plus any in the generation config (spec §4)."""
        ids = {self.tokenizer.eos_token_id}
        gen_eos = getattr(self.model.generation_config, "eos_token_id", None)
        ids.update(gen_eos if isinstance(gen_eos, list) else [gen_eos])
        ids.discard(None)
        if not ids:
            raise ConfigError(f"model {self.name!r} defines no end-of-sequence token")
        return frozenset(ids)

    def _control_ids(self) -> frozenset[int]:
        """Spec §2: special tokens and added tokens, except whitespace-only ones and the eos ids.

        Gemma's `<start_of_image>` is an added token that is not flagged special, so the special
        list alone would miss it; its added runs of newlines and tabs are text and stay.
        """
        added = {i for i, tok in self.tokenizer.added_tokens_decoder.items() if not tok.content.isspace()}
        return frozenset((added | set(self.tokenizer.all_special_ids)) - self.eos_ids)

    @property
    def vocab_size(self) -> int:
        return self.model.get_output_embeddings().weight.shape[0]

    @property
    def tokens(self) -> TokenBytes:
        """Every id's bytes, and which ids may extend a word (adafuse/tokens.py: text stays Unicode)."""
        return token_bytes(self.tokenizer, self.vocab_size)

    def input_embeddings(self) -> torch.Tensor:
        """The input embedding matrix, (vocab, hidden); read-only."""
        return self.model.get_input_embeddings().weight.detach()

    # ---- tokens ---------------------------------------------------------------------------------

    def render(self, prompt: str) -> str:
        """The prompt as this model reads it: plain text, or wrapped in its own chat template."""
        if not self.chat_template:
            return prompt
        messages = [{"role": "user", "content": prompt}]
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def encode(self, text: str, add_special_tokens: bool | None = None) -> list[int]:
        """`text`'s ids as the tokenizer encodes it (a string that spells a special token becomes it);
        special tokens added as for a prompt unless `add_special_tokens` says otherwise."""
        if add_special_tokens is None:
            # Plain prompts take the tokenizer's default special tokens (Gemma's <bos>); a rendered chat
            # template already holds its own, so adding them again would double the BOS.
            add_special_tokens = not self.chat_template
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def decode(self, ids: list[int]) -> str:
        """`ids` decoded on their own as the tokenizer does by default, special tokens spelled out (what
        a caller of `generate` reads; `text_of` decodes a span in its context, as spec §2 does)."""
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    @property
    def eos_token(self) -> str | None:
        """The tokenizer's end-of-sequence token as text (None where it names none)."""
        return self.tokenizer.eos_token

    @property
    def bos_token(self) -> str | None:
        """The tokenizer's beginning-of-sequence token as text (None where it names none)."""
        return self.tokenizer.bos_token

    @property
    def sequence_start_id(self) -> int:
        """The id a text's log-probability is conditioned on when nothing precedes it: BOS, else EOS
        (as lm_eval's `hf` model does)."""
        tokenizer = self.tokenizer
        return tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id

    def vocabulary_bytes(self) -> tuple[str, list[bytes | None]]:
        """(type, each id's bytes), one per logit column (adafuse/tokens.py `vocabulary_bytes`)."""
        return vocabulary_bytes(self.tokenizer, self.vocab_size)

    def encode_text(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """`text` encoded as text (spec §2): a string that looks like a control token never becomes one.

        `split_special_tokens` covers special tokens; an added token that is not flagged special
        (Gemma's `<table>`) still matches, so it is spelled out: its first character, then the rest.
        """
        ids = self.tokenizer.encode(text, add_special_tokens=add_special_tokens, split_special_tokens=True)
        specials = set(self.tokenizer.all_special_ids) if add_special_tokens else set()
        if not any(i in self.control_ids and i not in specials for i in ids):
            return ids
        spelled = []
        for i in ids:
            if i in self.control_ids and i not in specials:
                content = self.tokenizer.convert_ids_to_tokens(i)
                spelled += self.encode_text(content[0]) + self.encode_text(content[1:])
            else:
                spelled.append(i)
        return spelled

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

    def start(self, prompt: str, reserve: int = 0, mask_control: bool = True, prefix: str = "") -> None:
        """Make `prompt` the context. `prefix`, a start of the prompt that other prompts share (a task's
        instruction and exemplars: `Request.prefix`), is read once and kept for them (`prompt_reading`).

        `reserve` is how many more positions decoding may need (see `prompt_ids`). `mask_control=False`
        keeps control tokens in the distribution (`single`, which must equal `generate()`).
        """
        ids = self.prompt_ids(prompt, reserve)
        shared = self.shared_length(prompt, prefix, ids)
        self.mask_control = mask_control
        self.prompt_text = self.render(prompt)
        self.prompt_len = len(ids)
        self.text = ""
        if self.scheduler is not None:  # it reads the prompt when the pass runs (see `read_prompt`)
            logits = self.scheduler.read_prompt(self, ids, shared)
        else:
            logits = self.read_prompt(ids, shared)
        self.logprobs = self._log_softmax(logits[0, -1])
        # A cut-back may re-read the prompt's last word, but never a control token (a chat template's
        # markers) and never the first token, whose logits nothing computes.
        after_control = max((i + 1 for i, t in enumerate(ids) if t in self.control_ids), default=0)
        self.anchor = self._last_word_start(max(after_control, 1))

    def shared_length(self, prompt: str, prefix: str, ids: list[int]) -> int:
        """How many of the prompt's `ids` belong to its shared `prefix`: the ids they start with of the prompt
        as this model reads it (`render`) cut where `prefix` ends, so a token that spans the cut stays with
        the rest. At least one id is left after them (its logits are the prompt's); 0 without a prefix."""
        if not prefix:
            return 0
        rendered = self.render(prompt)
        at = rendered.find(prompt)  # a chat template wraps the prompt in its markers
        return 0 if at < 0 else min(common_prefix(self.encode(rendered[: at + len(prefix)]), ids), len(ids) - 1)

    def read_prompt(self, ids: list[int], shared: int = 0) -> torch.Tensor:
        """Make `ids` the context and the cache theirs, the first `shared` ids read as a stored prefix
        (`prompt_reading`); returns the last position's logits."""
        cache, tail, _ = self.prompt_reading(ids, shared)
        return self.read_prompt_tail(ids, cache, tail)

    def read_prompt_tail(self, ids: list[int], cache: DynamicCache, tail: torch.Tensor) -> torch.Tensor:
        """Read a prompt's `prompt_reading` in a pass of its own: the last position's logits."""
        logits = self.forward_alone(cache, tail, last_only=True)
        self.took_prompt(ids, cache)
        return logits

    def prompt_reading(self, ids: list[int], shared: int = 0) -> tuple[DynamicCache, torch.Tensor, bool]:
        """The cache a read of prompt `ids` starts from, the ids it reads after it, and whether the prefix
        in that cache was read now (a pass of its own, without logits).

        Where a prompt is split depends on the prompt alone, never on what was read before it: a position's
        bits depend on the pass that read it (attention rounds by its number of queries), and a prompt's
        numbers must not depend on the batch or the order of examples. Its first `shared` ids (its declared
        prefix, `shared_length`) are always read in a pass of their own, from nothing, the first time and
        stored (`prompts`), and the rest after them; with no prefix the whole prompt is read from nothing.
        """
        self.forward_passes += 1
        self.tokens_fed += len(ids) - shared
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

    def took_prompt(self, ids: list[int], cache: DynamicCache) -> None:
        """`cache`, a `prompt_reading` cache now holding all of `ids`, becomes the context's."""
        if not all(isinstance(layer, GrowingLayer) for layer in cache.layers):
            # read from an empty cache: the model's own layers, from here on growing in place (cache.py)
            cache = derive_cache(cache, lambda t: t)
        self.cache = cache
        self.ids = list(ids)

    def feed(self, ids: list[int]) -> None:
        """Append ids to the committed context and read them."""
        logits = self._forward(self.cache, torch.tensor([ids], device=self.device), last_only=True)
        self.ids = self.ids + list(ids)
        self.logprobs = self._log_softmax(logits[0, -1])

    def append_ids(self, ids: list[int], text: str) -> None:
        """Read ids this model chose itself; the generated text grows by `text` (what they decode to)."""
        self.feed(ids)
        self.text += text
        self.anchor = self._last_word_start(self.anchor)

    def reset_counters(self) -> None:
        self.forward_passes = 0
        self.tokens_fed = 0

    def _last_word_start(self, lowest: int) -> int:
        """The index of the token that holds the first character of the text's last word (spec §2),
        scanning back from the end no further than `lowest`."""
        whole = self.prompt_text + self.text
        last = _LAST_WORD.search(whole)
        length = len(whole) - last.start() if last else len(whole)
        for i in range(len(self.ids) - 1, lowest - 1, -1):
            if len(self.text_of(self.ids[i:], self.ids[:i])) >= length:
                return i
        return lowest

    # ---- text that another model chose (spec §4) --------------------------------------------------

    def align(self, text: str) -> Alignment:
        """How this model reads `text` after its context, as text, in context.

        The rule: encode (prompt + generated text + `text`) and keep the longest common prefix with
        the context ids. Usually that is the whole context and the ids after it carry `text`. Where
        the boundary re-tokenises ("\n" + "\n" into "\n\n", a prompt that ends in a space), the
        context is cut back to the common prefix and re-read. The cut-back never reaches before the
        start of the last committed word (`anchor`): where the full encoding departs from the context
        earlier (the context holds this model's own, non-canonical ids, or a chat template's control
        tokens), the text from the anchor on plus `text` is encoded on its own, after ids[:anchor].
        Either way, the ids re-read are bounded by `text` plus the last committed word. Tokens that
        lie wholly before `text`'s first character are `skip`: fed, never scored.
        """
        encoded = self.encode_text(self.prompt_text + self.text + text, add_special_tokens=not self.chat_template)
        keep = common_prefix(encoded, self.ids)
        if keep >= self.anchor:
            new = encoded[keep:]
        else:
            window = self.text_of(self.ids[self.anchor :], self.ids[: self.anchor])
            encoded = self.encode_text(window + text)
            common = common_prefix(encoded, self.ids[self.anchor :])
            keep, new = self.anchor + common, encoded[common:]
        reread = self.text_of(self.ids[keep:], self.ids[:keep])
        skip = 0
        while skip < len(new) and reread:
            covered = self.text_of(new[: skip + 1], self.ids[:keep])
            if len(covered) > len(reread) or not reread.startswith(covered) or ends_inside_char(covered):
                break
            skip += 1
        return Alignment(keep, new, skip)

    def read(self, alignments: list[Alignment]) -> list[Reading]:
        """Read every alignment in one batched forward pass (none if all are empty and need no cut-back)."""
        n = len(self.ids)
        lowest = min(a.base for a in alignments)
        # A cut-back row must re-read the token before its kept context: its logits predict the first new id.
        start = n if lowest == n else lowest - 1
        rows = self.fork(len(alignments), upto=start)
        inputs = [self.ids[start : a.base] + a.ids for a in alignments]
        step = rows.extend(inputs) if any(inputs) else None

        def predicting(row: int, position: int) -> torch.Tensor:
            """The distribution over the token at `position` of row `row`."""
            return self.logprobs if position == start == n else step[row, position - 1 - start]

        readings = []
        for i, a in enumerate(alignments):
            scored = [predicting(i, a.base + j)[t].item() for j, t in enumerate(a.ids) if j >= a.skip]
            readings.append(Reading(a, scored, predicting(i, a.base + len(a.ids)), (rows, i)))
        return readings

    def append_text(self, text: str) -> Reading:
        """Every model advances by `text`: align, read and commit it."""
        (reading,) = self.read([self.align(text)])
        self.commit(*reading.home, text)
        return reading

    # ---- forks ----------------------------------------------------------------------------------

    def fork(self, n: int, upto: int | None = None) -> "Rows":
        """n rows continuing the committed ids[:upto] (default: all of them); they share its KV."""
        upto = len(self.ids) if upto is None else upto
        return Rows(self, self.ids[:upto], derive_cache(self.cache, lambda t: t[:, :, :upto].expand(n, -1, -1, -1)), n)

    def commit(self, rows: "Rows", row: int, text: str) -> None:
        """The context becomes row `row` of a fork, whose tokens have been read; the generated text grows by `text`."""
        ids = rows.prefix + rows.tokens[row]
        if rows.last[row] is None:
            raise AssertionError(f"model {self.name!r}: row {row} has not been read")
        kept = common_prefix(self.ids, ids)
        self.ids, self.cache, self.logprobs = ids, rows.cache_of_row(row), rows.last[row]
        self.prompt_len = min(self.prompt_len, kept)  # a cut-back into the prompt: its last token now carries output
        self.text += text
        self.anchor = self._last_word_start(self.anchor)

    def check_invariant(self) -> None:
        length = self.cache.get_seq_length()
        if length != len(self.ids):
            raise AssertionError(
                f"model {self.name!r}: cache holds {length} tokens but the context has {len(self.ids)}"
            )

    def _log_softmax(self, logits: torch.Tensor) -> torch.Tensor:
        """Log-softmax over the vocabulary (last dim), control tokens removed when masking is on (spec §2)."""
        if self.mask_control and len(self._control_index):
            logits = logits.index_fill(-1, self._control_index, float("-inf"))
        return torch.log_softmax(logits, dim=-1)

    def _forward(
        self,
        cache: DynamicCache,
        input_ids: torch.Tensor,
        last_only: bool = False,
        lengths: list[int] | None = None,
        logprobs: bool = False,
    ) -> torch.Tensor:
        """Logits in float32 for `input_ids` read after the cached tokens; the cache grows by them. Without
        `lengths`, (batch, length, vocab); with them (lengths[i]: the real ids of row i, the rest its right
        padding), (real ids, vocab) in row order, padding never computed (see `forward_alone`). With
        `logprobs`, their `_log_softmax`. With a scheduler attached (adafuse/batching.py), the pass is merged
        with other examples' passes over the same weights, and the log-softmax is taken where the pass ran."""
        self.forward_passes += 1
        self.tokens_fed += input_ids.numel()
        if self.scheduler is not None:
            return self.scheduler.forward(self, cache, input_ids, last_only, lengths, logprobs)
        logits = self.forward_alone(cache, input_ids, last_only, lengths)
        return self._log_softmax(logits) if logprobs else logits

    @torch.inference_mode()
    def forward_alone(
        self, cache: DynamicCache, input_ids: torch.Tensor, last_only: bool = False, lengths: list[int] | None = None
    ) -> torch.Tensor:
        """One forward pass of this member's rows only.

        `last_only` computes the vocabulary projection for the last position alone (length 1): a
        1,400-token prompt would otherwise materialise 1.5 GB of logits with a 262k vocabulary.
        `lengths`: only the first lengths[i] positions of row i are computed by the linear layers, and
        their logits are returned packed, (sum(lengths), vocab) (adafuse/invariance.py `live_positions`).
        """
        kwargs = {self.cache_arg: cache}
        if last_only and self._can_keep_last:
            kwargs["logits_to_keep"] = 1
        width = input_ids.shape[1]
        with live_positions(lengths, width, self.device):
            logits = self.model(input_ids=input_ids, use_cache=True, **kwargs).logits
        return logits.float() if lengths is None else packed_logits(logits, lengths, width).float()

    def kv_bytes_per_token(self) -> int:
        """Bytes of keys and values one token takes in the cache, over all layers."""
        text = self.model.config.get_text_config()
        heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        return 2 * text.num_hidden_layers * heads * head_dim * self.model.dtype.itemsize
