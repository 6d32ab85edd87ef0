"""Draw one AdaFuse round as an SVG for the README (docs/img/round.svg).

    python -m tools.draw_round            # rewrite docs/img/round.svg
    python -m tools.draw_round --check    # exit 1 if the committed figure differs from what this draws

The figure is drawn from the data below, not by hand, so it stays true to spec §3-§4: each model
commits words while its margin Δ = p1 - p2 is at least τΔ (at most M words), branches into its B best
first tokens at the first uncertain word, the pool merges equal texts, every model scores every
candidate by mean token NLL in its own tokenisation, and the lowest mean wins. The numbers are
illustrative.
"""

import argparse
import sys
from dataclasses import dataclass
from html import escape
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "docs" / "img" / "round.svg"
TAU, MAX_WORDS, BRANCHES = 0.7, 3, 3


@dataclass
class Step:
    word: str
    margin: float


@dataclass
class Proposer:
    name: str
    tokenizer: str
    confident: list[Step]  # words committed with margin >= TAU
    uncertain_margin: float  # margin at the first uncertain word
    branches: list[str]  # the B words grown from the B best first tokens


PROPOSERS = [
    Proposer("SmolLM2-135M", "byte-level BPE", [Step(" William", 0.91)], 0.38, [" Shakespeare", " Blake", " Morris"]),
    Proposer("Gemma-3-270M", "SentencePiece", [], 0.44, [" William", " Shakespeare", " The"]),
]
# Mean token NLL of each pooled candidate, in each model's own tokens (SmolLM2, Gemma-3).
SCORES = {
    " William Shakespeare": (0.42, 0.55),
    " William Blake": (2.10, 2.64),
    " William Morris": (2.71, 3.05),
    " William": (1.35, 0.97),
    " Shakespeare": (0.88, 1.12),
    " The": (3.90, 2.48),
}
PROMPT = "Question: Who wrote Hamlet?\\nAnswer:"

FONT = "font-family='DejaVu Sans Mono, Menlo, Consolas, monospace'"
INK, MUTED, ACCENT, WIN = "#1f2328", "#57606a", "#0969da", "#1a7f37"


def candidates(p: Proposer) -> list[str]:
    """Spec §3: the committed words followed by each branch word (or the committed words alone after M)."""
    prefix = "".join(s.word for s in p.confident)
    if len(p.confident) == MAX_WORDS:
        return [prefix]
    return [prefix + b for b in p.branches[:BRANCHES]]


def pool() -> list[str]:
    """Spec §4: the union of the candidates, equal texts merged, in model order then branch rank."""
    seen: list[str] = []
    for p in PROPOSERS:
        seen += [c for c in candidates(p) if c not in seen]
    return seen


def text(x, y, s, size=13, fill=INK, weight="normal", anchor="start") -> str:
    return (
        f"<text x='{x}' y='{y}' {FONT} font-size='{size}' fill='{fill}' font-weight='{weight}' "
        f"text-anchor='{anchor}' xml:space='preserve'>{escape(s)}</text>"
    )


def box(x, y, w, h, stroke=MUTED, fill="#ffffff", width=1.2) -> str:
    return (
        f"<rect x='{x}' y='{y}' width='{w}' height='{h}' rx='6' "
        f"fill='{fill}' stroke='{stroke}' stroke-width='{width}'/>"
    )


def arrow(x1, y1, x2, y2) -> str:
    return (
        f"<line x1='{x1}' y1='{y1}' x2='{x2}' y2='{y2}' stroke='{MUTED}' stroke-width='1.4' marker-end='url(#head)'/>"
    )


