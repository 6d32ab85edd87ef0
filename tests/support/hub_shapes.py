"""The benchmarks' hub datasets in their hub shape, built from ../shared/data, for tests that read the hub
path without the hub.

`build(root)` writes one folder per hub repository (`root/<owner>/<name>/`) laid out as the hub lays the
repository out: a README.md whose `configs:` name each config's parquet file per split, and parquet files
whose columns and types are the hub's (nested records as structs, aliases as lists). `datasets.load_dataset`
reads such a folder as it reads the repository (configs, splits, and its errors for a config or split the
repository lacks). The rows come from the local files of the same benchmark, in their order, as the hub's
splits hold them; a split that has no local copy (NQ-open and TriviaQA train, SQuAD train) is stood in for
by other local rows in the same shape, for the few-shot pools.
"""

import ast
import csv
import gzip
import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tests.support.paths import SHARED_DATA

STRINGS = pa.list_(pa.string())
TRIVIA = pa.schema(
    [
        ("question", pa.string()),
        ("question_id", pa.string()),
        ("question_source", pa.string()),
        ("entity_pages", pa.struct([(k, STRINGS) for k in ("doc_source", "filename", "title", "wiki_context")])),
        ("search_results", pa.struct([(k, STRINGS) for k in ("description", "filename", "rank", "title", "url")])),
        (
            "answer",
            pa.struct(
                [
                    ("aliases", STRINGS),
                    ("normalized_aliases", STRINGS),
                    ("matched_wiki_entity_name", pa.string()),
                    ("normalized_matched_wiki_entity_name", pa.string()),
                    ("normalized_value", pa.string()),
                    ("type", pa.string()),
                    ("value", pa.string()),
                ]
            ),
        ),
    ]
)
SQUAD = pa.schema(
    [
        ("id", pa.string()),
        ("title", pa.string()),
        ("context", pa.string()),
        ("question", pa.string()),
        ("answers", pa.struct([("text", STRINGS), ("answer_start", pa.list_(pa.int32()))])),
    ]
)
FLORES = pa.schema(
    [
        ("id", pa.int32()),
        ("iso_639_3", pa.string()),
        ("iso_15924", pa.string()),
        ("glottocode", pa.string()),
        ("text", pa.string()),
        ("url", pa.string()),
        ("domain", pa.string()),
        ("topic", pa.string()),
        ("has_image", pa.int32()),
        ("has_hyperlink", pa.int32()),
        ("last_updated", pa.string()),
    ]
)
GLOTTOCODES = {"eng": "stan1293", "deu": "stan1295"}


def _text(path: Path) -> str:
    raw = path.read_bytes()
    return (gzip.decompress(raw) if path.suffix == ".gz" else raw).decode("utf-8")


def _json_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in _text(path).split("\n") if line.strip()]


def _nq(path: Path) -> pa.Table:
    return pa.Table.from_pylist([{"question": r["question"], "answer": r["answer"]} for r in _json_lines(path)])


def _trivia(path: Path) -> pa.Table:
    rows = []
    for i, (question, answers) in enumerate(csv.reader(io.StringIO(_text(path), newline=""), delimiter="\t")):
        aliases = [str(a) for a in ast.literal_eval(answers)]
        answer = {
            "aliases": aliases,
            "normalized_aliases": [a.lower() for a in aliases],
            "matched_wiki_entity_name": "",
            "normalized_matched_wiki_entity_name": "",
            "normalized_value": aliases[0].lower(),
            "type": "WikipediaEntity",
            "value": aliases[0],
        }
        rows.append(
            {
                "question": question,
                "question_id": f"tc_{i}",  # the hub's own ids, which the local file lacks, in their shape
                "question_source": "http://www.triviacountry.com/",
                "entity_pages": {k: [] for k in ("doc_source", "filename", "title", "wiki_context")},
                "search_results": {k: [] for k in ("description", "filename", "rank", "title", "url")},
                "answer": answer,
            }
        )
    return pa.Table.from_pylist(rows, schema=TRIVIA)


