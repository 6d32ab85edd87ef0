"""KV-cache invariants of the member wrapper, checked against cache-free forward passes: on the real pair
(and Gemma-3's sliding window, narrowed), and through whole decodes on the paper's pair in shape."""

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from adafuse import AdaFuseConfig
from adafuse.backend.cpu.tiles import tile_rows
from adafuse.engine.loop import drive
from adafuse.member.cache import PromptStore, fork_cache, view_cache
from adafuse.text.align import common_prefix
from oracles import reference
from oracles.fast import decode
from tests.support.members import WINDOW, clone

pytestmark = pytest.mark.slow


def full_next_logprobs(member, ids):
    return reference.RefModel(member).next_logprobs(ids)


def test_fork_extend_commit_match_full_forward(tiny):
    for member in tiny.members:
        m = clone(member)
        drive(m.start("The quick brown fox"))
        assert torch.allclose(m.logprobs, full_next_logprobs(m, m.ids), atol=1e-4)
        rows = m.fork(3)
        firsts = m.logprobs.topk(3).indices.tolist()
        drive(rows.extend([[firsts[0]], [firsts[1]], [firsts[2]]]))
        drive(rows.extend([[7], [], [9]]))  # row 1 stops early and is padded
        for i in range(3):
            assert torch.allclose(rows.last[i], full_next_logprobs(m, rows.prefix + rows.tokens[i]), atol=1e-4)
        m.commit(rows, 1, "", m.text_of(rows.tokens[1]))
        m.check_invariant()
        assert m.ids[-1] == firsts[1]
        drive(m.feed([11, 12]))
        m.check_invariant()
        assert torch.allclose(m.logprobs, full_next_logprobs(m, m.ids), atol=1e-4)
        with pytest.raises(AssertionError, match="stopped early"):
            drive(rows.extend([[1], [2], [3]]))


def test_rollback_past_the_sliding_window(narrow, shared_data):
    """Gemma 3 attends through a sliding window (512 tokens; WINDOW in `narrow`): rolling back past it
    must still be exact."""
    m = clone(narrow[1])
    prompt = (shared_data / "adafuse_local_datasets/GSM/gsm_prompt.txt").read_text()[:400]
    drive(m.start(prompt))
    assert len(m.ids) > 2 * WINDOW
    context = list(m.ids)
    rows = m.fork(2)
    drive(rows.extend([[100, 200, 300], [400, 500, 600]]))
    m.commit(rows, 0, "", m.text_of(rows.tokens[0]))
    drive(m.start(prompt[:-40]))  # a shorter prompt: the cache is cut back inside the prompt
    m.check_invariant()
    assert m.ids == m.tokenisation.encode(prompt[:-40])
    assert torch.allclose(m.logprobs, full_next_logprobs(m, m.ids), atol=1e-4)
    drive(m.start(prompt))
    assert m.ids == context
    assert torch.allclose(m.logprobs, full_next_logprobs(m, m.ids), atol=1e-4)


def test_the_shared_few_shot_prefix_is_read_once(tiny, shared_data):
    nq = (shared_data / "adafuse_local_datasets/NaturalQuestions/dev/nq_prompt.txt").read_text()
    for member in tiny.members:
        m = clone(member)
        m.runner.prompts = PromptStore()
        drive(m.start(nq + "\n\nQuestion: who is the president\nAnswer:", prefix=nq))
        ((prefix, _),) = m.runner.prompts.entries  # read in a pass of its own, and kept
        assert prefix == m.ids[: len(prefix)] and len(prefix) >= len(m.tokenisation.encode(nq)) - 1
        m.reset_counters()
        drive(m.start(nq + "\n\nQuestion: where is the eiffel tower\nAnswer:", prefix=nq))
        assert len(m.runner.prompts.entries) == 1 and m.ids[: len(prefix)] == prefix
        assert (m.forward_passes, m.tokens_fed) == (1, len(m.ids) - len(prefix))  # the question alone
        assert torch.allclose(m.logprobs, full_next_logprobs(m, m.ids), atol=1e-4)


