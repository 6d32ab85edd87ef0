"""The CUDA backend (adafuse/backend/cuda/) on this CPU: its code runs on CPU tensors, its kernels through Triton's
interpreter, on tiny random Llama- and Gemma-3-shaped models (grouped-query heads; Gemma's sliding window and its
own RMSNorm formula). What no GPU is needed to check:

- the choice: every op type probed on the device, verdicts kept in the store; exact passes batch-invariant;
- a read's logits and cache, alone and among other reads (forks of several rows, rows of unequal length, a
  prompt's tail, steps after caches of other lengths), bit for bit, with the kernels; close to the CPU backend's;
- a step's results come back on the host, and no pass reads a scalar back to the host while the step launches;
- the host's work per layer does not grow with a pass's reads (its tables made once per pass), and the caches hold
  what appending each read's positions layer by layer writes;
- with the stock kernels (batch_exact=false) one call per layer, and the run records its passes as batch-dependent.

As tests/unit/test_cuda_kernels.py, the checks run in a child process started with TRITON_INTERPRET=1 (the suite's
processes import triton compiled long before this file); `TRITON_INTERPRET=1 pytest -n 0 <this file>` runs them
directly. The bits of the compiled kernels on a GPU are the GPU check's to confirm (tools/gpu_check).
"""

import pytest
import torch
from torch.overrides import TorchFunctionMode
from transformers import DynamicCache, Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM

from adafuse.backend import MERGED, PROMPT, Execution, Pass, Read, backend_for
from adafuse.backend.probe_store import ProbeStore
from adafuse.member.cache import KVLedger, context_cache, fork_cache, view_cache
from tests.support.interpreter import compiled, interpreted, interpreter_runs, run_interpreted

pytestmark = pytest.mark.slow
CHILD_SECONDS = 900


@compiled
def test_the_cuda_backend_under_the_interpreter(require):
    """This file's tests, in a child process started with TRITON_INTERPRET=1; its report on failure."""
    require(interpreter_runs(), "Triton 3.7 or newer, whose interpreter runs (the `interpreter` extra)")
    report = run_interpreted(__file__, CHILD_SECONDS)
    assert "skipped" not in report, report


def llama():
    config = LlamaConfig(
        vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, attn_implementation="sdpa",
    )  # fmt: skip
    return LlamaForCausalLM(config).eval()


def gemma():
    config = Gemma3TextConfig(
        vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=256, sliding_window=6,
        layer_types=["sliding_attention", "full_attention"], attn_implementation="sdpa",
    )  # fmt: skip
    model = Gemma3ForCausalLM(config).eval()
    with torch.no_grad():  # Gemma's norms start at zero (times 1 + weight): give them some weight
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(0, 0.5)
    return model


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def models(request):
    """(the model prepared by the CUDA backend, the CPU backend's prepared copy of the same weights)."""
    torch.manual_seed(0)
    make = {"llama": llama, "gemma3": gemma}[request.param]
    from adafuse.backend.cuda.backend import CudaBackend

    cuda_side, cpu_side = make(), make()
    cpu_side.load_state_dict(cuda_side.state_dict())
    backend = CudaBackend("cpu", store=ProbeStore(None))
    return backend, backend.prepare(cuda_side), backend_for("cpu").prepare(cpu_side)


def run(backend, kind: str, model, reads: list[Read], exact: bool = True) -> list:
    (ran,) = backend.execute([Pass(kind, model, tuple(reads))], Execution(exact))
    return ran.results


def prompt_cache(backend, model, ids: list[int], stored: bool = False):
    """A prompt of `ids` read from nothing through `backend`: its context cache (`stored`: frozen, as a stored prompt
    prefix, which its readers read in place and never write)."""
    read = Read(DynamicCache(), torch.tensor([ids]), last_only=True)
    run(backend, PROMPT, model, [read])
    return context_cache(read.cache, KVLedger(), frozen=stored)


def over_prefix(backend, model, ids: list[int], prefix: int):
    """A prompt of `ids` whose first `prefix` ids are a stored prefix: its tail read after it, its context's first
    positions then read where the prefix lies."""
    context = view_cache(prompt_cache(backend, model, ids[:prefix], stored=True))
    run(backend, MERGED, model, [Read(context, torch.tensor([ids[prefix:]]), last_only=True)])
    return context


