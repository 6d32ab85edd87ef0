import pytest
from omegaconf import OmegaConf

from adafuse.ensemble import resolve_method
from adafuse.model import Member
from adafuse.session import Request
from adafuse.trace import Generation
from conf.compose import compose_run
from conf.schema import DataConf
from eval.tasks import Task


def decode(members, prompt: str, cfg, **request) -> Generation:
    """Decode `prompt` through the method seam with the method whose knobs `cfg` is; `request` holds
    the Request's other fields (stop, max_new_tokens, trace)."""
    spec, cfg = resolve_method(cfg, {})
    return spec.generate(members, Request(prompt, **request), cfg)


def assert_scores_match(fast_scores, slow_scores) -> None:
    """A fast Score list equals the reference's (base, ids, skip, nll) tuples; NLLs within 1e-4."""
    assert len(fast_scores) == len(slow_scores)
    for fs, (base, ids, skip, value) in zip(fast_scores, slow_scores):
        assert (fs.base, fs.ids, fs.skip) == (base, ids, skip)
        assert fs.nll == pytest.approx(value, abs=1e-4)


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
