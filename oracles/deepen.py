"""DeePEn without a cache, as the research notes describe it: transfer rows written out densely, every
distribution from a full forward pass, and upstream's optimiser loop over the whole vocabulary; and the
comparison of a fast decode with it."""

import torch

from baselines.deepen import DeepenConfig
from baselines.deepen_transfer import prepare
from oracles.fast import decode
from oracles.token_reference import PARTIAL, RefMember, stopped


def dense_rows(t, ids: torch.Tensor) -> torch.Tensor:
    """Rows `ids` of a member's transfer matrix, written out: offset + slope * (E[v] . unit anchor
    embedding), with the stored exact entries put in place."""
    anchor_dirs = torch.nn.functional.normalize(t.embeddings[t.anchors].float(), dim=-1)
    rows = t.offset[ids, None] + t.slope[ids, None] * (t.embeddings[ids].float() @ anchor_dirs.T)
    rows[torch.arange(len(ids))[:, None], t.top_ids[ids]] = t.top_values[ids]
    return rows


def to_anchors(t, lp: torch.Tensor, support: int) -> torch.Tensor:
    top = lp.topk(support).indices
    p = lp.exp()[top]
    return p @ dense_rows(t, top) + (1 - p.sum()) / len(t.anchors)


def inverse(t, lp: torch.Tensor, q: torch.Tensor, cfg: DeepenConfig, main: RefMember) -> int:
    """Upstream's loop over the whole vocabulary; tokens outside the `support` most probable get no gradient."""
    top = lp.topk(cfg.support).indices
    rows = dense_rows(t, top)
    frozen = torch.ones_like(lp, dtype=torch.bool)
    frozen[top] = False
    z = lp.clone().requires_grad_(True)
    opt = torch.optim.AdamW([z], lr=cfg.lr, betas=(0.9, 0.999))
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10, eta_min=cfg.lr / 4)
    for _ in range(cfg.steps):
        s = torch.softmax(z, dim=0)
        q0 = s[top] @ rows + (1 - s[top].sum()) / len(t.anchors)
        # upstream: nn.KLDivLoss() (reduction "mean": the sum over anchors divided by |A|)
        loss = torch.nn.functional.kl_div(q0.clamp_min(1e-12).log(), q.clamp_min(1e-12), reduction="sum") / len(q)
        opt.zero_grad()
        loss.backward()
        z.grad[frozen] = 0
        opt.step()
        sched.step()
    return main.m.best(z.detach(), [])[0]  # the best token that can start a character


def slow_deepen(members, prompt: str, cfg: DeepenConfig, stop=(), max_new_tokens: int = 16):
    """DeePEn as the research notes describe it, plainly: (text, stop reason, each member's output ids)."""
    transfers = prepare(members, cfg)  # the stored matrices; everything else is recomputed here
    refs = [RefMember(m, prompt) for m in members]
    weights = cfg.weights or [1 / len(members)] * len(members)
    main = refs[cfg.main]
    text = ""
    while True:
        with torch.enable_grad():
            dists = [r.logprobs() for r in refs]
            argmax = [r.m.best(lp, [])[0] for r, lp in zip(refs, dists)]
            token = argmax[cfg.main]
            texts = {r.texts()[i] for r, i in zip(refs, argmax)}
            agree = len(texts) == 1 and None not in texts
            if token not in main.eos_ids and not (cfg.skip_agree and agree):
                q = sum(w * to_anchors(t, lp, cfg.support) for w, t, lp in zip(weights, transfers, dists))
                token = inverse(transfers[cfg.main], dists[cfg.main], q, cfg, main)
        if token in main.eos_ids:
            return text, "eos", [r.generated() for r in refs]
        ids = [token]
        new = main.m.text(main.ids, ids)
        while new.endswith(PARTIAL) and len(ids) < 4:  # the main member finishes a multi-byte character
            ids.append(main.m.best(main.m.logprobs(main.ids + ids, 1)[-1], ids)[0])
            new = main.m.text(main.ids, ids)
        main.add_own(ids, text + new)
        for r in refs:
            if r is not main:
                r.add_text(text, new)
        text, reason = stopped(text + new, stop, refs, max_new_tokens)
        if reason:
            return text, reason, [r.generated() for r in refs]


def assert_deepen_agrees(members, prompt, cfg, stop, budget):
    gen = decode(members, prompt, cfg, stop=stop, max_new_tokens=budget, trace=True)
    text, reason, ids = slow_deepen(members, prompt, cfg, stop, budget)
    assert (gen.text, gen.stats.stop_reason) == (text, reason)
    assert gen.ids == ids
    for m in members:
        m.check_invariant()
    return gen
