"""Every method as an lm-evaluation-harness model (eval/lm_harness.py), offline, on the bundled pair: lm_eval's
generations equal the runner's example for example, `single` scores as lm_eval's own `hf` model, and the
ensemble's log-likelihood is the mean of its members' (computed here from full forward passes)."""

import json
from pathlib import Path

import pytest
import torch
from lm_eval import simple_evaluate
from lm_eval.api.instance import Instance
from lm_eval.tasks import TaskManager

from adafuse.engine.loop import drive
from adafuse.errors import ConfigError, ContextLengthError
from adafuse.member.cache import PromptStore
from adafuse.methods.scoring import loglikelihood
from conf.compose import compose_run
from eval.lm_harness import AdaFuseLM
from eval.lm_tasks import write_tasks
from eval.runner import main
from tests.support.bad_inputs import bad_input, pattern
from tests.support.members import clone, long_reads_stopped
from tests.support.paths import SHARED_DATA

pytestmark = pytest.mark.slow

EXAMPLES = 3
BUDGET = 8  # tokens: NQ answers fit; GSM8K chains are cut, the same way in both
ARC_STYLE = [
    {
        "question": "Which gas do plants take in from the air to make food?",
        "choices": ["carbon dioxide", "oxygen", "nitrogen", "helium"],
        "answer": 0,
    },
    {"question": "What is frozen water called?", "choices": ["steam", "ice", "sand", "glass"], "answer": 1},
    # a context that ends in a space: lm_eval's rule moves it into every choice
    {"question": "The closest star to the Earth is the ", "choices": ["Sun", "Moon", "Mars"], "answer": 0},
]
MULTIPLE_CHOICE_YAML = """\
task: arc_style
dataset_path: json
dataset_kwargs:
  data_files:
    test: {file}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
metric_list:
  - metric: acc
"""


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("lm_tasks")
    write_tasks(out, str(SHARED_DATA), tasks=["nq", "gsm8k"], limit=EXAMPLES)
    questions = out / "arc_style.jsonl"
    questions.write_text("".join(json.dumps(q) + "\n" for q in ARC_STYLE))
    (out / "arc_style.yaml").write_text(MULTIPLE_CHOICE_YAML.format(file=questions))
    return out


def runner_predictions(task: str, method: str, out: Path) -> list[str]:
    overrides = [f"task={task}", f"task.limit={EXAMPLES}", f"task.max_new_tokens={BUDGET}"]
    overrides += [f"data.dir={SHARED_DATA}", "wandb.mode=disabled", "progress=false", *method.split()]
    main(compose_run(*overrides), out)
    records = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    return [r["prediction"] for r in sorted(records, key=lambda r: int(r["id"].split("-")[-1]))]


def harness(task_dir: Path, tasks: list[str], model_args: str, **options) -> dict:
    return simple_evaluate(
        model="adafuse",
        model_args=model_args,
        tasks=tasks,
        task_manager=TaskManager(include_path=str(task_dir)),
        log_samples=True,
        **options,
    )


@pytest.mark.parametrize(
    "method, model_args",
    [("method=adafuse", "pair=tiny,method=adafuse"), ("method=single method.member=1", "method=single,member=1")],
)
def test_generations_equal_the_runners(task_dir, tmp_path, method, model_args):
    results = harness(
        task_dir, ["adafuse_nq", "adafuse_gsm8k"], model_args, batch_size=2, gen_kwargs=f"max_gen_toks={BUDGET}"
    )
    for task in ("nq", "gsm8k"):
        # one sample per document and filter (GSM8K has two filters over the same generation)
        by_document = {s["doc_id"]: s["resps"][0][0] for s in results["samples"][f"adafuse_{task}"]}
        generated = [by_document[i] for i in sorted(by_document)]
        assert len(generated) == EXAMPLES
        assert generated == runner_predictions(task, method, tmp_path / task), task
    assert results["results"]["adafuse_nq"]["exact_match,remove_whitespace"] >= 0


def choice_samples(results: dict) -> list[tuple[float, bool]]:
    samples = sorted(results["samples"]["arc_style"], key=lambda s: s["doc_id"])
    return [tuple(r[0]) for s in samples for r in s["resps"]]


def test_single_scores_choices_as_lm_evals_hf_model(task_dir):
    from lm_eval.models.huggingface import HFLM

    from adafuse.ensemble import model_config
    from adafuse.loading.pretrained import model_location

    ours = choice_samples(harness(task_dir, ["arc_style"], "method=single,member=0"))
    hf = HFLM(pretrained=model_location(model_config("smollm2_135m")), dtype="float32", device="cpu", batch_size=4)
    theirs = choice_samples(
        simple_evaluate(
            model=hf, tasks=["arc_style"], task_manager=TaskManager(include_path=str(task_dir)), log_samples=True
        )
    )
    assert len(ours) == sum(len(q["choices"]) for q in ARC_STYLE)
    assert [greedy for _, greedy in ours] == [greedy for _, greedy in theirs]
    assert [logprob for logprob, _ in ours] == pytest.approx([logprob for logprob, _ in theirs], abs=1e-4)


