"""Batching across examples (adafuse/engine/loop.py) changes no prediction: every example decoded with
others in flight equals the same example decoded alone.

Whole decodes run on the paper's pair in shape (real Llama-3 and Mistral tokenizers, tiny random weights:
what is checked is the scheduler, not the models); on the real bundled pair a merged pass equals separate
passes below, and tests/engine/test_adafuse_code.py decodes the authors' recorded examples batched."""

import gc
import threading
import time
import weakref

import pytest
import torch

from adafuse import Ensemble, Job, Request, ScoreJob, SingleConfig
from adafuse.backend import MERGED
from adafuse.backend.attention import PREFIX
from adafuse.config import ModelConfig
from adafuse.engine.executor import Executor
from adafuse.engine.loop import decode_many, drive
from adafuse.engine.scheduler import Scheduler
from adafuse.ensemble import resolve_method
from adafuse.errors import BatchMemoryError
from adafuse.member.cache import PromptStore
from adafuse.methods import METHODS
from tests.support.members import clone, pass_alone, pass_merged
from tests.support.paper_pair import NAMES
from tools.bench_decode import task_requests

pytestmark = pytest.mark.slow


def prompts_of_many_lengths(shared_data) -> list[Request]:
    nq = (shared_data / "adafuse_local_datasets/NaturalQuestions/dev/nq_prompt.txt").read_text()
    return [
        Request("Question: What is the capital of France?\nAnswer:", ["\n"], 8),  # stops after a round or two
        Request(nq + "\n\nQuestion: when was the last time anyone was on the moon\nAnswer:", ["\n"], 8, prefix=nq),
        Request("Die Hauptstadt von Deutschland ist", [], 10),  # runs to the budget
        Request("日本の首都は", [], 6),
        Request(nq + "\n\nQuestion: who wrote the declaration of independence\nAnswer:", ["\n"], 8, prefix=nq),
        Request(nq + "\n\nQuestion: who sang the song yesterday\nAnswer:", ["\n"], 6, prefix=nq),
    ]


@pytest.mark.parametrize("method, options", [("adafuse", {}), ("single", {"member": 1})])
def test_batched_predictions_equal_unbatched_ones(paper_pair, shared_data, method, options):
    cases = prompts_of_many_lengths(shared_data)
    alone = [paper_pair.decode(request, method=method, **options) for request in cases]
    spec, cfg = resolve_method(method, options)

    def one(members, i):  # each example keeps its own stop strings and budget
        return spec.generate(members, cases[i], cfg)

    executor, finished = Executor(), []
    # a batch of 3 for 6 examples: finished examples' slots are refilled while others run on
    for i, gen in decode_many(paper_pair.members, range(len(cases)), one, batch_size=3, executor=executor):
        finished.append(i)
        assert gen.text == alone[i].text, cases[i].prompt[-60:]
        assert gen.ids == alone[i].ids
        assert gen.stats.rounds == alone[i].stats.rounds
        assert gen.stats.forward_passes == alone[i].stats.forward_passes
    assert sorted(finished) == list(range(len(cases)))
    assert executor.merged > 0  # passes did carry several examples' rows
    # and refilled slots read their prompts' tails in those passes, not in passes of their own
    assert all(counts.merged_prompts > 0 for counts in executor.counts.values())


def test_examples_that_start_together_read_the_few_shot_prefix_once(tiny, shared_data):
    nq = (shared_data / "adafuse_local_datasets/NaturalQuestions/dev/nq_prompt.txt").read_text()
    questions = ["who wrote hamlet", "where is the eiffel tower", "when did ww2 end", "what is the capital of peru"]
    requests = [Request(nq + f"\n\nQuestion: {q}\nAnswer:", max_new_tokens=3, prefix=nq + "\n\n") for q in questions]
    member = clone(tiny.members[0])
    member.runner.prompts = PromptStore()  # cold: nothing read before this batch
    spec, cfg = resolve_method("single", {"member": 0})
    decoded = dict(decode_many([member], range(4), lambda slot, i: spec.generate(slot, requests[i], cfg), 4))
    assert len(member.runner.prompts.entries) == 1  # the prefix was read once...
    assert all(decoded[i].stats.tokens_fed[0] < 20 for i in range(4))  # ...and each example its question and answer
    for i, gen in decoded.items():
        assert gen.ids == tiny.decode(requests[i], method="single", member=0).ids


