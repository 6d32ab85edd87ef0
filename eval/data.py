"""Benchmark readers: local files (the layout of ../shared/data, canonical and the paper's own files)
and the Hugging Face hub. Every reader returns `Example`s in the source's canonical order.

A task's YAML names a reader and its arguments per source, e.g.
`{reader: dpr_tsv, file: triviaqa/topics.dpr.trivia.test.txt.gz}` or
`{reader: trivia_hub, path: mandarjoshi/trivia_qa, name: unfiltered.nocontext, split: validation, revision: main}`.
A malformed record raises DataError naming the file and line.

Every read is recorded in a `Sources` (what a run read: eval/runner.py writes it into config.yaml and
metrics.json): each local file with its sha256, each hub split with the commit its revision resolved to, which
is the commit that is read.
"""

import ast
import csv
import gzip
import hashlib
import io
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from adafuse.errors import DataError
from adafuse.registry import Registry
from eval.hub import describe, hub_commit

LOCAL = Registry("local data reader")
HUB = Registry("hub data reader")


@dataclass
class Example:
    id: str
    fields: dict[str, str]  # what prompt templates may use: question, context, source, solution, answer
    references: list[str]  # gold answers (aliases) or reference translations
    origin: str | None = None  # "file:line" of a user's own prompt, which errors about it name


@dataclass
class Sources:
    """What a task read: the local data folder (None: none), each local file's sha256 by its name (relative to
    that folder when inside it), and each hub split with the commit that was read."""

    local: str | None = None
    files: dict[str, str] = field(default_factory=dict)
    hub: list[dict] = field(default_factory=list)

    def add_file(self, path: Path) -> None:
        path = Path(path).expanduser().resolve()
        name = str(path)
        if self.local is not None and path.is_relative_to(self.local):
            name = str(path.relative_to(self.local))
        self.files[name] = hashlib.sha256(path.read_bytes()).hexdigest()

    def record(self) -> dict:
        """As config.yaml and metrics.json hold it (`data` of their `source`)."""
        return {"local": self.local, "files": dict(sorted(self.files.items())), "hub": self.hub}