def full_pass(member, context_ids: list[int], continuation_ids: list[int]) -> float:
    """The continuation's log-probability from one forward pass over both id lists, with no cache."""
    whole = context_ids + continuation_ids
    with torch.inference_mode():
        logits = member.model(input_ids=torch.tensor([whole])).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    return sum(logprobs[i - 1, whole[i]].item() for i in range(len(context_ids), len(whole)))


def choice_logprob(member, context: str, continuation: str) -> float:
    """lm_eval's boundary: trailing whitespace moves into the continuation, which is the ids that encoding
    context + continuation whole adds after the context's own encoding."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    context_ids = member.tokenisation.tokenizer(context)["input_ids"]
    return full_pass(
        member, context_ids, member.tokenisation.tokenizer(context + continuation)["input_ids"][len(context_ids) :]
    )


def test_ensemble_loglikelihood_is_the_mean_of_its_members(task_dir):
    model = AdaFuseLM(pair="tiny", method="adafuse")
    manager = TaskManager(include_path=str(task_dir))
    ours = choice_samples(simple_evaluate(model=model, tasks=["arc_style"], task_manager=manager, log_samples=True))
    members = model.ensemble.members
    expected = [
        sum(choice_logprob(m, q["question"], " " + choice) for m in members) / len(members)
        for q in ARC_STYLE
        for choice in q["choices"]
    ]
    assert [logprob for logprob, _ in ours] == pytest.approx(expected, abs=1e-3)

    text = "Water boils at one hundred degrees."
    [rolling] = model.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)])
    # the text's ids without special tokens, after the member's BOS id (SmolLM2 has one, as does Gemma)
    per_member = [
        full_pass(
            m,
            [m.tokenisation.tokenizer.bos_token_id],
            m.tokenisation.tokenizer(text, add_special_tokens=False)["input_ids"],
        )
        for m in members
    ]
    assert rolling == pytest.approx(sum(per_member) / len(per_member), abs=1e-3)


def test_contexts_that_share_exemplars_read_them_once_and_score_the_same_in_any_order(tiny):
    """Few-shot contexts (exemplars and query joined by blank lines, as lm_eval builds them): each member reads
    the exemplars once for all, and every score is the same, bit for bit, whichever contexts came before."""
    shots = "Question: What is 2 + 2?\nAnswer: 4\n\nQuestion: What colour is the sky?\nAnswer: blue\n\n"
    asked = [("What is 3 + 3?", " 6"), ("What is 3 + 4?", " 7"), ("What colour is grass?", " green")]
    requests = [(shots + f"Question: {question}\nAnswer:", answer) for question, answer in asked]
    members = [clone(m) for m in tiny.members]
    for member in members:
        member.runner.prompts = PromptStore()
    forward = drive(loglikelihood(members, requests))
    assert all(len(member.runner.prompts.entries) == 1 for member in members)
    assert drive(loglikelihood(members, requests[::-1]))[::-1] == forward


@pytest.mark.parametrize(
    "key, arguments",
    [
        ("lm_eval_sampling", {"until": ["\n"], "do_sample": True}),
        ("lm_eval_temperature", {"until": ["\n"], "temperature": 0.8}),
        ("lm_eval_num_beams", {"until": ["\n"], "num_beams": 4}),
    ],
)
def test_a_request_for_sampling_or_other_generation_is_refused_with_the_reason(key, arguments, tmp_path):
    model = AdaFuseLM(pair="tiny", method="single")
    with pytest.raises(ConfigError) as refused:
        model.generate_until([Instance("generate_until", {}, ("Question: 2+2?\nAnswer:", arguments), 0)])
    assert pattern(bad_input(key).message, tmp_path).fullmatch(str(refused.value)), refused.value


def test_a_request_longer_than_a_models_context_is_refused_before_any_model_reads_it(tmp_path):
    """Gemma-3 has room for it and would read it first, for minutes, then SmolLM2 refuse it: the hook on
    every model's pass stops a long read at once."""

    model = AdaFuseLM(pair="tiny", method="adafuse")
    with long_reads_stopped(model.ensemble.members) as long_reads, pytest.raises(ContextLengthError) as refused:
        model.generate_until([Instance("generate_until", {}, ("word " * 9000, {"until": ["\n"]}), 0)])
    assert long_reads == []
    assert pattern(bad_input("lm_eval_long_request").message, tmp_path).fullmatch(str(refused.value))