def test_retokenised_candidate_cuts_the_context_back_where_the_boundary_merges(gemma):
    """Gemma encodes "\\n\\n" as one token: a candidate "\\nThe" after a context ending in "\\n" re-tokenises
    across the boundary, so the context is cut back and the merged token is scored as part of the candidate."""
    m = clone(gemma)
    prompt = "Here is a list:\n"
    drive(m.start(prompt))
    (reading,) = drive(m.read([m.align("", "\nThe")]))
    a = reading.alignment
    encoded = m.tokenisation.encode(prompt + "\nThe")
    assert a.base < len(m.ids)  # the trailing "\n" token merged into "\n\n"
    assert encoded[: a.base] == m.ids[: a.base] and a.ids == encoded[a.base :]
    assert a.skip == 0  # "\n\n" carries the candidate's first character: it is scored
    expected = reference.nll(reference.RefModel(m), m.ids[: a.base], a.ids, False)
    assert -sum(reading.logprobs) / len(reading.logprobs) == pytest.approx(expected, abs=1e-4)
    m.commit(*reading.home, "", "\nThe")
    m.check_invariant()
    assert m.ids == encoded
    assert m.generated_ids == encoded[a.base :]  # the cut-back reached into the prompt: the merged token is output
    assert torch.allclose(m.logprobs, full_next_logprobs(m, m.ids), atol=1e-4)


def test_context_tokens_before_the_candidate_are_fed_but_not_scored(smol):
    """SmolLM2 reads "Answer: " as [..":", "Ġ"]; the candidate "Paris" encodes as "ĠParis" after ":", so
    the context's "Ġ" is cut back, and "ĠParis" carries the candidate: nothing is skipped. A candidate
    that starts with its own space ("  x") re-reads the prompt's space inside a token that is scored."""
    m = clone(smol)
    drive(m.start("Answer: "))
    assert m.tokenisation.tokenizer.convert_ids_to_tokens(m.ids[-1]) == "Ġ"
    a = m.align("", "Paris")
    assert (
        a.base == len(m.ids) - 1 and m.tokenisation.tokenizer.convert_ids_to_tokens(a.ids) == ["ĠParis"] and a.skip == 0
    )


def test_a_cut_back_never_reaches_before_the_last_committed_word(smol):
    """Once the context holds the model's own non-canonical ids before its last word, a later candidate
    is not cut back to them: the ids re-read stay bounded by the candidate plus the last word."""
    m = clone(smol)
    drive(m.start("Answer:"))
    space, paris = (
        m.tokenisation.encode_text(" "),
        m.tokenisation.encode_text("Paris"),
    )  # " " + "Paris": not the canonical " Paris"
    drive(m.append_ids(space + paris, "", " Paris"))
    drive(m.append_ids(m.tokenisation.encode_text(" is"), " Paris", " is"))  # the model's own next word
    canonical = m.tokenisation.encode_text("Answer: Paris is nice", add_special_tokens=True)
    assert common_prefix(canonical, m.ids) < len(m.ids) - 2  # a full re-encoding departs two words back
    a = m.align(" Paris is", " nice")
    assert (a.base, a.ids, a.skip) == (len(m.ids), m.tokenisation.encode_text(" nice"), 0)
    m.commit(*drive(m.read([a]))[0].home, " Paris is", " nice")
    assert m.ids[-4:-1] == space + paris + m.tokenisation.encode_text(" is")  # never re-read
    a = m.align(" Paris is nice", "\n")  # the last word " nice" may be re-read, nothing before it
    assert a.base >= len(m.ids) - 1


def test_generated_text_that_looks_like_a_control_token_is_encoded_as_text(tiny):
    for m in tiny.members:
        ids = m.tokenisation.encode_text(" <eos> <|im_end|> <start_of_image> <table>")
        assert not set(ids) & m.tokenisation.control_ids
        assert m.text_of(ids, m.tokenisation.encode("x")) == " <eos> <|im_end|> <start_of_image> <table>"


def test_cache_length_equals_context_after_every_decode(paper_pair):
    for prompt in ["Question: what is the tallest mountain?\nAnswer:", "Once upon a time,"]:
        decode(paper_pair.members, prompt, AdaFuseConfig(), stop=["\n"], max_new_tokens=12)
        for m in paper_pair.members:
            m.check_invariant()
            assert torch.allclose(m.logprobs, full_next_logprobs(m, m.ids), atol=1e-4)


