"""lm-evaluation-harness task files for the six benchmarks, with the runner's prompts and stop strings, for
a data folder of this machine (docs/lm_eval.md):

    adafuse-lm-eval-tasks lm_tasks --data-dir ../shared/data      # then: --include_path lm_tasks
    adafuse-lm-eval-tasks lm_tasks --tasks custom task.path=mine.jsonl   # any task of conf/task, run.py's overrides

The data folder's location differs per machine, so its tasks are written, not shipped: per benchmark a
`adafuse_<name>.yaml` and the examples as JSON lines (`dataset_path: json` with local `data_files`), read
through the runner's own readers (eval/data.py), whatever the source's format (TSV, SQuAD's nested JSON,
FLORES's aligned text files). The prompt is exactly the runner's (`Task.prompt`, checked per example):
the instruction and the fixed few-shot exemplars (or under `--variant paper` the authors' prompt file) are
the task's `description`, the query template its `doc_to_text`. Scorers are lm_eval's own: exact match
for the QA tasks and GSM8K (filters below), sacrebleu's BLEU and chrF for FLORES. All six carry the tag
`adafuse`, so `--tasks adafuse` runs every one. Any other task of conf/task (your own, or `custom` with its
`task.path`) is written the same way, with run.py's overrides after the flags.
"""

import argparse
import json
import re
from pathlib import Path

import yaml

from adafuse.errors import ConfigError
from conf.compose import CONF_DIR, compose_run
from eval.runner import settings_of
from eval.tasks import VARIANTS, Task, resolve_data_dir

TASKS = ("nq", "triviaqa", "squad", "gsm8k", "flores_en_de", "flores_de_en")  # the default: the paper's six
TAG = "adafuse"

# lm_eval's stock nq_open/triviaqa scoring: the first line without leading whitespace, compared with every
# alias after dropping case, punctuation and articles.
QA_SCORING = {
    "filter_list": [
        {"name": "remove_whitespace", "filter": [{"function": "remove_whitespace"}, {"function": "take_first"}]}
    ],
    "metric_list": [
        {
            "metric": "exact_match",
            "aggregation": "mean",
            "higher_is_better": True,
            "ignore_case": True,
            "ignore_punctuation": True,
            "regexes_to_ignore": ["\\b(?:The |the |An |A |The |a |an )"],
        }
    ],
}
# lm_eval's stock gsm8k scoring, with our exemplars' answer line ("The answer is N.") for its strict match.
GSM_SCORING = {
    "filter_list": [
        {
            "name": "strict-match",
            "filter": [
                {"function": "regex", "regex_pattern": "The answer is (\\-?[0-9\\.\\,]+)"},
                {"function": "take_first"},
            ],
        },
        {
            "name": "flexible-extract",
            "filter": [
                {"function": "regex", "group_select": -1, "regex_pattern": "(-?[$0-9.,]{2,})|(-?[0-9]+)"},
                {"function": "take_first"},
            ],
        },
    ],
    "metric_list": [
        {
            "metric": "exact_match",
            "aggregation": "mean",
            "higher_is_better": True,
            "ignore_case": True,
            "ignore_punctuation": False,
            "regexes_to_ignore": [",", "\\$", "\\.$"],
        }
    ],
}
TRANSLATION_SCORING = {
    "filter_list": [
        {"name": "remove_whitespace", "filter": [{"function": "remove_whitespace"}, {"function": "take_first"}]}
    ],
    "metric_list": [
        {"metric": "bleu", "aggregation": "bleu", "higher_is_better": True},
        {"metric": "chrf", "aggregation": "chrf", "higher_is_better": True},
    ],
}


def scoring(task: Task) -> dict:
    """lm_eval's filters and metrics for a task, chosen by what our runner scores it with."""
    ours = set(task.cfg.metrics.values())
    if "bleu" in ours:
        return TRANSLATION_SCORING
    if "acc" in ours:
        return GSM_SCORING
    if "em" in ours:
        return QA_SCORING
    raise ConfigError(f"task {task.name!r}: no lm_eval scoring for metrics {sorted(ours)}")


def jinja(template: str) -> str:
    """A str.format template ({question}) as lm_eval's Jinja ({{question}})."""
    return re.sub(r"\{(\w+)\}", r"{{\1}}", template)


