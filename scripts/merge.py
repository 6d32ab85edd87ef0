"""Write a run's metrics.json from the predictions its shards wrote, once every example has one;
otherwise say which examples are missing (exit status 1).

    python scripts/merge.py results/nq/adafuse/tiny/default

Every shard does this when it finishes; this script is for a run whose last shard failed, or to
check a run while its jobs are still queued.
"""

import argparse
import logging
import sys
from pathlib import Path

from adafuse.errors import AdaFuseError
from conf.schema import register
from eval.runner import merge

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path, help="a run directory: results/<task>/<method>/<model_pair>/<run_id>")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if not (args.run_dir / "config.yaml").is_file():
        print(f"{args.run_dir} is not a run directory (no config.yaml)", file=sys.stderr)
        return 2
    register()
    try:
        metrics = merge(args.run_dir)
    except AdaFuseError as err:
        print(f"{type(err).__name__}: {err}", file=sys.stderr)
        return 2
    if metrics is None:
        return 1
    print(f"wrote {args.run_dir / 'metrics.json'}: n={metrics['n']}, {metrics['metrics']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
