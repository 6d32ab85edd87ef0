"""`method=adafuse_code`: the AdaFuse authors' released decoder, token for token, with KV caches.

Table 1's numbers come from the authors' scripts (github.com/CCM0111/AdaFuse, commit c7ecc71:
`AdaFuse_two_models.py`, `AdaFuse_three_models.py`, `AdaFuse_four_models.py`), whose loop differs from
the paper's algorithm (`method=adafuse`, ../shared/spec/adafuse.md). This method reproduces what their
scripts output, so that a gap to Table 1 can be put on our code, theirs, the prompts or the scorer.
Their behaviour, rule by rule with line numbers: tests/fixtures/authors_code/BEHAVIOUR.md; the quirks
and the knob that turns each off: docs/protocol.md, "Their quirks". Line numbers below are
`AdaFuse_two_models.py`'s. No line of theirs is copied here.

Knobs, their flags and defaults (ours, theirs):

- `tau` (`--theta_delta`; 0.7, 0.7): a first token is stable when p1 - p2 >= tau.
- `branches` (`--beam_size`; 3, 1): 1 is their path A (no branching, L156-409), > 1 their path B
  (L411-811). Ours is 3 because the paper's runs used B = 3 (its Table 1 setting); their default 1
  never branches, which the paper's method always does at an uncertain word.
- `span_length` (`--span_length`; 1, 4): words in a proposal's first word slot. Their round adds up to
  two more words, so a round holds up to span_length + 2 words; the paper's M = 3 words per round
  implies 1 (with 4 a round could add 6 words).
- `max_rounds` (`--max_span_rounds`; 5, 5): rounds before their loop ends, their only length cap: at
  most 15 words with the defaults, enough for the QA prompts' "no more than 15 words" but not for a
  FLORES sentence or a GSM8K solution. The paper's runs on those must have used more; how many is
  unknown (the recordings use 25 for FLORES), so the default stays theirs.

Their `--max_words`, `--max_new_tokens`, `--max_total_tokens` and `--voting_strategy` are parsed and
never read; they have no knob here. The three- and four-model scripts are path A with `span_length` 1
hard-wired and no `--beam_size`: with K > 2 members, `branches` and `span_length` must be 1 (a
ConfigError says so before any model loads). K >= 5 follows their three/four-model rule (the fused
score is the mean of the models' non-NaN scores); K = 1 has no script and is refused.

Each round (their loop, L963-1102): every model proposes candidates from the shared text (their word
rule: a first token, 6 more greedy tokens, 5 more when the decode has fewer chunks than needed;
words are `str.split()` chunks, the first one skipping pure-punctuation chunks; ids trimmed to the
word by their prefix-decoding rule), the candidates form a pool keyed by text in model order (a model's
later duplicate overwrites its ids), every model scores every entry by mean NLL after the prefix
(its own ids, or `tokenizer(text, add_special_tokens=False)` for another model's: no leading space),
the fused score is the mean of the non-NaN scores (an entry with none is skipped), and the lowest
wins (ties: the earliest entry). The winner is appended after one space, cut at their stop markers.
Their answer rules (stop markers, `pred`) live in baselines/authors_rules.py, which the paper's scorer
replicas share.

What the output is. The Generation's text G is exactly what their loop appends after the prompt (their
`current_prefix` minus the prompt): single spaces between rounds and inside spans, never a newline.
`stats.notes["authors_pred"]` is their `pred` (the text after the last "Answer:" of prompt + G, or G
itself when the prompt has none, as GSM8K's, cut before the first `question:`/`note:`/`<`), and
`stats.notes["authors_stop"]` says what ended their loop ("marker", "boxed", "eos_string", "rounds",
"no_valid_candidates") or ours ("stop_string", "length"). The scorers' `generation_pred(G)` (used
by eval/paper_metrics.py) gives the same pred whenever G holds no `question:`, `note:` or `<` (their
loop lets one in only inside a `\\boxed{...}` span, or in a chunk like `xQuestion:` that their
cutting regex, which needs a word boundary, leaves whole).

The Request's stop strings and budget (their code has neither):
- stop strings cut G and end decoding as for every method. G's only whitespace is the single space
  their join inserts, so the tasks' stop strings (all of which hold a newline) never fire; their own
  markers end answers instead.
- `max_new_tokens` is an extra cap: after a round, once any member reads more than the budget in
  G's tokens (prompt + G re-encoded, minus the prompt's ids), decoding stops (`stop_reason` "length",
  the round's text kept whole, as every method overruns by at most one round). Their defaults end
  after 5 rounds of at most 3 words; the tasks' budgets (32 tokens for QA, 160 FLORES, 256 GSM8K)
  bind only where G passes them before round 5, and `authors_stop` "length" marks every such example.
- `positions_needed` is the budget plus one round: a row of one proposal holds at most 36 tokens
  (three word slots of 12), and another model's candidate, the text of at most 36 of the proposer's
  tokens re-encoded, is allowed twice that, 72 (the recordings' longest is 9 ids).

Fast: every member keeps its KV cache across rounds. Their code re-encodes the whole prefix for every
`generate` call and every score; here each member re-encodes prompt + G once per round and reads only
the ids after the longest prefix the new encoding shares with its context (one fork row, so a
batched run merges it). Within a round a proposal is one fork row per branch, grown greedily one
batched pass per token: a greedy continuation does not depend on where one of their `generate` calls
stopped (their calls on P + first word, P + first word + t2, ... continue one greedy sequence), so
every call of theirs is a prefix of one row, and every margin, beam and own-candidate log-probability
comes from the row that generated it. Other models' candidates are read in one batched pass per model.

Distributions are the models' raw ones (control tokens included, `raw_distribution`), as their
`generate` and scoring use. A generate call stops after the model's eos id (`Member.eos_ids`: the
tokenizer's eos plus the generation config's, the set transformers stops at for every model we ship);
an eos in a call's input stops nothing.
"""

