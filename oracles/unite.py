"""UniTE without a cache, as the research notes describe it: each member's top-k by text, their union,
every member's probability of each union entry (summed over the ids that spell it, or its first subtoken
where a vocabulary lacks it), the weighted average, and the winner appended to every context."""

from baselines.unite import EOS
from oracles.token_reference import RefMember, stopped


def slow_unite(members, prompt: str, k: int, weights, stop=(), max_new_tokens: int = 16):
    """UniTE as the research notes describe it, plainly: (text, stop reason, each member's output ids)."""
    refs = [RefMember(m, prompt) for m in members]
    text = ""
    while True:
        dists = [r.logprobs() for r in refs]
        tops = []
        for r, lp in zip(refs, dists):
            entries = {}
            for i in lp.argsort(descending=True).tolist():
                if lp[i] == float("-inf") or len(entries) == k:
                    break
                if i in r.eos_ids:
                    entries.setdefault(EOS, i)
                elif r.texts()[i] is not None:
                    entries.setdefault(r.texts()[i], i)
            tops.append(entries)
        union = []
        for top in tops:
            union += [e for e in top if e not in union]
        fused = [0.0] * len(union)
        for r, lp, w in zip(refs, dists, weights):
            p = lp.exp()
            raw = []
            for e in union:
                if e is EOS:
                    raw.append(max(p[i].item() for i in r.eos_ids))
                elif e in r.ids_by_text():  # every id whose text is e
                    raw.append(sum(p[i].item() for i in r.ids_by_text()[e]))
                else:
                    ids = r.m.encode_text(e, specials=False)
                    first = next((i for i in ids if r.texts()[i] != " "), ids[0])
                    raw.append(p[first].item())
            for j, v in enumerate(raw):
                fused[j] += w * v / sum(raw)
        best = max(fused)
        winner = union[fused.index(best)]
        if winner is EOS:
            return text, "eos", [r.generated() for r in refs]
        for r, top in zip(refs, tops):
            if winner in top:
                r.add_own([top[winner]], text + winner)
            else:
                r.add_text(text, winner)
        text, reason = stopped(text + winner, stop, refs, max_new_tokens)
        if reason:
            return text, reason, [r.generated() for r in refs]
