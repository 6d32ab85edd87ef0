"""Every tensor a method or member combines with a backend's result lives on that result's device, whatever device
the member names.

On a GPU a member names its model's device (cuda:k) while the CUDA backend hands every result back on the host
(adafuse/backend/cuda/backend.py), so a tensor made on the member's device and combined with a result (the control
ids masked in a distribution, say) fails at the first pass. Here a backend double computes on this CPU, as the CPU
backend does, for members that name cuda:0: a tensor made on the member's device would be made on a GPU this
machine does not have, and fail as it would on a GPU machine. Every method decodes the same text as with members
that name the host.
"""

import copy

import pytest
import torch

from adafuse.member.cache import KVLedger, PromptStore
from adafuse.member.member import Member
from adafuse.methods import METHODS
from oracles.fast import decode
from tests.support.backends import ResultsOnTheHost

pytestmark = pytest.mark.slow

PROMPT = "Question: what is the capital of France?\nAnswer:"
NAMED = torch.device("cuda", 0)
# DeePEn's transfer matrices over every token the stand-ins' vocabularies share (46k anchors, a 262k-token
# vocabulary) take some four minutes of this CPU to build; where results arrive does not hang on how many anchors.
KNOBS = {"deepen": {"max_anchors": 1024}}


def naming(member: Member, device: torch.device) -> Member:
    """A member over the same weights, prepared model and tokenisation whose runner names `device`."""
    runner = copy.copy(member.runner)
    runner.device = device
    runner.backend = ResultsOnTheHost(member.runner.backend)
    runner.prompts, runner.ledger = PromptStore(), KVLedger()
    return Member.over(runner, member.tokenisation)


def test_the_double_names_a_device_this_machine_cannot_make_tensors_on(tiny_shaped):
    """The double's point: a tensor on the named device cannot be made here (no GPU in this test's torch, or a
    GPU whose tensors no host result meets)."""
    member = naming(tiny_shaped[0], NAMED)
    assert member.device == NAMED and member.runner.prepared.device.type == "cpu"
    if not torch.cuda.is_available():
        with pytest.raises((AssertionError, RuntimeError)):
            torch.zeros(1, device=member.device)


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_combines_results_where_they_arrive(tiny_shaped, method):
    spec = METHODS[method]
    cfg = spec.config(**KNOBS.get(method, {}))
    on_host = decode([m.clone() for m in tiny_shaped], PROMPT, cfg, max_new_tokens=6, stop=["\n"])
    elsewhere = decode([naming(m, NAMED) for m in tiny_shaped], PROMPT, cfg, max_new_tokens=6, stop=["\n"])
    assert elsewhere.text == on_host.text