import math
import string
from dataclasses import dataclass, field

import torch

from adafuse.errors import ConfigError
from adafuse.member.context import Rows
from adafuse.member.member import Member
from adafuse.member.passes import together
from adafuse.methods import Method
from adafuse.methods.session import Session
from adafuse.text.align import common_prefix
from baselines.authors_rules import appended_text, loop_pred


@dataclass
class AdaFuseCodeConfig:
    """Knobs of `method=adafuse_code` (their flag in brackets; defaults in the module docstring)."""

    tau: float = 0.7  # [--theta_delta] a first token is stable when p1 - p2 >= tau
    branches: int = 3  # [--beam_size] B: 1 is their path A (no branching), > 1 their path B
    span_length: int = 1  # [--span_length] words in a proposal's first word slot
    max_rounds: int = 5  # [--max_span_rounds] rounds before their loop ends

    def __post_init__(self):
        if not self.tau >= 0:  # also rejects NaN; their negative theta_delta would equal 0 (Δ >= 0 always)
            raise ConfigError(f"adafuse_code: tau must be >= 0 (tau > 1: never stable), got {self.tau}")
        for name in ("branches", "span_length", "max_rounds"):
            if getattr(self, name) < 1:
                raise ConfigError(f"adafuse_code: {name} must be >= 1, got {getattr(self, name)}")


# ---- their constants ------------------------------------------------------------------------------

FIRST_CALL = 6  # greedy tokens after a word slot's first token (their max_new_tokens=6 calls)
EXTENSION = 5  # more greedy tokens when the decode holds too few chunks (their one extension call)
WORD_TOKENS = 1 + FIRST_CALL + EXTENSION  # a word slot's tokens, at most
ROUND_TOKENS = 3 * WORD_TOKENS  # a proposal row: first word, second word, third-word branch
FOREIGN_PER_TOKEN = 2  # positions allowed per proposer token when another model re-encodes its candidate


# ---- their text rules -----------------------------------------------------------------------------


def is_punctuation(text: str) -> bool:
    """Every character is ASCII punctuation (True for ""), their `all(ch in string.punctuation ...)`."""
    return all(ch in string.punctuation for ch in text)


def acceptable(text: str) -> bool:
    """A candidate text they keep (L264-266): not blank and not all punctuation (a space is neither)."""
    return bool(text.strip()) and not is_punctuation(text)


def has_marker(text: str) -> bool:
    """Their extension is skipped when the decode holds one of these (L217)."""
    return "</s>" in text or "question:" in text.lower() or "note:" in text.lower()


