"""DeePEn's transfer matrices (Huang et al., NeurIPS 2024): built once per set of models, cached on disk.

The decoding that uses them is baselines/deepen.py; research notes ../shared/research/baselines.md §2.

1. anchors A = the texts every member's normalised vocabulary holds as one token (baselines/vocab.py;
   upstream only rewrites `Ġ` as `▁`, so a byte-level and a SentencePiece vocabulary share much less);
2. relative representation of token v of member i: R_i[v, a] = cos(E_i[v], E_i[a]) over the anchors,
   E_i = the member's input embeddings, each row then L2-normalised (as upstream);
3. transfer matrix P_i = row-softmax(temperature * R_i), temperature 100 as upstream.

Bounded memory. P_i is |V_i| x |A| dense, tens of gigabytes for a 262k vocabulary. Its rows are close
to uniform (100 times a row-normalised cosine varies by a few tenths), so keeping only a row's top
entries keeps almost none of its mass, while a first-order form keeps its whole structure:

    P_i[v, a] ≈ offset[v] + slope[v] * (E_i[v] · Ê_a)        for a outside the row's top `row_top_k`,
    P_i[v, a]  = exact value                                  for the row's top `row_top_k` anchors,

(exp linearised around the row's mean; offset makes the row sum exactly 1; Ê_a = unit anchor
embedding). That is two numbers per row plus `row_top_k` exact entries, and the member's own
embedding matrix, which the model holds anyway. The build logs, and stores in the cache file's
metadata, the L1 error of every row against its dense row (docs/baselines.md gives the bundled pair's).

The cache file (safetensors, written atomically, built under a file lock so that concurrent processes
build it once) is keyed by each member's embeddings and vocabulary, the temperature, `row_top_k`,
`max_anchors` and the format. In memory, a member's matrix lives as long as its model does
(`_TRANSFERS` is keyed weakly by the model), so a process that loads pair after pair holds only the
matrices of the models still loaded.

`settings` below is anything with `temperature`, `row_top_k`, `max_anchors` and `cache_dir`
(a `DeepenConfig`).
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
from filelock import FileLock
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from adafuse.config import default_cache_dir
from adafuse.errors import ConfigError
from baselines.vocab import Vocabulary, common_texts, vocabulary_of

log = logging.getLogger(__name__)

FORMAT = "2"  # bump when the stored quantities change; it is part of the cache key
BUILD_ROWS = 1024  # rows of R per block while building: 1024 x |A| fp32 = 190 MB for 46k anchors


# ---- one member's transfer matrix ---------------------------------------------------------------


@dataclass
class Transfer:
    """Member i's P_i in the compressed form of the module docstring.

    Stored: anchors (|A|,) ids of the anchors in this vocabulary; offset, slope (V,); top_ids,
    top_values (V, k): the exact entries of each row's top k; top_fix (V, k): exact minus first-order
    value at those entries (stored, not derived on load: deriving it gathers k anchor embeddings per
    row, which every process that loads the matrices would repeat). Held from the model: embeddings
    (V, h), its input embeddings; anchor_dirs (|A|, h), the anchors' unit embeddings.
    """

    anchors: torch.Tensor
    offset: torch.Tensor
    slope: torch.Tensor
    top_ids: torch.Tensor
    top_values: torch.Tensor
    embeddings: torch.Tensor
    anchor_dirs: torch.Tensor
    top_fix: torch.Tensor

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
    top_fix = torch.empty(n_rows, k)
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
        top_fix[start : start + len(e)] = top_p - x.gather(1, top_i)
        dense.sub_(x).abs_()
        l1[start : start + len(e)] = dense.sum(dim=-1) - dense.gather(1, top_i).sum(dim=-1)
        offset[start : start + len(e)] = off
        slope[start : start + len(e)] = alpha * scale
        top_ids[start : start + len(e)] = top_i.int()
        top_values[start : start + len(e)] = top_p
        del x, dense
    tensors = {
        "anchors": anchors.int(),
        "offset": offset,
        "slope": slope,
        "top_ids": top_ids,
        "top_values": top_values,
        "top_fix": top_fix,
    }
    return tensors, {"l1_mean": l1.mean().item(), "l1_max": l1.max().item()}


_DIGESTS: "weakref.WeakKeyDictionary[object, str]" = weakref.WeakKeyDictionary()  # model -> its embeddings' digest
# model -> {cache key: its Transfer}. Weak: a Transfer holds the model's embeddings (their storage is
# the weights'), so a module-level dict would keep every pair ever loaded in memory.
_TRANSFERS: "weakref.WeakKeyDictionary[object, dict[str, Transfer]]" = weakref.WeakKeyDictionary()
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
        weights = embedding_digest(member.runner.input_embeddings())
        with _LOCK:
            _DIGESTS[member.model] = weights
    return hashlib.sha256(f"{weights} {vocab.digest}".encode()).hexdigest()


def cache_key(digests: list[str], settings) -> str:
    """The cache file's name: the distinct members (order-free), temperature, row_top_k, max_anchors, format."""
    text = json.dumps([FORMAT, settings.temperature, settings.row_top_k, settings.max_anchors, sorted(set(digests))])
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