def _open(path: Path) -> io.StringIO:
    """The file's text, gunzipped if it ends in .gz, newlines as a text file reads them; a file that is not
    UTF-8 (or not gzip) is a DataError that names it, and the line."""
    if not path.is_file():
        raise DataError(f"data file {path} does not exist")
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError) as err:
        raise DataError(f"{path}: not a readable gzip file ({err})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line, line_start = raw.count(b"\n", 0, err.start) + 1, raw.rfind(b"\n", 0, err.start) + 1
        raise DataError(
            f"{path}:{line}: not UTF-8 text (byte 0x{raw[err.start]:02x} at byte {err.start - line_start + 1} of "
            "the line); save the file as UTF-8"
        ) from None
    return io.StringIO(text, newline=None)


def _json_lines(path: Path):
    """(line number, record) per line. Splits on '\\n' only: some records hold U+0085 inside strings."""
    with _open(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"{path}:{lineno}: malformed JSON ({err.msg})") from None
            if not isinstance(record, dict):
                raise DataError(f"{path}:{lineno}: expected a JSON object, got {type(record).__name__}")
            yield lineno, record


def _field(record: dict, key: str, path, lineno, kind=None):
    if key not in record:
        raise DataError(f"{path}:{lineno}: missing field {key!r}")
    value = record[key]
    if kind is list and not (isinstance(value, list) and value and all(isinstance(v, str) for v in value)):
        raise DataError(f"{path}:{lineno}: field {key!r} must be a non-empty list of strings")
    if kind is str and not isinstance(value, str):
        raise DataError(f"{path}:{lineno}: field {key!r} must be a string")
    return value


def _qa(example_id: str, question: str, answers: list[str], **extra) -> Example:
    return Example(example_id, {"question": question.strip(), "answer": answers[0], **extra}, list(answers))


# ---- GSM8K solutions -----------------------------------------------------------------------------

_CALCULATOR = re.compile(r"<<[^>]*>>")


def gsm_number(text: str) -> str:
    return text.strip().replace(",", "").rstrip(".")


def _gsm(example_id: str, question: str, solution: str, number: str) -> Example:
    fields = {"question": question.strip(), "solution": solution.strip(), "answer": number}
    return Example(example_id, fields, [number])


def _gsm_official(example_id: str, question: str, answer: str, where: str) -> Example:
    """'reasoning with <<calculator>> notes\\n#### 18' -> solution text and final number."""
    if "####" not in answer:
        raise DataError(f"{where}: GSM8K answer has no '#### <number>' line")
    reasoning, number = answer.rsplit("####", 1)
    return _gsm(example_id, question, _CALCULATOR.sub("", reasoning), gsm_number(number))


# ---- local readers -------------------------------------------------------------------------------


@LOCAL.register("qa_jsonl")
def qa_jsonl(path: Path, prefix: str, skip: int = 0) -> list[Example]:
    """{"question": str, "answer": [str, ...]} per line (NQ-open, the paper's NQ and TriviaQA files)."""
    rows = []
    for i, (lineno, r) in enumerate(_json_lines(path)):
        if i >= skip:
            question = _field(r, "question", path, lineno, str)
            rows.append(_qa(f"{prefix}-{i}", question, _field(r, "answer", path, lineno, list)))
    return rows


@LOCAL.register("dpr_tsv")
def dpr_tsv(path: Path, prefix: str) -> list[Example]:
    """DPR-style TriviaQA: question<TAB>python list of aliases. CSV quoting as DPR's own loader reads it."""
    rows = []
    with _open(path) as f:
        for lineno, row in enumerate(csv.reader(f, delimiter="\t"), 1):
            if len(row) != 2:
                raise DataError(f"{path}:{lineno}: expected 2 tab-separated columns, got {len(row)}")
            try:
                answers = ast.literal_eval(row[1])
            except (ValueError, SyntaxError):
                raise DataError(f"{path}:{lineno}: answers are not a Python list literal") from None
            if not (isinstance(answers, list) and answers):
                raise DataError(f"{path}:{lineno}: answers must be a non-empty list")
            rows.append(_qa(f"{prefix}-{lineno - 1}", row[0], [str(a) for a in answers]))
    return rows


@LOCAL.register("squad_json")
def squad_json(path: Path, articles: str = "all") -> list[Example]:
    """Official SQuAD v1.1 JSON. `articles`: all, or head (all but the last) / tail (the last only), so
    that without a train file the last dev article can supply exemplars and is not scored."""
    with _open(path) as f:
        try:
            data = json.load(f)["data"]
        except (json.JSONDecodeError, KeyError) as err:
            raise DataError(f"{path}: not an official SQuAD JSON file ({err})") from None
    chosen = {"all": data, "head": data[:-1], "tail": data[-1:]}[articles]
    rows = []
    for article in chosen:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                answers = [a["text"] for a in qa["answers"]]
                rows.append(_qa(qa["id"], qa["question"], answers, context=paragraph["context"]))
    return rows


@LOCAL.register("squad_paper_jsonl")
def squad_paper_jsonl(path: Path, prefix: str) -> list[Example]:
    """The paper's squad_2500.jsonl: "question" is the context, a newline, then the question."""
    rows = []
    for i, (lineno, r) in enumerate(_json_lines(path)):
        text = _field(r, "question", path, lineno, str)
        if "\n" not in text:
            raise DataError(f"{path}:{lineno}: expected 'context\\nquestion' in field 'question'")
        context, question = text.rsplit("\n", 1)
        rows.append(_qa(f"{prefix}-{i}", question, _field(r, "answer", path, lineno, list), context=context))
    return rows


@LOCAL.register("gsm_jsonl")
def gsm_jsonl(path: Path, prefix: str) -> list[Example]:
    """Official GSM8K: the answer's last line is '#### <number>'."""
    return [
        _gsm_official(
            f"{prefix}-{i}",
            _field(r, "question", path, lineno, str),
            _field(r, "answer", path, lineno, str),
            f"{path}:{lineno}",
        )
        for i, (lineno, r) in enumerate(_json_lines(path))
    ]


@LOCAL.register("gsm_paper_jsonl")
def gsm_paper_jsonl(path: Path, prefix: str) -> list[Example]:
    """The paper's cleaned GSM8K: no calculator notes, last line 'Therefore, the answer is <number>'."""
    rows = []
    for i, (lineno, r) in enumerate(_json_lines(path)):
        answer = _field(r, "answer", path, lineno, str)
        match = re.search(r"(?i)the answer is\s*(.+?)\s*$", answer)
        if not match:
            raise DataError(f"{path}:{lineno}: answer has no final 'the answer is <number>'")
        solution = answer[: match.start()].rsplit("\n", 1)[0]
        rows.append(_gsm(f"{prefix}-{i}", _field(r, "question", path, lineno, str), solution, gsm_number(match[1])))
    return rows


def _sentences(path: Path) -> list[str]:
    """One sentence per line; the file's final newline ends the last line rather than adding an empty one."""
    with _open(path) as f:
        text = f.read()
    return text.removesuffix("\n").split("\n") if text else []


@LOCAL.register("flores_pair")
def flores_pair(source: Path, target: Path, prefix: str) -> list[Example]:
    """Two aligned FLORES files, one sentence per line."""
    sources, targets = _sentences(source), _sentences(target)
    if len(sources) != len(targets):
        raise DataError(f"{source} has {len(sources)} lines but {target} has {len(targets)}; they must align")
    for lineno, (s, t) in enumerate(zip(sources, targets), 1):
        if not s.strip() or not t.strip():
            raise DataError(f"{source if not s.strip() else target}:{lineno}: empty sentence")
    return [Example(f"{prefix}-{i}", {"source": s, "answer": t}, [t]) for i, (s, t) in enumerate(zip(sources, targets))]


@LOCAL.register("flores_paper_jsonl")
def flores_paper_jsonl(path: Path, prefix: str) -> list[Example]:
    """The paper's FLORES files: {"id", "question": source sentence, "answer": reference}."""
    rows = []
    for i, (lineno, r) in enumerate(_json_lines(path)):
        target = _field(r, "answer", path, lineno, str)
        rows.append(
            Example(f"{prefix}-{i}", {"source": _field(r, "question", path, lineno, str), "answer": target}, [target])
        )
    return rows


@LOCAL.register("prompts_jsonl")
def prompts_jsonl(path: Path) -> list[Example]:
    """A user's own prompts: {"id", "prompt", optional "references": [str, ...]} per line."""
    rows, seen = [], set()
    for lineno, r in _json_lines(path):
        example_id = str(_field(r, "id", path, lineno))
        if example_id in seen:
            raise DataError(f"{path}:{lineno}: duplicate id {example_id!r}")
        seen.add(example_id)
        references = _field(r, "references", path, lineno, list) if "references" in r else []
        prompt = _field(r, "prompt", path, lineno, str)
        if not prompt:
            raise DataError(f"{path}:{lineno}: example {example_id!r} has an empty prompt")
        rows.append(Example(example_id, {"prompt": prompt}, references, origin=f"{path}:{lineno}"))
    return rows


FILE_ARGUMENTS = ("path", "source", "target")  # a local reader's arguments that name files (`file` too, as path)


def read_local(spec: dict, data_dir: Path | None, sources: Sources | None = None) -> list[Example]:
    """Run a local reader; its file arguments are relative to `data_dir` unless absolute. The files it read
    are added to `sources`."""
    spec = dict(spec)
    reader = LOCAL[spec.pop("reader")]
    if "file" in spec:
        spec["path"] = spec.pop("file")
    for key in FILE_ARGUMENTS:
        if key in spec:
            path = Path(spec[key]).expanduser()
            spec[key] = path if path.is_absolute() or data_dir is None else Path(data_dir) / path
    rows = reader(**spec)
    if sources is not None:
        for key in FILE_ARGUMENTS:
            if key in spec:
                sources.add_file(spec[key])
    return rows


# ---- the Hugging Face hub ------------------------------------------------------------------------
# The converters see the rows of a split as `datasets` gives them. Ids are the example's place in the split,
# as the local readers give them (NQ-open, TriviaQA, GSM8K, FLORES: the hub's splits hold the same examples in
# the local files' order); SQuAD's are the dataset's own question ids, in both.


@HUB.register("nq_hub")
def nq_hub(rows, prefix: str) -> list[Example]:
    return [_qa(f"{prefix}-{i}", r["question"], list(r["answer"])) for i, r in enumerate(rows)]


@HUB.register("trivia_hub")
def trivia_hub(rows, prefix: str) -> list[Example]:
    """mandarjoshi/trivia_qa: the aliases are the references; `question_id` is not the id, as the local file
    (DPR's copy of the same unfiltered dev set) has none."""
    return [_qa(f"{prefix}-{i}", r["question"], list(r["answer"]["aliases"])) for i, r in enumerate(rows)]


@HUB.register("squad_hub")
def squad_hub(rows) -> list[Example]:
    return [_qa(r["id"], r["question"], list(r["answers"]["text"]), context=r["context"]) for r in rows]


@HUB.register("gsm_hub")
def gsm_hub(rows, prefix: str) -> list[Example]:
    return [_gsm_official(f"{prefix}-{i}", r["question"], r["answer"], f"row {i}") for i, r in enumerate(rows)]


def read_hub(spec: dict, sources: Sources | None = None) -> list[Example]:
    """Load a split from the hub with `datasets` at the commit its revision (default main) names now, and convert
    its rows; the split and that commit are added to `sources`."""
    spec = dict(spec)
    reader = spec.pop("reader")
    path, name, split = spec.pop("path"), spec.pop("name", None), spec.pop("split")
    revision = spec.pop("revision", None) or "main"
    if reader == "flores_hub":
        return _flores_hub(path, split, revision, sources, **spec)
    convert = HUB[reader]
    return convert(_load_split(path, name, split, revision, sources), **spec)


def _flores_hub(
    path: str, split: str, revision: str, sources: Sources | None, source: str, target: str, prefix: str
) -> list[Example]:
    """FLORES+ (openlanguagedata/flores_plus, gated): one config per language, named as the languages of
    ../shared/data's FLORES-200 files (eng_Latn); rows align by their id, and the sentence is `text`."""
    src = _load_split(path, source, split, revision, sources)
    tgt = _load_split(path, target, split, revision, sources)
    where = f"{path} ({{}}) split {split!r}"
    for config, rows in ((source, src), (target, tgt)):
        if "text" not in rows.column_names:
            raise DataError(
                f"{where.format(config)} has no field 'text' (its fields: {', '.join(rows.column_names)}): the FLORES "
                "reader reads FLORES+ (openlanguagedata/flores_plus); the original facebook/flores is a loading "
                "script, which datasets >= 4 cannot run"
            )
    targets = {r["id"]: r["text"] for r in tgt}
    missing = [r["id"] for r in src if r["id"] not in targets]
    if missing:
        raise DataError(f"{where.format(target)} has no sentence for id(s) {missing[:5]} of {source}")
    return [
        Example(f"{prefix}-{i}", {"source": r["text"], "answer": targets[r["id"]]}, [targets[r["id"]]])
        for i, r in enumerate(src)
    ]


def _load_split(path: str, name: str | None, split: str, revision: str, sources: Sources | None):
    """The split as `datasets` loads it (network, or its cache offline), at the commit `revision` names."""
    import datasets

    what = f"dataset {path}{f' ({name})' if name else ''} split {split!r}"
    where = f"the task's hub source (task.eval.hub / task.fewshot.hub: path {path!r}, name, split, revision)"
    url = f"https://huggingface.co/datasets/{path}"
    try:
        commit = hub_commit(path, revision, "dataset")
        rows = datasets.load_dataset(path, name, split=split, revision=commit)
    except Exception as err:  # the hub's errors and datasets': `describe` says which it was, and what to do
        raise describe(err, what, url, where) from err
    if sources is not None:
        sources.hub.append({"dataset": path, "config": name, "split": split, "revision": revision, "commit": commit})
    return rows