def first_word(text: str, span_length: int) -> str:
    """A proposal's first word slot (L245-253): its first `span_length` chunks that are not pure
    punctuation, else its first chunks whatever they are, joined by single spaces."""
    chunks = text.split()
    valid = [w for w in chunks if not is_punctuation(w)]
    return " ".join((valid or chunks)[:span_length])


def trim(m: Member, ids: list[int], target: str) -> list[int]:
    """`extract_word_tokens_from_generated` (L89-144): the shortest prefix of `ids` whose stripped decode
    is `target` (any case); else the longest whose decode is a prefix of it; else all `ids`. A prefix
    whose decode runs past the target ends the search. Blank decodes (a lone space token) are skipped."""
    target = target.strip()
    if not ids or not target:
        return ids
    best = None
    for i in range(1, len(ids) + 1):
        text = m.tokenisation.decode(ids[:i]).strip()
        if not text:
            continue
        if text == target or text.lower() == target.lower():
            return ids[:i]
        if target.startswith(text) or target.lower().startswith(text.lower()):
            best = ids[:i]
            continue
        if (text.startswith(target) or text.lower().startswith(target.lower())) and len(text) > len(target):
            return best if best is not None else ids[: max(i - 1, 1)]
    return best if best is not None else ids


# ---- greedy rows ------------------------------------------------------------------------------------


@dataclass
class Next:
    """What their code reads from one next-token distribution."""

    argmax: int  # greedy's token (torch.argmax: the first of equal maxima)
    top: list[tuple[int, float]]  # the most probable (id, log p), torch.topk order: their one-step beam call
    margin: float  # p1 - p2 (compute_top1_margin, L69)
    logprobs: torch.Tensor = field(repr=False)  # (vocab,) the distribution itself, a view


def _next_of(logprobs: torch.Tensor, width: int) -> list[Next]:
    """A Next per row of `logprobs`, (rows, vocab) log-softmax of the raw logits."""
    top = logprobs.topk(max(width, 2), dim=-1)
    probs = top.values[:, :2].exp()
    margins = (probs[:, 0] - probs[:, 1]).tolist()
    argmax, ids, lps = logprobs.argmax(-1).tolist(), top.indices.tolist(), top.values.tolist()
    return [Next(argmax[r], list(zip(ids[r], lps[r])), margins[r], logprobs[r]) for r in range(len(argmax))]


class Uncovered(Exception):
    """A frozen greedy row was asked for a token it does not hold."""


