"""`method=unite`: UniTE (Yao et al., ICLR 2025), token-level fusion over the union of the members' top-k.

Research notes: ../shared/research/baselines.md §4 (paper and the official code, starrYYxuan/UniTE
106a895, `unite2.py`/`unite3.py`). One step:

1. every member's `top_k` (k = 10) most probable next tokens, by text (baselines/vocab.py: each
   vocabulary normalised by its detected type, newline as a real "\\n"), form the union U, in the
   order member 0's first, then member 1's new ones, and so on (the tie-break);
2. member m's value for a union entry u: the probability of u as one token of m (summed over m's
   ids that stand for exactly u's text); if m has no such token, the probability of the first token
   of m's encoding of u that is not a bare-space token (the official `update_vocab`; the bare-space
   tokens are found from the normalised vocabulary, not hard-coded ids);
3. each member's values are renormalised over U (they sum to 1; the official code's softmax over
   the raw logits restricted to U's ids is the same thing when no two entries share an id), and
   averaged with weights λ (uniform by default; upstream's λ = 0.5 for two models);
4. the argmax's text (ties: the earlier entry of U) is appended, and every member advances by that
   text: `append_ids` with its own id where the text is one of its own top-k tokens, otherwise
   `append_text` (the seam's alignment with bounded cut-back).

Choices where the official code is buggy or silent (research notes §4.3):
- tokenizer types are detected from the vocabulary (upstream hard-codes the families "qwen2" and
  "llama3" in `unite2.py`, whatever models are passed in); the newline is "\\n", not "/n";
- the output is the winner's whole text (upstream emits model 1's id for it, which may be only the
  first sub-token of a string that model 1 spells with several tokens);
- no member re-reads its whole text per token (upstream re-prefills model 2 every step, and in
  `unite3.py` mixes a KV cache with re-tokenised ids);
- a token id's top-k candidacy needs whole text: control tokens are out (-inf already), and so are
  tokens that end inside a multi-byte character (SmolLM2 spells " ü" as `ĠÃ` + `¼`) and empty ones;
  a member's top-k is taken over its eligible tokens. Such tokens still serve as the "first
  sub-token" of step 2 (SmolLM2's value for Gemma's " über" is p(`ĠÃ`));
- eos: an eos id in a member's top-k makes "end of sequence" a union entry of its own, valued for
  every member by its most probable eos id; if it wins, decoding stops with stop_reason "eos".
"""

import logging
from dataclasses import dataclass

import torch

from adafuse.errors import ConfigError
from adafuse.member.passes import together
from adafuse.methods import Method
from adafuse.methods.session import Session
from baselines.vocab import Vocabulary, check_weights, member_weights, vocabulary_of

log = logging.getLogger(__name__)

EOS = None  # the union entry "end of sequence" (every text entry is a str)
STEP_OVERRUN = 64  # most positions one step may add to a member beyond the budget (a long token of another vocabulary)


@dataclass
class UniteConfig:
    """Knobs of `method=unite` (research notes §4.2)."""

    top_k: int = 10  # k: next tokens each member contributes to the union (hard-coded 10 upstream)
    weights: list[float] | None = None  # λ per member, summing to 1; null: uniform (upstream: 0.5 / 0.5)

    def __post_init__(self):
        if self.top_k < 1:
            raise ConfigError(f"unite: top_k must be >= 1, got {self.top_k}")
        check_weights("unite", self.weights)


def positions_needed(cfg: UniteConfig, max_new_tokens: int) -> int:
    return max_new_tokens + STEP_OVERRUN


@dataclass
class Step:
    """One step, for the trace: the union, each member's renormalised values over it, the fused ones."""

    union: list[str | None]  # None stands for eos
    values: list[list[float]]  # per member, renormalised over the union
    fused: list[float]
    winner: int


def top_entries(m, vocab: Vocabulary, k: int) -> dict[str | None, int]:
    """Member m's k most probable eligible tokens: entry (text, or EOS) -> its most probable id for it."""
    lp = m.logprobs
    ok = vocab.has_text.clone()
    ok[list(m.tokenisation.eos_ids)] = True
    eligible = lp.masked_fill(~ok, float("-inf"))
    entries: dict[str | None, int] = {}
    # More than k ids may be needed: two ids of one text (Gemma's "\n" and <0x0A>) make one entry.
    n = k
    while True:
        top = eligible.topk(min(n, len(lp))).indices.tolist()
        entries.clear()
        for i in top:
            if eligible[i] == float("-inf"):
                break
            key = EOS if i in m.tokenisation.eos_ids else vocab.texts[i]
            entries.setdefault(key, i)
            if len(entries) == k:
                return entries
        if n >= len(lp) or eligible[top[-1]] == float("-inf"):
            return entries
        n *= 2


def member_value(m, vocab: Vocabulary, probs: torch.Tensor, entry: str | None, memo: dict) -> float:
    """Member m's (unnormalised) probability of a union entry (step 2 of the module docstring)."""
    if entry is EOS:
        return max(probs[e].item() for e in m.tokenisation.eos_ids)
    ids = vocab.ids_of(entry)
    if ids:
        return probs[ids].sum().item()
    if entry not in memo:
        memo[entry] = first_subtoken(m.tokenisation.encode_text(entry), vocab)
    return probs[memo[entry]].item()


def first_subtoken(ids: list[int], vocab: Vocabulary) -> int:
    """The first id that is not a bare-space token (the bare space itself if that is all there is)."""
    for i in ids:
        if i not in vocab.bare_space:
            return i
    return ids[0]


def fuse(members, vocabs, weights, k: int, memos) -> tuple[Step, list[dict]]:
    """One UniTE step: (the step record, each member's top entries)."""
    tops = [top_entries(m, v, k) for m, v in zip(members, vocabs)]
    union: list[str | None] = []
    for top in tops:
        union.extend(e for e in top if e not in union)
    values = []
    for m, v, memo in zip(members, vocabs, memos):
        probs = m.logprobs.exp()
        raw = [member_value(m, v, probs, e, memo) for e in union]
        total = sum(raw)
        values.append([r / total for r in raw] if total > 0 else [1.0 / len(union)] * len(union))
    fused = [sum(w * val[j] for w, val in zip(weights, values)) for j in range(len(union))]
    winner = max(range(len(union)), key=lambda j: (fused[j], -j))
    return Step(union, values, fused, winner), tops


def decode(s: Session, cfg: UniteConfig):
    """UniTE over the session's members (K >= 1; K = 1 is that member's greedy decoding over eligible tokens):
    a program, every member's read of the winner in the same engine step."""
    members = s.members
    weights = member_weights("unite", cfg.weights, len(members))
    vocabs = [vocabulary_of(m) for m in members]
    memos = [{} for _ in members]  # per member: union text -> its first sub-token, for this example
    while True:
        step, tops = fuse(members, vocabs, weights, cfg.top_k, memos)
        s.log(step)
        entry = step.union[step.winner]
        if entry is EOS:
            s.add("", eos=True)
            break
        reads = [
            m.append_ids([top[entry]], s.text, entry) if entry in top else m.append_text(s.text, entry)
            for m, top in zip(members, tops)
        ]
        yield from together(reads)
        if s.add(entry):
            break


METHOD = Method(UniteConfig, decode, positions_needed)