def test_decode_batch_returns_results_in_prompt_order(paper_pair):
    prompts = ["Question: Who wrote Hamlet?\nAnswer:", "1, 2, 3, 4,", "Question: What is 2 + 2?\nAnswer:"]
    batched = paper_pair.decode_batch(prompts, batch_size=2, stop=["\n"], max_new_tokens=8)
    alone = [paper_pair.decode(p, stop=["\n"], max_new_tokens=8).text for p in prompts]
    assert [g.text for g in batched] == alone and len(set(alone)) == len(prompts)


def assert_merged_equals_separate(member):
    """Rows of different examples, with caches of different lengths, read together: logits and caches
    as if each had been read alone (float rounding aside)."""
    short, long = clone(member), clone(member)
    drive(short.start("Hello there"))
    drive(long.start("The quick brown fox jumps over the lazy dog. " * 20))
    rows_a, rows_b = short.fork(2), long.fork(1)
    inputs = [torch.tensor([[5, 6, 7], [8, 9, 10]]), torch.tensor([[11]])]
    merged = pass_merged(member, [rows_a.cache, rows_b.cache], inputs)
    # the context is read in place, not copied: two rows hold only their own positions; one row at the context's
    # end writes its positions after the context's, in its buffer, which a prompt's read made with room to spare
    fork, tip = rows_a.cache.layers[0], rows_b.cache.layers[0]
    assert fork.base is short.cache.layers[0].buffer and (fork.own.keys.shape[0], fork.own_length) == (2, 3)
    assert tip.base is long.cache.layers[0].buffer and tip.own_length == 1 and tip.riding and tip.own is None
    fresh_a, fresh_b = short.fork(2), long.fork(1)
    separate = [pass_alone(member, fresh_a.cache, inputs[0]), pass_alone(member, fresh_b.cache, inputs[1])]
    for got, want in zip(merged, separate):
        assert got.shape == want.shape
        assert torch.allclose(got, want, atol=1e-3)
    for got_cache, want_cache in [(rows_a.cache, fresh_a.cache), (rows_b.cache, fresh_b.cache)]:
        assert got_cache.get_seq_length() == want_cache.get_seq_length()
        for g, w in zip(got_cache.layers, want_cache.layers):
            assert torch.allclose(g.keys, w.keys, atol=1e-3)


def test_a_merged_pass_equals_separate_passes(tiny):
    for member in tiny.members:
        assert_merged_equals_separate(member)


def test_a_model_is_prepared_for_merging_when_its_member_is_made(paper_pair_dir):
    """The backend wraps a model's attention once, when its first member is made (adafuse/backend/__init__.py), and a
    fresh model merges exactly."""
    fresh = Ensemble.from_config([ModelConfig(name=NAMES[0], path=str(paper_pair_dir / NAMES[0]))]).members[0]
    assert fresh.model.config._attn_implementation.startswith(PREFIX) and fresh.runner.prepared.splits_attention
    assert_merged_equals_separate(fresh)


def test_a_pass_that_cannot_fit_is_a_named_error(tiny):
    prompts = ["Question: What is the capital of France?\nAnswer:"] * 2
    with pytest.raises(BatchMemoryError, match="MiB"):
        tiny.decode_batch(prompts, batch_size=2, max_new_tokens=4, scheduler=Scheduler(memory_budget=1 << 20))


PROMPTS = ["Question: Who wrote Hamlet?\nAnswer:", "1, 2, 3, 4,", "The capital of Peru is", "Once upon a time"] * 2


def greedy_slots(smol, fail_on=None):
    """(an example's program for decode_many, weak references to the slot clones it decoded with)."""
    seen = []

    def one(members, i):
        if i == fail_on:
            raise RuntimeError(f"example {i} failed")
        seen.append(weakref.ref(members[0]))
        return METHODS["single"].generate(members, Request(PROMPTS[i], max_new_tokens=12), SingleConfig(0))

    return one, seen


def test_a_failing_example_ends_the_run_and_leaves_no_program_or_clone_behind(smol):
    threads = threading.active_count()
    one, seen = greedy_slots(smol, fail_on=4)
    with pytest.raises(RuntimeError, match="example 4 failed"):
        for _ in decode_many([smol], range(len(PROMPTS)), one, batch_size=3):
            pass
    gc.collect()
    assert threading.active_count() == threads  # nothing waits on a pass that will never run
    assert seen and all(ref() is None for ref in seen)  # their clones and caches are gone