class Greedy:
    """Rows of one fork, each after the same context C: row i is `heads[i]`, then the argmax after each token.

    The rows grow together, one batched pass per token, so every row holds as many tokens; a row may
    run past what its proposal uses. Their `generate` calls on C + a prefix of a row continue the same
    greedy sequence, so each call is a stretch of a row (`call`), whatever call came before it.
    """

    def __init__(self, rows: Rows, first: Next, heads: list[list[int]], head_lps: list[list[float]], width: int):
        if len({len(h) for h in heads}) != 1:
            raise AssertionError("rows that grow together need heads of one length")
        self.m, self.rows, self.width = rows.member, rows, width
        self.context = rows.prefix  # C, the ids before every row's tokens
        self.tokens = [list(h) for h in heads]
        self.lps = [list(lp) for lp in head_lps]  # log p of each token after C and the tokens before it
        self.after = [{0: first} for _ in heads]  # after[i][j]: Next after C + tokens[i][:j]
        self.read = 0  # tokens of every row in the rows' cache after C
        self.base = 0  # of those, the ones in the rows' own prefix (a continuation of last round's row)
        self.frozen = False  # True: reading is refused (`Uncovered`), only the tokens held may be used

    @classmethod
    def of(cls, m: Member, heads: list[list[int]], head_lps: list[list[float]], width: int) -> "Greedy":
        """Rows after the member's committed context."""
        return cls(m.fork(len(heads)), _next_of(m.logprobs[None], width)[0], heads, head_lps, width)

    def next_at(self, i: int, j: int):
        """Next after C + tokens[i][:j] (a program: reads up to j; only the last of several ids read at once
        has one)."""
        if j > self.read:
            step = yield from self.rows.extend([t[self.read : j] for t in self.tokens])  # (rows, j - read, vocab)
            for after, nxt in zip(self.after, _next_of(step[:, -1], self.width)):
                after[j] = nxt
            self.read = j
        return self.after[i][j]

    def grow(self, n: int):
        """Every row holds at least n tokens (a program)."""
        while len(self.tokens[0]) < n:
            j = len(self.tokens[0])
            if self.frozen and j not in self.after[0]:
                raise Uncovered
            yield from self.next_at(0, j)
            for tokens, lps, after in zip(self.tokens, self.lps, self.after):
                tokens.append(after[j].argmax)
                lps.append(after[j].top[0][1])  # the argmax's log p: the maximum

    def call(self, i: int, start: int, new: int):
        """Their greedy `generate(max_new_tokens=new)` on C + tokens[i][:start] (a program): the end of what it
        returns. It stops after a generated eos id; one in its input stops nothing."""
        end = start
        while end < start + new:
            yield from self.grow(end + 1)
            end += 1
            if self.tokens[i][end - 1] in self.m.tokenisation.eos_ids:
                break
        return end

    def extended(self, i: int, start: int, end: int, chunks: int):
        """Their extension (L217-243), a program: when the decode of tokens[i][start:end] has fewer than
        `chunks` chunks and no marker, 5 more tokens; returns the end and the decode."""
        text = self.m.tokenisation.decode(self.tokens[i][start:end])
        if len(text.split()) < chunks and not has_marker(text):
            end = yield from self.call(i, end, EXTENSION)
            text = self.m.tokenisation.decode(self.tokens[i][start:end])
        return end, text

    def span(self, text: str, i: int, end: int, before: "CodeSpan | None" = None) -> "CodeSpan":
        """A candidate: `text`, with tokens[i][:end] (after the ids and log-probs of `before`, if given)."""
        ids, lps = self.tokens[i][:end], self.lps[i][:end]
        return CodeSpan(text, before.ids + ids, before.lps + lps) if before else CodeSpan(text, ids, lps)

    def cut(self, i: int, j: int) -> bool:
        """Cut row i's cache after C + tokens[i][:j] (this object is then done growing); False where that
        point lies inside the rows' own prefix."""
        if not self.base <= j <= self.read:
            return False
        self.rows.truncate(i, j - self.base, self.after[i][j].logprobs)
        self.read = j
        return True

    def branch(self, j: int, width: int):
        """Rows after C + tokens[0][:j], one per token of their beam call there, and where their own
        tokens start: 0 when they share this row's KV (this row is cut at j), else j (read again). A program."""
        beams = (yield from self.next_at(0, j)).top[:width]
        if self.cut(0, j):
            heads, lps = [[b] for b, _ in beams], [[lp] for _, lp in beams]
            return Greedy(self.rows.fork(0, len(beams)), self.after[0][j], heads, lps, width), 0
        heads = [self.tokens[0][:j] + [b] for b, _ in beams]
        return Greedy.of(self.m, heads, [self.lps[0][:j] + [lp] for _, lp in beams], width), j

    def continuation(self, i: int, n: int) -> "Greedy":
        """Row i after its first n tokens, as one row over the same KV (what it has read after them stays)."""
        child = Greedy(self.rows.fork(i, 1), self.after[i][n], [self.tokens[i][n:]], [self.lps[i][n:]], self.width)
        child.context = self.context + self.tokens[i][:n]
        child.after[0] = {j - n: nxt for j, nxt in self.after[i].items() if j >= n}
        child.read = child.base = self.read - n
        return child


def continue_from(m: Member, rows: list[Greedy], ids: list[int], generated: str, text: str) -> Greedy | None:
    """If `ids`, the re-encoded prompt + G, continue a row of this round (its context, then its first n
    tokens, with the distribution after them), make them the member's context without reading anything
    and return the row's continuation, the start of the next round's greedy row; else None."""
    for g in rows:
        n = len(ids) - len(g.context)
        if n < 1 or ids[: len(g.context)] != g.context:
            continue
        for i, tokens in enumerate(g.tokens):
            if tokens[:n] == ids[len(g.context) :] and n in g.after[i] and g.base <= n <= g.read:
                after = g.continuation(i, n)
                g.cut(i, n)
                m.commit(g.rows, i, generated, text)
                m.check_invariant()
                return after
    return None


# ---- one model's proposals ----------------------------------------------------------------------------


@dataclass
class CodeSpan:
    text: str
    ids: list[int]
    lps: list[float]  # log p of each id in context, as the row that generated it read it


