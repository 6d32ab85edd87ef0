"""What a decode returns: the text, per-example statistics, and (with trace=True) the spec §7 record.

A trace holds each model's prompt ids and, per round, every candidate's ids and context length per
model, so `contexts()` can replay each model's context and every score can be recomputed with a
plain, cache-free forward pass.
"""

from dataclasses import asdict, dataclass, field


@dataclass
class Stats:
    stop_reason: str = ""  # "eos", "stop" (a stop string), or "length" (the token budget)
    rounds: int = 0
    words_per_round: list[int] = field(default_factory=list)  # words in each round's winner
    tokens_generated: list[int] = field(default_factory=list)  # per model: ids of the output in its vocabulary
    tokens_fed: list[int] = field(default_factory=list)  # per model: token positions through forward, padding included
    # per model: the forward passes this example asked for (its prompt's read included). Batched, the engine runs
    # several examples' requests in one merged pass, each computed as its own pass alone, so each counts here;
    # the passes the engine ran are metrics.json's `batching` (adafuse/engine/executor.py)
    forward_passes: list[int] = field(default_factory=list)
    seconds: float = 0.0
    # decoding ended in one more round, not counted in `rounds`, whose every candidate stopped at the same
    # text: it ended there, its words neither completed nor scored (adafuse/methods/adafuse.py RoundEnd)
    early_finish: bool = False
    notes: dict = field(default_factory=dict)  # facts a method reports per example (LLM-Blender: ranker, chosen member)


@dataclass
class ModelRound:
    """One model's proposal in one round."""

    margins: list[float]  # the margin p1 - p2 at each word start it tested
    committed: list[str]  # the confident words it committed before stopping or branching
    branched: bool  # True when an uncertain word ended its proposal


@dataclass
class Score:
    """One model's score of one candidate: the mean NLL of `ids[skip:]` read after its first `base` context ids."""

    base: int  # context ids kept; below the context length only where re-tokenising merged across the boundary
    ids: list[int]
    eos: bool  # an end-of-sequence token was scored after ids
    nll: float
    skip: int = 0  # leading ids that re-read context before the candidate's first character: fed, not scored


@dataclass
class CandidateTrace:
    text: str
    eos: bool
    proposers: list[int]  # indices of the models that proposed it, in pool order
    words: int
    scores: list[Score]  # one per model
    fused: float  # mean of the models' NLLs; the lowest wins


@dataclass
class RoundTrace:
    round_idx: int
    models: list[ModelRound]
    candidates: list[CandidateTrace]
    winner: int


@dataclass
class Trace:
    prompt_ids: list[list[int]]  # per model
    rounds: list[RoundTrace] = field(default_factory=list)  # AdaFuse's rounds (spec §7)
    steps: list = field(default_factory=list)  # other methods' per-step records (dataclasses)

    def contexts(self):
        """Yield, for each round, every model's context ids at its start (replaying the winners)."""
        context = [list(ids) for ids in self.prompt_ids]
        for rnd in self.rounds:
            yield [list(ids) for ids in context]
            for k, score in enumerate(rnd.candidates[rnd.winner].scores):
                context[k] = context[k][: score.base] + score.ids


@dataclass
class Generation:
    text: str
    stats: Stats
    ids: list[list[int]] = field(default_factory=list)  # per model: the output's token ids in its vocabulary
    trace: Trace | None = None

    def to_dict(self) -> dict:
        return asdict(self)
