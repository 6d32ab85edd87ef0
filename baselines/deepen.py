"""`method=deepen`: DeePEn (Huang et al., NeurIPS 2024), token-level fusion through relative representations.

Research notes: ../shared/research/baselines.md §2 (paper and the official code,
OrangeInSouth/DeePEn e966d33). Every member's next-token distribution is mapped into one shared
space, the "anchors" (the tokens all vocabularies hold), averaged there, and mapped back onto the
main member's vocabulary by a few optimiser steps on its logits; the main member's argmax is the
next token, and its text is appended to every other member.

One-off preparation per set of models (`prepare`), cached on disk:
1. anchors A = the texts every member's normalised vocabulary holds as one token (baselines/vocab.py;
   upstream only rewrites `Ġ` as `▁`, so a byte-level and a SentencePiece vocabulary share much less);
2. relative representation of token v of member i: R_i[v, a] = cos(E_i[v], E_i[a]) over the anchors,
   E_i = the member's input embeddings, each row then L2-normalised (as upstream);
3. transfer matrix P_i = row-softmax(temperature * R_i), temperature 100 as upstream.

Bounded memory. P_i is |V_i| x |A| dense: 262,144 x 46,032 fp32 = 48 GB for Gemma-3 in the bundled
pair. Measured on that pair, every row of P_i is close to uniform (each entry is within a few tenths
of 1/|A|: the row-normalised cosines times 100 have a standard deviation of 0.1-0.16), so keeping
the top entries of a row keeps almost no mass (0.3% for the top 64) and is no better than the
uniform matrix (mean L1 error 0.074 for SmolLM2 and 0.135 for Gemma-3, the same as uniform).
We therefore store each row in a first-order form that keeps its whole structure:

    P_i[v, a] ≈ offset[v] + slope[v] * (E_i[v] · Ê_a)        for a outside the row's top `row_top_k`,
    P_i[v, a]  = exact value                                  for the row's top `row_top_k` anchors,

(exp linearised around the row's mean; offset makes the row sum exactly 1; Ê_a = unit anchor
embedding). That is two numbers per row plus `row_top_k` exact entries, and the member's own
embedding matrix, which the model holds anyway. The build logs, and stores in the cache file's
metadata, the L1 error of every row against its dense row (measured on the bundled pair, k = 16:
mean 0.0065 / max 0.069 for SmolLM2, mean 0.0145 / max 0.047 for Gemma-3; see the README).

Per step (upstream's `BasedOnProbabilityTransferLogits_Loacal_FP32_Processor`):
- q_i = p_i @ P_i for every member, over its `support` most probable tokens; the rest of its mass
  (`1 - covered`) is spread uniformly over the anchors (every row is close to uniform, see above);
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

import hashlib
import json
import logging
import os
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from adafuse.errors import ConfigError
from adafuse.loading import default_cache_dir
from adafuse.methods import METHODS, Method
from adafuse.session import Session
from adafuse.words import ends_inside_char
from baselines.vocab import Vocabulary, check_weights, common_texts, member_weights, vocabulary_of

log = logging.getLogger(__name__)

FORMAT = "1"  # bump when the stored quantities change; it is part of the cache key
BUILD_ROWS = 1024  # rows of R per block while building: 1024 x |A| fp32 = 190 MB for 46k anchors


# ---- knobs ------------------------------------------------------------------------------------------


@dataclass
class DeepenConfig:
    """Knobs of `method=deepen` (research notes §2.2)."""

    main: int = 0  # index of the main member: its ids are the output, its logits are optimised
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
        if self.main < 0:
            raise ConfigError(f"deepen: main must be >= 0 (a member index), got {self.main}")
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


# ---- one member's transfer matrix ---------------------------------------------------------------


@dataclass
class Transfer:
    """Member i's P_i in the compressed form of the module docstring.

    Stored: anchors (|A|,) ids of the anchors in this vocabulary; offset, slope (V,); top_ids,
    top_values (V, k): the exact entries of each row's top k. Held from the model: embeddings
    (V, h), its input embeddings; anchor_dirs (|A|, h), the anchors' unit embeddings. Derived once:
    top_fix (V, k), exact minus first-order value at the kept entries.
    """

    anchors: torch.Tensor
    offset: torch.Tensor
    slope: torch.Tensor
    top_ids: torch.Tensor
    top_values: torch.Tensor
    embeddings: torch.Tensor
    anchor_dirs: torch.Tensor
    top_fix: torch.Tensor | None = None

    def __post_init__(self):
        if self.top_fix is None:
            self.top_fix = torch.empty_like(self.top_values)
            for start in range(0, len(self.offset), BUILD_ROWS):
                ids = torch.arange(start, min(start + BUILD_ROWS, len(self.offset)))
                top = self.top_ids[ids]
                dots = torch.einsum("nh,nkh->nk", self.embeddings[ids].float(), self.anchor_dirs[top])
                self.top_fix[ids] = self.top_values[ids] - (self.offset[ids, None] + self.slope[ids, None] * dots)

    @property
    def n_anchors(self) -> int:
        return len(self.anchors)

    def rows(self, ids: torch.Tensor) -> "TransferRows":
        """The rows `ids` of P_i, ready for products with weights over them."""
        return TransferRows(
            scaled=self.slope[ids, None] * self.embeddings[ids].float(),
            offset=self.offset[ids],
            top_ids=self.top_ids[ids],
            top_fix=self.top_fix[ids],
            anchor_dirs=self.anchor_dirs,
        )

    def dense_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """(N, |A|) rows of the compressed P_i written out; for tests and error reports."""
        e = self.embeddings[ids].float()
        rows = self.offset[ids, None] + self.slope[ids, None] * (e @ self.anchor_dirs.T)
        return rows.scatter(1, self.top_ids[ids], self.top_values[ids])


@dataclass
class TransferRows:
    scaled: torch.Tensor  # (N, h): slope[v] * E[v]
    offset: torch.Tensor  # (N,)
    top_ids: torch.Tensor  # (N, k)
    top_fix: torch.Tensor  # (N, k)
    anchor_dirs: torch.Tensor  # (|A|, h)

    def to_anchors(self, w: torch.Tensor) -> torch.Tensor:
        """Σ_v w[v] P[v, :], shape (|A|,); differentiable in w (N,)."""
        q = self.anchor_dirs @ (w @ self.scaled) + (w * self.offset).sum()
        return q.index_add(0, self.top_ids.flatten(), (w[:, None] * self.top_fix).flatten())


# ---- building, caching --------------------------------------------------------------------------


def build_transfer(
    embeddings: torch.Tensor, anchors: torch.Tensor, temperature: float, row_top_k: int
) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """The stored tensors of one member's P (see `Transfer`), and the L1 error of its compressed rows.

    Reads R in blocks of BUILD_ROWS rows, so memory stays at a few blocks of |A| floats.
    """
    E = embeddings.detach().float()
    n_rows, n_anchors = E.shape[0], len(anchors)
    k = min(row_top_k, n_anchors - 1)
    anchor_dirs = torch.nn.functional.normalize(E[anchors], dim=-1)  # (|A|, h)
    offset, slope = torch.empty(n_rows), torch.empty(n_rows)
    top_ids, top_values = torch.empty(n_rows, k, dtype=torch.int32), torch.empty(n_rows, k)
    l1 = torch.empty(n_rows)
    for start in range(0, n_rows, BUILD_ROWS):
        e = E[start : start + BUILD_ROWS]
        norm_e = e.norm(dim=-1)
        x = e @ anchor_dirs.T  # (c, |A|): |e| cos(e, anchor)
        cos_norm = x.norm(dim=-1) / norm_e.clamp_min(1e-30)  # L2 norm of the row of cosines
        ok = (norm_e > 0) & (cos_norm > 0)  # a zero embedding has a uniform row
        scale = torch.where(ok, temperature / (cos_norm * norm_e).clamp_min(1e-30), torch.zeros_like(norm_e))
        x.mul_(scale[:, None])  # x = temperature * R (rows of R L2-normalised)
        lse = torch.logsumexp(x, dim=-1)
        mu = x.mean(dim=-1)
        alpha = torch.exp(mu - lse)
        top_x, top_i = x.topk(k, dim=-1)
        top_p = torch.exp(top_x - lse[:, None])
        # Outside the top k: alpha * (beta + x - mu), exp linearised at the row mean; beta makes the row sum 1.
        rest_dev = x.sum(dim=-1) - top_x.sum(dim=-1) - (n_anchors - k) * mu
        beta = ((1 - top_p.sum(dim=-1)) / alpha - rest_dev) / (n_anchors - k)
        off = alpha * (beta - mu)
        # Error against the dense row, top entries excluded (they are exact).
        dense = (x - lse[:, None]).exp_()
        x.mul_(alpha[:, None]).add_(off[:, None])  # x is now the first-order row
        dense.sub_(x).abs_()
        l1[start : start + len(e)] = dense.sum(dim=-1) - dense.gather(1, top_i).sum(dim=-1)
        offset[start : start + len(e)] = off
        slope[start : start + len(e)] = alpha * scale
        top_ids[start : start + len(e)] = top_i.int()
        top_values[start : start + len(e)] = top_p
        del x, dense
    tensors = {"anchors": anchors.int(), "offset": offset, "slope": slope, "top_ids": top_ids, "top_values": top_values}
    return tensors, {"l1_mean": l1.mean().item(), "l1_max": l1.max().item()}


_DIGESTS: "weakref.WeakKeyDictionary[object, str]" = weakref.WeakKeyDictionary()  # model -> its embeddings' digest
_LOADED: dict[str, dict] = {}  # cache key -> tensors read from disk, shared by every example of a run
_TRANSFERS: dict[tuple[str, str], Transfer] = {}  # (cache key, member digest) -> ready Transfer
_LOCK = threading.Lock()  # guards the memos above
_BUILD_LOCK = threading.Lock()  # one build at a time: examples decoded in parallel wait for the first


def embedding_digest(embeddings: torch.Tensor) -> str:
    """sha256 of an embedding matrix's shape, dtype and bytes (0.5 s for 670 MB)."""
    h = hashlib.sha256(f"{tuple(embeddings.shape)} {embeddings.dtype}".encode())
    flat = embeddings.detach().to("cpu").contiguous().view(-1).view(torch.uint8)
    for block in flat.split(1 << 26):
        h.update(block.numpy().tobytes())
    return h.hexdigest()


