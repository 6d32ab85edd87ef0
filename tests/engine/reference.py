"""A slow reference AdaFuse, written as plainly as ../shared/spec/adafuse.md reads.

No KV cache and no bookkeeping shared with the fast decoder: every quantity (next-token
distribution, each candidate's NLL) comes from a full forward pass over the whole token sequence,
and text is decoded from the start of the context. It shares only the weights and tokenizers.
"""

from dataclasses import dataclass, field

import torch

CHAR_SLACK = 4  # as the fast decoder: a word cut at the token cap may finish its last character


class RefModel:
    def __init__(self, member):
        self.tokenizer = member.tokenizer
        self.model = member.model
        self.eos_ids = member.eos_ids
        self.name = member.name
        self._next: dict[tuple[int, ...], torch.Tensor] = {}

    @torch.inference_mode()
    def logprobs(self, ids: list[int], last: int) -> torch.Tensor:
        """log p(x_{i+1} | x_{<=i}) at the last `last` positions i, from one forward pass with no cache.

        Only the vocabulary projection is limited to those positions (a 262k vocabulary over a long
        prompt would take gigabytes); every layer still reads the whole sequence.
        """
        ids_t = torch.tensor([ids], device=self.model.device)
        logits = self.model(input_ids=ids_t, use_cache=False, logits_to_keep=last).logits
        return torch.log_softmax(logits[0].float(), dim=-1)

    def next_logprobs(self, ids: list[int]) -> torch.Tensor:
        key = tuple(ids)  # a pure function of the ids: remembering it changes no result, only the time
        if key not in self._next:
            self._next[key] = self.logprobs(ids, 1)[-1]
        return self._next[key]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def text(self, context: list[int], span: list[int]) -> str:
        head, whole = self.decode(context), self.decode(context + span)
        assert whole.startswith(head), (head[-20:], whole[-20:])
        return whole[len(head) :]

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)


@dataclass
class RefWord:
    ids: list[int]
    text: str
    eos: bool


def greedy_word(m: RefModel, context: list[int], first: int, max_tokens: int) -> RefWord:
    """Spec §2: from `first`, append argmax tokens until the word is complete."""
    if first in m.eos_ids:
        return RefWord([], "", True)
    ids = [first]
    while True:
        nxt = int(m.next_logprobs(context + ids).argmax())
        text = m.text(context, ids)
        if nxt in m.eos_ids:
            return RefWord(ids, text, True)
        partial = text.endswith("\ufffd")
        has_word = text.strip() != "" and not partial
        if has_word and text[-1].isspace():
            return RefWord(ids, text, False)
        if has_word and m.text(context + ids, [nxt])[:1].isspace():
            return RefWord(ids, text, False)
        if (len(ids) >= max_tokens and not partial) or len(ids) >= max_tokens + CHAR_SLACK:
            return RefWord(ids, text, False)
        ids.append(nxt)


def propose(m: RefModel, context: list[int], cfg) -> list[list[RefWord]]:
    """Spec §3, one model: its candidates, each a list of words."""
    committed: list[RefWord] = []
    here = list(context)
    for _ in range(cfg.fixed_words or cfg.max_words):
        probs = m.next_logprobs(here).exp()
        top = torch.sort(probs, descending=True)
        delta = (top.values[0] - top.values[1]).item()
        if cfg.fixed_words is None and delta < cfg.tau:
            if cfg.diversity or cfg.branches == 1:
                firsts = top.indices[: cfg.branches].tolist()
                return [committed + [greedy_word(m, here, t, cfg.max_word_tokens)] for t in firsts]
            return [committed + [w] for w in beam_words(m, here, cfg)]
        word = greedy_word(m, here, int(top.indices[0]), cfg.max_word_tokens)
        committed.append(word)
        here = here + word.ids
        if word.eos:
            break
    return [committed]


def beam_words(m: RefModel, context: list[int], cfg) -> list[RefWord]:
    """Word-level beam search (diversity=false), as the fast decoder defines it, without a cache."""
    width = cfg.branches
    live = [([], 0.0)]
    finished = []  # (score, RefWord)
    for _ in range(cfg.max_word_tokens + CHAR_SLACK):
        expansions = []
        for h, (ids, score) in enumerate(live):
            lp = m.next_logprobs(context + ids)
            top = torch.sort(lp, descending=True)
            for value, token in zip(top.values[:width].tolist(), top.indices[:width].tolist()):
                expansions.append((score + value, h, token))
        expansions.sort(key=lambda e: -e[0])
        ended, grown = set(), []
        for total, h, token in expansions:
            ids = live[h][0]
            text = m.text(context, ids)
            if token in m.eos_ids:
                boundary = True
            elif ids and text.strip() and not text.endswith("\ufffd"):
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
            if text.strip() and not text.endswith("\ufffd") and text[-1].isspace():
                finished.append((total, RefWord(ids, text, False)))
            else:
                live.append((ids, total))
        if not live:
            break
    else:
        finished += [(total, RefWord(ids, m.text(context, ids), False)) for ids, total in live]
    finished.sort(key=lambda f: -f[0])
    return [w for _, w in finished[:width]]


@dataclass
class RefCandidate:
    text: str
    eos: bool
    proposers: list[int] = field(default_factory=list)
    own: dict = field(default_factory=dict)  # model -> ids it generated
    scores: list = field(default_factory=list)  # per model: (base, ids, nll)
    fused: float = 0.0


def nll(m: RefModel, context: list[int], ids: list[int], eos: bool) -> float:
    """Mean NLL of `ids` after `context` (+ the most probable eos id), from one cache-free forward pass."""
    lp = m.logprobs(context + ids, len(ids) + 1)  # row j predicts the token after context + ids[:j]
    values = [lp[j, t].item() for j, t in enumerate(ids)]
    if eos:
        values.append(max(lp[-1, e].item() for e in m.eos_ids))
    return -sum(values) / len(values)


def generate(members, prompt: str, cfg, stop=(), max_new_tokens: int = 64):
    """Returns (text, rounds); each round is (candidates, winner index)."""
    models = [RefModel(m) for m in members]
    contexts = [m.encode(prompt) for m in models]
    prompt_lens = [len(c) for c in contexts]
    text, rounds = "", []
    while True:
        pool: dict = {}
        for k, m in enumerate(models):
            for words in propose(m, contexts[k], cfg):
                key = ("".join(w.text for w in words), words[-1].eos)
                cand = pool.setdefault(key, RefCandidate(*key))
                if k not in cand.own:
                    cand.proposers.append(k)
                    cand.own[k] = [i for w in words for i in w.ids]
        pool = list(pool.values())
        for cand in pool:
            for k, m in enumerate(models):
                if k in cand.own:
                    base, ids = len(contexts[k]), cand.own[k]
                else:
                    full = m.encode(prompt + text + cand.text)
                    base = 0
                    while base < min(len(full), len(contexts[k])) and full[base] == contexts[k][base]:
                        base += 1
                    ids = full[base:]
                cand.scores.append((base, ids, nll(m, contexts[k][:base], ids, cand.eos)))
            cand.fused = sum(s[2] for s in cand.scores) / len(models)
        winner = min(range(len(pool)), key=lambda i: pool[i].fused)
        best = pool[winner]
        rounds.append((pool, winner))
        for k in range(len(models)):
            base, ids, _ = best.scores[k]
            contexts[k] = contexts[k][:base] + ids
        text += best.text
        hits = [text.find(s) for s in stop if s in text]
        if hits:
            return text[: min(hits)], rounds
        if best.eos or any(len(c) - n >= max_new_tokens for c, n in zip(contexts, prompt_lens)):
            return text, rounds
