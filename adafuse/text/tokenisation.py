"""One model's tokenisation: its tokenizer and everything the decoders derive from it, made once per model
and shared by every example that decodes with it.

The word rule reads decoded text, always in context (adafuse/text/words.py `Detokenizer`); text another model
chose is encoded as text, never as a control token (`encode_text`, spec §2); each token's bytes keep the
shared text Unicode (adafuse/text/tokens.py); a model's end-of-sequence ids and control tokens (spec §2, §4)
come from its tokenizer and generation config. Only this module and adafuse/loading/pretrained.py hold a tokenizer.
"""

import functools

import torch
from jinja2 import TemplateError

from adafuse.errors import ConfigError, ContextLengthError, DataError
from adafuse.text.tokens import TokenBytes, vocabulary_bytes
from adafuse.text.words import Detokenizer


class ChatPrompt(str):
    """A chat request's user message, carrying the system message sent before it: text wherever a prompt is text
    (its shared prefix, its checks), and the conversation for each model's own chat template (`render`)."""

    system: str

    def __new__(cls, text: str, system: str = ""):
        prompt = super().__new__(cls, text)
        prompt.system = system
        return prompt


class Tokenisation:
    def __init__(self, name: str, tokenizer, vocab_size: int, generation_eos=None, chat_template: bool = False):
        """`vocab_size`: the width of the model's logits; `generation_eos`: its generation config's eos id(s)."""
        if chat_template and not tokenizer.chat_template:
            raise ConfigError(f"model {name!r} has no chat template; set chat_template: false for it")
        self.name = name
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.chat_template = chat_template
        self.detokenizer = Detokenizer(tokenizer)
        self.eos_ids = self._eos_ids(generation_eos)
        self.control_ids = self._control_ids()
        self._control_index: dict[torch.device, torch.Tensor] = {}
        self._prompts: dict[str, list[int]] = {}  # the prompts in flight and their shared prefixes, as read

    def _eos_ids(self, generation_eos) -> frozenset[int]:
        """The tokenizer's eos id plus any in the generation config (spec §4)."""
        ids = {self.tokenizer.eos_token_id}
        ids.update(generation_eos if isinstance(generation_eos, list) else [generation_eos])
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

    def control_index(self, device: torch.device) -> torch.Tensor:
        """The control ids as a long tensor on `device` (for masking them in a distribution)."""
        if device not in self._control_index:
            ids = sorted(self.control_ids)
            self._control_index[device] = torch.tensor(ids, dtype=torch.long, device=device)
        return self._control_index[device]

    @functools.cached_property
    def tokens(self) -> TokenBytes:
        """Every id's bytes, and which ids may extend a word (adafuse/text/tokens.py: text stays Unicode)."""
        return TokenBytes(self.tokenizer, self.vocab_size)

    def vocabulary_bytes(self) -> tuple[str, list[bytes | None]]:
        """(type, each id's bytes), one per logit column (adafuse/text/tokens.py `vocabulary_bytes`)."""
        return vocabulary_bytes(self.tokenizer, self.vocab_size)

    def render(self, prompt: str) -> str:
        """The prompt as this model reads it: plain text, or wrapped in its own chat template, after the system
        message a ChatPrompt carries. A template that takes no system turn (it raises on one) reads the system
        message as the start of the user's, a blank line before it."""
        if not self.chat_template:
            return prompt
        system = getattr(prompt, "system", "")
        user = [{"role": "user", "content": str(prompt)}]
        if not system:
            return self._template(user)
        try:
            return self._template([{"role": "system", "content": system}, *user])
        except TemplateError:
            return self._template([{"role": "user", "content": f"{system}\n\n{prompt}"}])

    def _template(self, messages: list[dict]) -> str:
        # The answer starts at once: a template with a thinking mode (Qwen3) is told to leave it off; the others
        # never read the variable.
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, enable_thinking=False
        )

    def encode(self, text: str, add_special_tokens: bool | None = None) -> list[int]:
        """`text`'s ids as the tokenizer encodes it (a string that spells a special token becomes it);
        special tokens added as for a prompt unless `add_special_tokens` says otherwise."""
        if add_special_tokens is None:
            # Plain prompts take the tokenizer's default special tokens (Gemma's <bos>); a rendered chat
            # template already holds its own, so adding them again would double the BOS.
            add_special_tokens = not self.chat_template
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    PROMPTS_KEPT = 256  # the prompts in flight, queued and just checked, and their tasks' shared prefixes

    def encode_prompt(self, text: str) -> list[int]:
        """`encode(text)` with the prompt's special tokens, kept: a prompt is checked to fit before it is queued,
        then read, and its task's prefix is split off every prompt of the task; each is tokenised once while it
        is among the last PROMPTS_KEPT (a run that checks more prompts than that before decoding tokenises the
        early ones again when it reads them)."""
        ids = self._prompts.get(text)
        if ids is None:
            if len(self._prompts) >= self.PROMPTS_KEPT:
                self._prompts.clear()
            ids = self._prompts[text] = self.encode(text)
        return list(ids)

    def prompt_ids(self, prompt: str, reserve: int, max_positions: int | None) -> list[int]:
        """The prompt's ids; raises if they leave fewer than `reserve` of the model's `max_positions`."""
        ids = self.encode_prompt(self.render(prompt))
        if not ids:
            raise DataError(f"model {self.name!r}: the prompt encodes to no tokens (an empty prompt?)")
        if max_positions and len(ids) + reserve > max_positions:
            raise ContextLengthError(
                f"model {self.name!r}: a prompt has {len(ids)} tokens and decoding may add {reserve}, "
                f"but the model's context holds {max_positions}"
            )
        return ids

    def decode(self, ids: list[int]) -> str:
        """`ids` decoded on their own as the tokenizer does by default, special tokens spelled out (what
        a caller of `generate` reads; `text_of` decodes a span in its context, as spec §2 does)."""
        return self.tokenizer.decode(ids, skip_special_tokens=False)

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

    def text_of(self, span: list[int], context: list[int]) -> str:
        """The text `span` adds after `context` (spec §2: decoded in context)."""
        return self.detokenizer.text(context, span)

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