def propose(m: Member, cfg: AdaFuseCodeConfig, row: Greedy | None = None):
    """`generate_candidate_spans` for the member's context P: its candidates, the margins it tested, and
    its greedy rows (a program). `row`, if given, is the greedy row after P that the last round already started."""
    row = row or Greedy.of(m, [[]], [[]], cfg.branches)
    first = yield from row.next_at(0, 0)  # their 1-token call on P
    margins = [first.margin]
    if cfg.branches > 1 and first.margin < cfg.tau:
        return *(yield from _branch_first_word(m, cfg, first, row)), margins
    # the first word: t1, their 6-token call, the extension
    yield from row.grow(1)
    end, raw = yield from row.extended(0, 0, (yield from row.call(0, 1, FIRST_CALL)), 2)
    w1 = first_word(raw, cfg.span_length)
    w1_ids = trim(m, row.tokens[0][:end], w1)
    whole_first = row.span(w1, 0, end)  # path B falls back to the untrimmed ids (L572-574, L717-719)
    if first.margin < cfg.tau:  # path A: the uncertain word ends the proposal
        return ([row.span(w1, 0, len(w1_ids))] if acceptable(w1) else []), [row], margins
    # the second word: t2 from P + w1_ids (their 1-token call), then their 5/6-token call and extension
    j = len(w1_ids)
    second = yield from row.next_at(0, j)
    margins.append(second.margin)
    stable = second.margin >= cfg.tau
    yield from row.grow(j + 1)
    if cfg.branches == 1:  # path A (L284-407): 5 tokens and three chunks wanted when stable, else 6 and two
        called = yield from row.call(0, j + 1, 5 if stable else 6)
        end, raw = yield from row.extended(0, j, called, 3 if stable else 2)
        words = raw.split()
        if not words:
            return ([row.span(w1, 0, j)] if acceptable(w1) else []), [row], margins
        text = " ".join([w1] + words[: 2 if stable else 1])
        trimmed = row.span(text, 0, len(trim(m, row.tokens[0][:end], text)))
        return ([trimmed] if acceptable(text) else []), [row], margins
    # path B (L534-719): 6 tokens, two chunks wanted
    end, raw = yield from row.extended(0, j, (yield from row.call(0, j + 1, FIRST_CALL)), 2)
    words = raw.split()
    if not words:
        return ([whole_first] if acceptable(w1) else []), [row], margins
    text = w1 + " " + words[0]
    if not stable:  # no branching at an uncertain second word; the ids are not trimmed
        return ([row.span(text, 0, end)] if acceptable(text) else []), [row], margins
    return *(yield from _branch_third_word(m, cfg, row, text, len(trim(m, row.tokens[0][:end], text)))), margins


def _branch_first_word(m: Member, cfg: AdaFuseCodeConfig, first: Next, row: Greedy):
    """Path B at an uncertain first token (L721-809): the B beam tokens, each completed into a first
    word slot; the ids are all the tokens generated (7 to 12), untrimmed. The first beam token is the
    greedy one: where `row`, the greedy row after P that the last round started, already holds its
    whole slot, that slot costs nothing. A program."""
    beams = first.top[: cfg.branches]
    held = None
    if row.tokens[0][:1] == [beams[0][0]]:
        row.frozen = True
        try:
            held = yield from _slot(row, 0, cfg.span_length)
        except Uncovered:
            pass
        row.frozen = False
    fresh = beams[1:] if held else beams
    rows = Greedy.of(m, [[b] for b, _ in fresh], [[lp] for _, lp in fresh], cfg.branches) if fresh else None
    slots = [held] if held else []
    for i in range(len(fresh)):
        slots.append((yield from _slot(rows, i, cfg.span_length)))
    return [span for span in slots if span], [g for g in (row, rows) if g]


def _slot(rows: Greedy, i: int, span_length: int) -> CodeSpan | None:
    """Row i's first word slot: its first token, their 6-token call and extension, the word rule (a program)."""
    end, raw = yield from rows.extended(i, 0, (yield from rows.call(i, 1, FIRST_CALL)), 2)
    text = first_word(raw, span_length)
    return rows.span(text, i, end) if raw.split() and acceptable(text) else None


