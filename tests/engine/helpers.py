from omegaconf import OmegaConf

from adafuse.model import Member
from conf.schema import DataConf
from eval.tasks import Task
from tests.harness import compose_run


def clone(member: Member) -> Member:
    """A second member over the same weights and tokenizer, with its own context and cache."""
    return member.clone()


def nq_prompt(shared_data, example_id: str) -> tuple[str, list[str]]:
    """The harness's prompt and stop strings for one Natural Questions example."""
    cfg = OmegaConf.to_object(compose_run("task=nq", "task.limit=5").task)
    task = Task(cfg, DataConf(dir=str(shared_data)))
    return next(task.prompt(ex) for ex in task.examples if ex.id == example_id), list(cfg.stop)


def nq_few_shot_case(shared_data, budget: int) -> tuple[str, list[str], int]:
    """(prompt, stop strings, budget): the paper's NQ few-shot prompt (~700 tokens) and one question."""
    nq = (shared_data / "adafuse_local_datasets/NaturalQuestions/dev/nq_prompt.txt").read_text()
    return nq + "\n\nQuestion: when was the last time anyone was on the moon\nAnswer:", ["\n"], budget
