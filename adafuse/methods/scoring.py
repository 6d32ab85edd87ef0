"""Log-likelihoods of strings under an ensemble whose members tokenise differently (lm-evaluation-harness's
`loglikelihood` and `loglikelihood_rolling`; eval/lm_harness.py is the adapter).

A product of experts over strings: each member scores the same continuation text after the same context,
in its own tokenization, and the ensemble's log-probability is the mean of the members'. No token alignment
is needed, because every member's value is the probability of one and the same string.

The tokenization boundary follows lm_eval's `hf` model, so that one member scores exactly as `hf` does:
whitespace that ends the context moves to the start of the continuation; the context is encoded alone (with
the tokenizer's default special tokens, Gemma's <bos>), context + continuation is encoded whole, and the
continuation is the whole's ids after as many ids as the context alone has. An empty context is the
member's BOS id (its EOS id where it has none), as in `hf`. Log-probabilities come from the raw
distribution (control tokens not masked): a string's probability under the model as it is.

The context is read once per member (its text through its last blank line, the exemplars that few-shot
contexts share, once for all of them: `exemplars_length`) and its KV cache is shared by every continuation
scored after it. Scoring is a program like a decode (adafuse/member/passes.py): the engine steps it beside the
examples in flight, so a server scoring a long text never stalls the completions decoding meanwhile.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from adafuse.errors import ContextLengthError
from adafuse.member.context import Context
from adafuse.member.member import Member
from adafuse.member.passes import ReadPrompt, together
from adafuse.methods.session import through_last_blank_line
from adafuse.text.align import common_prefix

# Continuation positions read per forward pass: the log-softmax of a pass is (rows, positions, vocabulary)
# floats, 1 GiB for 4 rows of 256 positions over Gemma's 262k vocabulary.
POSITIONS_PER_PASS = 256


@dataclass(frozen=True)
class Likelihood:
    """One continuation's score: the ensemble's value and each member's."""

    logprob: float  # mean of the members' log-probabilities of the continuation's text
    greedy: bool  # the continuation is every member's greedy continuation, in its own tokenization
    member_logprobs: tuple[float, ...]
    member_greedy: tuple[bool, ...]


def _encode(member: Member, text: str) -> list[int]:
    """`text` with the tokenizer's default special tokens, unless it already starts with the BOS text (as `hf`)."""
    bos = member.tokenisation.bos_token
    return member.tokenisation.encode(text, add_special_tokens=not (bos and text.startswith(bos)))


def exemplars_length(member: Member, context: str, ids: list[int]) -> int:
    """How many of a context's `ids` are those of its text through its last blank line (`through_last_blank_line`:
    the exemplars that few-shot contexts share), so that each member reads them once for every context."""
    shared = through_last_blank_line(context)
    return min(common_prefix(_encode(member, shared), ids), len(ids) - 1) if shared else 0


