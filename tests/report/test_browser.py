"""The report page in a real browser: Debian's Chromium, headless, driven by Playwright, opening the
page from file:// as a reader would. CI installs the browser (.ci/run); elsewhere without it these
tests skip, but under CI=true they fail instead (tests/conftest.py `require`)."""

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from eval.report import ReportRun, open_run, pair_counts, query_of, write_report
from eval.report.browser import CHROMIUM, chromium
from tests.support.paths import ROOT

GRID = ROOT / "results" / "grid"
NQ_ADAFUSE, NQ_GEMMA = GRID / "nq/adafuse/tiny/default", GRID / "nq/single/tiny/method.member=1"


@pytest.fixture(scope="module")
def browser(require):
    require(importlib.util.find_spec("playwright") is not None, "playwright is not installed (the test extra)")
    require(
        shutil.which(CHROMIUM) is not None,
        f"no Chromium at {CHROMIUM} (apt-get install chromium or set ADAFUSE_CHROMIUM)",
    )
    with chromium() as opened:
        yield opened


class Page:
    """A report opened from file://, with every console error and uncaught exception it raised."""

    def __init__(self, browser, path: Path):
        self.errors = []
        self.fetched = []  # anything but the file itself: the page must need no network
        self.page = browser.new_page()
        self.page.route("**/*", self.only_the_file)
        self.page.on("console", lambda msg: self.errors.append(msg.text) if msg.type == "error" else None)
        self.page.on("pageerror", lambda err: self.errors.append(str(err)))
        self.page.goto(path.resolve().as_uri())
        self.page.wait_for_selector("body[data-ready=true]")

    def only_the_file(self, route):
        if route.request.url == self.page.url or route.request.url.startswith("file://"):
            route.continue_()
        else:
            self.fetched.append(route.request.url)
            route.abort()

    def shown(self) -> int:
        """How many examples the table says pass the filters; checked against the rows drawn."""
        count = int(self.page.get_attribute("#shown", "data-count"))
        assert self.page.locator("tr.example").count() == min(count, 200)
        return count


@pytest.fixture(scope="module")
def grid_page(browser, tmp_path_factory):
    out = write_report([NQ_ADAFUSE, NQ_GEMMA], tmp_path_factory.mktemp("report") / "nq.html", resamples=100)
    page = Page(browser, out)
    yield page
    page.page.close()


def test_opens_from_file_without_errors(grid_page):
    assert grid_page.page.url.startswith("file://")
    assert grid_page.errors == [] and grid_page.fetched == []
    assert grid_page.shown() == 100
    assert grid_page.page.locator("#runs-table tbody tr").count() == 2
    # Neither committed run has a trace: the page gives the command that makes one.
    notes = grid_page.page.locator("p.notrace code").all_inner_texts()
    assert len(notes) == 2 and all("trace=true" in n and "task.limit=100" in n for n in notes)


def test_side_by_side_counts_match_python(grid_page):
    a, b = ReportRun(open_run(NQ_ADAFUSE)), ReportRun(open_run(NQ_GEMMA))
    expected = pair_counts(a, b)
    page = grid_page.page
    for key in ("shared", "a_better", "b_better", "tie", "differ"):
        assert int(page.inner_text(f"#count-{key}")) == expected[key], key
    for key in ("a_better", "b_better", "differ"):
        page.click(f"#filter-{key}")
        assert grid_page.shown() == expected[key]
        page.click(f"#filter-{key}")  # off again
        assert grid_page.shown() == expected["shared"]
    # Swapping A and B swaps the counts.
    page.select_option("#run-a", "1")
    page.select_option("#run-b", "0")
    assert int(page.inner_text("#count-a_better")) == expected["b_better"]
    assert int(page.inner_text("#count-b_better")) == expected["a_better"]
    page.select_option("#run-a", "0")
    page.select_option("#run-b", "1")
    assert grid_page.errors == []


def test_table_filters(grid_page):
    a = ReportRun(open_run(NQ_ADAFUSE))
    page = grid_page.page
    right = sum(a.score(i) == 1 for i in a.run.ids)
    page.select_option("#outcome", "right")
    assert grid_page.shown() == right > 0
    page.select_option("#outcome", "wrong")
    assert grid_page.shown() == len(a.run.ids) - right
    page.select_option("#outcome", "all")
    # Text search over ids, questions, references and both runs' predictions, ignoring case.
    gemma = ReportRun(open_run(NQ_GEMMA))
    word = a.run.records[0]["references"][0].split()[0].lower()
    hits = sum(
        word
        in "\n".join(
            [r["id"], query_of(r["prompt"]), *r["references"], r["prediction"], gemma.by_id[r["id"]]["prediction"]]
        ).lower()
        for r in a.run.records
    )
    page.fill("#search", word.upper())
    assert grid_page.shown() == hits >= 1
    page.fill("#search", "")
    assert grid_page.shown() == 100
    assert grid_page.errors == []


def test_sorting_by_a_metric(grid_page):
    page = grid_page.page
    page.click("#table th:has-text('A em')")
    page.click("#table th:has-text('A em')")  # descending: right answers first
    a = ReportRun(open_run(NQ_ADAFUSE))
    first = page.get_attribute("tr.example >> nth=0", "data-id")
    assert a.score(first) == 1
    page.click("#table th:has-text('id')")


@pytest.mark.slow
def test_an_example_expands_to_its_rounds(browser, traced, tmp_path):
    out = write_report([traced["adafuse"], traced["single"]], tmp_path / "traced.html", resamples=100)
    page = Page(browser, out)
    run = open_run(traced["adafuse"])
    for record in run.records[:3]:
        page.page.click(f"tr.example[data-id='{record['id']}']")
        detail = page.page.locator(f"tr.detail[data-id='{record['id']}']")
        rounds = detail.locator("div.round")
        assert rounds.count() == len(record["trace"]["rounds"])
        for k, rnd in enumerate(record["trace"]["rounds"]):
            winner = rounds.nth(k).locator("tr.winner td >> nth=0").inner_text()
            assert winner.startswith(json.dumps(rnd["candidates"][rnd["winner"]]["text"], ensure_ascii=False))
        # The member's greedy steps are drawn too, one row per generated token.
        assert detail.locator("table tr.round").count() >= 1
        page.page.click(f"tr.example[data-id='{record['id']}']")  # closed again
        assert page.page.locator(f"tr.detail[data-id='{record['id']}']").count() == 0
    assert page.errors == []
    page.page.close()


@pytest.mark.slow
def test_every_traced_method_draws_its_steps(browser, traced, tmp_path):
    """Five runs side by side; opening an example draws each one's trace: a row per round or step."""
    methods = ["adafuse", "single", "unite", "sweetspan", "llm_blender"]
    out = write_report([traced[m] for m in methods], tmp_path / "all.html", resamples=100)
    page = Page(browser, out)
    first = open_run(traced["adafuse"]).ids[0]
    page.page.click(f"tr.example[data-id='{first}']")
    detail = page.page.locator(f"tr.detail[data-id='{first}']")
    drawn = [section.locator(".round").count() for section in detail.locator("div.trace").all()]
    expected = []
    for method in methods:
        trace = ReportRun(open_run(traced[method])).by_id[first]["trace"]
        expected.append(
            len(trace["rounds"])
            if method == "adafuse"
            else len(trace["steps"][0]["candidates"])
            if method == "llm_blender"
            else len(trace["steps"])
        )
    assert drawn == expected
    assert page.errors == []
    page.page.close()