def member_digest(member, vocab: Vocabulary) -> str:
    """What member i's P depends on apart from the anchors: its input embeddings and its vocabulary's
    texts. The embeddings' digest is remembered per model object (clones of a member share it)."""
    with _LOCK:
        weights = _DIGESTS.get(member.model)
    if weights is None:
        weights = embedding_digest(member.input_embeddings())
        with _LOCK:
            _DIGESTS[member.model] = weights
    return hashlib.sha256(f"{weights} {vocab.digest}".encode()).hexdigest()


def cache_key(digests: list[str], cfg: DeepenConfig) -> str:
    """The cache file's name: the distinct members (order-free), temperature, row_top_k, max_anchors, format."""
    text = json.dumps([FORMAT, cfg.temperature, cfg.row_top_k, cfg.max_anchors, sorted(set(digests))])
    return hashlib.sha256(text.encode()).hexdigest()


def anchor_ids(vocab: Vocabulary, texts: list[str], encode) -> torch.Tensor:
    """Each anchor text's id in this vocabulary; a text with several ids (Gemma's "\\n" and <0x0A>)
    takes the one its tokenizer produces for the text, else the lowest."""
    ids = []
    for text in texts:
        options = vocab.ids_of(text)
        if len(options) > 1:
            own = encode(text)
            options = own if len(own) == 1 and own[0] in options else options
        ids.append(options[0])
    return torch.tensor(ids, dtype=torch.long)


