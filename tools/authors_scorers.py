"""Run the AdaFuse authors' own scorers on our committed grid predictions; store their per-example verdicts.

    pip install --target /tmp/w2n word2number==1.1
    ADAFUSE_DATA_DIR=../shared/data python -m tools.authors_scorers --authors /path/to/AdaFuse --word2number /tmp/w2n

`--authors` is a checkout of github.com/CCM0111/AdaFuse at c7ecc712457f1b0074d798bfd98c37418c774e08. Their code
is never copied into this tree: it is read and run from that checkout. `--word2number` is a folder from which
`import word2number` works (their requirements.txt lists word2number; its only release is 1.1). The runs
default to every committed grid run of NQ, TriviaQA, SQuAD, GSM8K and FLORES (results/grid/<task>/<method>/
tiny/<run_id>/). Writes tests/fixtures/authors_scorers/<task>_<method>_<run_id>.json, literals.json and
provenance.json; tests/unit/test_authors_scorers.py holds our paper_* scorers to them (README.md there).

Each of our records becomes the record their pipeline would have written for it:
* `question`: their `extract_target_question` (AdaFuse_two_models.py) applied to the prompt that THEIR collate
  function builds from their prompt file and the example's question as their test file holds it (SQuAD:
  context + "\\n" + question). Not our prompt: our templates differ (NQ's adds a "?"), and their QA scorers
  join predictions to references on this text.
* `pred`: our raw generation as their loop and writer would have kept it. The loop commits whitespace-split
  words joined by single spaces and stops at the first committed word that holds `boxed{` (kept up to its `}`
  by their `extract_boxed_answer`) or "question:", "note:" or "<" (kept as far as their
  `clean_text_before_question` leaves it); the writer then takes the text after the last "Answer:" (else the
  whole generation) through `clean_text_before_question`. We replay that word by word (their rounds committed
  1-3 words; only a `boxed {` split by whitespace would be caught differently).
* `label`: the example's record in their test file (same question text), else our references in their format
  (TriviaQA: 37 of our 100 questions are not among their 6,000; SQuAD: none of our 100 v1.1-dev questions is
  among their 2,500).

Their scripts run from their own files, never edited: each file is executed as a module whose namespace already
holds the names it uses but never imports, then its `main()` runs on the converted files with `sys.argv` set as
on their command line. Settings (what the namespace holds):
* `as_shipped`: nothing. eval_nq.py and eval_squad.py then raise NameError('w2n') in `_num_equiv_any` on every
  pair that is neither equal nor two digit strings; eval_spbleu.py cannot load (a return annotation names the
  never-imported `sacrebleu`).
* `with_imports`: the imports their README asks for: `w2n` = word2number's module, and `sacrebleu`, whose
  `corpus_bleu` gets tokenize="13a" for their "spm" when the flores101 SentencePiece model is not in
  sacrebleu's cache (sacrebleu would download it; 13a is what our `paper_bleu` falls back to then).
* `w2n_inert` (QA only): a `w2n` whose `word_to_num` raises the ValueError that their code catches, i.e. their
  scripts as shipped with the NameError turned into "not a number" (number words are never converted).
Our paper_* replicas follow `with_imports`: they call word2number where these scripts do.
Verdicts are captured per pair by wrapping their `is_correct` (QA) and `is_match` (GSM8K) in the module: an
exception there is recorded as a crash and the pair counted wrong so that the loop goes on (as shipped, their
script stops at the first one).
"""

import argparse
import ast
import contextlib
import hashlib
import io
import json
import re
import subprocess
import sys
import traceback
import types
from pathlib import Path

import sacrebleu
from omegaconf import OmegaConf

from conf.schema import register, saved_config
from eval.metrics import spbleu_available
from eval.tasks import Task, resolve_data_dir

ROOT = Path(__file__).resolve().parent.parent

AUTHORS_COMMIT = "c7ecc712457f1b0074d798bfd98c37418c774e08"
FIXTURES = ROOT / "tests" / "fixtures" / "authors_scorers"

