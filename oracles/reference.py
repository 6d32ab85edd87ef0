"""A slow reference AdaFuse, written as plainly as ../shared/spec/adafuse.md reads.

No KV cache and no bookkeeping shared with the fast decoder (adafuse/methods/adafuse.py): every quantity
(next-token distribution, each candidate's NLL) comes from a full forward pass over the whole token
sequence, and text is decoded from the start of the context. It shares only the weights, the
tokenizers and two constants. The tests check the fast decoder against it token for token, and
tools/bench_decode.py times the two side by side.
"""

import re
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from adafuse.text.tokens import vocabulary_bytes
from adafuse.text.words import CHAR_SLACK
from adafuse.text.words import REPLACEMENT as PARTIAL


def _utf8_prefix(data: bytes) -> str:
    """ "complete" (whole characters), "open" (a character unfinished at the end), or "invalid"."""
    try:
        data.decode("utf-8")
        return "complete"
    except UnicodeDecodeError as err:
        return "open" if err.reason == "unexpected end of data" else "invalid"


class LogprobMemo:
    """Remembers the reference's cache-free forward passes across runs, least recently used first out past
    `max_bytes`.

    A pass's log-probability rows are a pure function of the weights, the control tokens (from the
    tokenizer), the ids it reads and the rows it keeps, so an entry is keyed on the model and tokenizer
    objects (by identity, each held by the entry, so that an id is not reused while it is remembered), the
    ids and the number of rows. Keyed on the whole pass, not on each row's prefix: a row is the same
    function of its prefix at any pass length only up to float rounding (the matrix shapes differ), so a
    row served to a pass of another length would make a run's numbers depend on which runs came before
    it. Served only to the very pass that computed it, a run reads what it would compute without the memo,
    bit for bit, in any order. Off unless a caller sets `MEMO` (the test session does: its tests run the
    reference over the same prompts again and again); tools/bench_decode.py times the reference without it.
    """

    def __init__(self, max_bytes: int):
        self.max_bytes, self.bytes, self.hits, self.misses = max_bytes, 0, 0, 0
        self._entries: OrderedDict = OrderedDict()  # key -> (model, tokenizer, rows)

    def get(self, model, tokenizer, ids: tuple[int, ...], last: int) -> torch.Tensor | None:
        """The rows of the pass over `ids` that kept the `last` rows, if it ran before; else None."""
        key = (id(model), id(tokenizer), last, ids)
        entry = self._entries.get(key)
        if entry is None or entry[0] is not model or entry[1] is not tokenizer:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return entry[2]

    def put(self, model, tokenizer, ids: tuple[int, ...], last: int, rows: torch.Tensor) -> None:
        size = rows.numel() * rows.element_size()
        if size > self.max_bytes:
            return
        key = (id(model), id(tokenizer), last, ids)
        stale = self._entries.pop(key, None)  # an entry under a reused id
        if stale is not None:
            self.bytes -= stale[2].numel() * stale[2].element_size()
        self._entries[key] = (model, tokenizer, rows)
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, (_, _, old) = self._entries.popitem(last=False)
            self.bytes -= old.numel() * old.element_size()


MEMO: LogprobMemo | None = None

# Each tokenizer's id -> bytes table, built once: reading a 262k vocabulary takes seconds, and every
# generate() builds fresh RefModels.
_VOCAB_BYTES: "weakref.WeakKeyDictionary[object, list[bytes | None]]" = weakref.WeakKeyDictionary()


def _vocab_bytes(tokenizer, size: int) -> list[bytes | None]:
    table = _VOCAB_BYTES.get(tokenizer)
    if table is None or len(table) != size:
        table = _VOCAB_BYTES[tokenizer] = vocabulary_bytes(tokenizer, size)[1]
    return table