def test_a_fork_reads_its_context_in_place_and_no_write_reaches_a_view_handed_out(smol):
    """adafuse/member/cache.py: a fork holds only its own positions (the context's are read where they are) and
    grows them in place; committing a row appends its positions after the context's (in place where the context's
    buffer has room after its end, as the tip commit below checks; here the prompt's buffer is full); a row's
    context taken before more steps, and a view of the context taken before the commit, keep their values; one row
    at the context's end writes in the context's buffer and commits without a copy; a crop makes the next read
    start a buffer of its own; every context still matches full forward passes."""
    m = clone(smol)
    drive(m.start("The quick brown fox"))
    context = m.cache.layers[0]
    rows = m.fork(2)
    drive(rows.extend([[5], [6]]))
    fork = rows.cache.layers[0]
    assert fork.base is context.buffer and fork.own.keys.shape[2] < 64  # no copy of the context's positions
    own = fork.own.keys.data_ptr()
    early = rows.cache_of_row(0)  # row 0's context now: the prompt and one id
    kept = early.layers[0].keys.clone()
    drive(rows.extend([[7], [8]]))
    drive(rows.extend([[9], [10]]))
    assert fork.own.keys.data_ptr() == own  # written in place, not concatenated
    assert torch.equal(early.layers[0].keys, kept)
    for i in range(2):
        assert torch.allclose(rows.last[i], full_next_logprobs(m, rows.prefix + rows.tokens[i]), atol=1e-4)
    snapshot = view_cache(m.cache)
    before = snapshot.layers[0].keys.clone()
    m.commit(rows, 1, "", m.text_of(rows.tokens[1]))
    assert torch.equal(snapshot.layers[0].keys, before)
    assert m.cache.get_seq_length() == len(m.ids) and torch.equal(
        m.cache.layers[0].keys[:, :, : before.shape[2]], before
    )
    # one row at the context's end (a proposal) writes its positions in the context's buffer, and its commit
    # copies nothing; a second fork there finds the end taken and writes a buffer of its own
    buffer, length = m.cache.layers[0].buffer, m.cache.get_seq_length()
    tip, late = m.fork(1), m.fork(1)
    drive(tip.extend([[12]]))
    drive(late.extend([[13]]))
    assert tip.cache.layers[0].riding and not late.cache.layers[0].riding and buffer.filled == length + 1
    assert torch.allclose(late.last[0], full_next_logprobs(m, m.ids + [13]), atol=1e-4)
    m.commit(tip, 0, "", m.text_of([12]))
    assert m.cache.layers[0].buffer is buffer and m.cache.get_seq_length() == len(m.ids) == length + 1
    assert torch.allclose(m.logprobs, full_next_logprobs(m, m.ids), atol=1e-4)
    m.cache.crop(-1)  # a rollback: the next read starts a buffer of its own
    m.context.ids = m.ids[:-1]
    drive(m.feed([11]))
    assert m.cache.layers[0].buffer is not buffer
    assert torch.allclose(m.logprobs, full_next_logprobs(m, m.ids), atol=1e-4)


def test_a_commit_writes_in_place_once_its_round_s_forks_are_let_go_and_never_under_a_live_one(smol):
    """A proposal rides its context's buffer; the round's winner is another fork's row. Committed, the context holds
    that row's positions where the fork wrote them until its next read: with the round's forks let go by then, it
    writes them after its own in place, where the lost proposal wrote (no copy of the context); with the proposal
    still held, it copies, and the proposal keeps its values. Every context still matches full forward passes."""
    m = clone(smol)
    drive(m.start("The quick brown fox"))
    buffer, length = m.cache.layers[0].buffer, m.cache.get_seq_length()
    for held in (False, True):
        proposal, candidates = m.fork(1), m.fork(2)
        drive(proposal.extend([[12, 13]]))
        drive(candidates.extend([[5], [6]]))
        assert proposal.cache.layers[0].riding and buffer.filled == length + 2
        kept = proposal.cache.layers[0].keys.clone()
        m.commit(candidates, 1, "", m.text_of([6]))
        assert m.cache.get_seq_length() == len(m.ids) == length + 1
        if not held:
            del proposal, candidates
        drive(m.feed([7]))
        assert (m.cache.layers[0].buffer is buffer) == (not held)
        assert torch.allclose(m.logprobs, full_next_logprobs(m, m.ids), atol=1e-4)
        if held:
            assert torch.equal(proposal.cache.layers[0].keys, kept)
        buffer, length = m.cache.layers[0].buffer, m.cache.get_seq_length()


