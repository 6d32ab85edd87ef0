"""The member: one causal LM as a decoder sees it, for one example, in three parts: the model's weights as the
engine runs them (`runner`, adafuse/member/runner.py), its tokenisation (`tokenisation`,
adafuse/text/tokenisation.py), both shared with every other example's member of the model, and the example's
own context (`context`, adafuse/member/context.py).

Decoders (adafuse/methods/, baselines/) talk only to this API and never touch tensors inside a cache; they read
the tokenisation through `member.tokenisation`. The operations that read tokens are programs
(adafuse/member/passes.py): they yield the forward pass they need, as data, and are run with `yield from`;
the engine runs the passes.

- `start(prompt, prefix=...)`: set the context to a prompt; its declared shared prefix (the few-shot
  exemplars that all examples of a task share) is read once per model and kept (`prefix_length`).
- `append_ids(ids, generated, text)`: read ids the model chose itself; the generated text grows by `text`.
- `fork(n)`: n rows that continue the committed context as one batch (branches, candidates to score).
- `commit(rows, i, generated, text)`: make row i of a fork the committed context, without reading its tokens again.
- `align(generated, text)`, `read(alignments)`, `append_text(generated, text)`: text that another model chose,
  encoded in this model's context with the bounded cut-back of spec §4 (adafuse/text/align.py).

`generated` is always the generated text G before the operation: the session keeps G (adafuse/methods/session.py).
"""

from dataclasses import replace

import torch
from transformers import DynamicCache

from adafuse.backend import Read
from adafuse.member.context import Context, Reading, Rows
from adafuse.member.passes import Forward, ReadPrompt
from adafuse.member.runner import Runner
from adafuse.text.align import Alignment, align, common_prefix, last_word_start
from adafuse.text.tokenisation import Tokenisation

HOST = torch.device("cpu")