class RefModel:
    def __init__(self, member):
        self.tokenizer = member.tokenisation.tokenizer
        self.model = member.model
        self.chat_template = member.tokenisation.chat_template
        self.eos_ids = member.tokenisation.eos_ids
        self.name = member.name
        added = {i for i, t in self.tokenizer.added_tokens_decoder.items() if t.content.strip() != ""}
        self.control = sorted((added | set(self.tokenizer.all_special_ids)) - set(self.eos_ids))
        self._rows: dict[tuple[int, ...], torch.Tensor] = {}  # prefix -> log p(. | prefix), this run's
        self._bytes = None

    def may_follow(self, word: list[int], token: int) -> bool:
        """Text stays Unicode (README): may `token` extend a word of ids `word` (which starts at a
        character boundary)? Its bytes must leave the word a valid UTF-8 prefix; a token without
        bytes (eos) may only come at a character boundary."""
        if self._bytes is None:
            self._bytes = _vocab_bytes(self.tokenizer, self.model.get_output_embeddings().weight.shape[0])
        before = b"".join(self._bytes[i] or b"" for i in word)
        if self._bytes[token] is None:
            return _utf8_prefix(before) == "complete"
        return _utf8_prefix(before + self._bytes[token]) != "invalid"

    def best(self, logprobs: torch.Tensor, word: list[int], n: int = 1) -> list[int]:
        """The n most probable tokens that may extend `word`, most probable first."""
        k = min(len(logprobs), 8 * n)  # not a sort of the whole 262k vocabulary: most tokens may follow
        while True:
            chosen = [t for t in logprobs.topk(k).indices.tolist() if self.may_follow(word, t)][:n]
            if len(chosen) == n or k == len(logprobs):
                return chosen
            k = min(len(logprobs), 16 * k)

    @torch.inference_mode()
    def logprobs(self, ids: list[int], last: int) -> torch.Tensor:
        """log p(x_{i+1} | x_{<=i}) at the last `last` positions i, from cache-free forward passes.

        Row i depends on ids[:i+1] alone (the models are causal), so a row is computed once per prefix, by
        one forward pass over the whole of the first sequence that asks for it, and then remembered: a
        candidate's NLL reads the rows that generating it computed. Control tokens get probability zero
        (spec §2). Only the vocabulary projection is limited to the rows asked for (a 262k vocabulary over
        a long prompt would take gigabytes); every layer still reads the whole sequence.
        """
        prefixes = [tuple(ids[:i]) for i in range(len(ids) - last + 1, len(ids) + 1)]
        rows = [self._known(prefix) for prefix in prefixes]
        if any(row is None for row in rows):
            fresh = self._pass(ids, last)
            rows = [self._remember(p, new) if row is None else row for p, row, new in zip(prefixes, rows, fresh)]
        return torch.stack(rows)

    def _known(self, prefix: tuple[int, ...]) -> torch.Tensor | None:
        return self._rows.get(prefix)

    def _remember(self, prefix: tuple[int, ...], row: torch.Tensor) -> torch.Tensor:
        row = self._rows[prefix] = row.clone()  # not a view that would keep the whole forward's rows alive
        return row

    def _pass(self, ids: list[int], last: int) -> torch.Tensor:
        """`_forward`, or the same pass's rows from the session's MEMO (LogprobMemo: why whole passes)."""
        if MEMO is None:
            return self._forward(ids, last)
        key = tuple(ids)
        rows = MEMO.get(self.model, self.tokenizer, key, last)
        if rows is None:
            rows = self._forward(ids, last)
            MEMO.put(self.model, self.tokenizer, key, last, rows)
        return rows

    def _forward(self, ids: list[int], last: int) -> torch.Tensor:
        ids_t = torch.tensor([ids], device=self.model.device)
        logits = self.model(input_ids=ids_t, use_cache=False, logits_to_keep=last).logits[0].float()
        logits[:, self.control] = float("-inf")
        return torch.log_softmax(logits, dim=-1)

    def next_logprobs(self, ids: list[int]) -> torch.Tensor:
        return self.logprobs(ids, 1)[-1]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def text(self, context: list[int], span: list[int]) -> str:
        head, whole = self.decode(context), self.decode(context + span)
        common = 0
        while common < min(len(head), len(whole)) and head[common] == whole[common]:
            common += 1
        # Only a partial last character may change (its replacement characters: one, or one per byte).
        assert common >= len(head.rstrip(PARTIAL)), (head[-20:], whole[-20:])
        return whole[common:]

    def render(self, prompt: str) -> str:
        if not self.chat_template:
            return prompt
        chat = [{"role": "user", "content": prompt}]
        return self.tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)

    def encode_prompt(self, prompt: str) -> list[int]:
        return self.tokenizer.encode(self.render(prompt), add_special_tokens=not self.chat_template)

    def encode_text(self, text: str, specials: bool) -> list[int]:
        ids = self.tokenizer.encode(text, add_special_tokens=specials, split_special_tokens=True)
        assert not set(ids) & set(self.control) - set(self.tokenizer.all_special_ids), "a control token in text"
        return ids