# task -> (their scorer, their test file, their prompt file), paths inside their checkout
TASKS = {
    "nq": (
        "evaluation/eval_nq.py",
        "NaturalQuestions/test/natural-questions.jsonl",
        "NaturalQuestions/dev/nq_prompt.txt",
    ),
    "triviaqa": ("evaluation/eval_trivia.py", "TriviaQA/wikipedia-test-6000.jsonl", "TriviaQA/prompt.txt"),
    "squad": ("evaluation/eval_squad.py", "SQUAD/squad_2500.jsonl", "SQUAD/squad_prompt.txt"),
    "gsm8k": ("evaluation/eval_gsm.py", "GSM/test.cleand.jsonl", "GSM/gsm_prompt.txt"),
    "flores_de_en": (
        "evaluation/eval_spbleu.py",
        "Flores/flores_deu2eng_qa.devtest.jsonl",
        "Flores/flores_deu2en_prompt.txt",
    ),
    "flores_en_de": (
        "evaluation/eval_spbleu.py",
        "Flores/flores_eng2deu_qa.devtest.jsonl",
        "Flores/flores_en2deu_prompt.txt",
    ),
}
QA_TASKS = ("nq", "triviaqa", "squad")
MAIN_SCRIPT = "AdaFuse_two_models.py"
# the helpers of their main script that build a record (run from their file, not copied)
MAIN_HELPERS = (
    "create_qa_collate_fn",
    "create_gsm_collate_fn",
    "extract_target_question",
    "clean_text_before_question",
    "extract_boxed_answer",
)

# Literal pairs on which a rule matters, scored by their scripts too (literals.json): (pred, label) as their
# record holds them; our side scores the pred as the generation and the label as the references.
QA_LITERALS = [
    ("Obama’s", ["Obama"]),  # curly possessive
    ("Obama's", ["Obama"]),  # straight possessive
    ("beatle", ["The Beatles"]),  # plural s (NQ only)
    ("two", ["2"]),  # number word vs digits
    ("1", ["one", "one season"]),
    ("228 million", ["18 million"]),  # word2number reads "N million" as 1000000, whatever N
    ("twenty-one", ["21"]),
    ("007", ["7"]),
    ("²", ["2"]),  # str.isdigit() but not int()-able
    ("14 December 1972 UTC", ["December 1972"]),
    ("14 December 1972 UTC at noon GMT", ["14 December 1972"]),
    ("", ["The Who"]),
    ("Vancouver", ["Seattle"]),
    # word2number's quirks, which our replicas take with it
    ("3 million", ["5 million"]),  # TriviaQA reads both as 1000000; NQ and SQuAD turn "million" into digits first
    ("two million", ["2000000"]),
    ("One Direction", ["Direction"]),  # the number-word run takes the space after it: "1direction"
    ("turning point", ["zero"]),  # word2number reads "point" alone as 0
    ("thousand five", ["5"]),  # word2number raises IndexError, which eval_nq.py and eval_squad.py do not catch
]
GSM_LITERALS = [
    ("so \\boxed{8}", "Therefore, the answer is 18"),  # substring rule
    ("3 + 15 = 18 apples", "Therefore, the answer is 18"),  # no box: all digits concatenated
    (".", "Therefore, the answer is 18"),  # "." is no float, so it stays "." and is inside "18.00"
    ("\\boxed{1,000}", "Therefore, the answer is 1000"),
    ("\\boxed{}", "Therefore, the answer is 18"),
    ("no number at all", "Therefore, the answer is 18"),
]


# ---- their code, loaded from their checkout --------------------------------------------------------------


def main_helpers(authors: Path) -> dict:
    """The record-building functions of their AdaFuse_two_models.py (the file itself cannot be imported: its
    `utils` package is missing), compiled from their file's own text."""
    path = authors / MAIN_SCRIPT
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    nodes = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name in MAIN_HELPERS]
    if sorted(node.name for node in nodes) != sorted(MAIN_HELPERS):
        raise SystemExit(f"{path} does not define {MAIN_HELPERS}")
    namespace = {"re": re}
    exec(compile(ast.Module(body=nodes, type_ignores=[]), str(path), "exec"), namespace)
    return namespace