def draw() -> str:
    names = pool()
    fused = {c: sum(SCORES[c]) / len(SCORES[c]) for c in names}
    winner = min(names, key=lambda c: (fused[c], names.index(c)))  # ties: earliest in pool order
    parts = [
        "<defs><marker id='head' markerWidth='8' markerHeight='8' refX='7' refY='4' orient='auto'>"
        f"<path d='M0,0 L8,4 L0,8 z' fill='{MUTED}'/></marker></defs>",
        "<rect width='100%' height='100%' fill='#ffffff'/>",
        text(20, 28, "One AdaFuse round", 16, weight="bold"),
        text(20, 48, f"τΔ = {TAU}, M = {MAX_WORDS} words, B = {BRANCHES} branches (illustrative numbers)", 12, MUTED),
        box(20, 62, 440, 34, ACCENT, "#f6f8fa"),
        text(32, 84, f"shared text G: {PROMPT}", 13),
    ]
    px, pw = 490, 450
    # 1. Proposals, one panel per model.
    y = 116
    for p in PROPOSERS:
        height = 36 + 18 * (len(p.confident) + 1) + 18 * len(candidates(p))
        parts.append(box(20, y, 420, height))
        parts.append(text(32, y + 20, f"{p.name} ({p.tokenizer}) proposes", 13, weight="bold"))
        line = y + 40
        for s in p.confident:
            parts.append(text(40, line, f"Δ = {s.margin:.2f} ≥ τΔ: commit {s.word!r}", 12, MUTED))
            line += 18
        branching = f"Δ = {p.uncertain_margin:.2f} < τΔ: branch into its {BRANCHES} best first tokens"
        parts.append(text(40, line, branching, 12, MUTED))
        line += 18
        for c in candidates(p):
            parts.append(text(56, line, repr(c), 12, ACCENT))
            line += 18
        parts.append(arrow(440, y + height / 2, px - 4, y + height / 2))
        y += height + 14
    bottom_left = y - 14
    # 2. The pool, scored by every model in its own tokens; 3. the lowest mean wins.
    parts.append(box(px, 62, pw, 80 + 22 * len(names), ACCENT))
    parts.append(text(px + 12, 84, "pool: every model scores every candidate", 13, weight="bold"))
    parts.append(text(px + 12, 102, "mean token NLL, each in its own tokenisation", 12, MUTED))
    head = 126
    for col, label in ((px + 12, "candidate"), (px + 228, "SmolLM2"), (px + 310, "Gemma-3"), (px + 392, "mean")):
        parts.append(text(col, head, label, 12, MUTED, "bold"))
    row = head + 22
    for c in names:
        won = c == winner
        colour = WIN if won else INK
        weight = "bold" if won else "normal"
        smol, gemma = SCORES[c]
        parts.append(text(px + 12, row, repr(c), 12, colour, weight))
        parts.append(text(px + 228, row, f"{smol:.2f}", 12, colour, weight))
        parts.append(text(px + 310, row, f"{gemma:.2f}", 12, colour, weight))
        parts.append(text(px + 392, row, f"{fused[c]:.2f}", 12, colour, weight))
        row += 22
    result_y = row + 24
    parts.append(arrow(px + pw / 2, row - 8, px + pw / 2, result_y))
    parts.append(box(px, result_y, pw, 56, WIN, "#f0fff4"))
    parts.append(text(px + 12, result_y + 22, f"lowest mean wins: {winner!r}", 13, WIN, "bold"))
    parts.append(text(px + 12, result_y + 42, "appended to G verbatim; every model keeps its KV cache", 12, MUTED))
    height = max(bottom_left, result_y + 56) + 20
    return (
        f"<svg xmlns='http://www.w3.org/2000/svg' width='960' height='{height:.0f}' "
        f"viewBox='0 0 960 {height:.0f}'>\n" + "\n".join(parts) + "\n</svg>\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare with the committed figure instead of writing")
    args = parser.parse_args(argv)
    svg = draw()
    if args.check:
        same = OUT.is_file() and OUT.read_text() == svg
        print(f"{OUT}: {'up to date' if same else 'out of date: run python -m tools.draw_round'}")
        return 0 if same else 1
    OUT.write_text(svg)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