def _squad(path: Path) -> pa.Table:
    rows = []
    for article in json.loads(_text(path))["data"]:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                answers = {
                    "text": [a["text"] for a in qa["answers"]],
                    "answer_start": [a["answer_start"] for a in qa["answers"]],
                }
                rows.append(
                    {
                        "id": qa["id"],
                        "title": article["title"],
                        "context": paragraph["context"],
                        "question": qa["question"],
                        "answers": answers,
                    }
                )
    return pa.Table.from_pylist(rows, schema=SQUAD)


def _squad_shaped(path: Path) -> pa.Table:
    """Questions of another benchmark in SQuAD's shape (the answer's sentence as the passage): rows for SQuAD's
    train split, which has no local copy, that share no question with its validation split."""
    rows = []
    for i, r in enumerate(_json_lines(path)):
        context = f"The answer is {r['answer'][0]}."
        answers = {"text": [r["answer"][0]], "answer_start": [context.index(r["answer"][0])]}
        rows.append(
            {"id": f"train-{i}", "title": "stand-in", "context": context, "question": r["question"], "answers": answers}
        )
    return pa.Table.from_pylist(rows, schema=SQUAD)


def _gsm(path: Path) -> pa.Table:
    return pa.Table.from_pylist([{"question": r["question"], "answer": r["answer"]} for r in _json_lines(path)])


def _flores(path: Path, language: str) -> pa.Table:
    iso, script = language.split("_")
    sentences = _text(path).removesuffix("\n").split("\n")
    rows = [
        {
            "id": i + 1,
            "iso_639_3": iso,
            "iso_15924": script,
            "glottocode": GLOTTOCODES[iso],
            "text": sentence,
            "url": "",
            "domain": "wikinews",
            "topic": "",
            "has_image": 0,
            "has_hyperlink": 0,
            "last_updated": "2.1",
        }
        for i, sentence in enumerate(sentences)
    ]
    return pa.Table.from_pylist(rows, schema=FLORES)


def splits(data: Path = SHARED_DATA) -> dict[str, dict[str, dict[str, pa.Table]]]:
    """repository -> config -> split -> its rows."""
    flores = {
        f"{lang}_Latn": {
            split: _flores(data / f"flores200/{lang}_Latn.{split}", f"{lang}_Latn") for split in ("dev", "devtest")
        }
        for lang in ("eng", "deu")
    }
    trivia = {
        "validation": _trivia(data / "triviaqa/topics.dpr.trivia.test.txt.gz"),
        "train": _trivia(data / "triviaqa/topics.dpr.trivia.dev.txt.gz"),  # stands in for unfiltered train
    }
    return {
        "google-research-datasets/nq_open": {
            "nq_open": {
                "validation": _nq(data / "nq_open/NQ-open.dev.jsonl"),
                "train": _nq(data / "nq_open/NQ-open.efficientqa.dev.1.1.jsonl"),  # stands in for NQ-open train
            }
        },
        "mandarjoshi/trivia_qa": {"rc.nocontext": trivia, "unfiltered.nocontext": trivia},
        "rajpurkar/squad": {
            "plain_text": {
                "validation": _squad(data / "squad_v1.1/dev-v1.1.json.gz"),
                "train": _squad_shaped(data / "nq_open/NQ-open.efficientqa.dev.1.1.jsonl"),
            }
        },
        "openai/gsm8k": {
            "main": {"test": _gsm(data / "gsm8k/test.jsonl"), "train": _gsm(data / "gsm8k/train.jsonl.gz")}
        },
        "openlanguagedata/flores_plus": flores,
    }


def build(root: Path, data: Path = SHARED_DATA) -> dict[str, Path]:
    """Write every repository below `root`; returns each repository's folder by its hub id."""
    folders = {}
    for repo, configs in splits(data).items():
        folder = root / repo
        card = ["---", "configs:"]
        for config, tables in configs.items():
            card += [f"- config_name: {config}", "  data_files:"]
            for split, table in tables.items():
                file = Path(config) / f"{split}-00000-of-00001.parquet"
                (folder / config).mkdir(parents=True, exist_ok=True)
                pq.write_table(table, folder / file)
                card += [f"  - split: {split}", f"    path: {file}"]
        (folder / "README.md").write_text("\n".join([*card, "---", ""]))
        folders[repo] = folder
    return folders