def transfer_path(settings, key: str) -> Path:
    root = Path(settings.cache_dir).expanduser() if settings.cache_dir else default_cache_dir()
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


def prepare(members, settings) -> list[Transfer]:
    """Every member's transfer matrix: from this process's memory, else the disk cache, else built and saved."""
    vocabs = [vocabulary_of(m) for m in members]
    digests = [member_digest(m, v) for m, v in zip(members, vocabs)]
    key = cache_key(digests, settings)
    ready = _ready(members, key)
    if ready is not None:
        return ready
    with _BUILD_LOCK:
        ready = _ready(members, key)
        if ready is not None:
            return ready
        path = transfer_path(settings, key)
        path.parent.mkdir(parents=True, exist_ok=True)
        # Across processes too (test workers, a SLURM array on a fresh cache): one builds, the others read.
        with FileLock(path.with_suffix(".lock")):
            if path.is_file():
                stored = load_file(str(path))
                log.info("deepen: transfer matrices read from %s", path)
            else:
                stored = _build_all(members, vocabs, digests, settings, path)
        transfers = [_transfer(stored, d[:16], m.runner.input_embeddings()) for m, d in zip(members, digests)]
        with _LOCK:
            for m, transfer in zip(members, transfers):
                _TRANSFERS.setdefault(m.model, {})[key] = transfer
    return transfers


def _ready(members, key: str) -> list[Transfer] | None:
    with _LOCK:
        ready = [_TRANSFERS.get(m.model, {}).get(key) for m in members]
    return ready if all(ready) else None


def _transfer(stored: dict[str, torch.Tensor], tag: str, embeddings: torch.Tensor) -> Transfer:
    anchors = stored[f"{tag}.anchors"].long()
    return Transfer(
        anchors=anchors,
        offset=stored[f"{tag}.offset"],
        slope=stored[f"{tag}.slope"],
        top_ids=stored[f"{tag}.top_ids"].long(),
        top_values=stored[f"{tag}.top_values"],
        top_fix=stored[f"{tag}.top_fix"],
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


def _build_all(members, vocabs, digests, settings, path: Path) -> dict[str, torch.Tensor]:
    texts = choose_anchors(vocabs, settings.max_anchors)
    if len(texts) < 2:
        raise ConfigError(f"deepen: the members share {len(texts)} tokens; at least 2 anchors are needed")
    started = time.perf_counter()
    tensors: dict[str, torch.Tensor] = {}
    metadata = {"format": FORMAT, "temperature": str(settings.temperature), "row_top_k": str(settings.row_top_k)}
    metadata["max_anchors"] = str(settings.max_anchors)
    metadata["anchors"] = str(len(texts))
    for m, vocab, d in zip(members, vocabs, digests):
        tag = d[:16]
        if f"{tag}.anchors" in tensors:  # the same model twice (a clone)
            continue
        t0 = time.perf_counter()
        anchors = anchor_ids(vocab, texts, m.tokenisation.encode_text)
        with torch.inference_mode():
            own, error = build_transfer(m.runner.input_embeddings(), anchors, settings.temperature, settings.row_top_k)
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