def test_a_context_over_a_stored_prefix_names_it_in_its_runs_and_copies_it_only_into_one_tensor(smol):
    """A context read after a stored prompt prefix writes only its own positions: its buffer's first ones are read
    where the store holds them, as its runs and its forks' say (the CUDA backend's kernel reads them there:
    tests/engine/test_cuda_backend.py); made one tensor (the CPU's attention), they are copied in, once, and the
    runs stay as they were (a cache's layers plan alike whichever were made one tensor). The stored prefix is never
    written."""
    m = clone(smol)
    m.runner.prompts = PromptStore()
    drive(m.start("The quick brown fox jumps", prefix="The quick brown"))
    ((_, stored),) = m.runner.prompts.entries
    prefix, length = stored.layers[0].buffer, stored.get_seq_length()
    before = prefix.keys.clone()
    context = view_cache(stored)
    torch.manual_seed(0)
    new = [torch.randn(1, *prefix.keys.shape[1:2], 2, prefix.keys.shape[3]) for _ in range(2)]
    for layer in context.layers:
        layer.append(*new)
    layer = context.layers[0]
    buffer = layer.buffer
    assert buffer.under == (prefix, length) and layer.sources() == (buffer, prefix)
    assert layer.run_plan(0, length + 2) == [(1, 0, 0, length), (0, 0, length, 2)]
    fork = fork_cache(context, 2, length + 2).layers[0]
    fork.append(*[torch.randn(2, *t.shape[1:2], 1, t.shape[3]) for t in new])
    assert fork.sources() == (buffer, fork.own, prefix)
    assert fork.run_plan(1, length + 3) == [(2, 0, 0, length), (0, 0, length, 2), (1, 1, 0, 1)]
    keys = fork.keys  # one tensor: the prefix's positions copied into the context's buffer, once
    assert buffer.under_copied and layer.run_plan(0, length + 2) == [(1, 0, 0, length), (0, 0, length, 2)]
    assert torch.equal(buffer.keys[:, :, :length], prefix.keys[:, :, :length])
    plans = {(len(other.sources()), tuple(other.run_plan(0, length + 2))) for other in context.layers}
    assert plans == {(2, tuple(layer.run_plan(0, length + 2)))}  # layer 0 made one tensor, the others not
    assert torch.equal(keys[1, :, :length], prefix.keys[0, :, :length])
    assert torch.equal(keys[1, :, length:-1], new[0][0])
    assert torch.equal(prefix.keys, before)


def test_a_fork_of_rows_of_unequal_length_computes_only_their_ids(smol):
    """Rows.extend gives each row's distributions at the ids it read. The padding after a shorter row is
    never multiplied (only the real positions reach the linear layers, in whole tiles) and cannot be
    indexed, and a real row's values are bit for bit those of the same pass with no padding at all."""
    m = clone(smol)
    drive(m.start("Once upon a time"))
    layer = m.model.model.layers[0].mlp.down_proj
    with LinearRows() as rows_multiplied:
        steps = drive(m.fork(3).extend([[5, 6, 7], [8], []]))
    tile = tile_rows(m.runner.backend.probes, layer.weight, layer.bias)
    assert max(rows_multiplied.rows) == -(-4 // tile) * tile  # 4 real ids of the 9 positions
    assert steps.packed.shape[0] == 4
    with pytest.raises(IndexError, match="no position 1"):
        steps[1, 1]
    unpadded = drive(m.fork(3).extend([[5, 6, 7], [8, 8, 8], [9, 9, 9]]))
    for j in range(3):
        assert torch.equal(steps[0, j], unpadded[0, j])
    assert torch.equal(steps[1, 0], unpadded[1, 0])


class LinearRows(TorchFunctionMode):
    """The rows of every matrix multiply (F.linear) made inside the block."""

    def __init__(self):
        super().__init__()
        self.rows = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is F.linear:
            self.rows.append(args[0].reshape(-1, args[0].shape[-1]).shape[0])
        return func(*args, **(kwargs or {}))
