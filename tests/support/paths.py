"""Where the checkout and the benchmark data are: the repository root, and the data folder as runs find it
(`$ADAFUSE_DATA_DIR`, else `../shared/data` beside the checkout: eval/tasks.py `resolve_data_dir`). Light on
purpose: conftest imports it in xdist's controller, which imports no torch."""

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHARED_DATA = Path(os.environ.get("ADAFUSE_DATA_DIR") or ROOT.parent / "shared" / "data")
