"""`method=deepen`: DeePEn (Huang et al., NeurIPS 2024), token-level fusion through relative representations.

Research notes: ../shared/research/baselines.md §2 (paper and the official code,
OrangeInSouth/DeePEn e966d33). Every member's next-token distribution is mapped into one shared
space, the "anchors" (the tokens all vocabularies hold), averaged there, and mapped back onto the
main member's vocabulary by a few optimiser steps on its logits; the main member's argmax is the
next token, and its text is appended to every other member.

One-off preparation per set of models (`prepare`, baselines/deepen_transfer.py, cached on disk):
the anchors A (the texts every member's vocabulary holds as one token) and each member's transfer
matrix P_i = row-softmax(temperature * R_i), R_i its tokens' relative representations over A.

Per step (upstream's `BasedOnProbabilityTransferLogits_Loacal_FP32_Processor`):
- q_i = p_i @ P_i for every member, over its `support` most probable tokens; the rest of its mass
  (`1 - covered`) is spread uniformly over the anchors (every row of P is close to uniform);
  q = Σ w_i q_i with weights w (uniform by default; upstream's `-ew`);
- inverse mapping: z starts at the main member's log-probabilities; `steps` (T = 5) AdamW steps
  (lr η, betas (0.9, 0.999), torch's default weight decay 0.01, eps 1e-8) with a cosine schedule
  (T_max = 10, eta_min = η/4), each stepping after one evaluation of upstream's loss
  `KLDivLoss()(log(softmax(z) @ P_main), q)` with reduction "mean" (divided by |A|; with "sum" or
  "batchmean" η would have to be rescaled by about |A|, research notes §2.2); next token = argmax z.
  Only the `support` most probable main tokens receive gradients; the others keep theirs at zero,
  so Adam leaves them where they are apart from weight decay, which is applied to them too. This
  is what upstream's optimiser does to them anyway: their gradient is about p(v) * 1e-6, far below
  Adam's eps (1e-8) for p(v) < 1e-3, so their update is a vanishing fraction of η.
  Log-probabilities instead of raw logits change nothing: softmax, gradients and Adam's updates are
  shift-invariant, and weight decay scales every entry alike.
- the ensemble step is skipped (the main member's argmax is taken) when the main member's argmax is
  an eos id (upstream), when lr = 0 or steps = 0 (upstream), and, with `skip_agree` (default on,
  the upstream maintainer's advice in DeePEn issue #6), when every member's argmax token stands for
  the same text.

Choices where upstream is buggy or silent (research notes §2.3):
- any member can be the main one (`main`), byte-level too: the text that the main member's chosen
  ids add is taken in context (upstream pastes the raw token string, `Ġ`/`<0x0A>` included, into
  the other models' prompts, so only a SentencePiece main model works there);
- the other members read that text through the seam's alignment (`Member.append_text`), keeping
  their KV caches (upstream re-tokenises and re-reads every assist model's whole text each token);
- a chosen token that ends inside a multi-byte character (SmolLM2's `ĠÃ` of " ü") is completed by
  the main member's own greedy tokens before any other member reads the text: no shared text
  position exists inside a character (at most 3 more tokens);
- eos is decided by the main member: its argmax eos stops generation (upstream), and so does an
  eos that becomes the argmax after the optimisation; the other members' eos mass takes part in q
  through their transfer rows like any token.
"""

import logging
from dataclasses import dataclass
from typing import Any

import torch

from adafuse.errors import ConfigError
from adafuse.member.passes import together
from adafuse.methods import Method
from adafuse.methods.session import Session
from adafuse.text.tokens import SENTENCEPIECE
from adafuse.text.words import CHAR_SLACK, ends_inside_char
from baselines.deepen_transfer import Transfer, prepare
from baselines.vocab import check_weights, member_weights, vocabulary_of

log = logging.getLogger(__name__)

SENTENCEPIECE_MAIN = "sentencepiece"


# ---- knobs ------------------------------------------------------------------------------------------


