"""PairRM (LLM-Blender's ranker, Jiang, Ren, Lin, ACL 2023), written for transformers 5.

The `llm-blender` package (0.0.2) does not import under transformers >= 5 (it imports
`TRANSFORMERS_CACHE` and calls `batch_encode_plus`, both removed; upstream issue #33), so the ranker
is written here. Its parameter names follow the upstream checkpoints (`pretrained_model.*`,
`head_layer.{1,4}.*`), so both published layouts load unchanged: `llm-blender/PairRM` (a ranker
config.json naming its DeBERTa backbone) and `llm-blender/PairRM-hf` (a DeBERTa-v2 config.json holding
the prefix-token ids).

For every ordered pair (i, j), i != j, it reads
`[CLS]<|source|>prompt[SEP][CLS]<|candidate1|>answer_i[SEP][CLS]<|candidate2|>answer_j[SEP]` and returns
C[i, j] = head([h_src; h_c1]) - head([h_src; h_c2]), where h_x is the final hidden state at that prefix
token and head is Linear(2H -> H) -> Tanh -> Linear(H -> 1). Answer i scores mean_{j != i} (C[i, j] -
C[j, i]), so each comparison counts in both orders (upstream's full matrix, "max_logits").

Where this differs from upstream (deliberately):
- upstream's score averages over all j including j = i (a zero), i.e. scales by (N-1)/N; the mean
  here is over j != i. The ranking is the same;
- every special token's text ([SEP], [CLS], <|source|>, ...) inside an input becomes a space
  (upstream does this for [SEP] only), so an answer can never fake a prefix position;
- a source longer than 1224 tokens keeps its end, not its start: our few-shot prompts put the
  question being answered last.
"""

import json
import threading
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from adafuse.errors import ConfigError, ModelFileError

SOURCE, CANDIDATE1, CANDIDATE2, CANDIDATE = "<|source|>", "<|candidate1|>", "<|candidate2|>", "<|candidate|>"
SOURCE_MAX_TOKENS, CANDIDATE_MAX_TOKENS = 1224, 412  # upstream's input budget: 1224 + 2 * 412 = 2048
PAIRS_PER_BATCH = 8  # comparisons read in one forward pass (bounds memory on 2048-token inputs)
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


class PairRMModel(nn.Module):
    """A DeBERTa-v2 encoder and PairRM's pairwise head.

    The attribute names and the head's layer indices (dropouts at 0 and 3) are those of upstream's
    checkpoints, so their state dicts load unchanged. Dropout is off: this module only infers.
    """

    def __init__(self, backbone_config, n_tasks: int = 1):
        super().__init__()
        from transformers import DebertaV2Model

        hidden = backbone_config.hidden_size
        self.pretrained_model = DebertaV2Model(backbone_config)
        self.head_layer = nn.Sequential(
            nn.Dropout(0.0), nn.Linear(2 * hidden, hidden), nn.Tanh(), nn.Dropout(0.0), nn.Linear(hidden, n_tasks)
        )

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, marks: torch.Tensor) -> torch.Tensor:
        """input_ids, attention_mask: (pairs, length); marks: (pairs, 3), the positions of <|source|>,
        <|candidate1|> and <|candidate2|>. Returns (pairs,): > 0 when candidate 1 is the better one."""
        hidden = self.pretrained_model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        rows = torch.arange(len(input_ids), device=input_ids.device)[:, None]
        source, first, second = hidden[rows, marks].unbind(1)  # each (pairs, H)
        left = self.head_layer(torch.cat([source, first], dim=-1))  # (pairs, n_tasks)
        right = self.head_layer(torch.cat([source, second], dim=-1))
        return (left - right).mean(dim=-1)


