"""A benchmark as the harness sees it: examples, few-shot prompt, stop strings, budget, extraction, metrics.

The task's YAML (conf/task/<name>.yaml) is the declaration; this file turns it into prompts and
scores. Nothing here is specific to one benchmark except through the readers it names.
"""

import os
import random
from functools import cached_property
from pathlib import Path

from adafuse import through_last_blank_line
from adafuse.errors import ConfigError, DataError
from eval import paper_metrics  # noqa: F401  (registers the paper_* replicas in METRICS)
from eval.data import Example, Sources, read_hub, read_local
from eval.extract import EXTRACTORS, extract
from eval.metrics import METRICS, spbleu_available, spm_model_path

VARIANTS = ("canonical", "paper")
BESIDE_CHECKOUT = Path(__file__).resolve().parents[2] / "shared" / "data"


def resolve_data_dir(value: str | None) -> str | None:
    """data.dir=auto: $ADAFUSE_DATA_DIR, else ../shared/data beside the checkout, else None (the hub)."""
    if value != "auto":
        return value
    if os.environ.get("ADAFUSE_DATA_DIR"):
        return os.environ["ADAFUSE_DATA_DIR"]
    return str(BESIDE_CHECKOUT) if BESIDE_CHECKOUT.is_dir() else None


class Task:
    def __init__(self, cfg, data):
        """`cfg`: a TaskConf; `data`: a DataConf. Checks every name and file, then loads the examples."""
        self.cfg, self.data = cfg, data
        if data.variant not in VARIANTS:
            raise ConfigError(f"data.variant must be one of {VARIANTS}, got {data.variant!r}")
        for name in cfg.extract:
            EXTRACTORS[name]
        self.metrics = {reported: METRICS[key] for reported, key in cfg.metrics.items()}
        # Reported name -> why the task does not compute it here (metrics.json records it).
        self.skipped: dict[str, str] = {}
        if "spbleu" in cfg.metrics.values() and not spbleu_available():
            why = (
                f"the flores101 SentencePiece model is not at {spm_model_path()} (a run never downloads it: "
                "scripts/prepare_data.py fetches it once)"
            )
            self.skipped = {r: why for r, key in cfg.metrics.items() if key == "spbleu"}
            self.metrics = {r: m for r, m in self.metrics.items() if r not in self.skipped}
        # What the task read (config.yaml's `source`: a resume with other data is refused, eval/results.py)
        self.sources = Sources(local=str(Path(data.dir).expanduser().resolve()) if data.dir is not None else None)
        self.prompt_file = self._read_prompt_file()
        self.examples = self._load_examples()
        self.shots = self._load_shots()

    @property
    def name(self) -> str:
        return self.cfg.name

    # ---- data -----------------------------------------------------------------------------------

    def _source(self, sources: dict, what: str):
        """The reader spec for this variant: the paper's files, a local folder, or the hub."""
        if self.data.variant == "paper":
            if self.data.dir is None:
                raise ConfigError(
                    "data.variant=paper reads the paper's own evaluation files: set data.dir to a folder that "
                    "holds adafuse_local_datasets/ (the authors' local_datasets/, as in ../shared/data)"
                )
            kind = "paper"
        else:
            kind = "local" if self.data.dir is not None else "hub"
        if kind not in sources:
            raise ConfigError(f"task {self.name!r} has no {kind} source for its {what}")
        return kind, sources[kind]

    def _read(self, sources: dict, what: str) -> list[Example]:
        kind, spec = self._source(sources, what)
        rows = (
            read_hub(spec, self.sources)
            if kind == "hub"
            else read_local(spec, Path(self.data.dir).expanduser() if self.data.dir else None, self.sources)
        )
        if not rows:
            raise DataError(f"task {self.name!r}: the {what} ({spec}) hold no examples")
        return rows

    def _load_examples(self) -> list[Example]:
        if self.cfg.path is not None:  # task=custom: the user's own prompts
            rows = read_local({"reader": "prompts_jsonl", "file": self.cfg.path}, None, self.sources)
            if not rows:
                raise DataError(f"{self.cfg.path} holds no prompts")
        elif not self.cfg.eval:
            raise ConfigError(
                f"task {self.name!r} reads its examples from your file: set task.path=FILE.jsonl, one "
                '{"id": ..., "prompt": ..., "references": [...]} per line (references optional)'
            )
        else:
            rows = self._read(self.cfg.eval, "examples")
        if self.cfg.limit is not None:
            if self.cfg.limit < 1:
                raise ConfigError(f"task.limit must be >= 1 (or null for all), got {self.cfg.limit}")
            rows = rows[: self.cfg.limit]
        return rows

    def _load_shots(self) -> list[Example]:
        if not self.cfg.num_fewshot or self.prompt_file is not None:
            return []
        pool = self._read(self.cfg.fewshot, "few-shot pool")
        if len(pool) < self.cfg.num_fewshot:
            raise DataError(f"task {self.name!r}: {self.cfg.num_fewshot} exemplars asked, the pool has {len(pool)}")
        scored = {_input_text(e) for e in self.examples}
        shots = random.Random(self.cfg.fewshot_seed).sample(pool, self.cfg.num_fewshot)
        leaked = [s.id for s in shots if _input_text(s) in scored]
        if leaked:
            raise DataError(f"task {self.name!r}: exemplars {leaked} are also scored examples")
        return shots

    def _read_prompt_file(self) -> str | None:
        if self.cfg.prompt_file is None:
            return None
        path = self.prompt_file_path()
        if not path.is_file():
            raise DataError(f"task.prompt_file {path} does not exist")
        if self.cfg.paper_query is None:
            raise ConfigError(f"task {self.name!r} defines no paper_query to follow a prompt file")
        self.sources.add_file(path)
        return path.read_text(encoding="utf-8")

    def prompt_file_path(self) -> Path:
        """task.prompt_file as a path: a relative one is read below data.dir when that holds it (the paper's
        prompt files, `paper_prompt_file`, are named so), else from the working directory."""
        path = Path(self.cfg.prompt_file).expanduser()
        if not path.is_absolute() and self.data.dir is not None:
            below = Path(self.data.dir).expanduser() / path
            if below.is_file():
                return below
        return path

    # ---- prompts --------------------------------------------------------------------------------

    @cached_property
    def preamble(self) -> str:
        """What every prompt starts with before its query: the instruction and exemplars, each followed by a
        blank line, or the paper's prompt file."""
        if self.prompt_file is not None:
            return self.prompt_file
        parts = [self.cfg.instruction] if self.cfg.instruction else []
        parts += [_fill(self.cfg.shot, shot, self.name) for shot in self.shots]
        return "".join(part + "\n\n" for part in parts)

    @property
    def query(self) -> str:
        """The template that follows `preamble`, filled with an example's fields."""
        return self.cfg.query if self.prompt_file is None else self.cfg.paper_query

    @cached_property
    def prefix(self) -> str:
        """The start every prompt shares, through its last blank line before the query's first field: what a
        decode reads once for all examples (`Request.prefix`). Cut at a blank line, as lm_eval's few-shot
        delimiter is, so that its contexts are split where the runner splits its prompts (eval/lm_harness.py)."""
        return through_last_blank_line(self.preamble + self.query.split("{", 1)[0])

    def prompt(self, example: Example) -> str:
        """Instruction, exemplars and query, separated by blank lines; or the paper's prompt file + query."""
        return self.preamble + _fill(self.query, example, self.name)

    # ---- scores ---------------------------------------------------------------------------------

    def primary_metric(self, paper: bool = False) -> str | None:
        """The reported name of the metric a run reports first: the task's first, or under protocol=paper
        (`paper`) its first paper_* replica of the authors' scorers."""
        names = list(self.metrics)
        if paper:
            names = [n for n in names if n.startswith("paper_")] or names
        return names[0] if names else None

    def score(self, example: Example, prediction: str) -> tuple[str, dict[str, float]]:
        """The extracted answer and the per-example scores (empty without references)."""
        answer = extract(self.cfg.extract, prediction)
        if not example.references:
            return answer, {}
        scores = {}
        for reported, metric in self.metrics.items():
            if metric.per_example is not None:
                scores[reported] = metric.per_example(prediction if metric.raw else answer, example.references)
        return answer, scores

    def bleu_tokenizers(self) -> dict[str, str]:
        """The sacrebleu tokenizer of each reported BLEU metric, as it scores now."""
        return {reported: m.bleu_tokenizer() for reported, m in self.metrics.items() if m.bleu_tokenizer is not None}

    def corpus_scores(self, records: list[dict]) -> dict[str, float]:
        """Every metric over all records (in example order); no record is dropped."""
        if not records or not all(r["references"] for r in records):
            return {}
        references = [r["references"] for r in records]
        return {
            reported: metric.corpus([r["prediction"] if metric.raw else r["answer"] for r in records], references)
            for reported, metric in self.metrics.items()
        }


def _input_text(example: Example) -> str | None:
    """What the model is asked about: a question, or a sentence to translate."""
    return example.fields.get("question", example.fields.get("source"))


def _fill(template: str, example: Example, task: str) -> str:
    try:
        return template.format(**example.fields)
    except KeyError as err:
        raise ConfigError(f"task {task!r}: template {template!r} uses {err}, which its data does not have") from None
