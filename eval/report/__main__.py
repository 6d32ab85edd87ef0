"""python -m eval.report RUN_DIR [RUN_DIR ...] -o report.html: one run's report, or runs side by side."""

import argparse
import sys
import tempfile
from pathlib import Path

from adafuse.errors import AdaFuseError, ConfigError
from eval.bootstrap import RESAMPLES
from eval.report import write_report
from eval.report.browser import screenshot


def check_writable(output: Path) -> None:
    """ConfigError, before any work, if the report cannot be written to `output`; creates nothing."""
    folder = output.parent
    if output.is_dir():
        raise ConfigError(f"-o {output} is a folder; name the HTML file to write, e.g. -o {output / 'report.html'}")
    if not folder.is_dir():
        raise ConfigError(f"-o {output}: the folder {folder} does not exist; create it or choose another -o")
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        raise ConfigError(f"-o {output}: cannot write in {folder} ({err.strerror}); choose another -o") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eval.report", description=__doc__)
    parser.add_argument("runs", nargs="+", type=Path, help="run directories (results/<task>/<method>/<pair>/<run_id>)")
    parser.add_argument("-o", "--output", type=Path, default=Path("report.html"), help="the HTML file to write")
    parser.add_argument(
        "--resamples", type=int, default=RESAMPLES, help="bootstrap resamples of each metric (default %(default)s)"
    )
    parser.add_argument("--screenshot", type=Path, help="also a PNG of the page's top, by headless Chromium")
    args = parser.parse_args(argv)
    if args.resamples < 2:
        parser.error("a standard error needs at least 2 resamples")
    try:
        check_writable(args.output)
        out = write_report(args.runs, args.output, resamples=args.resamples)
    except AdaFuseError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"{out} ({out.stat().st_size / 1e6:.1f} MB)")
    if args.screenshot:
        print(screenshot(out, args.screenshot))
    return 0


if __name__ == "__main__":
    sys.exit(main())