def transfer_path(cfg: DeepenConfig, key: str) -> Path:
    root = Path(cfg.cache_dir).expanduser() if cfg.cache_dir else default_cache_dir()
    return root / "deepen" / f"{key}.safetensors"


def write_atomic(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    """safetensors written to a temporary file beside `path`, then renamed over it (readers never see half)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem[:12]}-", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        save_file({k: v.contiguous() for k, v in tensors.items()}, tmp, metadata=metadata)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_metadata(path: Path) -> dict[str, str]:
    with safe_open(str(path), "pt") as f:
        return f.metadata() or {}


def prepare(members, cfg: DeepenConfig) -> list[Transfer]:
    """Every member's transfer matrix: from this process's memory, else the disk cache, else built and saved."""
    vocabs = [vocabulary_of(m) for m in members]
    digests = [member_digest(m, v) for m, v in zip(members, vocabs)]
    key = cache_key(digests, cfg)
    with _LOCK:
        ready = [_TRANSFERS.get((key, d)) for d in digests]
    if all(ready):
        return ready
    with _BUILD_LOCK:
        with _LOCK:
            stored = _LOADED.get(key)
        if stored is None:
            path = transfer_path(cfg, key)
            if path.is_file():
                stored = load_file(str(path))
                log.info("deepen: transfer matrices read from %s", path)
            else:
                stored = _build_all(members, vocabs, digests, cfg, path)
            with _LOCK:
                _LOADED[key] = stored
        transfers = []
        for m, d in zip(members, digests):
            with _LOCK:
                ready = _TRANSFERS.get((key, d))
            if ready is None:
                ready = _transfer(stored, d[:16], m.input_embeddings())
                with _LOCK:
                    _TRANSFERS[(key, d)] = ready
            transfers.append(ready)
    return transfers


def _transfer(stored: dict[str, torch.Tensor], tag: str, embeddings: torch.Tensor) -> Transfer:
    anchors = stored[f"{tag}.anchors"].long()
    return Transfer(
        anchors=anchors,
        offset=stored[f"{tag}.offset"],
        slope=stored[f"{tag}.slope"],
        top_ids=stored[f"{tag}.top_ids"].long(),
        top_values=stored[f"{tag}.top_values"],
        embeddings=embeddings,
        anchor_dirs=torch.nn.functional.normalize(embeddings[anchors].float(), dim=-1),
    )


def choose_anchors(vocabs: list[Vocabulary], max_anchors: int | None) -> list[str]:
    """The anchor texts: every common text, or the `max_anchors` whose largest id over the members is
    smallest (BPE merge ranks and SentencePiece piece order both put frequent tokens first)."""
    texts = common_texts(vocabs)
    if max_anchors is not None and len(texts) > max_anchors:
        rank = {t: max(v.ids_of(t)[0] for v in vocabs) for t in texts}
        texts = sorted(sorted(texts, key=lambda t: (rank[t], t))[:max_anchors])
    return texts


def _build_all(members, vocabs, digests, cfg: DeepenConfig, path: Path) -> dict[str, torch.Tensor]:
    texts = choose_anchors(vocabs, cfg.max_anchors)
    if len(texts) < 2:
        raise ConfigError(f"deepen: the members share {len(texts)} tokens; at least 2 anchors are needed")
    started = time.perf_counter()
    tensors: dict[str, torch.Tensor] = {}
    metadata = {"format": FORMAT, "temperature": str(cfg.temperature), "row_top_k": str(cfg.row_top_k)}
    metadata["max_anchors"] = str(cfg.max_anchors)
    metadata["anchors"] = str(len(texts))
    for m, vocab, d in zip(members, vocabs, digests):
        tag = d[:16]
        if f"{tag}.anchors" in tensors:  # the same model twice (a clone)
            continue
        t0 = time.perf_counter()
        anchors = anchor_ids(vocab, texts, m.encode_text)
        with torch.inference_mode():
            own, error = build_transfer(m.input_embeddings(), anchors, cfg.temperature, cfg.row_top_k)
        tensors.update({f"{tag}.{name}": t for name, t in own.items()})
        nbytes = sum(t.numel() * t.element_size() for t in own.values())
        log.info(
            "deepen: %s transfer matrix %d x %d built in %.1f s, %.1f MB stored; L1 error per row vs dense: "
            "mean %.4f, max %.4f",
            m.name, len(vocab), len(texts), time.perf_counter() - t0, nbytes / 2**20, error["l1_mean"],
            error["l1_max"],
        )  # fmt: skip
        metadata[f"{tag}.name"] = m.name
        metadata[f"{tag}.l1_mean"] = f"{error['l1_mean']:.6f}"
        metadata[f"{tag}.l1_max"] = f"{error['l1_max']:.6f}"
        metadata[f"{tag}.seconds"] = f"{time.perf_counter() - t0:.1f}"
    metadata["seconds"] = f"{time.perf_counter() - started:.1f}"
    write_atomic(path, tensors, metadata)
    log.info("deepen: transfer matrices saved to %s", path)
    return tensors


def dense_transfer_rows(embeddings: torch.Tensor, anchors: torch.Tensor, ids: torch.Tensor, temperature: float):
    """The exact rows `ids` of P = row-softmax(temperature * R), R the row-normalised cosines (for error reports)."""
    E = embeddings.detach().float()
    cos = torch.nn.functional.normalize(E[ids], dim=-1) @ torch.nn.functional.normalize(E[anchors], dim=-1).T
    return torch.softmax(temperature * torch.nn.functional.normalize(cos, dim=-1), dim=-1)


# ---- decoding ------------------------------------------------------------------------------------

STEP_OVERRUN = 64  # most positions one step may add to a member beyond the budget (a long token's text)
CHAR_TOKENS = 4  # a chosen token inside a multi-byte character is completed within this many tokens
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


def inverse_map(transfer: Transfer, z0: torch.Tensor, q: torch.Tensor, cfg: DeepenConfig) -> tuple[int, list[float]]:
    """argmax of the main member's logits after `steps` AdamW steps towards q (module docstring)."""
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
    return int(top.indices[int(z.detach().argmax())]), losses


def generate(members, prompt: str, cfg: DeepenConfig, *, stop=(), max_new_tokens: int = 64, trace: bool = False):
    """Decode `prompt` with DeePEn over `members`; `cfg.main` picks the member whose ids are the output."""
    if cfg.main >= len(members):
        raise ConfigError(f"deepen: main member {cfg.main} does not exist; the ensemble has {len(members)}")
    weights = member_weights("deepen", cfg.weights, len(members))
    vocabs = [vocabulary_of(m) for m in members]
    transfers = prepare(members, cfg)
    main, others = members[cfg.main], [m for i, m in enumerate(members) if i != cfg.main]
    s = Session(
        members,
        prompt,
        reserve=positions_needed(cfg, max_new_tokens),
        stop=stop,
        max_new_tokens=max_new_tokens,
        trace=trace,
    )
    while True:
        argmax = [int(m.logprobs.argmax()) for m in members]
        first = argmax[cfg.main]
        skip = first in main.eos_ids or cfg.lr == 0 or cfg.steps == 0
        if not skip and cfg.skip_agree:
            texts = {vocabs[i].texts[t] for i, t in enumerate(argmax)}
            skip = len(texts) == 1 and None not in texts
        token, losses = first, []
        if not skip:
            q = sum(w * anchor_distribution(t, m.logprobs, cfg.support) for w, t, m in zip(weights, transfers, members))
            token, losses = inverse_map(transfers[cfg.main], main.logprobs, q, cfg)
        if s.record:
            s.record.steps.append(Step(argmax, not skip, token, losses))
        if token in main.eos_ids:
            s.add("", eos=True)
            break
        text = _advance_main(main, token)
        for m in others:
            m.append_text(text)
        if s.add(text):
            break
    return s.finish()


def _advance_main(main, token: int) -> str:
    """Read `token` into the main member and return the text it adds; a token that ends inside a
    multi-byte character is completed first with the member's own argmax tokens (module docstring)."""
    text = main.text_of([token])
    if not ends_inside_char(text):
        main.append_ids([token], text)
        return text
    rows = main.fork(1)
    ids = [token]
    rows.extend([[token]])
    while ends_inside_char(text) and len(ids) < CHAR_TOKENS:
        dist = rows.last[0].clone()
        dist[list(main.eos_ids)] = float("-inf")
        nxt = int(dist.argmax())
        rows.extend([[nxt]])
        ids.append(nxt)
        text = main.text_of(ids)
    main.commit(rows, 0, text)
    return text


METHODS.register("deepen")(Method(DeepenConfig, generate, positions_needed))
