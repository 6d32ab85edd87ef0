"""Check the recorded authors' traces (tests/fixtures/authors_code/*.json) against the behaviour that
tests/fixtures/authors_code/BEHAVIOUR.md describes, rule by rule.

    python -m tools.check_authors_fixtures                      # every fixture; tokenizers only
    python -m tools.check_authors_fixtures --models FILE.json   # also recompute with the models

Without --models it rebuilds, from the recorded generate outputs and margins alone, every model's
proposals (word rule, path A / path B, id trimming, call sequence and input lengths), the pool
(order, duplicate merging, re-tokenisation), the fusion (NaN rule, mean, first-minimum tie
rule), the text appended, the stop rule and `pred`, and compares each with what their code did.
With --models it also checks, per recorded round, that the scores their generate calls returned are
the raw next-token distribution of the re-tokenised prefix (top-5 and one-step beam tokens), that
recomputed span scores agree, and measures how far KV-cached scoring is from their uncached scoring.
This file is our own description in code of their rules; it shares no code with theirs.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import string
import sys
from collections import Counter
from pathlib import Path

from tools.authors_code import default_cache_dir

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "authors_code"

PUNCT = set(string.punctuation)
MARKERS = ("question:", "note:")
REJECTED = Counter()


def all_punct(s: str) -> bool:
    return all(ch in PUNCT for ch in s)


def acceptable(s: str) -> bool:
    ok = bool(s.strip()) and not all_punct(s)
    if not ok:
        REJECTED["rejected_candidates"] += 1
    return ok


def needs_more(text: str, need: int) -> bool:
    """Their extension test: fewer than `need` whitespace chunks and no '</s>' / 'question:' / 'note:'."""
    low = text.lower()
    return len(text.split()) < need and "</s>" not in text and "question:" not in low and "note:" not in low


def trim(tok, ids: list[int], target: str) -> list[int]:
    """Shortest prefix of ids whose decode equals target (case-insensitive too); else the longest one whose
    decode is a prefix of it, stopping at the first prefix that overshoots it; else all the ids."""
    if not ids:
        return ids
    target = target.strip()
    if not target:
        return ids
    best = None
    for i in range(1, len(ids) + 1):
        d = tok.decode(ids[:i], skip_special_tokens=False).strip()
        if not d:
            continue
        if d == target or d.lower() == target.lower():
            return ids[:i]
        if target.startswith(d) or target.lower().startswith(d.lower()):
            best = ids[:i]
            continue
        if (d.startswith(target) and len(d) > len(target)) or (
            d.lower().startswith(target.lower()) and len(d) > len(target)
        ):
            return best if best is not None else (ids[: i - 1] if i > 1 else ids[:i])
    return best if best is not None else ids


def first_word(words: list[str], span_length: int) -> str:
    valid = [w for w in words if w.strip() and not all_punct(w)]
    if valid:
        return " ".join(valid[:span_length])
    return " ".join(words[:span_length]) if words else ""


class Calls:
    """The recorded generate calls of one proposal, consumed in order with their expected shape checked."""

    def __init__(self, calls, where):
        self.calls, self.k, self.where = calls, 0, where

    def take(self, max_new, beams, in_len):
        if self.k >= len(self.calls):
            raise AssertionError(f"{self.where}: expected a generate call (max_new={max_new}) that was not made")
        c = self.calls[self.k]
        self.k += 1
        got = (c["max_new"], c["beams"], c["in"])
        if got != (max_new, beams, in_len):
            raise AssertionError(
                f"{self.where}: call {self.k} was (max_new, beams, in)={got}, expected {(max_new, beams, in_len)}"
            )
        return c

    def done(self):
        if self.k != len(self.calls):
            raise AssertionError(f"{self.where}: {len(self.calls) - self.k} generate call(s) more than described")


def propose_path_a(tok, calls: Calls, margins, n_prompt, theta, span_length):
    c = calls.take(1, 1, n_prompt)
    t1 = c["new"][0]
    m1 = margins[0]
    c = calls.take(6, 1, n_prompt + len(t1))
    fw = t1 + c["new"][0]
    raw = tok.decode(fw, skip_special_tokens=False)
    if needs_more(raw, 2):
        fw = fw + calls.take(5, 1, n_prompt + len(fw))["new"][0]
        raw = tok.decode(fw, skip_special_tokens=False)
    w1 = first_word(raw.split(), span_length)
    w1_ids = trim(tok, fw, w1)
    if m1 < theta:
        return ([(w1, w1_ids)] if acceptable(w1) else []), 1
    c = calls.take(1, 1, n_prompt + len(w1_ids))
    t2 = c["new"][0]
    stable2 = margins[1] >= theta
    full = t2 + calls.take(5 if stable2 else 6, 1, n_prompt + len(w1_ids) + len(t2))["new"][0]
    txt = tok.decode(full, skip_special_tokens=False)
    if needs_more(txt, 3 if stable2 else 2):
        full = full + calls.take(5, 1, n_prompt + len(w1_ids) + len(full))["new"][0]
        txt = tok.decode(full, skip_special_tokens=False)
    ws = txt.split()
    n = min(len(ws), 2 if stable2 else 1)
    if n == 0:
        return ([(w1, w1_ids)] if acceptable(w1) else []), 2
    s = " ".join([w1] + ws[:n])
    return ([(s, trim(tok, w1_ids + full, s))] if acceptable(s) else []), 2


def complete(tok, calls: Calls, base_len, first_ids):
    """6 greedy tokens after the given first token(s), then 5 more if the text has fewer than 2 chunks."""
    ids = first_ids + calls.take(6, 1, base_len + len(first_ids))["new"][0]
    txt = tok.decode(ids, skip_special_tokens=False)
    if needs_more(txt, 2):
        ids = ids + calls.take(5, 1, base_len + len(ids))["new"][0]
        txt = tok.decode(ids, skip_special_tokens=False)
    return ids, txt


def propose_path_b(tok, calls: Calls, margins, n_prompt, theta, span_length, beams):
    c = calls.take(1, 1, n_prompt)
    t1 = c["new"][0]
    spans = []
    if margins[0] >= theta:
        fw, raw = complete(tok, calls, n_prompt, t1)
        w1 = first_word(raw.split(), span_length)
        w1_ids = trim(tok, fw, w1)
        t2 = calls.take(1, 1, n_prompt + len(w1_ids))["new"][0]
        w2_full, txt2 = complete(tok, calls, n_prompt + len(w1_ids), t2)
        ws = txt2.split()
        if not ws:
            return ([(w1, fw)] if acceptable(w1) else []), 2
        w2 = ws[0]
        if margins[1] < theta:
            s = w1 + " " + w2
            return ([(s, w1_ids + w2_full)] if acceptable(s) else []), 2
        s12 = w1 + " " + w2
        ids12 = trim(tok, w1_ids + w2_full, s12)
        beam = calls.take(1, beams, n_prompt + len(ids12))
        for b in beam["new"]:
            w3_full, txt3 = complete(tok, calls, n_prompt + len(ids12), b)
            ws3 = txt3.split()
            if ws3:
                s = s12 + " " + ws3[0]
                if acceptable(s):
                    spans.append((s, ids12 + w3_full))
        return spans, 2
    beam = calls.take(1, beams, n_prompt)
    for b in beam["new"]:
        ids, txt = complete(tok, calls, n_prompt, b)
        words = txt.split()
        if not words:
            continue
        s = first_word(words, span_length)
        if acceptable(s):
            spans.append((s, ids))
    return spans, 1


def clean_before_marker(text: str) -> str:
    m = re.search(r"(.*?)(?:\bquestion\s*:|\bnote\s*:|<)", text, flags=re.IGNORECASE)
    return m.group(1).strip() if m else text.strip()


def boxed_part(text: str) -> str:
    m = re.search(r"(.*?\\?boxed\s*\{[^}]*\})", text, flags=re.IGNORECASE)
    return m.group(1).strip() if m else text.strip()


class Checker:
    def __init__(self, models: bool, model_rounds: int | None = None):
        from transformers import AutoTokenizer

        self.models = models
        self.model_rounds = model_rounds
        self._tok: dict[str, object] = {}
        self._model: dict[str, object] = {}
        self.AutoTokenizer = AutoTokenizer
        self.stats = Counter()
        self.notes: list[str] = []

    def tok(self, d):
        if d not in self._tok:
            self._tok[d] = self.AutoTokenizer.from_pretrained(str(default_cache_dir() / "gguf" / d))
        return self._tok[d]

    def model(self, d):
        import torch
        from transformers import AutoModelForCausalLM

        if d not in self._model:
            self._model[d] = AutoModelForCausalLM.from_pretrained(
                str(default_cache_dir() / "gguf" / d), dtype=torch.float32
            ).eval()
        return self._model[d]

    def check_file(self, path: Path):
        data = json.loads(path.read_text(encoding="utf-8"))
        meta = data["meta"]
        dirs = [m["dir"] for m in meta["models"]]
        toks = [self.tok(d) for d in dirs]
        args = meta["args"]
        theta = args["theta_delta"]
        span_length = args.get("span_length", 1)  # the 3- and 4-model scripts take the first word only
        beams = args.get("beam_size", 1)
        path_b = beams > 1
        n = len(dirs)
        for ex in data["examples"]:
            where0 = f"{path.name} #{ex['index']}"
            prompt = ex["prompt"]
            prefix = prompt
            for rnd in ex["rounds"]:
                where = f"{where0} round {rnd['round']}"
                # 1. proposals rebuilt from the recorded generate outputs
                pool: dict[str, list] = {}
                for m, prop in enumerate(rnd["proposals"]):
                    assert prop["model"] == m, f"{where}: proposals out of model order"
                    tok = toks[m]
                    n_prompt = len(tok(prefix)["input_ids"])
                    calls = Calls(prop["calls"], f"{where} model {m + 1}")
                    margins = [x["margin"] for x in prop["margins"]]
                    if path_b:
                        spans, n_margins = propose_path_b(tok, calls, margins, n_prompt, theta, span_length, beams)
                    else:
                        spans, n_margins = propose_path_a(tok, calls, margins, n_prompt, theta, span_length)
                    calls.done()
                    assert len(margins) == n_margins, (
                        f"{where} model {m + 1}: {len(margins)} margins, expected {n_margins}"
                    )
                    got = [(s["text"], s["ids"]) for s in prop["spans"]]
                    assert got == spans, f"{where} model {m + 1}: proposals {got} != rebuilt {spans}"
                    for c, mg in zip([c for c in prop["calls"] if "top5" in c], margins):
                        top = c["top5"]
                        assert abs((top[0][1] - top[1][1]) - mg) < 1e-6, f"{where}: margin is not p1 - p2"
                        assert c["new"][0][0] == top[0][0], f"{where}: greedy token is not the top-1"
                        self.stats["margins"] += 1
                        if abs(mg - theta) < 1e-3:
                            self.notes.append(f"{where} model {m + 1}: margin {mg:.6f} within 1e-3 of theta {theta}")
                    for s, ids in spans:
                        pool.setdefault(s, [None] * n)[m] = ids
                        if " ".join(tok.decode(ids, skip_special_tokens=False).split()) != s:
                            self.stats["span_ids_decode_to_other_text" + ("_pathB" if path_b else "_pathA")] += 1
                    self.stats["proposals"] += 1
                # 2. pool order, merging, re-tokenisation
                assert [e["text"] for e in rnd["pool"]] == list(pool), f"{where}: pool order"
                fused = []
                for e in rnd["pool"]:
                    assert e["own_ids"] == pool[e["text"]], f"{where}: own ids of {e['text']!r}"
                    for m in range(n):
                        want = (
                            e["own_ids"][m]
                            if e["own_ids"][m] is not None
                            else toks[m](e["text"], add_special_tokens=False)["input_ids"]
                        )
                        assert e["scored_ids"][m] == want, f"{where}: model {m + 1} scored ids of {e['text']!r}"
                        if e["own_ids"][m] is None:
                            self.stats["retokenised"] += 1
                            spaced = toks[m](" " + e["text"], add_special_tokens=False)["input_ids"]
                            if spaced != want:
                                self.stats["retok_differs_from_spaced"] += 1
                    vals = [s for s in e["scores"] if s is not None]
                    if n == 2:
                        avg = (
                            None if not vals else (vals[0] if len(vals) == 1 else (e["scores"][0] + e["scores"][1]) / 2)
                        )
                    else:
                        avg = sum(vals) / len(vals) if vals else None
                    if avg is None:
                        assert e["skipped"], f"{where}: all-NaN candidate not skipped"
                        self.stats["all_nan"] += 1
                        continue
                    if len(vals) < n:
                        self.stats["some_nan"] += 1
                    assert not e["skipped"] and abs(e["avg"] - avg) < 1e-12, f"{where}: avg of {e['text']!r}"
                    fused.append((e["text"], avg))
                # 3. selection: first minimum in pool order
                if not fused:
                    assert rnd["selected"] is None and rnd["stop"] == "no_valid_candidates", f"{where}: empty pool"
                    assert rnd["appended"] == ""
                    continue
                best = min(a for _, a in fused)
                sel = next(s for s, a in fused if a == best)
                assert rnd["selected"] == sel, f"{where}: selected {rnd['selected']!r}, rule gives {sel!r}"
                ties = [s for s, a in fused if a == best]
                if len(ties) > 1:
                    self.stats["exact_ties"] += 1
                second = sorted(a for _, a in fused)[1] if len(fused) > 1 else math.inf
                if second - best < 1e-3:
                    self.notes.append(f"{where}: best and second-best avg within {second - best:.2e}")
                # 4. append and stop rule
                if re.search(r"\\?boxed\s*\{", sel, flags=re.IGNORECASE):
                    kept, stop = boxed_part(sel), "boxed"
                elif any(k in sel.lower() for k in MARKERS) or "<" in sel:
                    kept, stop = clean_before_marker(sel), "marker"
                else:
                    kept, stop = sel, None
                    if any(t.eos_token and t.eos_token in sel for t in toks):
                        stop = "eos_string"
                app = (" " + kept) if kept else ""
                assert rnd["appended"] == app, f"{where}: appended {rnd['appended']!r}, rule gives {app!r}"
                if stop is None and rnd["round"] == args["max_span_rounds"] and rnd is ex["rounds"][-1]:
                    stop = "cap"
                assert rnd["stop"] == stop, f"{where}: stop {rnd['stop']!r}, rule gives {stop!r}"
                if stop == "marker" and not kept:
                    self.stats["marker_rounds_adding_nothing"] += 1
                if rnd["appended"] and sel != kept:
                    self.stats["partial_kept"] += 1
                if self.models and (self.model_rounds is None or rnd["round"] <= self.model_rounds):
                    self.check_models(dirs, toks, prefix, rnd, where)
                if app:
                    self.boundary_stats(toks, prefix, app, rnd, sel)
                prefix += app
                self.stats["rounds"] += 1
            assert prefix == prompt + ex["continuation"], f"{where0}: continuation"
            if "Answer:" in prefix:
                pred = clean_before_marker(prefix.split("Answer:")[-1].strip())
            else:
                pred = clean_before_marker(prefix.replace(prompt, "", 1).strip())
            assert pred == ex["pred"] == ex["record"]["pred"], f"{where0}: pred {ex['pred']!r}, rule gives {pred!r}"
            self.stats["examples"] += 1
            self.stats[f"stop_{ex['stop']}"] += 1

    def boundary_stats(self, toks, prefix, app, rnd, sel):
        """How the re-tokenised prefix relates to the previous one and to the ids a model generated."""
        entry = next(e for e in rnd["pool"] if e["text"] == sel)
        for m, tok in enumerate(toks):
            before = tok(prefix)["input_ids"]
            after = tok(prefix + app)["input_ids"]
            if after[: len(before)] != before:
                self.stats["prefix_tokens_changed_at_boundary"] += 1
                self.notes.append(f"model {m + 1}: tokens of the prefix changed when {app!r} was appended")
            self.stats["appends_tokenised"] += 1
            own = entry["own_ids"][m]
            if own is not None and app == " " + sel:
                if after == before + own:
                    self.stats["winner_own_ids_equal_retokenised_tail"] += 1
                else:
                    self.stats["winner_own_ids_differ_from_retokenised_tail"] += 1
            tail = after[len(before) :] if after[: len(before)] == before else None
            if tail is not None and tail != tok(app, add_special_tokens=False)["input_ids"]:
                self.stats["tail_differs_from_tokenised_append"] += 1

    def check_models(self, dirs, toks, prefix, rnd, where):
        import torch

        with torch.no_grad():
            for m, prop in enumerate(rnd["proposals"]):
                model, tok = self.model(dirs[m]), toks[m]
                ids = tok(prefix, return_tensors="pt")["input_ids"]
                out = model(ids, use_cache=True)
                logits = out.logits[0, -1].float()
                probs = torch.softmax(logits, -1)
                first = prop["calls"][0]
                p, ix = torch.topk(probs, 5)
                for (rid, rp), tid, tp in zip(first["top5"], ix.tolist(), p.tolist()):
                    assert rid == tid and abs(rp - tp) < 1e-5, (
                        f"{where} model {m + 1}: top-5 {first['top5']} vs forward {list(zip(ix.tolist(), p.tolist()))}"
                    )
                self.stats["top5_vs_forward"] += 1
                beam_calls = [c for c in prop["calls"] if c["beams"] > 1 and c["in"] == ids.shape[1]]
                for c in beam_calls:
                    want = torch.topk(torch.log_softmax(logits, -1), c["beams"]).indices.tolist()
                    assert [s[0] for s in c["new"]] == want, (
                        f"{where} model {m + 1}: beam tokens {c['new']} vs top-{c['beams']} {want}"
                    )
                    self.stats["beam_vs_topk"] += 1
                # scores: recomputed uncached, and with a KV cache of the prefix
                cache = out.past_key_values
                for e in rnd["pool"]:
                    span = e["scored_ids"][m]
                    if not span:
                        continue
                    full = torch.cat([ids, torch.tensor([span])], dim=1)
                    lp = torch.log_softmax(model(full).logits.float(), -1)
                    n = ids.shape[1]
                    nll = -lp[0, n - 1 : -1].gather(-1, torch.tensor(span)[:, None]).mean().item()
                    rec = e["scores"][m]
                    assert rec is not None and abs(nll - rec) < 1e-4, (
                        f"{where} model {m + 1}: score {rec} vs recomputed {nll}"
                    )
                    self.stats["uncached_max_diff_e9"] = max(
                        self.stats["uncached_max_diff_e9"], int(abs(nll - rec) * 1e9)
                    )
                    import copy

                    c2 = copy.deepcopy(cache)
                    step = model(torch.tensor([span]), past_key_values=c2, use_cache=True).logits.float()
                    lp2 = torch.log_softmax(torch.cat([logits[None, None], step[:, :-1]], dim=1), -1)
                    nll2 = -lp2[0].gather(-1, torch.tensor(span)[:, None]).mean().item()
                    self.stats["scores_recomputed"] += 1
                    d = abs(nll2 - rec)
                    key = f"cached_max_diff_e9_model{m + 1}"
                    self.stats[key] = max(self.stats[key], int(d * 1e9))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "files", nargs="*", type=Path, help="fixture files (default: all of tests/fixtures/authors_code/*.json)"
    )
    p.add_argument("--models", action="store_true", help="also run the models (slow)")
    p.add_argument("--model-rounds", type=int, help="with --models: only the first N rounds of each example")
    a = p.parse_args()
    import torch

    torch.set_num_threads(1)
    files = a.files or sorted(FIXTURES.glob("*.json"))
    ch = Checker(a.models, a.model_rounds)
    bad = 0
    for f in files:
        try:
            ch.check_file(f)
            print(f"ok   {f.name}")
        except AssertionError as err:
            bad += 1
            print(f"FAIL {f.name}: {err}")
    print(dict(ch.stats, **REJECTED))
    for note in ch.notes:
        print("note:", note)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
