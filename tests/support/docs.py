"""The fenced blocks of a docs page and the marker before each (`<!-- check: compose -->`, `<!-- runnable -->`), as
tests/integration/test_docs.py checks them and tests/integration/test_your_own.py runs a page's commands."""

import re
from pathlib import Path

FENCE = re.compile(r"^(?:<!-- (?P<marker>[^>]*?) -->\n)?```(?P<lang>\w*)\n(?P<body>.*?)^```$", re.DOTALL | re.MULTILINE)


def blocks(page: Path, marker: str) -> list[tuple[int, str]]:
    """(line number of the block's first line, body) of every fenced block that follows `<!-- marker -->`."""
    text = page.read_text()
    found = []
    for match in FENCE.finditer(text):
        if match["marker"] == marker:
            found.append((text.count("\n", 0, match.start("body")) + 1, match["body"]))
    return found