def test_a_caller_that_stops_early_leaves_no_program_or_clone_behind(smol):
    threads = threading.active_count()
    one, seen = greedy_slots(smol)
    stream = decode_many([smol], range(len(PROMPTS)), one, batch_size=3)
    next(stream)
    stream.close()  # e.g. `break` out of `for key, gen in ens.decode_stream(...)`
    del stream
    gc.collect()
    assert threading.active_count() == threads
    assert seen and all(ref() is None for ref in seen)


def test_a_merged_pass_orders_its_rows_by_slot(smol):
    """A step's requests come slot by slot, and a merged pass keeps that order (a request's place is its index)."""
    one, _ = greedy_slots(smol)
    executor, merged = Executor(), []
    run = executor.run

    def spy(plans, requests):
        merged.extend(plan.places for plan in plans if plan.kind == MERGED)
        return run(plans, requests)

    executor.run = spy
    for _ in decode_many([smol], range(len(PROMPTS)), one, batch_size=4, executor=executor):
        pass
    assert executor.merged > 0 and merged
    assert all(list(places) == sorted(places) for places in merged)


def test_an_example_s_members_ask_for_their_passes_in_the_same_step(tiny):
    """AdaFuse's members propose and score together (adafuse/member/passes.py `together`): even one example alone
    in a batched run has both models' requests in one engine step, and its text is the unbatched one."""
    prompt = "Question: What is the capital of France?\nAnswer:"
    steps = []
    executor = Executor()
    run = executor.run

    def spy(plans, requests):
        steps.append({r.runner.name for r in requests})
        return run(plans, requests)

    executor.run = spy
    spec, cfg = resolve_method("adafuse", {})
    ((_, gen),) = decode_many(
        tiny.members, [0], lambda members, _: spec.generate(members, Request(prompt, ("\n",), 8), cfg), 1, executor
    )
    assert gen.text == tiny.decode(prompt, stop=["\n"], max_new_tokens=8).text
    both = {m.name for m in tiny.members}
    assert sum(step == both for step in steps) >= 3  # the prompts, proposals and scores alike
    assert len(steps) < sum(gen.stats.forward_passes)  # fewer steps than the members' passes


def test_an_engine_s_failing_example_ends_alone_and_the_others_decode_as_alone(tiny):
    """`Ensemble.engine` (a server's loop): an example that raises (here its listener) has its exception as
    its result; the example beside it finishes with the text of its decode alone."""
    spec, cfg = resolve_method("single", {"member": 0})
    request = Request("The capital of Italy is", max_new_tokens=4)

    def broken(text):
        raise RuntimeError(f"listener failed on {text!r}")

    engine = tiny.engine(batch_size=2)
    engine.submit("broken", Job(request, spec, cfg, broken))
    engine.submit("fine", Job(request, spec, cfg))
    results = {}
    while engine.busy:
        results.update(engine.step())
    engine.close()
    assert isinstance(results["broken"], RuntimeError) and "listener failed" in str(results["broken"])
    assert results["fine"].text == tiny.decode(request, method="single", member=0).text


def test_a_batch_holds_each_context_once_and_a_fork_only_its_own_positions(tiny, shared_data):
    """adafuse/member/cache.py, on GSM8K's 4-shot prompts (about 800 tokens): the task's prefix is stored once per
    model, each example holds its context once (its forks read it in place), so the KV per example in flight
    stays within two contexts' worth, and the run's report says so (metrics.json `batching`)."""
    requests = task_requests("gsm8k", 8, shared_data, budget=12)
    for member in tiny.members:
        member.runner.prompts = PromptStore()  # no other task's prefix stored beside this one's
    stream = tiny.decode_stream(enumerate(requests), batch_size=4)
    decoded = dict(stream)
    report = stream.batching
    for member in tiny.members:
        how = report[member.name]
        one_context = how["kv_bytes_per_token"] * how["longest_context"]
        prompt = requests[0].prompt
        prefix = member.prefix_length(prompt, requests[0].prefix, member.prompt_ids(prompt))
        assert how["kv_prefix_bytes"] == prefix * how["kv_bytes_per_token"]  # the prefix, stored once, frozen
        assert 0 < how["kv_peak_bytes_per_example"] <= 2 * one_context, member.name
        assert how["kv_peak_bytes"] <= 4 * 2 * one_context
    for i in (0, 5):
        assert decoded[i].text == tiny.decode(requests[i]).text