def raw_jinja(text: str) -> str:
    """Text that lm_eval's Jinja renders verbatim (exemplars may hold braces)."""
    return "{% raw %}" + text + "{% endraw %}" if text else ""


def write_task(
    name: str, data_dir: str, out: Path, variant: str = "canonical", limit: int | None = None, overrides=()
) -> Path:
    """Write adafuse_<name>.yaml and its first `limit` examples (all: None) under `out`, the task composed with
    run.py's `overrides` too; returns the YAML's path."""
    own = [f"task={name}", f"data.dir={data_dir}", f"data.variant={variant}", f"task.limit={limit or 'null'}"]
    settings = settings_of(compose_run(*own, *overrides))
    task = Task(settings.task, settings.data)
    prefix, query = task.preamble, task.query
    examples = out / "data" / f"{TAG}_{name}.jsonl"
    examples.parent.mkdir(parents=True, exist_ok=True)
    with open(examples, "w", encoding="utf-8") as f:
        for example in task.examples:
            if prefix + query.format(**example.fields) != task.prompt(example):
                raise AssertionError(f"task {name!r}: the lm_eval prompt of {example.id} is not the runner's")
            record = {"id": example.id, **example.fields, "references": example.references}
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    multiple = "em" in task.cfg.metrics.values()
    config = {
        "task": f"{TAG}_{name}",
        "tag": [TAG],
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(examples.resolve())}},
        "test_split": "test",
        "output_type": "generate_until",
        "description": raw_jinja(prefix),
        "doc_to_text": jinja(query),
        # QA golds are alias lists (correct if any matches); a translation has one reference.
        "doc_to_target": "references" if multiple else "{{references[0]}}",
        "generation_kwargs": {
            "until": list(task.cfg.stop),
            "max_gen_toks": task.cfg.max_new_tokens,
            "do_sample": False,
        },
        **scoring(task),
        "metadata": {"version": task.cfg.version, "variant": variant, "data_dir": data_dir},
    }
    path = out / f"{TAG}_{name}.yaml"
    path.write_text(yaml.dump(config, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=1 << 20), "utf-8")
    return path


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (prompts) as literal blocks, readable as the model reads them."""


def _text(dumper, value: str):
    block = "\n" in value and value.strip()
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if block else None)


_Dumper.add_representer(str, _text)


def write_tasks(
    out: Path,
    data_dir: str | None = None,
    variant: str = "canonical",
    tasks=TASKS,
    limit: int | None = None,
    overrides=(),
) -> list[Path]:
    data_dir = resolve_data_dir(data_dir or "auto")
    if data_dir is None:
        raise ConfigError("no data folder: pass --data-dir (the layout of ../shared/data) or set ADAFUSE_DATA_DIR")
    data_dir = str(Path(data_dir).expanduser().resolve())
    if variant not in VARIANTS:
        raise ConfigError(f"variant must be one of {VARIANTS}, got {variant!r}")
    out = Path(out)
    return [write_task(name, data_dir, out, variant, limit, overrides) for name in tasks]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="folder to write the tasks into (lm_eval's --include_path)")
    parser.add_argument("--data-dir", help="the benchmark data (default: $ADAFUSE_DATA_DIR, else ../shared/data)")
    parser.add_argument("--variant", default="canonical", choices=VARIANTS, help="paper: the authors' own files")
    parser.add_argument(
        "--tasks", default=",".join(TASKS), help=f"comma-separated tasks of conf/task (default: {','.join(TASKS)})"
    )
    parser.add_argument("--limit", type=int, help="write only the first N examples of each task (default: all)")
    parser.add_argument("overrides", nargs="*", help="run.py's overrides for every task (task.path=FILE for custom)")
    args = parser.parse_intermixed_args(argv)
    names = [t for t in args.tasks.split(",") if t]
    known = sorted(p.stem for p in (CONF_DIR / "task").glob("*.yaml"))
    unknown = sorted(set(names) - set(known))
    if unknown:
        parser.error(f"unknown task(s) {', '.join(unknown)}; valid: {', '.join(known)}")
    for path in write_tasks(args.out, args.data_dir, args.variant, names, args.limit, args.overrides):
        print(path)


if __name__ == "__main__":
    main()