@dataclass
class DeepenConfig:
    """Knobs of `method=deepen` (research notes §2.2)."""

    # The main member, whose ids are the output and whose logits are optimised: an index, or
    # "sentencepiece" for the pair's one SentencePiece member (upstream can only run with such a main
    # model: it pastes the main member's raw token strings into the others' prompts).
    main: Any = 0
    lr: float = 0.15  # η; upstream's default 0 means "main model only", its README example uses 0.15
    steps: int = 5  # T: optimiser steps of the inverse mapping
    weights: list[float] | None = None  # one per member, summing to 1; null: uniform (upstream: -ew)
    temperature: float = 100.0  # of the transfer matrices' row softmax (hard-coded 100 upstream)
    row_top_k: int = 16  # exact entries kept per transfer-matrix row (the rest in first-order form)
    support: int = 4096  # most probable tokens per distribution mapped through the matrices
    max_anchors: int | None = None  # keep the N most frequent common tokens as anchors; null: all (upstream)
    skip_agree: bool = True  # take the main argmax when all members' argmax tokens have the same text
    cache_dir: str | None = None  # transfer matrices; null: $ADAFUSE_CACHE or ~/.cache/adafuse

    def __post_init__(self):
        if self.main != SENTENCEPIECE_MAIN and not (isinstance(self.main, int) and self.main >= 0):
            raise ConfigError(
                f"deepen: main must be a member index (>= 0) or {SENTENCEPIECE_MAIN!r}, got {self.main!r}"
            )
        if not self.lr >= 0:  # also rejects NaN
            raise ConfigError(f"deepen: lr must be >= 0 (0 means main member only), got {self.lr}")
        if self.steps < 0:
            raise ConfigError(f"deepen: steps (T) must be >= 0, got {self.steps}")
        if not self.temperature > 0:
            raise ConfigError(f"deepen: temperature must be > 0, got {self.temperature}")
        if self.row_top_k < 0:
            raise ConfigError(f"deepen: row_top_k must be >= 0, got {self.row_top_k}")
        if self.support < 1:
            raise ConfigError(f"deepen: support must be >= 1, got {self.support}")
        if self.max_anchors is not None and self.max_anchors < 2:
            raise ConfigError(f"deepen: max_anchors must be >= 2 (or null for all), got {self.max_anchors}")
        check_weights("deepen", self.weights)


# ---- decoding ------------------------------------------------------------------------------------

STEP_OVERRUN = 64  # most positions one step may add to a member beyond the budget (a long token's text)
WEIGHT_DECAY = 0.01  # torch.optim.AdamW's default, which upstream keeps
Q_FLOOR = 1e-12  # first-order rows can dip a hair below 0 (entries ~ -5e-6 next to 1/|A| ~ 2e-5)


def positions_needed(cfg: DeepenConfig, max_new_tokens: int) -> int:
    return max_new_tokens + STEP_OVERRUN


@dataclass
class Step:
    """One step, for the trace."""

    argmax: list[int]  # each member's argmax id
    fused: bool  # False: the ensemble step was skipped (see the module docstring)
    token: int  # the main member's chosen id
    loss: list[float]  # the loss before each optimiser step


def anchor_distribution(transfer: Transfer, logprobs: torch.Tensor, support: int) -> torch.Tensor:
    """q = p @ P over the `support` most probable tokens; the rest of the mass spread uniformly. (|A|,)"""
    top = logprobs.topk(min(support, len(logprobs)))
    p = top.values.exp()
    q = transfer.rows(top.indices).to_anchors(p)
    return q + (1 - p.sum()).clamp_min(0) / transfer.n_anchors


