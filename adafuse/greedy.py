"""`method=single`: greedy decoding with one member, under the same stop rules and budget as AdaFuse.

It reads one token per forward pass through the member's KV cache, so it matches transformers'
`generate(do_sample=False)` token for token without inheriting a model's shipped sampling defaults.
"""

import time

from adafuse.config import SingleConfig
from adafuse.decode import cut_at_stop
from adafuse.errors import ConfigError
from adafuse.model import Member
from adafuse.trace import Generation, Stats


def positions_needed(cfg: SingleConfig, max_new_tokens: int) -> int:
    return max_new_tokens


def generate(
    members: list[Member], prompt: str, cfg: SingleConfig, *, stop=(), max_new_tokens: int = 64, trace: bool = False
) -> Generation:
    if cfg.member >= len(members):
        raise ConfigError(f"single: member {cfg.member} does not exist; the ensemble has {len(members)} models")
    started = time.perf_counter()
    m = members[cfg.member]
    m.reset_counters()
    m.start(prompt, reserve=positions_needed(cfg, max_new_tokens))
    generated: list[int] = []
    text, stats = "", Stats()
    while not stats.stop_reason:
        token = int(m.logprobs.argmax())
        if token in m.eos_ids:
            stats.stop_reason = "eos"
            break
        generated.append(token)
        # Decode the whole output each step: a lone token may hold part of a multi-byte character.
        text, cut = cut_at_stop("", m.text_of(generated, m.ids[: m.prompt_len]), stop)
        stats.rounds += 1
        if cut:
            stats.stop_reason = "stop"
        elif len(generated) >= max_new_tokens:
            stats.stop_reason = "length"
        else:  # like generate(), the last token is never read: nothing would use its logits
            m.feed([token])
    stats.tokens_generated = [len(generated)]
    stats.tokens_fed = [m.tokens_fed]
    stats.forward_passes = [m.forward_passes]
    stats.seconds = time.perf_counter() - started
    return Generation(text=text, stats=stats, ids=[generated])