def split_ids(member: Member, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """(context ids, continuation ids) in this member's tokenization, by lm_eval's `hf` rule (module doc)."""
    if context == "":
        ids = member.tokenisation.encode(continuation, add_special_tokens=False)
        prefix = member.tokenisation.sequence_start_id
        return (ids[:1], ids[1:]) if ids and ids[0] == prefix else ([prefix], ids)
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    context_ids = _encode(member, context)
    return context_ids, _encode(member, context + continuation)[len(context_ids) :]


def score_ids(member: Member, context: list[int], continuations: Sequence[list[int]], prefix_length: int = 0):
    """(log-probability, greedy) of each id list after `context`, whose KV all of them share (a program); the
    context's first `prefix_length` ids are a prefix other contexts share (`exemplars_length`)."""
    longest = max(len(c) for c in continuations)
    limit = member.runner.max_positions
    if limit and len(context) + max(longest - 1, 0) > limit:
        raise ContextLengthError(
            f"model {member.name!r}: a context of {len(context)} tokens and a continuation of {longest} "
            f"do not fit in the model's {limit} positions"
        )
    cache, logits = yield ReadPrompt(member.runner, list(context), prefix_length)
    member.context = Context(list(context), cache)
    after_context = torch.log_softmax(logits[0, -1].float(), dim=-1)
    totals = [after_context[c[0]].item() if c else 0.0 for c in continuations]
    greedy = [not c or int(after_context.argmax()) == c[0] for c in continuations]
    # Each row reads its continuation but the last id (whose successor nobody asks for), right-padded:
    # padding comes after a row's real ids, so causal attention never lets them see it.
    fed = [c[:-1] for c in continuations]
    width = max(len(f) for f in fed)
    rows = member.fork(len(continuations))
    for start in range(0, width, POSITIONS_PER_PASS):
        end = min(start + POSITIONS_PER_PASS, width)
        block = [(f + [0] * width)[start:end] for f in fed]
        logits = yield from member.forward(rows.cache, torch.tensor(block))
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        for row, ids in enumerate(continuations):
            targets = ids[start + 1 : end + 1]
            if not targets:
                continue
            index = torch.tensor(targets, device=logprobs.device)
            rows_logprobs = logprobs[row, : len(targets)]
            totals[row] += rows_logprobs.gather(-1, index[:, None]).sum().item()
            greedy[row] = greedy[row] and bool((rows_logprobs.argmax(-1) == index).all())
    return list(zip(totals, greedy))


def _combine(per_member: list[list[tuple[float, bool]]]) -> list[Likelihood]:
    scores = []
    for values in zip(*per_member):
        logprobs = tuple(v[0] for v in values)
        flags = tuple(v[1] for v in values)
        scores.append(Likelihood(sum(logprobs) / len(logprobs), all(flags), logprobs, flags))
    return scores


def loglikelihood(members: list[Member], requests: Sequence[tuple[str, str]]):
    """The score of each (context, continuation), in input order (a program: every member's passes in the same
    engine steps); the continuations of one context share its KV."""
    by_context: dict[str, list[int]] = {}
    for i, (context, _) in enumerate(requests):
        by_context.setdefault(context, []).append(i)
    return _combine((yield from together([_member_scores(m, requests, by_context) for m in members])))


def _member_scores(member: Member, requests: Sequence[tuple[str, str]], by_context: dict[str, list[int]]):
    values: list[tuple[float, bool] | None] = [None] * len(requests)
    for context, indices in by_context.items():
        # The context's ids are the same for every continuation unless the context is empty (then
        # a continuation may start with the prefix id itself): group by the ids, not the text.
        groups: dict[tuple[int, ...], list[tuple[int, list[int]]]] = {}
        for i in indices:
            context_ids, continuation_ids = split_ids(member, context, requests[i][1])
            groups.setdefault(tuple(context_ids), []).append((i, continuation_ids))
        for context_ids, group in groups.items():
            prefix_length = exemplars_length(member, context, list(context_ids))
            scored = yield from score_ids(member, list(context_ids), [c for _, c in group], prefix_length)
            for (i, _), value in zip(group, scored):
                values[i] = value
    return values


def rolling_windows(ids: list[int], prefix: int, width: int) -> list[tuple[list[int], list[int]]]:
    """(context, targets) windows that score every id of `ids` once, each with as much context as fits in
    `width` positions: the first after `prefix` alone (lm_eval's rolling rule, context length 1)."""
    sequence = [prefix] + ids
    windows = []
    for start in range(1, len(sequence), width):
        end = min(start + width, len(sequence))
        windows.append((sequence[max(0, end - 1 - width) : start], sequence[start:end]))
    return windows


def loglikelihood_rolling(members: list[Member], texts: Sequence[str]):
    """Each text's log-probability from its first character (after the BOS, or EOS, id), in windows of
    the member's context length; the text is encoded without special tokens (a program)."""
    return _combine((yield from together([_member_rolling(m, texts) for m in members])))


def _member_rolling(member: Member, texts: Sequence[str]):
    width = member.runner.max_positions or 1 << 62
    values = []
    for text in texts:
        ids = member.tokenisation.encode(text, add_special_tokens=False)
        total, greedy = 0.0, True
        for context, targets in rolling_windows(ids, member.tokenisation.sequence_start_id, width):
            [(logprob, is_greedy)] = yield from score_ids(member, context, [targets])
            total, greedy = total + logprob, greedy and is_greedy
        values.append((total, greedy))
    return values