@dataclass
class PairRanker:
    """A loaded PairRM: compares answers to one prompt pairwise, in both orders."""

    model: PairRMModel
    tokenizer: object
    marks: tuple[int, int, int]  # ids of <|source|>, <|candidate1|>, <|candidate2|>
    source_max_tokens: int = SOURCE_MAX_TOKENS
    candidate_max_tokens: int = CANDIDATE_MAX_TOKENS

    def _clean(self, text: str) -> str:
        """Special tokens' text becomes a space, so inputs hold each prefix token exactly once."""
        for special in set(self.tokenizer.all_special_tokens) | {SOURCE, CANDIDATE1, CANDIDATE2, CANDIDATE}:
            text = text.replace(special, " ")
        return text

    def _segment(self, prefix: str, text: str, limit: int, keep_end: bool = False) -> list[int]:
        """[CLS] prefix text [SEP] as upstream encodes each part, cut to `limit` tokens: the text's
        start is kept (upstream), or its end with `keep_end`."""
        ids = self.tokenizer(prefix + self._clean(text))["input_ids"]
        mark = self.tokenizer.convert_tokens_to_ids(prefix)
        if ids[:1] != [self.tokenizer.cls_token_id] or ids[1:2] != [mark] or ids[-1:] != [self.tokenizer.sep_token_id]:
            raise ConfigError(f"PairRM's tokenizer does not encode a segment as [CLS]{prefix}...[SEP]")
        if len(ids) <= limit:
            return ids
        body = ids[2:-1]
        body = body[len(body) - (limit - 3) :] if keep_end else body[: limit - 3]
        return ids[:2] + body + ids[-1:]

    def pair_ids(self, source: str, first: str, second: str) -> list[int]:
        """The input ids of one comparison: is `first` a better answer to `source` than `second`?

        A long source keeps its end: a few-shot prompt puts the question being answered last
        (upstream keeps the start, which would cut the question away).
        """
        source_ids = self._segment(SOURCE, source, self.source_max_tokens, keep_end=True)
        # Budget the source does not use goes to the candidates, as upstream does.
        limit = (self.source_max_tokens + 2 * self.candidate_max_tokens - len(source_ids)) // 2
        return source_ids + self._segment(CANDIDATE1, first, limit) + self._segment(CANDIDATE2, second, limit)

    @torch.inference_mode()
    def compare(self, source: str, candidates: list[str]) -> torch.Tensor:
        """C (N, N) in float32: C[i, j] > 0 when answer i beats answer j with i shown first; C[i, i] = 0."""
        n = len(candidates)
        pairs = [(i, j) for i in range(n) for j in range(n) if i != j]
        matrix = torch.zeros(n, n)
        device = next(self.model.parameters()).device
        pad = self.tokenizer.pad_token_id
        for start in range(0, len(pairs), PAIRS_PER_BATCH):
            chunk = pairs[start : start + PAIRS_PER_BATCH]
            inputs = [self.pair_ids(source, candidates[i], candidates[j]) for i, j in chunk]
            longest = max(len(ids) for ids in inputs)
            ids = torch.tensor([x + [pad] * (longest - len(x)) for x in inputs], device=device)
            mask = torch.tensor([[1] * len(x) + [0] * (longest - len(x)) for x in inputs], device=device)
            marks = torch.tensor([[x.index(m) for m in self.marks] for x in inputs], device=device)
            logits = self.model(ids, mask, marks).float().cpu()
            for (i, j), value in zip(chunk, logits.tolist()):
                matrix[i, j] = value
        return matrix

    def scores(self, source: str, candidates: list[str]) -> tuple[list[float], torch.Tensor]:
        """Each answer's score mean_{j != i} (C[i, j] - C[j, i]) (higher is better), and C."""
        matrix = self.compare(source, candidates)
        return scores_from_matrix(matrix), matrix


def scores_from_matrix(matrix: torch.Tensor) -> list[float]:
    """score_i = mean over j != i of (C[i, j] - C[j, i]): i's margin over j, shown first and second."""
    n = matrix.shape[0]
    if n < 2:
        return [0.0] * n
    return ((matrix - matrix.T).sum(dim=1) / (n - 1)).tolist()


def _is_local(path: str) -> bool:
    return path.startswith(("/", ".", "~")) or Path(path).expanduser().exists()


def check_pairrm_path(path: str) -> None:
    """Config-time check (no weights read): a local path must be a directory that holds a PairRM checkpoint.

    A hub id ("owner/name") is checked when it is downloaded.
    """
    if not _is_local(path):
        return
    directory = Path(path).expanduser()
    if not directory.is_dir():
        raise ConfigError(f"pairrm_path {path!r}: no such directory (a PairRM checkpoint is a directory)")
    _checkpoint_kind(directory)
    _weight_file(directory)


def _checkpoint_kind(directory: Path) -> tuple[str, dict]:
    """("ranker", config) for llm-blender/PairRM's layout, ("hf", config) for PairRM-hf's; else a ConfigError."""
    config_file = directory / "config.json"
    if not config_file.is_file():
        raise ConfigError(f"pairrm_path {str(directory)!r} holds no config.json, so it is not a PairRM checkpoint")
    try:
        config = json.loads(config_file.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"pairrm_path {str(directory)!r}: config.json is not valid JSON ({e})") from None
    if "ranker_type" in config:
        if config["ranker_type"] != "pairranker":
            raise ConfigError(
                f"pairrm_path {str(directory)!r} holds an LLM-Blender ranker of type {config['ranker_type']!r}, "
                "not a PairRM ('pairranker')"
            )
        return "ranker", config
    if config.get("model_type") == "deberta-v2" and {"source_prefix_id", "cand1_prefix_id", "cand2_prefix_id"} <= set(
        config
    ):
        return "hf", config
    raise ConfigError(
        f"pairrm_path {str(directory)!r} is not a PairRM checkpoint: its config.json is neither an LLM-Blender "
        "ranker config (ranker_type: pairranker) nor a DeBERTa-v2 config with PairRM's prefix-token ids "
        f"(model_type is {config.get('model_type')!r})"
    )


def _weight_file(directory: Path) -> Path:
    for name in WEIGHT_FILES:
        if (directory / name).is_file():
            return directory / name
    raise ConfigError(f"pairrm_path {str(directory)!r} holds no weights ({' or '.join(WEIGHT_FILES)})")