def _branch_third_word(m: Member, cfg: AdaFuseCodeConfig, row: Greedy, words12: str, h: int):
    """Path B after two stable tokens (L617-716): the B beam tokens after the two words' trimmed ids
    (their first h tokens), each completed into a third word; no third margin is tested, the ids are
    not trimmed. A program."""
    ids12 = row.span(words12, 0, h)
    rows, start = yield from row.branch(h, cfg.branches)  # their one-step beam call on P + ids12
    before = None if start else ids12  # rows that read the two words again hold their ids themselves
    spans = []
    for i in range(len(rows.tokens)):
        end, raw = yield from rows.extended(i, start, (yield from rows.call(i, start + 1, FIRST_CALL)), 2)
        words = raw.split()
        text = words12 + " " + words[0] if words else ""
        if words and acceptable(text):
            spans.append(rows.span(text, i, end, before))
    return spans, [row, rows]


# ---- pool, scores, selection --------------------------------------------------------------------------


@dataclass
class Entry:
    """A pool entry (L978-984), as `trace=true` records it."""

    text: str
    own_ids: list[list[int] | None]  # per model: its own ids for this text, if it proposed it
    scored_ids: list[list[int]]  # per model: the ids it scored (its own, or the text encoded alone)
    scores: list[float | None]  # per model: mean NLL after the prefix; None where no id was scored (their NaN)
    fused: float | None  # the mean of the scores that are not None; None: skipped


def build_code_pool(proposals: list[list[CodeSpan]]) -> tuple[list[Entry], dict[str, list[CodeSpan | None]]]:
    """The pool keyed by text in model order; a model's later span with the same text overwrites its ids."""
    own: dict[str, list[CodeSpan | None]] = {}
    for k, spans in enumerate(proposals):
        for span in spans:
            own.setdefault(span.text, [None] * len(proposals))[k] = span
    entries = [Entry(text, [s.ids if s else None for s in spans], [], [], None) for text, spans in own.items()]
    return entries, own


def score_code_pool(m: Member, k: int, pool: list[Entry], own: dict[str, list[CodeSpan | None]]):
    """Model k's score of every entry (compute_span_perplexity, L814-837): the mean NLL of its own ids,
    or of the text encoded alone with no special tokens; the latter read in one batched pass (a program)."""
    foreign = [e for e in pool if own[e.text][k] is None]
    encoded = {e.text: m.tokenisation.encode(e.text, add_special_tokens=False) for e in foreign}
    read = [e.text for e in foreign if encoded[e.text]]
    lps: dict[str, list[float]] = {}
    if read:
        step = yield from m.fork(len(read)).extend([encoded[t] for t in read])  # (rows, longest, vocab)
        for r, text in enumerate(read):
            ids = encoded[text]
            later = step[r, : len(ids) - 1].gather(-1, torch.tensor(ids[1:], device=step.device)[:, None])
            lps[text] = [m.logprobs[ids[0]].item()] + later[:, 0].tolist()
    for e in pool:
        span = own[e.text][k]
        ids, values = (span.ids, span.lps) if span else (encoded[e.text], lps.get(e.text, []))
        e.scored_ids.append(list(ids))
        # their float32 cross-entropy mean; no ids: their mean of nothing is NaN, kept here as None
        e.scores.append(-torch.tensor(values, dtype=torch.float32).mean().item() if values else None)


def fuse(pool: list[Entry]) -> None:
    """The mean of each entry's non-NaN scores, added in model order (L1013-1024; three:L632-648)."""
    for e in pool:
        valid = [x for x in e.scores if x is not None and not math.isnan(x)]
        e.fused = sum(valid) / len(valid) if valid else None


# ---- decoding -----------------------------------------------------------------------------------------


@dataclass
class CodeProposal:
    """One model's proposals in one round, as `trace=true` records them."""

    margins: list[float]  # Δ at each test: the first token's, then the second's where their code tests it
    spans: list[tuple[str, list[int]]]  # (text, ids), in the order proposed


@dataclass
class CodeRound:
    """One round of their loop, as their span trace and log record it."""

    round_idx: int
    proposals: list[CodeProposal]  # per model
    pool: list[Entry]  # pool order
    selected: str | None  # None: no entry had a score (their loop breaks)
    appended: str  # what the text grew by
    stop: str | None  # why decoding ended after this round (`stats.notes["authors_stop"]`)


STOP_REASONS = {
    "marker": "stop",
    "boxed": "stop",
    "no_valid_candidates": "stop",
    "stop_string": "stop",
    "eos_string": "eos",
    "rounds": "length",
    "length": "length",
}