def offline_sacrebleu() -> types.SimpleNamespace:
    """sacrebleu as their eval_spbleu.py uses it; tokenize="spm" becomes "13a" when the flores101 model is absent."""

    def corpus_bleu(hypotheses, references, tokenize="13a", **kwargs):
        if tokenize == "spm" and not spbleu_available():
            tokenize = "13a"
        return sacrebleu.corpus_bleu(hypotheses, references, tokenize=tokenize, **kwargs)

    return types.SimpleNamespace(metrics=sacrebleu.metrics, corpus_bleu=corpus_bleu)


def inert_w2n() -> types.SimpleNamespace:
    def word_to_num(text):
        raise ValueError("w2n_inert: no number words")

    return types.SimpleNamespace(word_to_num=word_to_num)


def load_script(path: Path, setting: str, word2number_dir: Path | None):
    """Their scorer executed as a module; `setting` says which never-imported names it is given first."""
    module = types.ModuleType(f"authors_{path.stem}")
    module.__file__ = str(path)
    if setting == "with_imports":
        # Their scorers `from word2number import w2n`; --word2number names a checkout of the version their README
        # pins, found first: someone else's code from a directory the user gives, not the project's own imports.
        if word2number_dir is not None and str(word2number_dir) not in sys.path:
            sys.path.insert(0, str(word2number_dir))
        from word2number import w2n

        module.w2n = w2n
        module.sacrebleu = offline_sacrebleu()
    elif setting == "w2n_inert":
        module.w2n = inert_w2n()
    exec(compile(path.read_text(encoding="utf-8"), str(path), "exec"), module.__dict__)
    return module


CRASH_MESSAGES: dict[str, str] = {}  # "crash: <exception type> in <their function>" -> the message


def crash_of(err: BaseException) -> str:
    """The verdict for a crash, "crash: <exception type> in <their function>"; the message is kept aside."""
    frame = traceback.extract_tb(err.__traceback__)[-1]
    crash = f"crash: {type(err).__name__} in {frame.name}"
    CRASH_MESSAGES.setdefault(crash, str(err))
    return crash


def run_main(module, argv: list[str]) -> str:
    """Their main() as their command line runs it; returns the line that gives the score."""
    out = io.StringIO()
    saved = sys.argv
    sys.argv = argv
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            try:
                module.main()
            except SystemExit as exit_:
                print(f"SystemExit({exit_.code})")
    finally:
        sys.argv = saved
    lines = [ln for ln in out.getvalue().splitlines() if ln.startswith(("num_q", "Accuracy:", "spBLEU:", "SystemExit"))]
    return lines[-1] if lines else out.getvalue().strip()


# ---- our runs, converted to their records ----------------------------------------------------------------


def their_question_text(task: str, fields: dict) -> str:
    """The example's `question` as their test file holds it."""
    if task == "squad":
        return fields["context"] + "\n" + fields["question"]
    return fields["source"] if task.startswith("flores") else fields["question"]


def their_pred(generation: str, prompt: str, helpers: dict) -> str:
    """Their writer's `pred` had their loop committed our generation (see the module docstring)."""
    clean, boxed = helpers["clean_text_before_question"], helpers["extract_boxed_answer"]
    prefix = prompt
    for word in generation.split():
        if re.search(r"\\?boxed\s*\{", word, flags=re.IGNORECASE):
            kept = boxed(word)
            if kept:
                prefix += " " + kept
            break
        if "question:" in word.lower() or "note:" in word.lower() or "<" in word:
            kept = clean(word)
            if kept:
                prefix += " " + kept
            break
        prefix += " " + word
    if "Answer:" in prefix:
        return clean(prefix.split("Answer:")[-1].strip())
    return clean(prefix.replace(prompt, "", 1).strip())


def pred_digest(pred: str) -> str:
    """A short fingerprint of a pred with its whitespace runs made single spaces (their loop's joins)."""
    return hashlib.sha256(" ".join(pred.split()).encode("utf-8")).hexdigest()[:12]


def load_task(run_dir: Path) -> Task:
    """The run's task as its config.yaml declares it, read from the local data (never the hub)."""
    settings = OmegaConf.to_object(saved_config(run_dir / "config.yaml"))
    settings.data.dir = resolve_data_dir(settings.data.dir)
    if settings.data.dir is None:
        raise SystemExit("no local data: set ADAFUSE_DATA_DIR to the folder that holds the benchmarks (shared/data)")
    return Task(settings.task, settings.data)


