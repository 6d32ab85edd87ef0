"use strict";
// The report page: reads the payload (eval/report/__init__.py) and draws the runs, the comparison and the
// example table. Rows are drawn a page at a time and an example's trace only when it is opened, so that a
// run of thousands of examples opens at once.

const DATA = JSON.parse(document.getElementById("data").textContent);
const RUNS = DATA.runs;
const EXAMPLES = DATA.examples;
const PAGE_ROWS = 200;
const state = { search: "", outcome: "all", a: 0, b: Math.min(1, RUNS.length - 1), sort: null, desc: false, rows: PAGE_ROWS };
const opened = new Set();

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  for (const child of children.flat()) {
    if (child !== null && child !== undefined) node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function fmt(value, digits = 2) {
  if (typeof value === "number") return Number.isInteger(value) ? String(value) : value.toFixed(digits);
  if (Array.isArray(value)) return value.map((v) => fmt(v, digits)).join(" / ");
  return value === null || value === undefined ? "–" : String(value);  // "inf", "nan" arrive as strings
}

// Text as a string literal, so that spaces and newlines inside a candidate are visible.
function literal(text) {
  return el("span", { class: "tok" }, JSON.stringify(text));
}

function score(example, r) {
  const mine = example.runs[r];
  return mine ? mine.scores[RUNS[r].primary] : null;
}

// The mean per-example primary score of each run: "above mean" is the right/wrong of a continuous metric.
const MEANS = RUNS.map((run, r) => {
  const values = EXAMPLES.map((ex) => score(ex, r)).filter((v) => v !== null);
  return values.reduce((s, v) => s + v, 0) / Math.max(values.length, 1);
});

function isRight(example, r) {
  const value = score(example, r);
  if (value === null) return null;
  return RUNS[r].binary ? value === 1 : value > MEANS[r];
}

function pairOutcome(example, a, b) {
  const sa = score(example, a), sb = score(example, b);
  if (sa === null || sb === null) return null;
  return sa > sb ? "a_better" : sb > sa ? "b_better" : "tie";
}

function runName(r) {
  return String.fromCharCode(65 + r);  // A, B, C, ...
}

// ---- runs ------------------------------------------------------------------------------------------------

function drawRuns() {
  document.getElementById("title").textContent =
    `${RUNS[0].task}: ${RUNS.length === 1 ? RUNS[0].label : RUNS.length + " runs side by side"}`;
  const section = document.getElementById("runs");
  const metricNames = [...new Set(RUNS.flatMap((run) => Object.keys(run.metrics)))];
  const head = el("tr", {}, el("th", { text: "run" }), el("th", { text: "settings" }), el("th", { text: "n" }),
    metricNames.map((name) => el("th", { text: name + " ± SE" })),
    el("th", { text: "s / example" }), el("th", { text: "tokens / s" }), el("th", { text: "forward passes" }),
    el("th", { text: "rounds / example" }), el("th", { text: "words per round" }));
  const rows = RUNS.map((run, r) => {
    const knobs = Object.entries(run.method).map(([k, v]) => `${k}=${fmt(v)}`).join(" ");
    const t = run.throughput;
    const words = Object.entries(run.words_per_round).map(([w, share]) => `${w}: ${(100 * share).toFixed(0)}%`).join(", ");
    return el("tr", { "data-run": r },
      el("td", {}, el("b", { text: runName(r) + " " }), run.label),
      el("td", {}, el("code", { text: knobs }), el("div", { class: "note" },
        `models ${run.models.join(", ")} · protocol ${run.protocol} · primary ${run.primary} · ${run.created || ""} · ${run.git_sha ? run.git_sha.slice(0, 10) : ""}`),
        el("div", { class: "note" }, run.path)),
      el("td", { class: "num", text: run.n }),
      metricNames.map((name) => {
        const m = run.metrics[name];
        return el("td", { class: "num", title: m ? `bootstrap over examples, ${m.resamples} resamples` : "", text: m ? `${fmt(m.value)} ± ${fmt(m.se)}` : "" });
      }),
      el("td", { class: "num", text: fmt(t.seconds_per_example) }),
      el("td", { class: "num", text: fmt(t.generated_tokens_per_second) }),
      el("td", { class: "num", text: fmt(t.forward_passes) }),
      el("td", { class: "num", text: fmt(t.rounds_per_example) }),
      el("td", { text: words }));
  });
  const resamples = [...new Set(RUNS.flatMap((run) => Object.values(run.metrics).map((m) => m.resamples)))].filter(Boolean);
  section.append(el("h2", { text: "Runs" }), el("table", { id: "runs-table" }, el("thead", {}, head), el("tbody", {}, rows)),
    el("p", { class: "note", text: `± : the bootstrap standard error over examples (${resamples.join(" or ")} resamples; hover a value for its own). Throughput per model where two numbers are given.` }));
  RUNS.forEach((run, r) => {
    if (!run.has_trace) {
      section.append(el("p", { class: "note notrace", "data-run": r },
        `Run ${runName(r)} has no trace: rounds are not shown. Rerun it with trace=true (it writes beside it, in a run directory whose name ends in trace=True): `,
        el("code", { class: "cmd", text: run.trace_command })));
    }
  });
}

// ---- comparison ------------------------------------------------------------------------------------------

function pairLabels() {
  const a = runName(state.a), b = runName(state.b);
  const binary = RUNS[state.a].binary && RUNS[state.b].binary;
  return {
    a_better: binary ? `${a} right, ${b} wrong` : `${a} scores higher`,
    b_better: binary ? `${b} right, ${a} wrong` : `${b} scores higher`,
    tie: binary ? "both right or both wrong" : "equal scores",
    differ: "predictions differ",
  };
}

function drawCompare() {
  if (RUNS.length < 2) return;
  const section = document.getElementById("compare");
  section.hidden = false;
  section.replaceChildren();
  const chooser = (id, key) => el("select", { id, onchange: (e) => { state[key] = Number(e.target.value); update(); } },
    RUNS.map((run, r) => {
      const option = el("option", { value: r, text: `${runName(r)}: ${run.label}` });
      if (r === state[key]) option.selected = true;
      return option;
    }));
  const counts = { shared: 0, a_better: 0, b_better: 0, tie: 0, differ: 0 };
  for (const ex of EXAMPLES) {
    const outcome = pairOutcome(ex, state.a, state.b);
    if (outcome === null) continue;
    counts.shared += 1;
    counts[outcome] += 1;
    if (ex.runs[state.a].prediction !== ex.runs[state.b].prediction) counts.differ += 1;
  }
  const labels = pairLabels();
  const buttons = ["a_better", "b_better", "tie", "differ"].map((key) =>
    el("button", { id: `filter-${key}`, class: state.outcome === key ? "active" : "",
      onclick: () => { state.outcome = state.outcome === key ? "all" : key; update(); } },
      `${labels[key]}: `, el("b", { id: `count-${key}`, text: counts[key] })));
  section.append(el("h2", { text: "Side by side" }),
    el("div", {}, "A = ", chooser("run-a", "a"), " B = ", chooser("run-b", "b"),
      el("span", { class: "note" }, ` on the ${counts.shared} examples both scored (`, el("span", { id: "count-shared", text: counts.shared }), ")")),
    el("div", { class: "counts" }, buttons));
}

// ---- example table ---------------------------------------------------------------------------------------

function outcomeOptions() {
  const select = document.getElementById("outcome");
  const a = runName(state.a);
  const options = [["all", "all examples"],
    ["right", RUNS[state.a].binary ? `${a} right` : `${a} above its mean`],
    ["wrong", RUNS[state.a].binary ? `${a} wrong` : `${a} at or below its mean`]];
  if (RUNS.length > 1) Object.entries(pairLabels()).forEach(([key, label]) => options.push([key, label]));
  select.replaceChildren(...options.map(([value, label]) => {
    const option = el("option", { value, text: label });
    if (value === state.outcome) option.selected = true;
    return option;
  }));
}

const haystacks = new Map();
function haystack(example) {
  if (!haystacks.has(example.id)) {
    const predictions = example.runs.map((mine) => (mine ? mine.prediction : ""));
    haystacks.set(example.id, [example.id, example.query, ...example.references, ...predictions].join("\n").toLowerCase());
  }
  return haystacks.get(example.id);
}

function keep(example) {
  const outcome = state.outcome;
  if (outcome === "right" || outcome === "wrong") {
    if (isRight(example, state.a) !== (outcome === "right")) return false;
  } else if (outcome === "differ") {
    const a = example.runs[state.a], b = example.runs[state.b];
    if (!a || !b || a.prediction === b.prediction) return false;
  } else if (outcome !== "all" && pairOutcome(example, state.a, state.b) !== outcome) {
    return false;
  }
  return !state.search || haystack(example).includes(state.search);
}

function columns() {
  const cols = [{ title: "id", key: (ex) => ex.id, cell: (ex) => ex.id },
    { title: "question", key: (ex) => ex.query, cell: (ex) => el("span", { class: "pred" }, ex.query) }];
  RUNS.forEach((run, r) => cols.push({
    title: `${runName(r)} prediction`, key: (ex) => (ex.runs[r] ? ex.runs[r].prediction : ""),
    cell: (ex) => prediction(ex, r) }));
  cols.push({ title: "references", key: (ex) => ex.references.join(" | "), cell: (ex) => ex.references.join(" | ") });
  RUNS.forEach((run, r) => Object.keys(run.metrics).forEach((name) => cols.push({
    title: `${runName(r)} ${name}`, numeric: true,
    key: (ex) => (ex.runs[r] && name in ex.runs[r].scores ? ex.runs[r].scores[name] : -Infinity),
    cell: (ex) => {
      const mine = ex.runs[r];
      if (!mine || !(name in mine.scores)) return "–";
      const value = mine.scores[name];
      return el("span", { class: name === run.primary ? (isRight(ex, r) ? "right" : "wrong") : "" }, fmt(value));
    } })));
  return cols;
}

// Words of run r's prediction that differ from the other compared run's (A against B, the others against A).
function prediction(example, r) {
  const mine = example.runs[r];
  if (!mine) return el("span", { class: "note", text: "not scored" });
  const other = RUNS.length > 1 ? example.runs[r === state.a ? state.b : state.a] : null;
  if (!other || other === mine) return el("span", { class: "pred" }, mine.prediction);
  const words = mine.prediction.split(/(\s+)/), theirs = other.prediction.split(/(\s+)/);
  const same = commonWords(words, theirs);
  return el("span", { class: "pred" }, words.map((w, i) => (same.has(i) || !w.trim() ? w : el("mark", { class: "diff" }, w))));
}

// Positions in `a` of a longest common subsequence with `b`.
function commonWords(a, b) {
  const n = a.length, m = b.length;
  const table = Array.from({ length: n + 1 }, () => new Int32Array(m + 1));
  for (let i = n - 1; i >= 0; i--)
    for (let j = m - 1; j >= 0; j--)
      table[i][j] = a[i] === b[j] ? table[i + 1][j + 1] + 1 : Math.max(table[i + 1][j], table[i][j + 1]);
  const keep = new Set();
  for (let i = 0, j = 0; i < n && j < m;) {
    if (a[i] === b[j]) { keep.add(i); i++; j++; } else if (table[i + 1][j] >= table[i][j + 1]) i++; else j++;
  }
  return keep;
}

function drawTable() {
  const cols = columns();
  const table = document.getElementById("table");
  table.tHead.replaceChildren(el("tr", {}, cols.map((col, c) => el("th", {
    class: state.sort === c ? (state.desc ? "sorted-down" : "sorted-up") : "",
    onclick: () => { state.desc = state.sort === c ? !state.desc : false; state.sort = c; drawTable(); } }, col.title))));
  let rows = EXAMPLES.filter(keep);
  if (state.sort !== null) {
    const key = cols[state.sort].key, sign = state.desc ? -1 : 1;
    rows = rows.map((ex) => [key(ex), ex]).sort((x, y) => sign * (x[0] < y[0] ? -1 : x[0] > y[0] ? 1 : 0)).map((p) => p[1]);
  }
  const body = [];
  for (const ex of rows.slice(0, state.rows)) {
    body.push(el("tr", { class: "example", "data-id": ex.id, onclick: (e) => toggle(ex, e.currentTarget, cols.length) }, cols.map((col) => el("td", { class: col.numeric ? "num" : "text" }, col.cell(ex)))));
    if (opened.has(ex.id)) body.push(detailRow(ex, cols.length));
  }
  table.tBodies[0].replaceChildren(...body);
  document.getElementById("shown").textContent = `${rows.length} of ${EXAMPLES.length} examples`;
  document.getElementById("shown").dataset.count = rows.length;
  const more = document.getElementById("more");
  more.hidden = rows.length <= state.rows;
  more.textContent = `show ${Math.min(PAGE_ROWS, rows.length - state.rows)} more of ${rows.length - state.rows}`;
}

// Opening or closing one example touches its own detail row only, not the rows drawn around it.
function toggle(example, row, width) {
  if (opened.has(example.id)) {
    opened.delete(example.id);
    row.nextElementSibling.remove();
  } else {
    opened.add(example.id);
    row.after(detailRow(example, width));
  }
}

// ---- one example -----------------------------------------------------------------------------------------

function detailRow(example, width) {
  const cell = el("td", { colspan: width });
  cell.append(el("details", { class: "prompt" }, el("summary", { text: "prompt" }), el("pre", { text: DATA.prompt_prefix + example.prompt })));
  example.runs.forEach((mine, r) => {
    const run = RUNS[r];
    cell.append(el("h3", {}, `${runName(r)}: ${run.label}`));
    if (!mine) { cell.append(el("p", { class: "note", text: "this run did not score this example" })); return; }
    cell.append(el("div", {}, "prediction ", literal(mine.prediction), " · answer ", literal(mine.answer),
      ` · ${Object.entries(mine.scores).map(([k, v]) => `${k} ${fmt(v)}`).join(", ")}`,
      ` · stop: ${mine.stop} · ${mine.rounds} rounds · ${fmt(mine.seconds)} s`));
    if (!mine.trace) {
      cell.append(el("p", { class: "note" }, "No trace for this example. This command decodes it again with one (and the examples before it): ",
        el("code", { class: "cmd", text: mine.trace_command })));
      return;
    }
    cell.append(drawTrace(mine.trace, run));
  });
  return el("tr", { class: "detail", "data-id": example.id }, cell);
}

function drawTrace(trace, run) {
  const draw = { adafuse: adafuseRounds, sweetspan: spanRounds, unite: uniteSteps, deepen: deepenSteps,
    single: greedySteps, llm_blender: blenderRanking }[trace.kind];
  return el("div", { class: "trace", "data-kind": trace.kind },
    draw ? draw(trace, run) : el("pre", { text: JSON.stringify(trace.steps, null, 1) }));
}

// A table of candidates: each model's NLL on a shaded scale (darker: lower, more likely), the fused score, the winner.
function poolTable(pool, winner, run, extra) {
  const all = pool.flatMap((c) => c.nll).filter((v) => typeof v === "number");
  const lo = Math.min(...all), hi = Math.max(...all);
  const shade = (v) => (typeof v === "number" && hi > lo ? `background: rgba(52, 104, 216, ${(0.45 * (hi - v) / (hi - lo)).toFixed(2)})` : "");
  const head = el("tr", {}, el("th", { text: "candidate" }), el("th", { text: "proposed by" }),
    run.models.map((name) => el("th", { text: `NLL ${name}` })), el("th", { text: "fused" }), extra ? el("th", { text: extra.title }) : null);
  const rows = pool.map((c, j) => el("tr", { class: j === winner ? "winner" : "", "data-candidate": j },
    el("td", {}, literal(c.text), c.eos ? " ⟨eos⟩" : ""),
    el("td", { text: c.proposers.map((k) => run.models[k]).join(", ") }),
    c.nll.map((v, k) => el("td", { class: "nll", style: shade(v) }, fmt(v, 3), c.tokens ? el("span", { class: "note" }, ` (${c.tokens[k]} tok)`) : null)),
    el("td", { class: "nll", text: fmt(c.fused, 3) }), extra ? el("td", { text: extra.cell(c) }) : null));
  return el("table", { class: "heat" }, el("thead", {}, head), el("tbody", {}, rows));
}

function adafuseRounds(trace, run) {
  return el("div", { class: "rounds" }, trace.rounds.map((rnd) => {
    const proposals = el("table", {}, el("thead", {}, el("tr", {}, ["model", "committed words", `first-token margins (τ = ${fmt(run.tau)})`, "ended", "its branches"].map((t) => el("th", { text: t })))),
      el("tbody", {}, rnd.models.map((m, k) => el("tr", {},
        el("td", { text: run.models[k] }),
        el("td", {}, m.committed.map(literal)),
        el("td", {}, m.margins.map((v) => el("span", { class: run.tau !== null && v >= run.tau ? "margin-ok" : "margin-low", text: fmt(v) + " " }))),
        el("td", { text: m.branched ? "branched" : "stopped" }),
        el("td", {}, m.proposed.map((j) => literal(rnd.pool[j].text)))))));
    const ending = [el("div", {}, "appended ", literal(rnd.appended))];
    if (rnd.cut) ending.push(el("div", { class: "note" }, "cut by the stop: ", literal(rnd.cut)));
    if (rnd.stop) ending.push(el("div", { class: "note", text: `decoding ended here: ${rnd.stop}` }));
    return el("div", { class: "round", "data-round": rnd.round, "data-winner": rnd.winner },
      el("h4", { text: `round ${rnd.round}` }), proposals, poolTable(rnd.pool, rnd.winner, run), ending);
  }));
}

function spanRounds(trace, run) {
  return el("div", { class: "rounds" }, trace.rounds.map((rnd) => el("div", { class: "round", "data-round": rnd.round, "data-winner": rnd.winner },
    el("h4", { text: `round ${rnd.round}` }),
    poolTable(rnd.pool, rnd.winner, run, { title: "kept by the filter", cell: (c) => c.kept.map((k) => run.models[k]).join(", ") }))));
}

function uniteSteps(trace, run) {
  const rows = trace.steps.map((step, s) => {
    const order = step.fused.map((v, j) => j).sort((x, y) => step.fused[y] - step.fused[x]).slice(0, 5);
    return el("tr", { class: "round", "data-round": s, "data-winner": step.winner },
      el("td", { text: s }), el("td", { class: "winner" }, literal(step.union[step.winner] === null ? "<eos>" : step.union[step.winner])),
      el("td", {}, order.map((j) => el("span", { class: j === step.winner ? "winner" : "" },
        literal(step.union[j] === null ? "<eos>" : step.union[j]), ` ${fmt(step.fused[j], 3)} (${step.values.map((v) => fmt(v[j], 3)).join(" / ")})  `))));
  });
  return el("table", {}, el("thead", {}, el("tr", {}, ["step", "chosen", `top of the union: fused (${run.models.join(" / ")})`].map((t) => el("th", { text: t })))), el("tbody", {}, rows));
}

function deepenSteps(trace, run) {
  const rows = trace.steps.map((step, s) => el("tr", { class: "round", "data-round": s },
    el("td", { text: s }), el("td", { text: step.argmax.join(" / ") }), el("td", { text: step.token }),
    el("td", { text: step.fused ? "fused" : "skipped" }), el("td", { text: step.loss.length ? `${step.loss[0].toPrecision(3)} → ${step.loss[1].toPrecision(3)}` : "" })));
  return el("table", {}, el("thead", {}, el("tr", {}, ["step", `argmax ids (${run.models.join(" / ")})`, "chosen id", "ensemble", "loss first → last"].map((t) => el("th", { text: t })))), el("tbody", {}, rows));
}

function greedySteps(trace) {
  const rows = trace.steps.map((step, s) => el("tr", { class: "round", "data-round": s },
    el("td", { text: s }), el("td", {}, literal(step.text)), el("td", { text: step.token }), el("td", { class: "num", text: fmt(step.logprob, 3) })));
  return el("table", {}, el("thead", {}, el("tr", {}, ["step", "text", "id", "log-probability"].map((t) => el("th", { text: t })))), el("tbody", {}, rows));
}

function blenderRanking(trace, run) {
  const ranking = trace.ranking;
  const chosenText = ranking.answers[ranking.chosen];
  const rows = ranking.candidates.map((text, j) => el("tr", { class: "round" + (text === chosenText ? " winner" : ""), "data-round": j },
    el("td", {}, literal(text)),
    el("td", { text: ranking.answers.map((a, k) => (a === text ? run.models[k] : null)).filter(Boolean).join(", ") }),
    ranking.nll.length ? el("td", { text: ranking.nll.map((row) => fmt(row[j], 3)).join(" / ") }) : null,
    el("td", { class: "num", text: fmt(ranking.scores[j], 3) })));
  const head = ["answer", "answered by", ranking.nll.length ? `NLL (${run.models.join(" / ")})` : null, `${ranking.ranker} score`].filter(Boolean);
  return el("div", {}, el("p", { class: "note", text: `ranker ${ranking.ranker}; chosen: ${run.models[ranking.chosen]}'s answer` }),
    el("table", {}, el("thead", {}, el("tr", {}, head.map((t) => el("th", { text: t })))), el("tbody", {}, rows)));
}

// ---- wiring ----------------------------------------------------------------------------------------------

function update() {
  state.rows = PAGE_ROWS;
  drawCompare();
  outcomeOptions();
  drawTable();
}

document.getElementById("search").addEventListener("input", (e) => { state.search = e.target.value.trim().toLowerCase(); state.rows = PAGE_ROWS; drawTable(); });
document.getElementById("outcome").addEventListener("change", (e) => { state.outcome = e.target.value; update(); });
document.getElementById("more").addEventListener("click", () => { state.rows += PAGE_ROWS; drawTable(); });
drawRuns();
update();
document.body.dataset.ready = "true";
