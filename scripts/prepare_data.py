"""Build the data folder once: the six benchmarks from the repositories they come from, at pinned commits, each
file checked against its sha256, and the flores101 SentencePiece model that spBLEU reads, into sacrebleu's cache.

    python scripts/prepare_data.py DATA_DIR                    # then: export ADAFUSE_DATA_DIR=DATA_DIR
    python scripts/prepare_data.py DATA_DIR --mirror URL        # the same files from a mirror of their hosts

Runs and the tests read the folder from $ADAFUSE_DATA_DIR (or data.dir=DATA_DIR). A file already there with
the pinned content is left as it is, so a rerun fetches only what is missing or wrong. A mirror holds each file
at <mirror>/<host>/<path> for https://<host>/<path>. Files over 4 MB are kept
gzip-compressed, as the readers expect (docs/data.md lists the
layout). The SentencePiece model goes where sacrebleu looks for it, $SACREBLEU/models/ (default
~/.sacrebleu/models/): on a cluster, point SACREBLEU at storage the compute nodes share. protocol=paper also
reads the authors' own evaluation files, which this does not fetch: docs/data.md says where they go.
"""

import argparse
import gzip
import hashlib
import sys
import tempfile
import urllib.request
from pathlib import Path

GITHUB = "https://raw.githubusercontent.com"
# (the file in the data folder, repository, commit, its path there, sha256 of its bytes there). A target ending in
# .gz holds those bytes gzip-compressed.
SOURCES = [
    *[
        (f"nq_open/{name}", "google-research-datasets/natural-questions", "fb26a3073b1fe636c97302890a27b491d6530130")
        + (f"nq_open/{name}", sha)
        for name, sha in [
            ("NQ-open.dev.jsonl", "f15567f38099f3615f5b8a685c0aef449c11ad90d3da3735e8d1b98115b40616"),
            ("NQ-open.efficientqa.dev.1.1.jsonl", "0ad45e2fa9fd32d10b3cf08c63e6d22f97ba1a0ce44ea98040f4c18bce7e268d"),
        ]
    ],
    (
        "squad_v1.1/dev-v1.1.json.gz",
        "rajpurkar/SQuAD-explorer",
        "eee5fdbf62f8613a7812b03419e6b29617b74fd1",
        "dataset/dev-v1.1.json",
        "95aa6a52d5d6a735563366753ca50492a658031da74f301ac5238b03966972c9",
    ),
    *[
        (f"triviaqa/topics.dpr.trivia.{split}.txt.gz", "castorini/anserini-tools")
        + ("5b819c1a45c8a0a3ec9426f476694f44a29dfaf3", f"topics/topics.dpr.trivia.{split}.txt", sha)
        for split, sha in [
            ("test", "041ed9ddd2977c7fe452d290cf60e1f7e0a803977b0f912e234d218261c10e57"),
            ("dev", "79e7ea851bb5ca6ebbfd6c760d032064d324166d46b8ffaf70e0fb733186ed2a"),
        ]
    ],
    *[
        (
            target,
            "openai/grade-school-math",
            "3101c7d5072418e28b9008a6636bde82a006892c",
            f"grade_school_math/data/{name}",
        )
        + (sha,)
        for target, name, sha in [
            ("gsm8k/test.jsonl", "test.jsonl", "3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14"),
            ("gsm8k/train.jsonl.gz", "train.jsonl", "17f347dc51477c50d4efb83959dbb7c56297aba886e5544ee2aaed3024813465"),
        ]
    ],
    # FLORES-200 as released (not FLORES+), in Helsinki-NLP's copy: devtest at its head, dev at an older commit
    # (deleted since), renamed to the release's own names
    *[
        (f"flores200/{language}.devtest", "Helsinki-NLP/OPUS-MT-testsets", "ac0f19c0be3cb4e0d9450fcb2d7a9847c4bdd180")
        + (f"datasets/facebook/flores/flores200_dataset/devtest/{language}.devtest", sha)
        for language, sha in [
            ("eng_Latn", "612e9fbe87997617c0fa8fa8929654a4f49b728d96738112c2b86ef6a1d78d88"),
            ("deu_Latn", "9a1bfa90d153fedb7ff80047f4a63d493998888eddb056e8a28e24592f26e5f2"),
        ]
    ],
    *[
        (f"flores200/{language}_Latn.dev", "Helsinki-NLP/OPUS-MT-testsets", "5677844c738832a280dc1d59a056a970564bdce3")
        + (f"testsets/flores200_dataset/dev/{language}.dev", sha)
        for language, sha in [
            ("eng", "51a25f527fd81f428b6933d85a2f5e5544af92aa82042c7fbf0c4120327fba0a"),
            ("deu", "12fac774c6f79d966774a1829648a6e107700662e9e7b9e31ad08541382b97aa"),
        ]
    ],
]


def content(path: Path) -> bytes:
    """A data file's bytes as its repository holds them (a .gz decompressed)."""
    raw = path.read_bytes()
    return gzip.decompress(raw) if path.suffix == ".gz" else raw


def mirrored(url: str, mirror: str | None) -> str:
    """`url` (https://<host>/<path>), or its copy at <mirror>/<host>/<path>."""
    return f"{mirror.rstrip('/')}/{url.split('://', 1)[1]}" if mirror else url


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=60) as response:
        return response.read()


def prepare_file(folder: Path, target: str, repo: str, commit: str, path: str, sha256: str, mirror: str | None) -> str:
    """One file into the folder, unless it is there already with the pinned content; what was done."""
    out = folder / target
    if out.is_file() and hashlib.sha256(content(out)).hexdigest() == sha256:
        return "kept"
    url = mirrored(f"{GITHUB}/{repo}/{commit}/{path}", mirror)
    try:
        data = fetch(url)
    except OSError as err:
        raise SystemExit(f"prepare_data: cannot fetch {url}: {err}") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        raise SystemExit(f"prepare_data: {url} has sha256 {digest}, not the pinned {sha256}; nothing was written")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=out.parent, prefix=f".{out.name}.", delete=False) as tmp:
        tmp.write(gzip.compress(data, 9, mtime=0) if out.suffix == ".gz" else data)
    Path(tmp.name).replace(out)  # whole or not at all
    return f"fetched {len(data):,} bytes"


def prepare_spm(mirror: str | None) -> str:
    """The flores101 SentencePiece model into sacrebleu's cache, by sacrebleu's own download (from its URL, or that
    URL's copy on the mirror); where it now is."""
    from sacrebleu.tokenizers.tokenizer_spm import SPM_MODELS
    from sacrebleu.utils import download_file

    from eval.metrics import spm_model_path

    download_file(mirrored(SPM_MODELS["flores101"]["url"], mirror), spm_model_path())
    return spm_model_path()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data_dir", type=Path, help="the folder to build (export ADAFUSE_DATA_DIR=it after)")
    parser.add_argument("--mirror", help="a base URL that holds each file at <mirror>/<host>/<path>")
    parser.add_argument("--no-spm", action="store_true", help="leave the flores101 SentencePiece model out")
    args = parser.parse_args(argv)
    for target, *source in SOURCES:
        print(f"{target}: {prepare_file(args.data_dir, target, *source, args.mirror)}")
    if not args.no_spm:
        print(f"flores101 SentencePiece model: {prepare_spm(args.mirror)}")
    print(f"done: export ADAFUSE_DATA_DIR={args.data_dir.resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