@dataclass
class RefWord:
    ids: list[int]
    text: str
    eos: bool
    cut: bool = False


def cut_back(m: RefModel, context: list[int], ids: list[int]) -> RefWord:
    """A word at the hard cap that still ends inside a character: its longest clean prefix."""
    for n in range(len(ids) - 1, 0, -1):
        text = m.text(context, ids[:n])
        if not text.endswith(PARTIAL):
            return RefWord(ids[:n], text, False, cut=True)
    return RefWord(ids, m.text(context, ids), False)


def greedy_word(m: RefModel, context: list[int], first: int, max_tokens: int) -> RefWord:
    """Spec §2: from `first`, append argmax tokens until the word is complete."""
    if first in m.eos_ids:
        return RefWord([], "", True)
    ids = [first]
    while True:
        lp = m.next_logprobs(context + ids)
        nxt = int(lp.argmax())
        if not m.may_follow(ids, nxt):
            (nxt,) = m.best(lp, ids)
        text = m.text(context, ids)
        if nxt in m.eos_ids:
            return RefWord(ids, text, True)
        partial = text.endswith(PARTIAL)
        has_word = text.strip() != "" and not partial
        if has_word and text[-1].isspace():
            return RefWord(ids, text, False)
        if has_word and m.text(context + ids, [nxt])[:1].isspace():
            return RefWord(ids, text, False)
        if len(ids) >= max_tokens and not partial:
            return RefWord(ids, text, False)
        if len(ids) >= max_tokens + CHAR_SLACK:
            return cut_back(m, context, ids)
        ids.append(nxt)


def propose(m: RefModel, context: list[int], cfg) -> list[list[RefWord]]:
    """Spec §3, one model: its candidates, each a list of words."""
    committed: list[RefWord] = []
    here = list(context)
    for _ in range(cfg.fixed_words or cfg.max_words):
        probs = m.next_logprobs(here).exp()
        top = probs.topk(2).values
        delta = (top[0] - top[1]).item()
        if cfg.fixed_words is None and delta < cfg.tau:
            if cfg.diversity or cfg.branches == 1:
                firsts = m.best(m.next_logprobs(here), [], cfg.branches)
                return [committed + [greedy_word(m, here, t, cfg.max_word_tokens)] for t in firsts]
            return [committed + [w] for w in beam_words(m, here, cfg)]
        word = greedy_word(m, here, m.best(m.next_logprobs(here), [])[0], cfg.max_word_tokens)
        committed.append(word)
        here = here + word.ids
        if word.eos or word.cut:
            break
    return [committed]


