"""`method=single`: greedy decoding with one member, under the same stop rules and budget as AdaFuse.

It reads one token per forward pass through the member's KV cache, so it matches transformers'
`generate(do_sample=False)` token for token without inheriting a model's shipped sampling defaults.
Like `generate()`, it keeps the model's control tokens in the distribution; like
lm-evaluation-harness, it leaves them out of the prediction's text.
"""

from dataclasses import dataclass

from adafuse.config import SingleConfig
from adafuse.errors import ConfigError
from adafuse.methods import Method
from adafuse.methods.session import Session
from adafuse.text.top import best
from adafuse.text.words import ends_inside_char


@dataclass
class GreedyStep:
    """One step of `trace=true`: the chosen id, its log-probability, and the text the output gained."""

    token: int
    logprob: float
    text: str


def positions_needed(cfg: SingleConfig, max_new_tokens: int) -> int:
    return max_new_tokens


def members_used(cfg: SingleConfig, available: int) -> list[int]:
    if cfg.member >= available:
        raise ConfigError(f"single: member {cfg.member} does not exist; the ensemble has {available} models")
    return [cfg.member]


def decode(s: Session, cfg: SingleConfig):
    """Greedy decoding of the session's one member (the seam passes only the member `cfg` names): a program."""
    (m,) = s.members
    prompt_ids = list(m.ids)
    generated: list[int] = []
    while not s.done:
        token = best(m.logprobs)
        if token in m.tokenisation.eos_ids:
            s.add("", eos=True)
            break
        generated.append(token)
        # Decode the whole output each step: a lone token may hold part of a multi-byte character.
        shown = m.text_of([t for t in generated if t not in m.tokenisation.control_ids], prompt_ids)
        new = "" if ends_inside_char(shown) else shown[len(s.text) :]
        if s.tracing:
            s.log(GreedyStep(token, m.logprobs[token].item(), new))
        # Like generate(), the last token is never read: nothing would use its logits.
        before = s.text
        if not s.add(new, unread=1):
            yield from m.append_ids([token], before, new)
    s.set_output_ids([generated])


METHOD = Method(SingleConfig, decode, positions_needed, members_used, raw_distribution=True)
