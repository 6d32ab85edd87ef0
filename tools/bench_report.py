"""How large a report of a full NQ run with traces is, and how fast it opens in headless Chromium.

    python -m tools.bench_report TRACED_RUN_DIR [--examples 3610] [--out results/bench/report.json]

TRACED_RUN_DIR is a run made with trace=true (e.g. `python run.py task.limit=6 trace=true`). Its records
are replicated, with new ids, into a run of --examples examples (NQ-open's test set: 3,610), once with
their traces and once without; each is written as a report and opened from file:// in headless
Chromium. Printed side by side, and written to --out: the file sizes, the seconds to build each report,
and the seconds from navigation until the page has drawn its tables (then to open one example's rounds).
"""

import argparse
import json
import platform
import shutil
import tempfile
import time
from pathlib import Path

from eval.report import open_run, write_report
from eval.report.browser import CHROMIUM, chromium  # noqa: E402


def replicate(source: Path, out: Path, examples: int, traces: bool) -> Path:
    """A run directory of `examples` records, copies of the source's in turn with ids nq-0, nq-1, ..."""
    run = open_run(source)
    out.mkdir(parents=True)
    shutil.copy(source / "config.yaml", out / "config.yaml")
    ids = [f"nq-{i}" for i in range(examples)]
    with open(out / "predictions.jsonl", "w") as f:
        for i, example_id in enumerate(ids):
            record = {**run.records[i % len(run.records)], "id": example_id}
            if not traces:
                record.pop("trace", None)
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    (out / "metrics.json").write_text(json.dumps({**run.metrics, "n": examples, "ids": ids}))
    return out


def open_in_chromium(page_path: Path) -> dict:
    with chromium() as browser:
        page = browser.new_page()
        errors = []
        page.on("pageerror", lambda err: errors.append(str(err)))
        page.goto(page_path.resolve().as_uri())
        page.wait_for_selector("body[data-ready=true]", timeout=120_000)
        ready = page.evaluate("performance.now()") / 1000  # since navigation started
        start = time.perf_counter()
        page.click("tr.example >> nth=0")
        page.wait_for_selector("tr.detail")
        expand = time.perf_counter() - start
    if errors:
        raise SystemExit(f"{page_path}: the page raised {errors}")
    return {"load_seconds": ready, "expand_seconds": expand}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("traced_run", type=Path)
    parser.add_argument("--examples", type=int, default=3610)
    parser.add_argument("--out", type=Path, default=Path("results/bench/report.json"))
    args = parser.parse_args()
    if not any("trace" in r for r in open_run(args.traced_run).records):
        raise SystemExit(f"{args.traced_run} has no traces: make it with trace=true")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, traces in (("with traces", True), ("without traces", False)):
            run = replicate(args.traced_run, Path(tmp) / label.replace(" ", "_"), args.examples, traces)
            start = time.perf_counter()
            page = write_report([run], Path(tmp) / f"{run.name}.html")
            build = time.perf_counter() - start
            results[label] = {"bytes": page.stat().st_size, "build_seconds": build, **open_in_chromium(page)}
    print(f"{args.examples} examples          {'with traces':>14} {'without':>10} {'ratio':>6}")
    traced, plain = results["with traces"], results["without traces"]
    for key in ("bytes", "build_seconds", "load_seconds", "expand_seconds"):
        print(f"{key:24} {traced[key]:14.3g} {plain[key]:10.3g} {traced[key] / plain[key]:6.2f}")
    report = {
        "examples": args.examples,
        "source": str(args.traced_run),
        "chromium": CHROMIUM,
        "machine": platform.platform(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