def test_a_long_scoring_job_beside_decoding_examples_does_not_stall_them(tiny):
    """`Ensemble.engine` (the server's loop): log-likelihoods are a job the engine steps beside the completions
    (adafuse/methods/scoring.py), one pass at a time. While a long text is scored, the 8 completions go on
    producing words: none waits for the scoring to end, as one did when scoring ran between two steps."""
    spec, cfg = resolve_method("adafuse", {})
    heard: dict[int, list[float]] = {i: [] for i in range(8)}
    prompts = [f"Question: {q}?\nAnswer:" for q in ["2 + 3", "Who wrote Hamlet", "Where is Rome", "What is red"] * 2]
    engine = tiny.engine(batch_size=9)
    for i, prompt in enumerate(prompts):
        listener = lambda text, i=i: heard[i].append(time.perf_counter())  # noqa: E731 - one per example
        engine.submit(i, Job(Request(prompt, max_new_tokens=64), spec, cfg, listener))
    for _ in range(3):
        engine.step()  # the completions are under way before the scoring job arrives
    text = " ".join(["The quick brown fox jumps over the lazy dog while the cat sleeps in the warm sun."] * 2)
    words = text.split(" ")
    pairs = tuple((" ".join(words[:k]), " " + words[k]) for k in range(1, len(words)))
    engine.submit("scores", ScoreJob(pairs))
    started, finished = time.perf_counter(), {}
    while "scores" not in finished:
        finished.update(engine.step())
    ended = time.perf_counter()
    while engine.busy:
        finished.update(engine.step())
    engine.close()
    assert len(finished["scores"]) == len(pairs)
    assert [s.logprob for s in finished["scores"][:3]] == [s.logprob for s in tiny.loglikelihood(list(pairs[:3]))]
    # every completion that was still decoding heard new words all through the scoring: no gap as long as it
    gaps = []
    for times in heard.values():
        during = [started] + [t for t in times if started < t < ended] + [ended]
        if any(t > ended for t in times):  # still decoding when the scoring ended
            gaps.append(max(b - a for a, b in zip(during, during[1:])))
    assert gaps, "no completion was decoding while the text was scored"
    assert max(gaps) < (ended - started) / 3, (max(gaps), ended - started)


def test_a_device_without_room_for_another_example_holds_it_back_and_every_example_decodes(
    tiny, shared_data, monkeypatch
):
    """`Scheduler.admits`: an example joins the batch only where every device has room for its KV and one example's
    more beside those in flight; a full device holds it back, it is not an error, and every example's text is its
    decode alone. The scheduler knows what an example holds from the first it decoded."""
    nq = (shared_data / "adafuse_local_datasets/NaturalQuestions/dev/nq_prompt.txt").read_text() + "\n\n"
    questions = ["who wrote hamlet", "where is the eiffel tower", "when did ww2 end", "what is the capital of peru"]
    requests = [Request(nq + f"Question: {q}\nAnswer:", ("\n",), 8, prefix=nq) for q in questions]
    alone = [tiny.decode(r) for r in requests]
    scheduler, in_flight = Scheduler(), []
    dict(tiny.decode_stream(enumerate(requests[:1]), batch_size=1, scheduler=scheduler))  # what one example holds
    one_example = sum(figures.kv_peak_bytes_per_example for figures in scheduler.kv.values())
    runners = [m.runner for m in tiny.members]
    backend = tiny.members[0].runner.backend
    capacity = 4 * one_example  # room for two examples and one to spare (the stored prefix is not an example's)
    monkeypatch.setattr(type(backend), "free_memory", lambda self, device: capacity - sum(r.kv_held() for r in runners))
    update = scheduler.update

    def spy(requests_, examples):
        in_flight.append(examples)
        return update(requests_, examples)

    scheduler.update = spy
    decoded = dict(tiny.decode_stream(enumerate(requests), batch_size=4, scheduler=scheduler))
    assert 1 < max(in_flight) < 4
    assert [decoded[i].text for i in range(4)] == [g.text for g in alone]