PROMPTS = [[3, 17, 42, 5], [9, 8, 7, 6, 5, 4, 3, 2, 1, 11, 12], [50, 51, 52, 53, 54, 55, 56, 57, 58], [1, 2]]


def mixed_reads(backend, model) -> tuple[list, list]:
    """Caches of different lengths and the reads after them: greedy steps, forks of 3 rows of unequal length, and a
    fork row that reads nothing; then a step and a fork of 2 rows after contexts over a stored prefix (a row's keys in
    three places: the prefix, the context's own, the fork's); (their caches, (ids, lengths))."""
    contexts = [prompt_cache(backend, model, ids) for ids in PROMPTS]
    over = [over_prefix(backend, model, PROMPTS[1], 6), over_prefix(backend, model, PROMPTS[2], 4)]
    caches = [contexts[0], contexts[1], fork_cache(contexts[2], 3, 9), fork_cache(contexts[3], 3, 2)]
    caches += [over[0], fork_cache(over[1], 2, 9)]
    inputs = [
        (torch.tensor([[7]]), None),
        (torch.tensor([[8, 9]]), None),
        (torch.tensor([[5, 6, 7], [8, 9, 9], [4, 4, 4]]), [3, 1, 2]),
        (torch.tensor([[10, 11], [12, 12], [13, 13]]), [2, 1, 0]),
        (torch.tensor([[14]]), None),
        (torch.tensor([[15, 16], [17, 17]]), [2, 1]),
    ]
    return caches, inputs


@interpreted
def test_the_choice_is_made_on_the_device_and_kept_in_the_store(models, tmp_path):
    backend, model, _ = models
    choice = backend.choices[model.model]
    assert choice.invariant, choice.failing
    assert set(choice.verdicts) == {"linear", "rms_norm", "attention"}
    assert all(v["kernel"] for v in choice.verdicts.values())  # the kernels keep the bits, here as on any device
    assert choice.exact.attention == "kernel" and choice.stock.attention == "per_request"  # no torch varlen on a CPU
    described = backend.describe(model, exact=True)
    assert described["batch_invariant"] and described["ops"]["attention"] == "kernel"
    assert not backend.describe(model, exact=False)["batch_invariant"]


@interpreted
def test_a_read_has_the_bits_of_its_pass_alone_among_any_other_reads(models):
    backend, model, cpu = models
    caches, inputs = mixed_reads(backend, model)
    alone = [run(backend, MERGED, model, [Read(view_cache(c), x, n)])[0] for c, (x, n) in zip(caches, inputs)]
    for order in ([0, 1, 2, 3, 4, 5], [5, 3, 2, 1, 0, 4], [2, 0], [4, 5]):
        merged_caches = [view_cache(caches[j]) for j in order]
        reads = [Read(c, *inputs[j]) for c, j in zip(merged_caches, order)]
        merged = run(backend, MERGED, model, reads)
        for j, logits, cache in zip(order, merged, merged_caches):
            assert torch.equal(logits, alone[j]), (j, order)
            assert cache.get_seq_length() == caches[j].get_seq_length() + inputs[j][0].shape[1]
    # the kernels compute what the CPU backend computes, up to rounding
    cpu_caches, _ = mixed_reads(backend_for("cpu"), cpu)
    cpu_alone = [run(backend_for("cpu"), MERGED, cpu, [Read(c, x, n)])[0] for c, (x, n) in zip(cpu_caches, inputs)]
    for mine, theirs in zip(alone, cpu_alone):
        assert mine.shape == theirs.shape and torch.allclose(mine, theirs, atol=1e-4, rtol=1e-4)


@interpreted
def test_a_prompt_tail_beside_steps_has_the_bits_of_its_read_alone(models):
    backend, model, _ = models
    stored = prompt_cache(backend, model, PROMPTS[1][:6])
    tail = torch.tensor([PROMPTS[1][6:]])
    steps, _ = mixed_reads(backend, model)
    alone = run(backend, MERGED, model, [Read(view_cache(stored), tail, last_only=True)])[0]
    merged = run(
        backend, MERGED, model, [Read(view_cache(stored), tail, last_only=True), Read(steps[0], torch.tensor([[4]]))]
    )
    assert merged[0].shape == alone.shape == (1, 1, 96) and torch.equal(merged[0], alone)


