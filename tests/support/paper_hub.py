"""The paper's pair in shape (tests/support/paper_pair.py) and PairRM as the hub serves them, under their real
repository ids, for tests/support/fake_hub.py to serve: what scripts/prepare_models.py downloads before a sweep.

Each model's repository holds the shaped model's files and, as the real repositories do, another copy of the
weights that loading never reads (Llama's original/ checkpoint, Mistral's consolidated.safetensors), which a
download must leave on the hub. llm-blender/PairRM is a tiny random PairRM in the real repository's layout: a
ranker config that names its backbone, microsoft/deberta-v3-large, served beside it with a tiny config.
"""

import json
import shutil
from pathlib import Path

from adafuse import model_config
from tests.support.pairrm_checkpoint import write_checkpoint
from tests.support.paper_pair import NAMES

PAIRRM = "llm-blender/PairRM"
PAIRRM_BACKBONE = "microsoft/deberta-v3-large"
# Files of the real repositories beside what loading reads: the authors' own checkpoint formats.
UNREAD = {
    "llama31_8b_instruct": ["original/consolidated.00.pth", "original/params.json", "original/tokenizer.model"],
    "mistral7b_instruct_v03": ["consolidated.safetensors", "params.json"],
}


def hub_repos(root: Path, pair_dir: Path) -> dict[str, Path]:
    """Write every repository below `root`; returns each one's folder by its hub id."""
    repos = {}
    for name in NAMES:
        repo = model_config(name).path
        folder = root / repo
        shutil.copytree(pair_dir / name, folder)
        for unread in UNREAD[name]:
            (folder / unread).parent.mkdir(parents=True, exist_ok=True)
            (folder / unread).write_bytes(b"not read by a load: a download leaves it on the hub")
        repos[repo] = folder
    ranker = root / PAIRRM
    write_checkpoint(ranker, "ranker")
    config = json.loads((ranker / "config.json").read_text())
    shutil.move(config["model_name"], root / PAIRRM_BACKBONE)
    (ranker / "config.json").write_text(json.dumps(config | {"model_name": PAIRRM_BACKBONE}))
    repos[PAIRRM] = ranker
    repos[PAIRRM_BACKBONE] = root / PAIRRM_BACKBONE
    return repos
