"""What a run records of its passes (metrics.json's `batching`, adafuse/engine/executor.py `report`) is what each
model's backend says of them (`Backend.describe`), on every device, with each pass's seconds of compute and of the
host's own work."""

import copy

import pytest

from adafuse.engine.executor import Executor
from adafuse.engine.loop import decode_many
from adafuse.ensemble import resolve_method
from adafuse.member.cache import KVLedger, PromptStore
from adafuse.member.member import Member
from adafuse.methods.session import Request
from tests.support.backends import Delegating

pytestmark = pytest.mark.slow

PROMPTS = ["Question: who wrote hamlet\nAnswer:", "List three colors:\n", "1, 2, 3, 4,"]


class KernelsOfItsOwn(Delegating):
    """The CPU backend's passes, described as a backend with kernels of its own describes them."""

    def describe(self, model, exact):
        ops = {"linear": "kernel", "rms_norm": "kernel", "log_softmax": "per_read", "attention": "kernel"}
        return {"backend": "kernels-of-its-own", "batch_invariant": exact, "failing": [], "ops": ops}


def described(member: Member) -> Member:
    runner = copy.copy(member.runner)
    runner.backend = KernelsOfItsOwn(member.runner.backend)
    runner.prompts, runner.ledger = PromptStore(), KVLedger()
    return Member.over(runner, member.tokenisation)


def test_the_record_is_the_backends_description_with_gpu_and_host_seconds(tiny_shaped):
    members = [described(m) for m in tiny_shaped]
    spec, cfg = resolve_method("adafuse", {})
    executor = Executor()
    requests = [Request(p, ["\n"], 6) for p in PROMPTS]
    done = dict(decode_many(members, range(3), lambda slot, i: spec.generate(slot, requests[i], cfg), 3, executor))
    assert sorted(done) == [0, 1, 2]
    for member in members:
        record = executor.report()[member.name]
        assert {k: record[k] for k in ("backend", "linear", "rms_norm", "log_softmax", "attention")} == {
            "backend": "kernels-of-its-own",
            "linear": "kernel",
            "rms_norm": "kernel",
            "log_softmax": "per_read",
            "attention": "kernel",
        }
        assert record["passes"] > 0 and record["seconds"] > 0 and record["host_seconds"] > 0


def test_the_cpu_backend_records_its_own_ways(tiny_shaped):
    member = tiny_shaped[0].clone()
    spec, cfg = resolve_method("single", {"member": 0})
    executor = Executor()
    dict(decode_many([member], range(1), lambda slot, i: spec.generate(slot, Request(PROMPTS[0], ["\n"], 4), cfg), 1,
                     executor))  # fmt: skip
    record = executor.report()[member.name]
    assert (record["backend"], record["linear"], record["attention"]) == ("cpu-exact", "row_tiles", "per_request")
    assert record["seconds"] == record["host_seconds"]  # on the CPU the host computes the pass