class HostReads(TorchFunctionMode):
    """Every call that brings a tensor's value to the host (a sync on a GPU), made inside the block."""

    READS = {"item", "tolist", "__bool__", "__int__", "__float__", "numpy"}

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in self.READS or func is torch.equal:
            self.calls.append(func.__name__)
        return func(*args, **(kwargs or {}))


@interpreted
def test_a_step_reads_no_value_back_while_it_launches_and_returns_its_results_on_the_host(models):
    backend, model, _ = models
    caches, inputs = mixed_reads(backend, model)
    reads = [Read(c, x, n, logprobs=True) for c, (x, n) in zip(caches, inputs)]
    with HostReads() as reads_back:
        (ran,) = backend.execute([Pass(MERGED, model, tuple(reads))], Execution())
    assert reads_back.calls == []
    assert all(r.device.type == "cpu" for r in ran.results) and ran.seconds > 0


def launches(monkeypatch, names: list, *ops: str) -> None:
    """Record in `names` each launch of the kernels `ops` (adafuse/backend/cuda/kernels.py's `_linear`, ...): an
    eager call goes to its launcher, past the dispatcher."""
    from adafuse.backend.cuda import kernels

    for op in ops:
        launch = getattr(kernels, f"_{op}")

        def recorded(*args, op=op, launch=launch):
            names.append(op)
            return launch(*args)

        monkeypatch.setattr(kernels, f"_{op}", recorded)


