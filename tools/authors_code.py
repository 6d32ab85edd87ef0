"""Run the AdaFuse authors' own decoder scripts on this machine and record what they do.

    python scripts/authors_code.py --authors-code /path/to/AdaFuse --script two --task nq \
        --indices 0-11 --beam-size 1 --span-length 1 --out tests/fixtures/authors_code/nq_two_pathA.json

`--authors-code` is a checkout of github.com/CCM0111/AdaFuse. Their script file is imported as it is,
never edited. What it needs to run here is done from outside, at run time:

* the `utils.ans_process` / `utils.collate_fun` / `utils.extract_response` modules their scripts
  star-import (absent from their repository) and the `datasets.load_dataset("json", ...)` call are
  served by small modules written here (`_shim_modules`), present in `sys.modules` only while their
  file is imported;
* `AutoModelForCausalLM` / `AutoTokenizer` in their module's namespace are replaced by loaders that
  drop `use_auth_token` (transformers 5 rejects it), load float32 instead of float16, ignore
  `device_map={"": gpu_id}` (everything stays on the CPU) and keep the loaded objects for the next
  example, so that model loading is not part of an example's time;
* `torch.cuda.set_device` is a no-op while their worker runs (CPU-only torch has no CUDA);
* their per-GPU worker `ensemble_decoding_worker(gpu_id, start, end, args, prompt)` is called in this
  process, once per example (start = index, end = index + 1), with an `argparse.Namespace` holding
  their own CLI defaults (read from their `main()` with `ast`) plus the overrides given here.
  `main()` itself is never called (it needs CUDA devices and `multiprocessing`).

`torch.amp.autocast(device_type="cuda")` is left alone: on CPU torch it warns and does nothing.

Recording (optional; `record=False` for timing) wraps, without changing, their module-level functions
`generate_candidate_spans`, `compute_top1_margin`, `extract_word_tokens_from_generated`,
`compute_span_perplexity`, `extract_boxed_answer` and `clean_text_before_question`, each model's
`generate` and `_prepare_generation_config`, and shadows the builtins `min` and `print` in their
module's namespace (both still call the builtin). The wrappers read the calling frame's locals (round
index `i`, candidate text `span_txt`, the pool `cands`, and at the end of an example the final
`current_prefix` and `answer_text`), so the record holds what their code computed, not a recomputation.

Python entry point (also for benchmarks that time their code against ours):

    runner = AuthorsCode("/path/to/AdaFuse", script="two", model_paths=[smol_dir, gemma_dir])
    for ex in runner.run(test_set, prompts, [0, 1, 2], beam_size=3, span_length=1):
        ex["pred"], ex["wall_s"], ex["rounds"]
"""

from __future__ import annotations

import argparse
import ast
import builtins
import contextlib
import datetime
import hashlib
import importlib.util
import io
import json
import math
import os
import platform
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any, Iterable, Iterator

ROOT = Path(__file__).resolve().parent.parent

SCRIPTS = {
    "two": "AdaFuse_two_models.py",
    "three": "AdaFuse_three_models.py",
    "four": "AdaFuse_four_models.py",
}
N_MODELS = {"two": 2, "three": 3, "four": 4}

# The bundled pair, as converted by adafuse.loading (directory name = sha256 of the GGUF file).
SMOLLM2_SHA = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
GEMMA3_SHA = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
MODEL_NAMES = {SMOLLM2_SHA: "SmolLM2-135M-Instruct", GEMMA3_SHA: "Gemma-3-270M"}

# Their files for each task, relative to adafuse_local_datasets/ (the authors' local_datasets/).
TASKS = {
    "nq": ("NaturalQuestions/test/natural-questions.jsonl", "NaturalQuestions/dev/nq_prompt.txt"),
    "gsm8k": ("GSM/test.cleand.jsonl", "GSM/gsm_prompt.txt"),
    "flores_de_en": ("Flores/flores_deu2eng_qa.devtest.jsonl", "Flores/flores_deu2en_prompt.txt"),
    "flores_en_de": ("Flores/flores_eng2deu_qa.devtest.jsonl", "Flores/flores_en2deu_prompt.txt"),
    "triviaqa": ("TriviaQA/wikipedia-test-6000.jsonl", "TriviaQA/prompt.txt"),
    "squad": ("SQUAD/squad_2500.jsonl", "SQUAD/squad_prompt.txt"),
}