def members_used(cfg: AdaFuseCodeConfig, available: int) -> list[int]:
    if available < 2:
        raise ConfigError(f"adafuse_code: their scripts fuse 2, 3 or 4 models; the ensemble has {available}")
    if available > 2 and (cfg.branches > 1 or cfg.span_length > 1):
        raise ConfigError(
            f"adafuse_code: with {available} models set method.branches=1 and method.span_length=1 (got "
            f"{cfg.branches} and {cfg.span_length}): their three- and four-model scripts are path A with "
            "span_length 1 hard-wired and have no beam search (AdaFuse_three_models.py takes no --beam_size)"
        )
    return list(range(available))


def positions_needed(cfg: AdaFuseCodeConfig, max_new_tokens: int) -> int:
    """The budget (a round starts only below it), plus one round's longest row (module docstring)."""
    return max_new_tokens + FOREIGN_PER_TOKEN * ROUND_TOKENS


def decode(s: Session, cfg: AdaFuseCodeConfig):
    """Their loop (L957-1121) over the session's members: at most `max_rounds` rounds (a program, every member's
    passes in the same engine steps)."""
    members_used(cfg, len(s.members))
    if any(m.tokenisation.chat_template for m in s.members):
        raise ConfigError("adafuse_code: their scripts tokenise the plain prompt; set chat_template: false")
    prompt = s.request.prompt
    prompt_ids = [list(m.ids) for m in s.members]
    eos_strings = [m.tokenisation.eos_token for m in s.members if m.tokenisation.eos_token]
    why, seeds = "", [None] * len(s.members)
    for round_idx in range(cfg.max_rounds):
        proposed = yield from together([propose(m, cfg, seed) for m, seed in zip(s.members, seeds)])
        spans, rows, margins = zip(*proposed)
        pool, own = build_code_pool(list(spans))
        yield from together([score_code_pool(m, k, pool, own) for k, m in enumerate(s.members)])
        fuse(pool)
        scored = [e for e in pool if e.fused is not None]
        best = min(scored, key=lambda e: e.fused) if scored else None  # ties: the earliest entry
        new, stop = appended_text(best.text, eos_strings) if best else ("", "no_valid_candidates")
        stop = "stop_string" if s.append(new, words=len(new.split())) else stop
        ids = None
        if stop is None and round_idx + 1 == cfg.max_rounds:
            stop = "rounds"
        if stop is None:
            ids = [m.tokenisation.encode(prompt + s.text) for m in s.members]
            if any(len(i) - common_prefix(i, p) >= s.max_new_tokens for i, p in zip(ids, prompt_ids)):
                stop = "length"
        if s.tracing:
            props = [CodeProposal(d, [(sp.text, sp.ids) for sp in sps]) for sps, d in zip(spans, margins)]
            s.log(CodeRound(round_idx, props, pool, best.text if best else None, new, stop))
        if stop is not None:
            why = stop
            break
        # every model's context becomes the re-encoded prompt + G: a row of this round that holds it
        # already, or else the ids after what the new encoding shares with the context, read
        before = s.text[: len(s.text) - len(new)]
        seeds = [continue_from(m, g, i, before, new) for m, g, i in zip(s.members, rows, ids)]
        yield from together(
            [_read_prefix(m, m_ids, before, new) for m, seed, m_ids in zip(s.members, seeds, ids) if seed is None]
        )
    s.end(STOP_REASONS[why])
    s.note(authors_pred=loop_pred(prompt, s.text), authors_stop=why)
    outputs = [m.tokenisation.encode(prompt + s.text) for m in s.members]
    s.set_output_ids([i[common_prefix(i, p) :] for i, p in zip(outputs, prompt_ids)])


def _read_prefix(m: Member, ids: list[int], generated: str, text: str):
    """Make `ids`, the re-encoded prompt + G, m's context (a program): only the ids after the longest prefix
    they share with it are read (one fork row, which a batched run merges with other examples' passes)."""
    keep = min(common_prefix(m.ids, ids), len(ids) - 1)
    rows = m.fork(1, upto=keep)
    yield from rows.extend([ids[keep:]])
    m.commit(rows, 0, generated, text)
    m.check_invariant()


METHOD = Method(AdaFuseCodeConfig, decode, positions_needed, members_used, raw_distribution=True)
