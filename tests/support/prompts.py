"""The harness's prompts as the tests use them: Natural Questions as the runner renders it, the paper's few-shot
NQ prompt, and the token-level methods' prompts."""

from omegaconf import OmegaConf

from conf.compose import compose_run
from conf.schema import DataConf
from eval.tasks import Task


def nq_prompt(shared_data, example_id: str) -> tuple[str, list[str]]:
    """The harness's prompt and stop strings for one Natural Questions example."""
    cfg = OmegaConf.to_object(compose_run("task=nq", "task.limit=5").task)
    task = Task(cfg, DataConf(dir=str(shared_data)))
    return next(task.prompt(ex) for ex in task.examples if ex.id == example_id), list(cfg.stop)


def nq_few_shot_case(shared_data, budget: int) -> tuple[str, list[str], int]:
    """(prompt, stop strings, budget): the paper's NQ few-shot prompt and one question (about 190 tokens)."""
    nq = (shared_data / "adafuse_local_datasets/NaturalQuestions/dev/nq_prompt.txt").read_text()
    return nq + "\n\nQuestion: when was the last time anyone was on the moon\nAnswer:", ["\n"], budget


# The token-level methods' prompts (UniTE's and DeePEn's checks against their oracles): (prompt, stop, max_new_tokens)
TOKEN_METHOD_CASES = [
    ("Question: What is the capital of France?\nAnswer:", ["\n"], 10),  # an answer that ends at a newline
    ("Englisch: The old house is very small.\nDeutsch:", ["\n"], 12),  # German output
    ("Die größte Stadt in Österreich ist", [], 8),  # German prompt with umlauts
    ("The sum of 128 and 256 is", [], 8),  # digits
    ("A short list of fruits:\n1.", [], 12),  # newlines inside the output
]