def default_cache_dir() -> Path:
    return Path(os.environ.get("ADAFUSE_CACHE") or "~/.cache/adafuse").expanduser()


def default_model_paths(script: str) -> list[str]:
    smol = str(default_cache_dir() / "gguf" / SMOLLM2_SHA)
    gemma = str(default_cache_dir() / "gguf" / GEMMA3_SHA)
    return [smol, gemma, smol, gemma][: N_MODELS[script]]


def default_data_dir() -> Path:
    env = os.environ.get("ADAFUSE_DATA_DIR")
    if env:
        return Path(env)
    for base in (ROOT.parent, ROOT.parent.parent):
        if (base / "shared" / "data").is_dir():
            return base / "shared" / "data"
    return ROOT.parent / "shared" / "data"


# --------------------------------------------------------------------------------------------
# Shims for what their repository lacks. Written here from what their code calls; the worker path
# calls only `load_dataset("json", data_files=PATH, split="train")` and indexes the result.


def _read_jsonl(path: str) -> list[dict]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):  # split on "\n" only: some records hold U+0085 and the like
            if line.strip():
                rows.append(json.loads(line))
    return rows


def _shim_modules() -> dict[str, types.ModuleType]:
    datasets = types.ModuleType("datasets")
    datasets.__doc__ = "Stand-in for the one `datasets` call the AdaFuse scripts make (written for this driver)."
    cache: dict[str, list[dict]] = {}

    def load_dataset(kind, data_files=None, split=None, **kwargs):
        if kind != "json" or not isinstance(data_files, (str, os.PathLike)) or split not in (None, "train"):
            raise NotImplementedError(f"shim load_dataset supports only ('json', data_files=PATH, split='train'), got {kind!r}, {data_files!r}, {split!r}")
        key = str(data_files)
        if key not in cache:
            cache[key] = _read_jsonl(key)
        return cache[key]

    datasets.load_dataset = load_dataset

    def _post_hoc(name):
        def stub(*args, **kwargs):
            raise NotImplementedError(f"{name}: the post-hoc scorer of the authors' missing utils module; only their main() calls it, and this driver never does")
        stub.__name__ = name
        return stub

    utils = types.ModuleType("utils")
    utils.__path__ = []  # a package, so that `utils.ans_process` imports resolve to the entries below
    ans = types.ModuleType("utils.ans_process")
    for name in ("gsm_parse_pred_ans", "qa_parse_pred_ans", "arc_parse_pred_ans"):
        setattr(ans, name, _post_hoc(name))
    ans.__all__ = ["gsm_parse_pred_ans", "qa_parse_pred_ans", "arc_parse_pred_ans"]
    collate = types.ModuleType("utils.collate_fun")  # the worker uses the scripts' own collate functions
    collate.__all__ = []
    extract = types.ModuleType("utils.extract_response")  # nothing from it is used on the worker path
    extract.__all__ = []
    utils.ans_process, utils.collate_fun, utils.extract_response = ans, collate, extract
    return {"datasets": datasets, "utils": utils, "utils.ans_process": ans, "utils.collate_fun": collate, "utils.extract_response": extract}


