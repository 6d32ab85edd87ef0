"""Resolve a model entry (hub id, local directory, GGUF file, or bundled GGUF) to a tokenizer and weights.

GGUF weights are dequantised by transformers, slowly (the metadata of a large vocabulary most of
all). The result (safetensors + tokenizer) is cached under `<cache_dir>/gguf/<sha256>/`, keyed by
the GGUF's hash, so every later load takes seconds. The cache entry is built in a private temporary
directory and renamed into place, so concurrent jobs (a SLURM array) never see half a model, and
under a lock, so that they convert it once between them rather than once each.
"""

import hashlib
import logging
import shutil
import tempfile
from pathlib import Path

import torch
from filelock import FileLock

from adafuse.config import ModelConfig, default_cache_dir
from adafuse.errors import ConfigError, ModelFileError
from adafuse.loading.bundled import BUNDLES
from adafuse.loading.gguf import shared_gguf_reader

log = logging.getLogger(__name__)


def sha256_of(paths: list[Path]) -> str:
    """Hash of the files concatenated in order (the GGUF that the parts make up)."""
    h = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            while block := f.read(1 << 22):
                h.update(block)
    return h.hexdigest()


def resolve_device(device: str) -> torch.device:
    """The device a model loads on, with its index on a GPU ("auto" -> cuda:0 or cpu): what a run records."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        resolved = torch.device(device)
    except RuntimeError as err:
        raise ConfigError(f"device {device!r} is not a torch device (e.g. auto, cpu, cuda, cuda:1): {err}") from None
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"device {device!r}: torch sees no CUDA device here; use device: auto or cpu")
        if resolved.index is None:
            resolved = torch.device("cuda", torch.cuda.current_device())
    return resolved


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, dtype)


def member_device(cfg: ModelConfig, k: int) -> str:
    """The device member k of an ensemble loads on: a named device as it is; "auto", the k-th visible GPU
    (cycling through them: two members on a 4-GPU node take cuda:0 and cuda:1), else the CPU."""
    if cfg.device != "auto":
        return cfg.device
    return f"cuda:{k % torch.cuda.device_count()}" if torch.cuda.is_available() else "cpu"


def placement(cfg: ModelConfig) -> tuple[torch.device, torch.dtype]:
    """Where `load_pretrained` puts a model's weights, and in which dtype; loads nothing."""
    device = resolve_device(cfg.device)
    return device, resolve_dtype(cfg.dtype, device)


def gguf_parts(cfg: ModelConfig) -> list[Path]:
    """The GGUF file(s) behind a bundled or .gguf model entry, checked to exist and match the pinned hash."""
    parts = BUNDLES[cfg.bundle]() if cfg.bundle else [Path(cfg.path).expanduser()]
    for part in parts:
        if not part.is_file():
            raise ModelFileError(f"model {cfg.name!r}: model file {part} does not exist")
    return parts


def verified_hash(cfg: ModelConfig, parts: list[Path]) -> str:
    digest = sha256_of(parts)
    if cfg.sha256 and digest != cfg.sha256.lower():
        where = parts[0] if len(parts) == 1 else f"{parts[0]} (+{len(parts) - 1} parts)"
        raise ModelFileError(
            f"model {cfg.name!r}: {where} is corrupt or not the pinned file: sha256 {digest}, expected {cfg.sha256}"
        )
    return digest