class Member:
    def __init__(self, name: str, tokenizer, model, chat_template: bool = False, backend=None):
        """A member over a model loaded now: its runner (the backend prepares the model; default: the process's
        for the model's device type) and its tokenisation."""
        runner = Runner(name, model, backend)
        generation_eos = getattr(model.generation_config, "eos_token_id", None)
        self._over(runner, Tokenisation(name, tokenizer, runner.vocab_size, generation_eos, chat_template))

    @classmethod
    def over(cls, runner: Runner, tokenisation: Tokenisation) -> "Member":
        """A member of its own (a context, no passes yet) over a runner and a tokenisation that others share."""
        member = cls.__new__(cls)
        member._over(runner, tokenisation)
        return member

    def _over(self, runner: Runner, tokenisation: Tokenisation) -> None:
        self.name = runner.name
        self.runner = runner
        self.tokenisation = tokenisation
        self.model = runner.model  # the weights, as the oracles run them
        self.device = runner.device
        self.context = Context()
        self.forward_passes = 0
        self.tokens_fed = 0

    def clone(self) -> "Member":
        """A member over the same weights and tokenisation with a context of its own (one per example in flight)."""
        return Member.over(self.runner, self.tokenisation)

    def release(self) -> None:
        """Drop the context and its cache (a finished example's slot)."""
        self.context = Context()

    def reset_counters(self) -> None:
        self.forward_passes = 0
        self.tokens_fed = 0

    def text_of(self, span: list[int], context: list[int] | None = None) -> str:
        """The text `span` adds after `context` (default: the committed ids)."""
        return self.tokenisation.text_of(span, self.ids if context is None else context)

    def eos_logprob(self, logprobs: torch.Tensor) -> float:
        """Log-probability of the most probable end-of-sequence id (spec §4)."""
        return max(logprobs[e].item() for e in self.tokenisation.eos_ids)

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
        return self.tokenisation.prompt_ids(prompt, reserve, self.runner.max_positions)

    def start(self, prompt: str, reserve: int = 0, mask_control: bool = True, prefix: str = ""):
        """Make `prompt` the context (a program: yields the prompt's read). `prefix`, a start of the prompt that
        other prompts share (a task's instruction and exemplars: `Request.prefix`), is read once and kept for
        them (`prefix_length`).

        `reserve` is how many more positions decoding may need (see `prompt_ids`). `mask_control=False`
        keeps control tokens in the distribution (`single`, which must equal `generate()`).
        """
        ids = self.prompt_ids(prompt, reserve)
        prefix_length = self.prefix_length(prompt, prefix, ids)
        self.forward_passes += 1
        self.tokens_fed += len(ids) - prefix_length
        cache, logits = yield ReadPrompt(self.runner, ids, prefix_length, reserve)
        rendered = self.tokenisation.render(prompt)
        last = logits[0, -1]
        context = Context(ids, cache, None, rendered, len(ids), 0, mask_control, last)
        context.logprobs = self.log_softmax(last, mask_control)
        # A cut-back may re-read the prompt's last word, but never a control token (a chat template's
        # markers) and never the first token, whose logits nothing computes.
        after_control = max((i + 1 for i, t in enumerate(ids) if t in self.tokenisation.control_ids), default=0)
        context.anchor = last_word_start(self.tokenisation, ids, rendered, max(after_control, 1))
        self.context = context

    def back_to_prompt(self, snapshot: Context, mask_control: bool) -> None:
        """Make `snapshot`, this member's context as `start` left it (`Context.snapshot`), the context again,
        its distribution after the prompt under `mask_control` (from the prompt's raw logits)."""
        self.context = replace(snapshot, logprobs=self.log_softmax(snapshot.prompt_logits, mask_control))
        self.context.mask_control = mask_control

    def prefix_length(self, prompt: str, prefix: str, ids: list[int]) -> int:
        """How many of the prompt's `ids` belong to its shared `prefix`: the ids they start with of the prompt
        as this model reads it (`render`) cut where `prefix` ends, so a token that spans the cut stays with
        the rest. At least one id is left after them (its logits are the prompt's); 0 without a prefix.

        Where a prompt is split depends on the prompt alone, never on what was read before it: a position's bits
        depend on the pass that read it, and a prompt's numbers must not depend on the batch or the order of
        examples. The prefix is read in a pass of its own, from nothing, the first time any prompt asks for it,
        and kept (the runner's `prompts`); the rest is read after it."""
        if not prefix:
            return 0
        tokenisation = self.tokenisation
        rendered = tokenisation.render(prompt)
        at = rendered.find(prompt)  # a chat template wraps the prompt in its markers
        if at < 0:
            return 0
        return min(common_prefix(tokenisation.encode_prompt(rendered[: at + len(prefix)]), ids), len(ids) - 1)

    def feed(self, ids: list[int]):
        """Append ids to the committed context and read them (a program)."""
        cache = self.cache
        logits = yield from self.forward(cache, torch.tensor([ids]), last_only=True)
        self.context = replace(self.context, ids=self.ids + list(ids), logprobs=self.log_softmax(logits[0, -1]))

    def append_ids(self, ids: list[int], generated: str, text: str):
        """Read ids this model chose itself (a program); the generated text `generated` grows by `text`."""
        yield from self.feed(ids)
        self.context.anchor = self._last_word_start(generated + text)

    def _last_word_start(self, generated: str) -> int:
        """Where the last word of the context's text starts, once its generated text is `generated`."""
        context = self.context
        return last_word_start(self.tokenisation, context.ids, context.prompt_text + generated, context.anchor)

    # ---- text that another model chose (spec §4) --------------------------------------------------

    def align(self, generated: str, text: str) -> Alignment:
        """How this model reads `text` after its context, whose generated text is `generated`
        (adafuse/text/align.py)."""
        return align(self.tokenisation, self.context, generated, text)

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

    def append_text(self, generated: str, text: str):
        """Advance by `text`, which another model chose (a program): align, read and commit it."""
        (reading,) = yield from self.read([self.align(generated, text)])
        self.commit(*reading.home, generated, text)
        return reading

    # ---- forks ----------------------------------------------------------------------------------

    def fork(self, n: int, upto: int | None = None) -> Rows:
        """n rows continuing the committed ids[:upto] (default: all of them); they share its KV."""
        upto = len(self.ids) if upto is None else upto
        last = self.logprobs if upto == len(self.ids) else None
        return Rows(self, self.ids[:upto], self.context.forked_cache(n, upto), n, last)

    def commit(self, rows: Rows, row: int, generated: str, text: str) -> None:
        """The context becomes row `row` of a fork, whose tokens have been read; the generated text `generated`
        grows by `text`."""
        if rows.last[row] is None:
            raise AssertionError(f"model {self.name!r}: row {row} has not been read")
        ids = rows.prefix + rows.tokens[row]
        self.context = self.context.committed(ids, rows.cache_of_row(row), rows.last[row], self.context.anchor)
        self.context.anchor = self._last_word_start(generated + text)

    def check_invariant(self) -> None:
        self.context.check_invariant(self.name)

    # ---- passes ---------------------------------------------------------------------------------

    def forward(self, cache, input_ids: torch.Tensor, last_only=False, lengths=None, logprobs=False):
        """A program: the pass `Forward` describes, counted as this example's (see `Forward` for its result). With
        `logprobs`, the control tokens are masked where the context masks them (spec §2): their ids go with the
        pass on the host, as its input ids do, and the backend masks them where it computes."""
        self.forward_passes += 1
        self.tokens_fed += input_ids.numel()
        masked = self._control_index(HOST) if logprobs and self.context.mask_control else None
        return (yield Forward(self.runner, Read(cache, input_ids, lengths, last_only, logprobs, masked)))

    def _control_index(self, device: torch.device) -> torch.Tensor | None:
        tokenisation = self.tokenisation
        return tokenisation.control_index(device) if tokenisation.control_ids else None

    def log_softmax(self, logits: torch.Tensor, mask_control: bool | None = None) -> torch.Tensor:
        """Log-softmax over the vocabulary (last dim), control tokens removed when masking is on (spec §2):
        the context's setting unless `mask_control` says otherwise. Computed where the logits are, which need not
        be the model's device (the CUDA backend hands results back on the host)."""
        mask = self.context.mask_control if mask_control is None else mask_control
        index = self._control_index(logits.device) if mask else None
        if index is not None:
            logits = logits.index_fill(-1, index, float("-inf"))
        return torch.log_softmax(logits, dim=-1)