def inverse_map(
    transfer: Transfer, z0: torch.Tensor, q: torch.Tensor, cfg: DeepenConfig, allowed: torch.Tensor
) -> tuple[int, list[float]]:
    """argmax of the main member's logits after `steps` AdamW steps towards q (module docstring), over
    the tokens `allowed` to start a character (adafuse/text/tokens.py)."""
    top = z0.topk(min(cfg.support, len(z0)))
    rows = transfer.rows(top.indices)
    rest = z0.clone()
    rest[top.indices] = float("-inf")
    rest = rest[torch.isfinite(rest)]  # the frozen tail (control tokens are -inf and stay so)
    n_anchors = transfer.n_anchors
    with torch.enable_grad():
        z = top.values.clone().requires_grad_(True)
        opt = torch.optim.AdamW([z], lr=cfg.lr, betas=(0.9, 0.999), weight_decay=WEIGHT_DECAY)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10, eta_min=cfg.lr / 4)
        decay, losses = 1.0, []
        target = q.clamp_min(Q_FLOOR)
        entropy = (target * target.log()).sum()
        for _ in range(cfg.steps):
            tail = torch.logsumexp(rest * decay, dim=0) if len(rest) else torch.tensor(float("-inf"))
            norm = torch.logsumexp(torch.cat([z, tail.reshape(1)]), dim=0)
            s = torch.exp(z - norm)
            q0 = rows.to_anchors(s) + torch.exp(tail - norm) / n_anchors
            # KLDivLoss(reduction="mean")(log q0, q): sum over anchors of q (log q - log q0), divided by |A|
            loss = (entropy - (target * q0.clamp_min(Q_FLOOR).log()).sum()) / n_anchors
            opt.zero_grad()
            loss.backward()
            decay *= 1 - opt.param_groups[0]["lr"] * WEIGHT_DECAY  # what AdamW does to every logit
            opt.step()
            sched.step()
            losses.append(loss.item())
    final = z.detach().masked_fill(~allowed[top.indices.cpu()].to(z.device), float("-inf"))
    return int(top.indices[int(final.argmax())]), losses


def decode(s: Session, cfg: DeepenConfig):
    """DeePEn over the session's members; `cfg.main` picks the member whose ids are the output (a program)."""
    members = s.members
    index = main_index(cfg.main, members)
    weights = member_weights("deepen", cfg.weights, len(members))
    vocabs = [vocabulary_of(m) for m in members]
    transfers = prepare(members, cfg)
    main, others = members[index], [m for i, m in enumerate(members) if i != index]
    while True:
        argmax = [m.tokenisation.tokens.choose(m.logprobs) for m in members]  # each one that can start a character
        first = argmax[index]
        skip = first in main.tokenisation.eos_ids or cfg.lr == 0 or cfg.steps == 0
        if not skip and cfg.skip_agree:
            texts = {vocabs[i].texts[t] for i, t in enumerate(argmax)}
            skip = len(texts) == 1 and None not in texts
        token, losses = first, []
        if not skip:
            q = sum(w * anchor_distribution(t, m.logprobs, cfg.support) for w, t, m in zip(weights, transfers, members))
            token, losses = inverse_map(transfers[index], main.logprobs, q, cfg, main.tokenisation.tokens.can_start)
        if s.tracing:
            s.log(Step(argmax, not skip, token, losses))
        if token in main.tokenisation.eos_ids:
            s.add("", eos=True)
            break
        text = yield from _advance_main(main, token, s.text)
        yield from together([m.append_text(s.text, text) for m in others])
        if s.add(text):
            break


def main_index(main, members) -> int:
    """The main member's index: `main` itself, or the one SentencePiece member's."""
    if main == SENTENCEPIECE_MAIN:
        found = [i for i, m in enumerate(members) if m.tokenisation.tokens.kind == SENTENCEPIECE]
        if len(found) != 1:
            kinds = ", ".join(f"{m.name}: {m.tokenisation.tokens.kind}" for m in members)
            raise ConfigError(f"deepen: main={SENTENCEPIECE_MAIN!r} needs exactly one SentencePiece member ({kinds})")
        return found[0]
    if main >= len(members):
        raise ConfigError(f"deepen: main member {main} does not exist; the ensemble has {len(members)}")
    return main


def _advance_main(main, token: int, generated: str):
    """Read `token` into the main member and return the text it adds after the shared text (a program); a
    token that ends inside a multi-byte character is completed first with the member's own argmax tokens
    (module docstring)."""
    text = main.text_of([token])
    if not ends_inside_char(text):
        yield from main.append_ids([token], generated, text)
        return text
    rows = main.fork(1)
    ids = [token]
    yield from rows.extend([[token]])
    while ends_inside_char(text) and len(ids) < CHAR_SLACK:
        nxt = main.tokenisation.tokens.choose(
            rows.last[0], main.tokenisation.tokens.pending(ids)
        )  # a token that continues the character
        yield from rows.extend([[nxt]])
        ids.append(nxt)
        text = main.text_of(ids)
    main.commit(rows, 0, generated, text)
    return text


METHOD = Method(DeepenConfig, decode, positions_needed)