def beam_words(m: RefModel, context: list[int], cfg) -> list[RefWord]:
    """Word-level beam search (diversity=false), as the fast decoder defines it, without a cache."""
    width = cfg.branches
    live = [([], 0.0)]
    finished = []  # (score, RefWord)
    while live:
        expansions = []
        for h, (ids, score) in enumerate(live):
            lp = m.next_logprobs(context + ids)
            for token in m.best(lp, ids, width):
                expansions.append((score + lp[token].item(), h, token))
        expansions.sort(key=lambda e: -e[0])
        ended, grown = set(), []
        for total, h, token in expansions:
            ids = live[h][0]
            text = m.text(context, ids)
            if token in m.eos_ids:
                boundary = True
            elif ids and text.strip() and not text.endswith(PARTIAL):
                boundary = text[-1].isspace() or m.text(context + ids, [token])[:1].isspace()
            else:
                boundary = False
            if boundary and h not in ended:
                ended.add(h)
                finished.append((total, RefWord(ids, text, token in m.eos_ids)))
            elif not boundary and len(grown) < width:
                grown.append((live[h][0] + [token], total))
        finished.sort(key=lambda f: -f[0])
        best_live = max((total for _, total in grown), default=float("-inf"))
        if not grown or (len(finished) >= width and finished[width - 1][0] >= best_live):
            break
        live = []
        for ids, total in grown:
            text = m.text(context, ids)
            clean = text.strip() and not text.endswith(PARTIAL)
            if clean and text[-1].isspace() or len(ids) >= cfg.max_word_tokens and not text.endswith(PARTIAL):
                finished.append((total, RefWord(ids, text, False)))
            elif len(ids) >= cfg.max_word_tokens + CHAR_SLACK:
                word = cut_back(m, context, ids)
                lp = [m.next_logprobs(context + ids[:j])[t].item() for j, t in enumerate(word.ids)]
                finished.append((sum(lp), word))
            else:
                live.append((ids, total))
    finished.sort(key=lambda f: -f[0])
    return [w for _, w in finished[:width]]


@dataclass
class RefCandidate:
    text: str
    eos: bool
    proposers: list[int] = field(default_factory=list)
    own: dict = field(default_factory=dict)  # model -> ids it generated
    scores: list = field(default_factory=list)  # per model: (base, ids, skip, nll)
    fused: float = 0.0


def nll(m: RefModel, context: list[int], ids: list[int], eos: bool, skip: int = 0) -> float:
    """Mean NLL of `ids[skip:]` after `context` + `ids[:skip]` (+ the most probable eos id), from one
    cache-free forward pass."""
    lp = m.logprobs(context + ids, len(ids) + 1)  # row j predicts the token after context + ids[:j]
    values = [lp[j, t].item() for j, t in enumerate(ids) if j >= skip]
    if eos:
        values.append(max(lp[-1, e].item() for e in m.eos_ids))
    return -sum(values) / len(values)


def common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def last_word_start(m: RefModel, context: list[int], full_text: str, lowest: int) -> int:
    """The token of `context` that holds the first character of `full_text`'s last word."""
    match = re.search(r"\s*\S+\s*$", full_text)
    length = len(full_text) - match.start() if match else len(full_text)
    for i in range(len(context) - 1, lowest - 1, -1):
        if len(m.text(context[:i], context[i:])) >= length:
            return i
    return lowest


def align(m: RefModel, context: list[int], anchor: int, prefix_text: str, candidate: str):
    """Spec §4's in-context encoding with its bounded cut-back: (base, ids, skip)."""
    full = m.encode_text(prefix_text + candidate, specials=not m.chat_template)
    base = common(full, context)
    if base >= anchor:
        new = full[base:]
    else:
        window = m.encode_text(m.text(context[:anchor], context[anchor:]) + candidate, specials=False)
        kept = common(window, context[anchor:])
        base, new = anchor + kept, window[kept:]
    reread = m.text(context[:base], context[base:])
    skip = 0
    while skip < len(new) and reread:
        covered = m.text(context[:base], new[: skip + 1])
        if len(covered) > len(reread) or not reread.startswith(covered) or covered.endswith(PARTIAL):
            break
        skip += 1
    return base, new, skip


def stopped(text: str, stop) -> str | None:
    """`text` cut before the first stop string in it, or None if it holds none."""
    hits = [text.find(s) for s in stop if s in text]
    return text[: min(hits)] if hits else None