def convert(run_dir: Path, task: Task, authors: Path, helpers: dict) -> list[dict]:
    """Per committed prediction: our id, their record, the reference question, and where the label came from."""
    _, test_file, prompt_file = TASKS[task.name]
    theirs: dict[str, dict] = {}
    with open(authors / "local_datasets" / test_file, encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            theirs.setdefault(row["question"], row)
    prompt_text = (authors / "local_datasets" / prompt_file).read_text(encoding="utf-8")
    collate = helpers["create_gsm_collate_fn" if "gsm" in test_file.lower() else "create_qa_collate_fn"](prompt_text)
    examples = {ex.id: ex for ex in task.examples}
    converted = []
    with open(run_dir / "predictions.jsonl", encoding="utf-8") as f:
        for line in f:
            ours = json.loads(line)
            example = examples[ours["id"]]
            if task.prompt(example) != ours["prompt"]:
                raise SystemExit(f"{run_dir}: {ours['id']}: the task's prompt is not the one the run decoded")
            question = their_question_text(task.name, example.fields)
            row = theirs.get(question)
            label = row["answer"] if row is not None else list(example.references)
            (prompt,), _ = collate([{"question": question, "answer": label}])
            record = {
                "question": helpers["extract_target_question"](prompt),
                "pred": their_pred(ours["prediction"], prompt, helpers),
                "label": label,
            }
            converted.append(
                {"id": ours["id"], "record": record, "ref_question": question, "their_label": row is not None}
            )
    return converted


# ---- their verdicts --------------------------------------------------------------------------------------


def write_jsonl(path: Path, rows: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def qa_verdicts(script: Path, converted: list[dict], setting: str, w2n_dir, scratch: Path) -> tuple[list, str]:
    """Their eval_{nq,trivia,squad}.py on our records: per example 1/0, a crash, or "missing", plus, for an
    example whose question another example shares, the id whose pred and label their join kept."""
    pred_path, ref_path = scratch / "pred.jsonl", scratch / "ref.jsonl"
    write_jsonl(pred_path, [c["record"] for c in converted])
    write_jsonl(ref_path, [{"question": c["ref_question"], "answer": c["record"]["label"]} for c in converted])
    module = load_script(script, setting, w2n_dir)
    loaded: dict = {}
    verdicts: dict[int, object] = {}  # id(the answer list of one reference key) -> verdict

    def keeping(name):
        original = getattr(module, name)

        def wrapped(*args, **kwargs):
            loaded[name] = original(*args, **kwargs)
            return loaded[name]

        setattr(module, name, wrapped)

    keeping("load_references")
    keeping("load_predictions")
    is_correct = module.is_correct

    def recording_is_correct(answers, prediction, is_regex):
        try:
            verdict = is_correct(answers, prediction, is_regex)
        except Exception as err:  # noqa: BLE001  (their crash is the datum)
            verdicts[id(answers)] = crash_of(err)
            return False
        verdicts[id(answers)] = int(bool(verdict))
        return verdict

    module.is_correct = recording_is_correct
    printed = run_main(module, [script.name, "--pred", str(pred_path), "--ref", str(ref_path)])
    refs, preds = loaded["load_references"], loaded["load_predictions"]

    strip_block = getattr(module, "_strip_last_prompt_block", str.strip)  # eval_trivia.py only strips

    def pred_key(record):  # as their load_predictions keys it
        return strip_block(record["question"]).lower()

    out = []
    for c in converted:
        key = c["ref_question"].strip().lower()
        entry = {"id": c["id"], "verdict": verdicts.get(id(refs[key]), "missing")}
        kept = [d["id"] for d in converted if d["ref_question"].strip().lower() == key][-1]
        if kept != c["id"]:
            entry["joined_as"] = kept  # the dict kept a later example's label and pred for this question
        if pred_key(c["record"]) != key or key not in preds:
            entry["pred_unjoined"] = True
        out.append(entry)
    return out, printed


def gsm_verdicts(script: Path, converted: list[dict], setting: str, w2n_dir, scratch: Path) -> tuple[list, str]:
    path = scratch / "pred.jsonl"
    write_jsonl(path, [c["record"] for c in converted])
    module = load_script(script, setting, w2n_dir)
    calls: list = []
    is_match = module.is_match

    def recording_is_match(pred, label):
        try:
            verdict = is_match(pred, label)
        except Exception as err:  # noqa: BLE001
            calls.append(crash_of(err))
            return False
        calls.append(int(bool(verdict)))
        return verdict

    module.is_match = recording_is_match
    printed = run_main(module, [script.name, "--pred", str(path)])
    if len(calls) != len(converted):
        raise RuntimeError(f"{script.name} scored {len(calls)} of {len(converted)} lines")
    return [{"id": c["id"], "verdict": v} for c, v in zip(converted, calls)], printed


def bleu_score(script: Path, converted: list[dict], setting: str, w2n_dir, scratch: Path) -> dict:
    path = scratch / "pred.jsonl"
    write_jsonl(path, [c["record"] for c in converted])
    try:
        module = load_script(script, setting, w2n_dir)
    except Exception as err:  # noqa: BLE001  (as shipped, the file does not load)
        crash = crash_of(err)
        return {"crash": crash, "message": CRASH_MESSAGES[crash]}
    scores = []
    compute = module.compute_spbleu

    def recording_compute(preds, refs, lowercase):
        scores.append(compute(preds, refs, lowercase))
        return scores[-1]

    module.compute_spbleu = recording_compute
    printed = run_main(module, [script.name, "--input", str(path)])
    result = {"printed": printed}
    if scores:
        result.update(score=scores[0].score, tokenizer=bleu_tokenizer())
    return result


def bleu_tokenizer() -> str:
    return "flores101 (spm)" if spbleu_available() else "13a (no flores101 SentencePiece model: spm replaced)"


def settings_for(task: str) -> tuple[str, ...]:
    return ("as_shipped", "with_imports", "w2n_inert") if task in QA_TASKS else ("as_shipped", "with_imports")


def verdict_rows(task: str, script: Path, converted: list[dict], w2n_dir, scratch: Path) -> tuple[dict, list]:
    """Their printed score per setting, and one row per example with its verdict under every setting."""
    score = gsm_verdicts if task == "gsm8k" else qa_verdicts
    printed, rows = {}, [{"id": c["id"]} for c in converted]
    for setting in settings_for(task):
        per_example, printed[setting] = score(script, converted, setting, w2n_dir, scratch)
        for row, verdict in zip(rows, per_example):
            row[setting] = verdict["verdict"]
            row.update({k: v for k, v in verdict.items() if k not in ("id", "verdict")})
    return printed, rows


# ---- driver ----------------------------------------------------------------------------------------------


def default_runs() -> list[Path]:
    return sorted(
        run.parent for task in TASKS for run in (ROOT / "results" / "grid" / task).glob("*/tiny/*/predictions.jsonl")
    )


def fixture_name(run_dir: Path) -> str:
    task, method, _, run_id = run_dir.parts[-4:]
    return f"{task}_{method}_{run_id}.json"


def dump(path: Path, fixture: dict, rows_key: str = "examples") -> None:
    """Indented JSON with one line per example, so that a diff shows which example changed."""
    fixture = dict(fixture)
    rows = fixture.pop(rows_key, None)
    text = json.dumps(fixture, indent=1, ensure_ascii=False)
    if rows is not None:
        body = ",\n  ".join(json.dumps(row, ensure_ascii=False) for row in rows)
        text = text[:-2] + f',\n "{rows_key}": [\n  {body}\n ]\n}}'
    path.write_text(text + "\n", encoding="utf-8")


def score_run(run_dir: Path, task: Task, args, helpers: dict) -> dict:
    converted = convert(run_dir, task, args.authors, helpers)
    script = args.authors / TASKS[task.name][0]
    fixture = {"task": task.name, "run": str(run_dir.relative_to(ROOT)), "script": TASKS[task.name][0]}
    fixture["label_from_our_references"] = [c["id"] for c in converted if not c["their_label"]]
    if task.name.startswith("flores"):
        for setting in settings_for(task.name):
            fixture[setting] = bleu_score(script, converted, setting, args.word2number, args.scratch)
        fixture["dropped"] = [
            c["id"] for c in converted if not (c["record"]["pred"].strip() and c["record"]["label"].strip())
        ]
        fixture["examples"] = [{"id": c["id"], "pred": pred_digest(c["record"]["pred"])} for c in converted]
        return fixture
    printed, rows = verdict_rows(task.name, script, converted, args.word2number, args.scratch)
    fixture["printed"] = printed
    for row, c in zip(rows, converted):
        row["pred"] = pred_digest(c["record"]["pred"])
    fixture["crash_messages"] = crash_messages(rows)
    fixture["examples"] = rows
    return fixture


def crash_messages(rows: list[dict]) -> dict[str, str]:
    crashes = {v for row in rows for v in row.values() if isinstance(v, str) and v.startswith("crash: ")}
    return {crash: CRASH_MESSAGES[crash] for crash in sorted(crashes)}


def score_literals(args) -> dict:
    """Their scripts on the literal pairs above (one question per pair)."""
    literals = {}
    for task in ("nq", "triviaqa", "squad", "gsm8k"):
        pairs = GSM_LITERALS if task == "gsm8k" else QA_LITERALS
        converted = [
            {
                "id": f"literal-{i}",
                "record": {"question": f"literal question {i}", "pred": pred, "label": label},
                "ref_question": f"literal question {i}",
            }
            for i, (pred, label) in enumerate(pairs)
        ]
        _, rows = verdict_rows(task, args.authors / TASKS[task][0], converted, args.word2number, args.scratch)
        literals[task] = [{"pred": pred, "label": label, **row} for (pred, label), row in zip(pairs, rows)]
    literals["crash_messages"] = crash_messages([row for rows in literals.values() for row in rows])
    return literals


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="*", type=Path, help="run directories (default: every committed grid run)")
    parser.add_argument("--authors", type=Path, required=True, help=f"CCM0111/AdaFuse checked out at {AUTHORS_COMMIT}")
    parser.add_argument("--word2number", type=Path, help="a folder holding the word2number package")
    parser.add_argument("--out", type=Path, default=FIXTURES)
    parser.add_argument("--scratch", type=Path, default=Path("/tmp/authors_scorers"))
    args = parser.parse_args()
    head = subprocess.run(["git", "-C", str(args.authors), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.stdout.strip() != AUTHORS_COMMIT:
        raise SystemExit(f"{args.authors} is not a checkout of {AUTHORS_COMMIT} (HEAD: {head.stdout.strip() or '?'})")
    register()
    args.out.mkdir(parents=True, exist_ok=True)
    args.scratch.mkdir(parents=True, exist_ok=True)
    helpers = main_helpers(args.authors)
    for run_dir in [r.resolve() for r in (args.runs or default_runs())]:
        # each run's own task: runs of one benchmark may differ in prompt (protocol=paper reads their prompt file)
        fixture = score_run(run_dir, load_task(run_dir), args, helpers)
        dump(args.out / fixture_name(run_dir), fixture)
        print(f"{fixture['run']}: {fixture.get('printed') or fixture.get('with_imports')}")
    literals = score_literals(args)
    messages = literals.pop("crash_messages")
    (args.out / "literals.json").write_text(
        "{\n"
        + ",\n".join(
            f' "{task}": [\n  ' + ",\n  ".join(json.dumps(row, ensure_ascii=False) for row in rows) + "\n ]"
            for task, rows in literals.items()
        )
        + f',\n "crash_messages": {json.dumps(messages, ensure_ascii=False)}\n}}\n',
        encoding="utf-8",
    )
    from importlib.metadata import version

    provenance = {
        "repository": "github.com/CCM0111/AdaFuse",
        "commit": AUTHORS_COMMIT,
        "sha256": {
            p: hashlib.sha256((args.authors / p).read_bytes()).hexdigest()
            for p in sorted({t[0] for t in TASKS.values()} | {MAIN_SCRIPT})
        },
        "word2number": version("word2number"),
        "sacrebleu": sacrebleu.__version__,
        "bleu_tokenizer": bleu_tokenizer(),
    }
    (args.out / "provenance.json").write_text(json.dumps(provenance, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