@interpreted
@pytest.mark.parametrize("exact", [True, False])
def test_a_pass_makes_one_call_per_linear_layer_with_either_kernel(models, monkeypatch, exact):
    backend, model, _ = models
    caches, inputs = mixed_reads(backend, model)

    class Multiplies(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.stock = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.stock += func is torch.nn.functional.linear
            return func(*args, **(kwargs or {}))

    kernel = []
    launches(monkeypatch, kernel, "linear")
    with Multiplies() as count:
        run(backend, MERGED, model, [Read(c, x, n) for c, (x, n) in zip(caches, inputs)], exact=exact)
    linear_layers = sum(isinstance(m, torch.nn.Linear) for m in model.model.modules())
    # exact, the kernel where the probes found that the stock one moves a row's bits (on this host's BLAS)
    by_kernel = backend.choices[model.model].ops(exact).linear
    assert not (by_kernel and not exact)
    assert (len(kernel), count.stock) == ((linear_layers, 0) if by_kernel else (0, linear_layers))


def stock_attention_per_request(q, k, v, cu_q, cu_k, scale, window, max_q, max_k):
    """A stock one-call attention in `packed_attention`'s shape that runs here: SDPA once per request, causal."""
    out = []
    for b in range(len(cu_q) - 1):
        qs, ks, vs = q[cu_q[b] : cu_q[b + 1]], k[cu_k[b] : cu_k[b + 1]], v[cu_k[b] : cu_k[b + 1]]
        groups = qs.shape[1] // ks.shape[1]
        ks, vs = ks.repeat_interleave(groups, 1), vs.repeat_interleave(groups, 1)
        seen = torch.arange(len(ks))[None, :] <= torch.arange(len(ks) - len(qs), len(ks))[:, None]
        if window is not None:
            seen &= torch.arange(len(ks))[None, :] > torch.arange(len(ks) - len(qs), len(ks))[:, None] - window
        o = torch.nn.functional.scaled_dot_product_attention(
            qs.transpose(0, 1), ks.transpose(0, 1), vs.transpose(0, 1), seen, scale=scale
        )
        out.append(o.transpose(0, 1))
    return torch.cat(out)


def stock_attention_that_raises(*args):
    raise RuntimeError("FlashAttention only supports head dimensions up to 256")


@interpreted
@pytest.mark.parametrize("stock, used", [(stock_attention_per_request, "stock"), (stock_attention_that_raises, None)])
def test_a_stock_one_call_attention_is_used_only_where_its_probe_ran(stock, used):
    """Torch's one-call attention serves the inexact passes where its probe ran; where it raised, the model's own
    attention runs per request, the reason recorded, and a pass runs."""
    from adafuse.backend.cuda.backend import CudaBackend

    torch.manual_seed(0)
    backend = CudaBackend("cpu", store=ProbeStore(None), stock_attention=stock)
    model = backend.prepare(llama())
    described = backend.describe(model, exact=False)
    assert described["ops"]["attention"] == (used or "per_request")
    errors = [e for e in described["probe_errors"] if (e["op"], e["probe"]) == ("attention", "stock")]
    assert bool(errors) == (used is None)
    assert used or "head dimensions up to 256" in errors[0]["error"]
    caches, inputs = mixed_reads(backend, model)
    logits = run(backend, MERGED, model, [Read(c, x, n) for c, (x, n) in zip(caches, inputs)], exact=False)
    assert len(logits) == len(caches) and all(torch.isfinite(t).all() for t in logits)


@interpreted
def test_a_probe_that_raises_gives_no_verdict_says_why_and_is_probed_again(tmp_path, monkeypatch):
    """An exception is not a verdict: the op, the probe and the reason are in the run's record, nothing is stored,
    and the next process over the same store probes again (and stores what it finds)."""
    from adafuse.backend.cuda import kernels
    from adafuse.backend.cuda.backend import CudaBackend

    def cannot_build(*args, **kwargs):
        raise RuntimeError("Failed to find C compiler. Please specify via CC environment variable.")

    store = tmp_path / "probes.jsonl"
    with monkeypatch.context() as patched:
        patched.setattr(kernels, "linear", cannot_build)
        torch.manual_seed(0)
        first = CudaBackend("cpu", store=ProbeStore(store))
        described = first.describe(first.prepare(llama()), exact=True)
    errors = [e for e in described["probe_errors"] if e["op"] == "linear"]
    assert errors and all(e["probe"] == "kernel" for e in errors)
    assert all(e["error"].startswith("RuntimeError: Failed to find C compiler") for e in errors)
    assert described["verdicts"]["linear"]["kernel"] is None and described["ops"]["linear"] == "stock"
    assert not any('"linear"' in line and "'kernel'" in line for line in store.read_text().splitlines())
    torch.manual_seed(0)
    again = CudaBackend("cpu", store=ProbeStore(store))
    described = again.describe(again.prepare(llama()), exact=True)
    assert described["probe_errors"] == [] and described["verdicts"]["linear"]["kernel"] is True
    assert any('"linear"' in line and "'kernel'" in line for line in store.read_text().splitlines())


@interpreted
def test_a_pass_reads_every_row_where_it_lies_and_copies_no_kv(models):
    """Our kernel's attention reads each row's keys and values in the buffers they lie in (a stored prompt prefix's,
    a context's, a fork's own): a pass writes its new positions and copies none; a context over a stored prefix
    still reads it there. Torch's one call, where no exactness is asked, takes them
    packed: there each layer copies every row's (the control)."""
    from adafuse.backend.cuda.backend import CudaBackend
    from tools.bench_host import KVCopies

    backend, model, _ = models
    caches, inputs = mixed_reads(backend, model)
    run(backend, MERGED, model, [Read(c, x, n) for c, (x, n) in zip(caches, inputs)])  # the contexts get room
    steps = [torch.full((x.shape[0], 1), 3) for x, _ in inputs]
    lengths = [c.get_seq_length() for c in caches]
    with KVCopies().watch(*caches) as counted:
        run(backend, MERGED, model, [Read(c, x) for c, x in zip(caches, steps)])
    assert counted.copied == 0 and [c.get_seq_length() for c in caches] == [n + 1 for n in lengths]
    over = [caches[4].layers[0].buffer, caches[5].layers[0].base]  # contexts over a stored prefix, read there
    assert all(buffer.under is not None and not buffer.under_copied for buffer in over)
    stock = CudaBackend("cpu", store=ProbeStore(None), stock_attention=stock_attention_per_request)
    torch.manual_seed(0)
    prepared = stock.prepare(llama())
    caches, inputs = mixed_reads(stock, prepared)
    run(stock, MERGED, prepared, [Read(c, x, n) for c, (x, n) in zip(caches, inputs)], exact=False)
    with KVCopies().watch(*caches) as counted:
        run(stock, MERGED, prepared, [Read(c, x) for c, x in zip(caches, steps)], exact=False)
    assert counted.copied > 0


def appended_layer_by_layer(module, query, split, kwargs):
    """The slow, obvious way to the same attention: in every layer each read's cache appends its new positions
    (torch's copies, `append`) and names its rows' runs, then our kernel reads them."""
    from adafuse.backend.cuda import kernels
    from adafuse.backend.cuda.attention import sequences

    cu_q, _, max_q, _ = sequences(split.spans, query.device)
    kv_heads, table, empty = split.new[2].shape[1], [], (0,) * kernels.RUN_FIELDS
    for s, (own, new_keys, new_values) in zip(split.spans, split.per_request(), strict=True):
        own.append(new_keys, new_values)
        for row, live in enumerate(s.lengths):
            runs = runs_of(own, row, s.length + live)
            table.append([*runs, *[empty] * (kernels.RUNS_PER - len(runs))])
    split.new = None
    scale = kwargs.get("scaling") or module.scaling
    runs = torch.tensor(table, dtype=torch.int64)
    out = kernels.attention_in_place(
        query[0].transpose(0, 1), runs, cu_q, kv_heads, scale, True, kwargs.get("sliding_window"), max_q
    )
    return out.unsqueeze(0), None


def runs_of(layer, row: int, length: int) -> list[tuple]:
    """Row `row`'s first `length` positions of a cache layer as the kernel's runs, worked out for this layer alone:
    per run, the addresses of its first key and value, its count, and its strides between positions and heads."""
    sources, found = layer.sources(), []
    for source, buffer_row, start, count in layer.run_plan(row, length):
        keys, values, rows, positions, heads, size = sources[source].layout()
        step = (buffer_row * rows + start * positions) * size
        found.append((keys + step, values + step, count, positions, heads))
    return found


def held(caches) -> list:
    """Every layer's keys and values of every cache, as its reads see them (a fork's rows whole)."""
    return [[(layer.keys.clone(), layer.values.clone()) for layer in cache.layers] for cache in caches]


@interpreted
def test_the_tables_made_once_a_pass_give_what_appending_layer_by_layer_gives(models, monkeypatch):
    backend, model, _ = models
    runs = {}
    for way in ("tables", "layer by layer"):
        if way == "layer by layer":
            monkeypatch.setitem(backend._one_calls, "kernel", appended_layer_by_layer)
        caches, inputs = mixed_reads(backend, model)
        first = run(backend, MERGED, model, [Read(c, x, n) for c, (x, n) in zip(caches, inputs)])
        after_first = held(caches)
        steps = [torch.full((x.shape[0], 1), 3) for x, _ in inputs]  # a fork of one row at its context's end rides it
        second = run(backend, MERGED, model, [Read(c, x) for c, x in zip(caches, steps)])
        runs[way] = (first, after_first, second, held(caches))
    mine, theirs = tensors(runs["tables"]), tensors(runs["layer by layer"])  # logits, then every cache's K/V
    assert len(mine) == len(theirs) and all(torch.equal(a, b) for a, b in zip(mine, theirs))


def tensors(nested) -> list[torch.Tensor]:
    if isinstance(nested, torch.Tensor):
        return [nested]
    return [t for item in nested for t in tensors(item)]


@interpreted
def test_a_layer_makes_the_same_calls_whatever_the_reads(models, monkeypatch):
    """The host's work in a layer does not grow with the pass's reads: the ops dispatched from one layer's write to
    the next are as many for one read as for four (forks of three rows among them), and each layer writes once."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    backend, model, _ = models
    layers = len(model.model.model.layers)
    per_layer = []
    for count in (1, 6):
        caches, inputs = mixed_reads(backend, model)
        with Ops() as ops:
            launches(monkeypatch, ops.names, "write_in_place", "attention_in_place")
            run(backend, MERGED, model, [Read(c, x, n) for c, (x, n) in list(zip(caches, inputs))[:count]])
        writes = [i for i, name in enumerate(ops.names) if name == "write_in_place"]
        assert len(writes) == layers
        per_layer.append([ops.names[a:b] for a, b in zip(writes, writes[1:])])
    assert per_layer[0] == per_layer[1]