def converted_gguf_dir(cfg: ModelConfig, cache_dir: Path) -> Path:
    """Directory with the dequantised model and its tokenizer, converting the GGUF on first use."""
    parts = gguf_parts(cfg)
    digest = verified_hash(cfg, parts)
    target = cache_dir / "gguf" / digest
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(target.parent / f"{digest}.lock"):
        if (target / "config.json").is_file():  # converted by whoever held the lock before us
            return target
        log.info("converting %s from GGUF once (about a minute); cached at %s", cfg.name, target)
        work = Path(tempfile.mkdtemp(prefix=f".{digest[:12]}-", dir=target.parent))
        where = f"model {cfg.name!r}: {parts[0]}" + (f" (+{len(parts) - 1} parts)" if len(parts) > 1 else "")
        try:
            _dequantise(_joined(parts, work), work / "model", where)
            (work / "model").rename(target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return target


def _joined(parts: list[Path], work: Path) -> Path:
    if len(parts) == 1:
        return parts[0]
    joined = work / "model.gguf"
    with open(joined, "wb") as out:
        for part in parts:
            with open(part, "rb") as src:
                shutil.copyfileobj(src, out, 1 << 22)
    return joined


def _read_gguf(path: Path, where: str) -> None:
    """ModelFileError unless the file parses as GGUF: gguf's reader checks its magic number and maps every
    tensor's data, so a truncated file fails here, named, rather than inside transformers."""
    import gguf

    try:
        gguf.GGUFReader(path)
    except ValueError as err:
        raise ModelFileError(f"{where} is not a complete GGUF file ({err}); download it again") from None


def _dequantise(gguf: Path, out: Path, where: str) -> None:
    """`where`: the model and its file(s), as errors name them."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with shared_gguf_reader():
        _read_gguf(gguf, where)  # the shared reader: transformers' reads below reuse it
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The weights are dense after loading; without this save_pretrained refuses ("quantized with gguf").
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tokenizer.save_pretrained(out)
    model.save_pretrained(out)


def model_location(cfg: ModelConfig, cache_dir: Path | None = None) -> str:
    """Where transformers should load the model from: a directory or a hub id."""
    cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
    if cfg.bundle or cfg.path.endswith(".gguf"):
        converted = converted_gguf_dir(cfg, cache_dir)
        _check_safetensors(cfg, converted, f"delete {converted} (the conversion cache) to convert it again")
        return str(converted)
    path = Path(cfg.path).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelFileError(f"model {cfg.name!r}: {path} has no config.json, so it is not a model directory")
        _check_safetensors(cfg, path, "download it again")
        return str(path)
    if cfg.path.startswith(("/", ".", "~")) or path.exists():
        raise ModelFileError(f"model {cfg.name!r}: model path {path} does not exist")
    return cfg.path  # a hub id


def on_the_hub(cfg: ModelConfig) -> bool:
    """Does the entry name a hub repository (not a bundle, a GGUF file or a local path)?"""
    if cfg.bundle or cfg.path.endswith(".gguf") or cfg.path.startswith(("/", ".", "~")):
        return False
    return not Path(cfg.path).expanduser().exists()


# What loading a hub model reads: its configs, safetensors weights and tokenizer files. Other files that some
# repositories ship are not fetched: Llama's original/ checkpoint and Mistral's consolidated.safetensors, each
# another copy of the weights, the size of the model again.
HUB_FILES = [
    "config.json",
    "generation_config.json",
    "model*.safetensors",
    "model.safetensors.index.json",
    "tokenizer*",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.json",
    "chat_template.jinja",
]


def fetch_from_hub(cfg: ModelConfig) -> Path:
    """Download a hub model's HUB_FILES at its revision into the Hugging Face cache ($HF_HOME/hub), once: files
    already there are not fetched again. Returns the snapshot folder, named by the commit the revision resolved to,
    which the cache records for the revision (its refs/): a run with HF_HUB_OFFLINE=1 then loads that commit
    from the cache without asking the hub. The hub's errors (network, gated, no such repository) pass through."""
    from huggingface_hub import snapshot_download

    folder = Path(snapshot_download(cfg.path, revision=cfg.revision or "main", allow_patterns=HUB_FILES))
    if not (folder / "config.json").is_file() or not any(folder.glob("*.safetensors")):
        raise ModelFileError(
            f"model {cfg.name!r}: {cfg.path} at commit {folder.name} holds no config.json and safetensors weights, "
            "which is what this project loads"
        )
    _check_safetensors(cfg, folder, f"remove it (hf cache rm model/{cfg.path}) and prepare it again")
    return folder


def _check_safetensors(cfg: ModelConfig, folder: Path, fix: str) -> None:
    """ModelFileError, saying to `fix` it, if a weights file of `folder` is cut short or not safetensors: opening
    one reads its header and checks that the file holds every tensor it lists, without reading the weights."""
    from safetensors import SafetensorError, safe_open

    for file in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(file, framework="pt"):
                pass
        except SafetensorError as err:
            raise ModelFileError(
                f"model {cfg.name!r}: {file} is not a complete safetensors file ({err}); {fix}"
            ) from None


def load_pretrained(cfg: ModelConfig, cache_dir: Path | None = None):
    """(tokenizer, model) ready for inference on the configured device and dtype."""
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM, AutoTokenizer

    where = model_location(cfg, cache_dir)
    device, dtype = placement(cfg)
    options = dict(trust_remote_code=cfg.trust_remote_code, revision=cfg.revision)
    try:
        tokenizer = AutoTokenizer.from_pretrained(where, **options)
        model = AutoModelForCausalLM.from_pretrained(where, dtype=dtype, device_map={"": device}, **options)
    except OSError as err:
        raise ModelFileError(f"model {cfg.name!r}: cannot load from {where}: {err}") from err
    except SafetensorError as err:  # a hub download cut short: the local folders were checked above
        raise ModelFileError(
            f"model {cfg.name!r}: the weights of {where} are not complete ({err}); remove them from the Hugging Face "
            f"cache (hf cache rm model/{where}) and download them again"
        ) from None
    return tokenizer, model.eval()
