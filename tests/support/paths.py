"""Where the checkout and the benchmark data are: the repository root, and the data beside the checkout
(`../shared/data`, or $ADAFUSE_SHARED_DATA). Light on purpose: conftest imports it in xdist's controller,
which imports no torch."""

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHARED_DATA = Path(os.environ.get("ADAFUSE_SHARED_DATA", ROOT.parent / "shared" / "data"))