def _download(repo: str) -> Path:
    """The local snapshot of a hub checkpoint (only the files the ranker reads)."""
    from huggingface_hub import hf_hub_download, snapshot_download

    try:
        where = Path(snapshot_download(repo, allow_patterns=["*.json", "*.model", "*.txt", "*.safetensors"]))
        if not (where / "model.safetensors").is_file():
            hf_hub_download(repo, "pytorch_model.bin")
            where = Path(snapshot_download(repo, allow_patterns=["*.json", "*.model", "*.txt", "*.bin"]))
    except Exception as e:  # offline, unknown repo, gated, ...: say which and why
        raise ModelFileError(f"pairrm_path {repo!r} is not a local directory and could not be downloaded: {e}") from e
    return where


def fetch_pairrm(path: str) -> Path:
    """PairRM's checkpoint from the hub (or a local directory, checked), and for llm-blender/PairRM's layout the
    config of the backbone it names, into the Hugging Face cache once (scripts/prepare_models.py): what
    `load_pairrm` reads, then read offline. Returns the checkpoint's folder."""
    from transformers import AutoConfig

    directory = Path(path).expanduser() if _is_local(path) else _download(path)
    check_pairrm_path(str(directory))
    kind, config = _checkpoint_kind(directory)
    if kind == "ranker":
        try:
            AutoConfig.from_pretrained(config["model_name"])
        except Exception as e:
            raise ModelFileError(f"PairRM backbone {config.get('model_name')!r} could not be fetched: {e}") from e
    return directory


def load_pairrm(path: str, device: str | torch.device = "cpu") -> PairRanker:
    """Load PairRM from a local directory or a hub id; a directory without a PairRM checkpoint is a ConfigError."""
    from transformers import AutoConfig, AutoTokenizer, DebertaV2Config

    directory = Path(path).expanduser() if _is_local(path) else _download(path)
    check_pairrm_path(str(directory))
    kind, config = _checkpoint_kind(directory)
    if kind == "ranker":  # the backbone's architecture is that of the model it names
        try:
            backbone = AutoConfig.from_pretrained(config["model_name"])
        except Exception as e:
            raise ModelFileError(f"PairRM backbone {config.get('model_name')!r} could not be loaded: {e}") from e
        lengths = (config.get("source_maxlength"), config.get("candidate_maxlength"))
    else:
        backbone = DebertaV2Config.from_dict(config)
        lengths = (None, None)
    if backbone.model_type != "deberta-v2":
        raise ConfigError(f"pairrm_path {path!r}: the backbone is {backbone.model_type!r}, PairRM's is deberta-v2")
    tokenizer = AutoTokenizer.from_pretrained(directory)
    vocab = tokenizer.get_vocab()
    missing = [t for t in (SOURCE, CANDIDATE1, CANDIDATE2) if t not in vocab]
    if missing:
        raise ConfigError(f"pairrm_path {path!r}: the tokenizer lacks PairRM's prefix tokens {missing}")
    marks = tuple(vocab[t] for t in (SOURCE, CANDIDATE1, CANDIDATE2))
    if kind == "hf" and marks != (config["source_prefix_id"], config["cand1_prefix_id"], config["cand2_prefix_id"]):
        raise ConfigError(f"pairrm_path {path!r}: config.json and the tokenizer disagree on the prefix-token ids")

    weights = _weight_file(directory)
    if weights.suffix == ".safetensors":
        from safetensors.torch import load_file

        state = load_file(weights)
    else:
        state = torch.load(weights, map_location="cpu", weights_only=True)
    embeddings = state.get("pretrained_model.embeddings.word_embeddings.weight")
    if embeddings is None:
        raise ConfigError(f"pairrm_path {path!r} is not a PairRM checkpoint: no pretrained_model.* weights")
    if kind == "ranker":  # upstream resizes the backbone's embeddings to its tokenizer before loading
        backbone.vocab_size = embeddings.shape[0]
    model = PairRMModel(backbone, n_tasks=config.get("n_tasks", 1))
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as e:  # shape mismatches
        raise ConfigError(f"pairrm_path {path!r}: the weights do not fit a PairRM of this config: {e}") from None
    unexpected = [k for k in unexpected if not k.endswith("position_ids")]  # a buffer older versions saved
    if missing or unexpected:
        raise ConfigError(
            f"pairrm_path {path!r} is not a PairRM checkpoint: missing weights {missing[:5]}, "
            f"unexpected {unexpected[:5]}"
        )
    model.to(device).eval()
    return PairRanker(model, tokenizer, marks, lengths[0] or SOURCE_MAX_TOKENS, lengths[1] or CANDIDATE_MAX_TOKENS)


_LOADED: dict[tuple[str, str], PairRanker] = {}
_LOADING = threading.Lock()


def pairrm(path: str, device) -> PairRanker:
    """The PairRM at `path` on `device`, loaded once per process (its weights are read-only afterwards)."""
    key = (path, str(device))
    with _LOADING:
        if key not in _LOADED:
            _LOADED[key] = load_pairrm(path, device)
        return _LOADED[key]