class RefRun:
    """One example's shared-text state: each model's context, rendered prompt and anchor (the first
    token a cut-back may reach: the start of the last committed word), and the output text."""

    def __init__(self, members, prompt: str):
        self.models = [RefModel(m) for m in members]
        self.contexts = [m.encode_prompt(prompt) for m in self.models]
        self.prompt_texts = [m.render(prompt) for m in self.models]
        self.prompt_lens = [len(c) for c in self.contexts]
        self.anchors = []
        for m, c, t in zip(self.models, self.contexts, self.prompt_texts):
            after_control = max((i + 1 for i, x in enumerate(c) if x in m.control), default=0)
            self.anchors.append(last_word_start(m, c, t, max(after_control, 1)))
        self.text = ""

    def score(self, cand: RefCandidate) -> None:
        """Append each model's (base, ids, skip, nll) for the candidate: its own ids, else spec §4's alignment."""
        for k, m in enumerate(self.models):
            if k in cand.own:
                base, ids, skip = len(self.contexts[k]), cand.own[k], 0
            else:
                prefix = self.prompt_texts[k] + self.text
                base, ids, skip = align(m, self.contexts[k], self.anchors[k], prefix, cand.text)
            cand.scores.append((base, ids, skip, nll(m, self.contexts[k][:base], ids, cand.eos, skip)))

    def commit(self, best: RefCandidate) -> None:
        self.text += best.text
        for k, m in enumerate(self.models):
            base, ids, _, _ = best.scores[k]
            self.contexts[k] = self.contexts[k][:base] + ids
            self.prompt_lens[k] = min(self.prompt_lens[k], base)
            self.anchors[k] = last_word_start(m, self.contexts[k], self.prompt_texts[k] + self.text, self.anchors[k])

    def outputs(self) -> list[list[int]]:
        """Each model's ids after its prompt: the winners it committed."""
        return [c[n:] for c, n in zip(self.contexts, self.prompt_lens)]

    def ended(self, eos: bool, stop, max_new_tokens: int):
        """(text, each model's output ids) if the run ends after the last commit, else None."""
        outputs = self.outputs()
        cut = stopped(self.text, stop)
        if cut is not None:
            return cut, outputs
        if eos or any(len(o) >= max_new_tokens for o in outputs):
            return self.text, outputs
        return None


class RefResult(NamedTuple):
    text: str
    rounds: list  # each round with a winner: (candidates, winner index)
    ids: list[list[int]]  # each model's output ids
    early_finish: bool  # it ended in a further round whose every candidate cuts G at the same stop


def generate(members, request, cfg, early_finish: bool = True) -> RefResult:
    """Decode a `Request` (adafuse/methods/session.py). `early_finish`: end in a round that would end G at the
    same stop whatever won (adafuse/methods/adafuse.py `RoundEnd`), before scoring it, as the fast decoder does."""
    run, rounds = RefRun(members, request.prompt), []
    while True:
        pool: dict = {}
        for k, m in enumerate(run.models):
            for words in propose(m, run.contexts[k], cfg):
                key = ("".join(w.text for w in words), words[-1].eos)
                cand = pool.setdefault(key, RefCandidate(*key))
                if k not in cand.own:
                    cand.proposers.append(k)
                    cand.own[k] = [i for w in words for i in w.ids]
        pool = list(pool.values())
        # every candidate would end G at the same stop (spec §5): whichever won, G ends there
        cuts = {stopped(run.text + c.text, request.stop) for c in pool}
        if early_finish and len(cuts) == 1 and None not in cuts:
            return RefResult(cuts.pop(), rounds, run.outputs(), True)
        for cand in pool:
            run.score(cand)
            cand.fused = sum(s[3] for s in cand.scores) / len(run.models)
        winner = min(range(len(pool)), key=lambda i: pool[i].fused)
        rounds.append((pool, winner))
        run.commit(pool[winner])
        end = run.ended(pool[winner].eos, request.stop, request.max_new_tokens)
        if end:
            return RefResult(end[0], rounds, end[1], False)