def load_authors_module(script_path: Path, name: str | None = None) -> types.ModuleType:
    """Import their script file unmodified, with the shims in sys.modules only while it imports."""
    shims = _shim_modules()
    saved = {k: sys.modules.get(k) for k in shims}
    sys.modules.update(shims)
    try:
        spec = importlib.util.spec_from_file_location(name or f"authors_{script_path.stem}", script_path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    return mod


def argparse_defaults(script_path: Path) -> dict[str, Any]:
    """Their CLI defaults, read from the add_argument calls in their main() (the file is not run)."""
    tree = ast.parse(script_path.read_text(encoding="utf-8"))
    main = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main")
    out: dict[str, Any] = {}
    for node in ast.walk(main):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            flag = ast.literal_eval(node.args[0])
            dest = flag.lstrip("-").replace("-", "_")
            kw = {k.arg: k.value for k in node.keywords}
            out[dest] = ast.literal_eval(kw["default"]) if "default" in kw else None
    return out


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _git(cwd: Path, *args: str) -> str | None:
    try:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def _is_nan(x) -> bool:
    return isinstance(x, float) and math.isnan(x)


def _ids(x) -> list[int] | None:
    if x is None:
        return None
    if hasattr(x, "tolist"):
        x = x.tolist()
    return [int(t) for t in x]


# --------------------------------------------------------------------------------------------


class _Example:
    """What the wrappers collect while their worker decodes one example."""

    def __init__(self, n_models: int):
        self.n = n_models
        self.rounds: dict[int, dict] = {}
        self.prefix_before: dict[int, str] = {}
        self.current: dict | None = None  # the proposal being generated
        self.text_calls: list[dict] = []  # extract_boxed_answer / clean_text_before_question from the worker
        self.final: dict | None = None
        self.counts = {"generate": [0] * n_models, "ppl": [0] * n_models, "tokens_in": [0] * n_models}

    def round(self, i: int) -> dict:
        if i not in self.rounds:
            self.rounds[i] = {"round": i + 1, "proposals": [], "pool": [], "fused": None, "selected": None, "selected_avg": None}
        return self.rounds[i]


class AuthorsCode:
    """Their script module, patched from outside to run on this CPU, with optional recording."""

    def __init__(self, authors_code: str | Path, script: str = "two", model_paths: list[str] | None = None,
                 threads: int | None = 1, workdir: str | Path | None = None, log: io.TextIOBase | None = None):
        import torch

        if script not in SCRIPTS:
            raise ValueError(f"script must be one of {sorted(SCRIPTS)}, got {script!r}")
        self.authors_code = Path(authors_code).resolve()
        self.script = script
        self.script_path = self.authors_code / SCRIPTS[script]
        if not self.script_path.is_file():
            raise FileNotFoundError(f"{self.script_path} not found: --authors-code must be a checkout of CCM0111/AdaFuse")
        self.n_models = N_MODELS[script]
        self.model_paths = [str(Path(p).expanduser()) for p in (model_paths or default_model_paths(script))]
        if len(self.model_paths) != self.n_models:
            raise ValueError(f"{SCRIPTS[script]} takes {self.n_models} models, got {len(self.model_paths)}")
        if threads:
            torch.set_num_threads(threads)
        self.threads = torch.get_num_threads()
        self.workdir = Path(workdir) if workdir else Path.cwd() / "authors_code_work"
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log = log or open(self.workdir / "authors_stdout.log", "a", encoding="utf-8")
        self.mod = load_authors_module(self.script_path)
        self.defaults = argparse_defaults(self.script_path)
        self.rec: _Example | None = None
        self.load_seconds = 0.0
        self.load_cpu = 0.0
        self._models: dict[int, Any] = {}  # slot -> model (slot = order of from_pretrained calls in one worker call)
        self._tokenizers: dict[int, Any] = {}
        self._model_slot: dict[int, int] = {}  # id(model) -> slot
        self._load_calls = {"model": 0, "tokenizer": 0}
        self._site: tuple[int, int] | None = None
        self.generation_configs: dict[str, dict] = {}
        self.load_kwargs: list[dict] = []
        self._patch()

    # ---- patches that make their code run here ------------------------------------------------

    def _patch(self) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        runner = self
        mod = self.mod

        class ModelLoader:
            """Stands in for AutoModelForCausalLM in their module: CPU, float32, no use_auth_token."""

            @staticmethod
            def from_pretrained(path, *args, **kwargs):
                slot = runner._load_calls["model"]
                runner._load_calls["model"] += 1
                seen = {k: repr(v) for k, v in kwargs.items()}
                kwargs.pop("use_auth_token", None)  # transformers 5: TypeError in the model's __init__
                kwargs.pop("device_map", None)  # {"": gpu_id}; the CPU is the default device
                dtype = kwargs.pop("torch_dtype", None) or kwargs.pop("dtype", None)
                if dtype in (torch.float16, torch.bfloat16, None):
                    dtype = torch.float32
                if slot in runner._models and runner._models[slot][0] == str(path):
                    return runner._models[slot][1]
                t0, c0 = time.perf_counter(), time.process_time()
                model = AutoModelForCausalLM.from_pretrained(path, *args, dtype=dtype, **kwargs)
                runner.load_seconds += time.perf_counter() - t0
                runner.load_cpu += time.process_time() - c0
                runner.load_kwargs.append({"slot": slot, "their_kwargs": seen, "used": {"dtype": str(dtype), **{k: repr(v) for k, v in kwargs.items()}}})
                runner._models[slot] = (str(path), model)
                runner._model_slot[id(model)] = slot
                runner._wrap_model(model, slot)
                return model

        class TokenizerLoader:
            @staticmethod
            def from_pretrained(path, *args, **kwargs):
                slot = runner._load_calls["tokenizer"]
                runner._load_calls["tokenizer"] += 1
                if slot in runner._tokenizers and runner._tokenizers[slot][0] == str(path):
                    return runner._tokenizers[slot][1]
                t0, c0 = time.perf_counter(), time.process_time()
                tok = AutoTokenizer.from_pretrained(path, *args, **kwargs)
                runner.load_seconds += time.perf_counter() - t0
                runner.load_cpu += time.process_time() - c0
                runner._tokenizers[slot] = (str(path), tok)
                return tok

        mod.AutoModelForCausalLM = ModelLoader
        mod.AutoTokenizer = TokenizerLoader

        # recording wrappers (pass-through when self.rec is None)
        for name in ("generate_candidate_spans", "compute_top1_margin", "extract_word_tokens_from_generated",
                     "compute_span_perplexity", "extract_boxed_answer", "clean_text_before_question"):
            setattr(mod, name, getattr(self, f"_wrap_{name}")(getattr(mod, name)))
        mod.min = self._min
        mod.print = self._print

    @contextlib.contextmanager
    def _cpu_worker(self):
        import torch

        saved_set_device = torch.cuda.set_device
        saved_cwd = os.getcwd()
        torch.cuda.set_device = lambda *a, **k: None
        os.chdir(self.workdir)  # their worker writes span_trace_log_gpu0.txt and {output_file}_gpu0.json here
        try:
            yield
        finally:
            torch.cuda.set_device = saved_set_device
            os.chdir(saved_cwd)

    # ---- recording wrappers -------------------------------------------------------------------

    def _wrap_model(self, model, slot: int) -> None:
        import torch

        runner = self
        orig_generate = model.generate
        orig_prepare = model._prepare_generation_config

        def generate(*args, **kwargs):
            rec = runner.rec
            if rec is None:
                return orig_generate(*args, **kwargs)
            line = sys._getframe(1).f_lineno
            input_ids = kwargs.get("input_ids", args[0] if args else None)
            in_len = int(input_ids.shape[1])
            runner._site = (slot, line)
            out = orig_generate(*args, **kwargs)
            runner._site = None
            cfg = kwargs.get("generation_config")
            call = {"line": line, "in": in_len, "max_new": getattr(cfg, "max_new_tokens", None),
                    "beams": getattr(cfg, "num_beams", None), "new": out.sequences[:, in_len:].tolist()}
            scores = getattr(out, "scores", None)
            if scores:
                probs = torch.softmax(scores[0][0:1].float(), dim=-1)
                p, ix = torch.topk(probs, k=5, dim=-1)
                call["top5"] = [[int(a), float(b)] for a, b in zip(ix[0].tolist(), p[0].tolist())]
            seq_scores = getattr(out, "sequences_scores", None)
            if seq_scores is not None:
                call["seq_scores"] = [float(x) for x in seq_scores.tolist()]
            rec.counts["generate"][slot] += 1
            rec.counts["tokens_in"][slot] += in_len
            if rec.current is not None:
                rec.current["calls"].append(call)
            return out

        def prepare(*args, **kwargs):
            cfg, model_kwargs = orig_prepare(*args, **kwargs)
            site = runner._site
            if site is not None:
                key = f"model{site[0] + 1}@line{site[1]}"
                if key not in runner.generation_configs:
                    runner.generation_configs[key] = {
                        k: getattr(cfg, k, None) for k in (
                            "max_new_tokens", "max_length", "min_length", "num_beams", "num_return_sequences", "do_sample",
                            "temperature", "top_k", "top_p", "repetition_penalty", "length_penalty", "early_stopping",
                            "bos_token_id", "eos_token_id", "pad_token_id", "output_scores", "output_logits",
                            "return_dict_in_generate", "use_cache", "cache_implementation")}
            return cfg, model_kwargs

        model.generate = generate
        model._prepare_generation_config = prepare

    def _wrap_generate_candidate_spans(self, orig):
        runner = self

        def generate_candidate_spans(model, tokenizer, prompt, *args, **kwargs):
            rec = runner.rec
            if rec is None:
                return orig(model, tokenizer, prompt, *args, **kwargs)
            i = sys._getframe(1).f_locals.get("i")
            slot = runner._model_slot[id(model)]
            rnd = rec.round(i)
            if i not in rec.prefix_before:
                rec.prefix_before[i] = prompt
            elif rec.prefix_before[i] != prompt:
                raise AssertionError(f"round {i + 1}: model {slot + 1} was given a different prefix than model 1")
            prop = {"model": slot, "calls": [], "margins": [], "trims": []}
            rec.current = prop
            spans = orig(model, tokenizer, prompt, *args, **kwargs)
            rec.current = None
            prop["spans"] = [{"text": s, "ids": _ids(t)} for s, t in spans]
            rnd["proposals"].append(prop)
            return spans

        return generate_candidate_spans

    def _wrap_compute_top1_margin(self, orig):
        runner = self

        def compute_top1_margin(logits):
            m = orig(logits)
            rec = runner.rec
            if rec is not None and rec.current is not None:
                rec.current["margins"].append({"line": sys._getframe(1).f_lineno, "margin": m})
            return m

        return compute_top1_margin

    def _wrap_extract_word_tokens_from_generated(self, orig):
        runner = self

        def extract_word_tokens_from_generated(tokenizer, generated_tokens, target_word):
            out = orig(tokenizer, generated_tokens, target_word)
            rec = runner.rec
            if rec is not None and rec.current is not None:
                rec.current["trims"].append({"line": sys._getframe(1).f_lineno, "target": target_word,
                                             "n_in": len(generated_tokens), "n_out": len(out)})
            return out

        return extract_word_tokens_from_generated

    def _wrap_compute_span_perplexity(self, orig):
        runner = self

        def compute_span_perplexity(model, tokenizer, prefix, span, *args, **kwargs):
            score = orig(model, tokenizer, prefix, span, *args, **kwargs)
            rec = runner.rec
            if rec is None:
                return score
            caller = sys._getframe(1).f_locals
            i, text, cands = caller.get("i"), caller.get("span_txt"), caller.get("cands")
            slot = runner._model_slot[id(model)]
            rnd = rec.round(i)
            if not rnd["pool"]:
                rnd["pool"] = [{"text": s, "own_ids": [_ids(v) for v in vals], "scored_ids": [None] * rec.n,
                                "scores": [None] * rec.n} for s, vals in cands.items()]
                rnd["_index"] = {e["text"]: k for k, e in enumerate(rnd["pool"])}
            if prefix != rec.prefix_before.get(i):
                raise AssertionError(f"round {i + 1}: scoring prefix differs from the proposal prefix")
            entry = rnd["pool"][rnd["_index"][text]]
            entry["scored_ids"][slot] = _ids(span)
            entry["scores"][slot] = None if _is_nan(score) else float(score)
            rec.counts["ppl"][slot] += 1
            rec.counts["tokens_in"][slot] += len(tokenizer(prefix)["input_ids"]) + len(span)
            return score

        return compute_span_perplexity

    def _wrap_text_fn(self, orig, name):
        runner = self

        def wrapped(text):
            out = orig(text)
            rec = runner.rec
            frame = sys._getframe(1)
            if rec is not None and frame.f_code.co_name == "ensemble_decoding_worker":
                rec.text_calls.append({"fn": name, "line": frame.f_lineno, "round": frame.f_locals.get("i"),
                                       "arg": text, "out": out})
            return out

        wrapped.__name__ = name
        return wrapped

    def _wrap_extract_boxed_answer(self, orig):
        return self._wrap_text_fn(orig, "extract_boxed_answer")

    def _wrap_clean_text_before_question(self, orig):
        return self._wrap_text_fn(orig, "clean_text_before_question")

    def _min(self, *args, **kwargs):
        out = builtins.min(*args, **kwargs)
        rec = self.rec
        frame = sys._getframe(1)
        if rec is not None and frame.f_code.co_name == "ensemble_decoding_worker" and len(args) == 1:
            i = frame.f_locals.get("i")
            rnd = rec.round(i)
            if rnd["selected"] is None:
                rnd["fused"] = [[s, float(a)] for s, a in args[0]]
                rnd["selected"], rnd["selected_avg"] = out[0], float(out[1])
            elif rnd["selected"] != out[0]:
                raise AssertionError(f"round {i + 1}: two selections differ")
        return out

    def _print(self, *args, **kwargs):
        rec = self.rec
        frame = sys._getframe(1)
        if (rec is not None and frame.f_code.co_name == "ensemble_decoding_worker" and args
                and isinstance(args[0], str) and "| Pred:" in args[0]):
            loc = frame.f_locals
            rec.final = {"prefix": loc["current_prefix"], "pred": loc["answer_text"], "i": loc.get("i"),
                         "span_trace": json.loads(json.dumps(loc.get("span_trace", []))), "prompt": loc["prompt"],
                         "orig_question": loc.get("orig_question")}
        kwargs.setdefault("file", self.log)
        builtins.print(*args, **kwargs)

    # ---- running ------------------------------------------------------------------------------

    def make_args(self, test_set: str, prompts: str, output_file: str, **overrides) -> argparse.Namespace:
        values = dict(self.defaults)
        unknown = set(overrides) - set(values)
        if unknown:
            raise ValueError(f"{SCRIPTS[self.script]} has no option(s) {sorted(unknown)}; it takes {sorted(values)}")
        values.update({k: v for k, v in overrides.items() if v is not None})
        values.update(test_set=str(test_set), prompts=str(prompts), output_file=str(output_file))
        for k, p in enumerate(self.model_paths, 1):
            values[f"model_path{k}"] = p
        return argparse.Namespace(**values)

    def run(self, test_set: str | Path, prompts: str | Path, indices: Iterable[int], *, record: bool = True,
            **overrides) -> Iterator[dict]:
        """Decode the given rows of their test file with their worker, one example per worker call.

        Overrides are their CLI options by dest name (beam_size, span_length, theta_delta,
        max_span_rounds, ...); unset ones keep their defaults. Yields one dict per example.
        """
        test_set, prompts = Path(test_set).resolve(), Path(prompts).resolve()
        with open(prompts, encoding="utf-8") as f:  # as their main() reads it
            prompt_complex = f.read()
        rows = _read_jsonl(str(test_set))
        output_file = self.workdir / "authors_out.json"
        args = self.make_args(str(test_set), str(prompts), str(output_file), **overrides)
        for index in indices:
            self._load_calls = {"model": 0, "tokenizer": 0}
            gpu_file = Path(f"{output_file}_gpu0.json")
            if gpu_file.exists():
                gpu_file.unlink()
            self.rec = _Example(self.n_models) if record else None
            load_before, load_cpu_before = self.load_seconds, self.load_cpu
            t0, c0 = time.perf_counter(), time.process_time()
            with self._cpu_worker():
                self.mod.ensemble_decoding_worker(0, index, index + 1, args, prompt_complex)
            load = self.load_seconds - load_before  # only the first example loads the models
            wall = time.perf_counter() - t0 - load
            cpu = time.process_time() - c0 - (self.load_cpu - load_cpu_before)
            with open(gpu_file, encoding="utf-8") as f:
                their = [json.loads(line) for line in f if line.strip()]
            if len(their) != 1:
                raise AssertionError(f"example {index}: their worker wrote {len(their)} records")
            ex = {"index": index, "question": rows[index]["question"], "label": rows[index].get("answer"),
                  "pred": their[0]["pred"], "record": their[0], "wall_s": round(wall, 3), "cpu_s": round(cpu, 3),
                  "load_s": round(load, 3)}
            if record:
                ex.update(self._finish(self.rec, args, prompt_complex))
            self.rec = None
            yield ex

    def _finish(self, rec: _Example, args: argparse.Namespace, prompt_complex: str) -> dict:
        fin = rec.final
        if fin is None:
            raise AssertionError("their worker finished an example without the per-example print")
        prompt = fin["prompt"]
        if fin["pred"] is None:
            raise AssertionError("no pred")
        last = fin["i"]
        order = sorted(rec.rounds)
        if order != list(range(len(order))) or (order and order[-1] != last):
            raise AssertionError(f"rounds seen {order}, last round index {last}")
        traced = {t["round"] for t in fin["span_trace"]}  # their span_trace skips rounds that stopped on boxed/marker
        rounds = []
        for i in order:
            rnd = rec.rounds[i]
            rnd.pop("_index", None)
            before = rec.prefix_before[i]
            after = rec.prefix_before[i + 1] if i + 1 in rec.prefix_before else fin["prefix"]
            if not after.startswith(before):
                raise AssertionError(f"round {i + 1}: the prefix after the round does not extend the one before")
            rnd["appended"] = after[len(before):]
            rnd["continuation_after"] = after[len(prompt):]
            fused = {s: a for s, a in (rnd["fused"] or [])}
            for e in rnd["pool"]:
                e["avg"] = fused.get(e["text"])
                e["skipped"] = e["text"] not in fused
            calls = [c for c in rec.text_calls if c["round"] == i]
            if i == last:  # the answer extraction after the loop is the worker's last clean_text call
                calls = calls[:-1] if calls and calls[-1]["fn"] == "clean_text_before_question" else calls
            rnd["text_calls"] = [{k: c[k] for k in ("fn", "line", "arg", "out")} for c in calls]
            if rnd["selected"] is None:
                rnd["stop"] = "no_valid_candidates"
            elif i + 1 not in traced:
                rnd["stop"] = "boxed" if any(c["fn"] == "extract_boxed_answer" for c in calls) else "marker"
            elif i < last:
                rnd["stop"] = None
            elif i == args.max_span_rounds - 1:
                rnd["stop"] = "eos_string_or_cap"
            else:
                rnd["stop"] = "eos_string"
            rounds.append(rnd)
        stop = rounds[-1]["stop"] if rounds else "no_rounds"
        if stop == "eos_string_or_cap":
            # their eos check (a tokenizer's eos_token string inside the selected span) breaks the loop too;
            # both end the loop at the cap, so tell them apart by the text
            eos_strings = [t[1].eos_token for t in self._tokenizers.values() if t[1].eos_token]
            stop = "eos_string" if any(e in rounds[-1]["selected"] for e in eos_strings) else "cap"
            rounds[-1]["stop"] = stop
        extraction = [c for c in rec.text_calls if c["round"] == last][-1:]
        return {"prompt": prompt, "stop": stop, "n_rounds": len(rounds), "rounds": rounds,
                "continuation": fin["prefix"][len(prompt):],
                "pred_extraction": [{k: c[k] for k in ("fn", "line", "arg", "out")} for c in extraction],
                "counts": rec.counts, "span_trace": fin["span_trace"]}

    # ---- provenance ---------------------------------------------------------------------------

    def provenance(self) -> dict:
        import tokenizers
        import torch
        import transformers

        toks = []
        for slot in sorted(self._tokenizers):
            path, tok = self._tokenizers[slot]
            probe = tok("x", add_special_tokens=True)["input_ids"]
            toks.append({"model": slot + 1, "class": type(tok).__name__, "bos": [tok.bos_token, tok.bos_token_id],
                         "eos": [tok.eos_token, tok.eos_token_id], "pad_after_their_setup": [tok.pad_token, tok.pad_token_id],
                         "adds_bos": bool(tok.bos_token_id is not None and probe[:1] == [tok.bos_token_id]),
                         "padding_side": tok.padding_side})
        models = []
        for k, p in enumerate(self.model_paths, 1):
            name = Path(p).name
            models.append({"model": k, "dir": name, "name": MODEL_NAMES.get(name, name)})
        return {
            "authors_repo": "https://github.com/CCM0111/AdaFuse",
            "authors_commit": _git(self.authors_code, "rev-parse", "HEAD"),
            "script": SCRIPTS[self.script],
            "script_sha256": sha256_file(self.script_path),
            "driver": "scripts/authors_code.py",
            "driver_commit": _git(ROOT, "rev-parse", "HEAD"),
            "driver_sha256": sha256_file(Path(__file__)),
            "driver_tree_dirty": bool(_git(ROOT, "status", "--porcelain", "--", "scripts/authors_code.py")),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
            "threads": self.threads,
            "cpu": platform.processor() or platform.machine(),
            "models": models,
            "tokenizers_info": toks,
            "load": self.load_kwargs,
            "generation_configs": self.generation_configs,
            "recorded_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        }


# --------------------------------------------------------------------------------------------


def parse_indices(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if "-" in part:
            a, b = part.split("-")
            out.extend(range(int(a), int(b) + 1))
        elif part:
            out.append(int(part))
    return out


def _rel_data(path: Path) -> str:
    parts = Path(path).parts
    return "/".join(parts[parts.index("adafuse_local_datasets"):]) if "adafuse_local_datasets" in parts else str(path)


def write_fixture(path: Path, meta: dict, examples: list[dict]) -> None:
    """One JSON object; one example per line inside "examples" (compact, diffable)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    head = json.dumps(meta, ensure_ascii=False, indent=1)
    body = ",\n".join(json.dumps(ex, ensure_ascii=False, separators=(",", ":")) for ex in examples)
    with open(path, "w", encoding="utf-8") as f:
        f.write('{"meta": ' + head + ',\n"examples": [\n' + body + "\n]}\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--authors-code", required=True, type=Path, help="a checkout of CCM0111/AdaFuse")
    p.add_argument("--script", choices=sorted(SCRIPTS), default="two")
    p.add_argument("--models", nargs="+", help="model directories, model 1 first (default: the bundled SmolLM2, Gemma-3 pair, repeated for three/four)")
    p.add_argument("--task", choices=sorted(TASKS), help="their test file and prompt file for this task")
    p.add_argument("--test-set", type=Path, help="overrides the task's test file")
    p.add_argument("--prompts", type=Path, help="overrides the task's prompt file")
    p.add_argument("--data-dir", type=Path, default=None, help="folder holding adafuse_local_datasets/ (default: $ADAFUSE_DATA_DIR or ../shared/data)")
    p.add_argument("--indices", required=True, help="rows of the test file, e.g. 0-11 or 0,3,7")
    p.add_argument("--beam-size", type=int)
    p.add_argument("--span-length", type=int)
    p.add_argument("--theta-delta", type=float)
    p.add_argument("--max-span-rounds", type=int)
    p.add_argument("--max-words", type=int)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--workdir", type=Path, help="where their worker writes its files (default: ./authors_code_work)")
    p.add_argument("--out", type=Path, help="fixture JSON to write")
    p.add_argument("--name", help="setting name stored in the fixture")
    p.add_argument("--no-record", action="store_true", help="only preds and times (for timing)")
    a = p.parse_args(argv)

    data = (a.data_dir or default_data_dir()) / "adafuse_local_datasets"
    if a.task:
        test_set, prompts = (data / TASKS[a.task][0]), (data / TASKS[a.task][1])
    test_set = a.test_set or (test_set if a.task else None)
    prompts = a.prompts or (prompts if a.task else None)
    if test_set is None or prompts is None:
        p.error("give --task or both --test-set and --prompts")
    overrides = {k: v for k, v in {"beam_size": a.beam_size, "span_length": a.span_length, "theta_delta": a.theta_delta,
                                    "max_span_rounds": a.max_span_rounds, "max_words": a.max_words}.items() if v is not None}
    workdir = a.workdir or Path.cwd() / "authors_code_work"
    workdir.mkdir(parents=True, exist_ok=True)
    runner = AuthorsCode(a.authors_code, a.script, a.models, threads=a.threads, workdir=workdir)
    args = runner.make_args(str(test_set), str(prompts), "authors_out.json", **overrides)
    partial = workdir / "examples.jsonl"  # resume: examples already decoded with the same settings
    done: dict[int, dict] = {}
    settings = {k: v for k, v in vars(args).items() if not k.startswith("model_path") and k not in ("test_set", "prompts", "output_file")}
    key = json.dumps({"script": a.script, "models": runner.model_paths, "test_set": str(test_set), "settings": settings}, sort_keys=True)
    if partial.exists():
        for line in open(partial, encoding="utf-8"):
            ex = json.loads(line)
            if ex.pop("_key") == key:
                done[ex["index"]] = ex
    todo = [i for i in parse_indices(a.indices) if i not in done]
    print(f"{a.script}: {len(done)} done, {len(todo)} to decode; settings {settings}", file=sys.stderr, flush=True)
    with open(partial, "a", encoding="utf-8") as out:
        for ex in runner.run(test_set, prompts, todo, record=not a.no_record, **overrides):
            done[ex["index"]] = ex
            out.write(json.dumps({"_key": key, **ex}, ensure_ascii=False) + "\n")
            out.flush()
            print(f"[{ex['index']}] {ex['wall_s']:.1f}s wall {ex['cpu_s']:.1f}s cpu rounds={ex.get('n_rounds')} stop={ex.get('stop')} pred={ex['pred']!r}", file=sys.stderr, flush=True)
    if a.out:
        examples = [done[i] for i in parse_indices(a.indices)]
        meta = {"setting": a.name or a.out.stem,
                "task": a.task, "test_set": _rel_data(test_set), "prompts": _rel_data(prompts),
                "args": settings, "indices": parse_indices(a.indices),
                "wall_s_total": round(sum(ex["wall_s"] for ex in examples), 1),
                "cpu_s_total": round(sum(ex["cpu_s"] for ex in examples), 1),
                **runner.provenance()}
        write_fixture(a.out, meta, examples)
        print(f"wrote {a.out} ({a.out.stat().st_size} bytes)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
