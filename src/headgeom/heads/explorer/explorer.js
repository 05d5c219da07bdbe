// The explorer's state and links between views (docs §19). The charts are Vega-Lite views
// (headgeom/heads/explorer/views.py); this script owns the selection (run, task, split, head,
// ablation mode, block, timeline run, step), fills each chart's named dataset with the rows
// of that selection, and writes the detail tables and each view's sources.
//
// A run's tables are parsed from their own <script type="application/json"> block the first
// time the run is shown, so a study with many runs loads only what is looked at.
"use strict";

const META = JSON.parse(document.getElementById("explorer-meta").textContent);
const SPECS = META.specs;
const runCache = new Map();
const state = {
  run: META.default_run, task: META.tasks[0], split: META.default_split, layer: null, head: null,
  ablation: "zero", block: null, timelineRun: 0, step: null,
};

function runTables(i) {
  if (!runCache.has(i)) {
    const raw = JSON.parse(document.getElementById(`run-${i}`).textContent);
    const tables = {};
    for (const [name, columns] of Object.entries(raw)) tables[name] = toRows(columns);
    runCache.set(i, tables);
  }
  return runCache.get(i);
}

function showSources(view, run, task) {
  const el = document.querySelector(`.sources[data-view="${view}"]`);
  const rows = META.sources.filter((s) => s.view === view && (run === null || s.run === run)
    && (task === null || s.task === null || s.task === task));
  listSources(el, rows, "(no Parquet for this selection)");
}

// The rows of the selected task in the selected split, or, for an analysis run on one
// split of its own (edges: validation), in that split; and the split used.
function ofTask(rows) {
  const task = rows.filter((r) => r.task === state.task);
  if (task.some((r) => r.split === state.split)) return [task.filter((r) => r.split === state.split), state.split];
  const splits = [...new Set(task.map((r) => r.split))];
  return splits.length === 1 ? [task, splits[0]] : [[], state.split];
}

function splitNote(split) {
  return split === state.split ? "" : ` (computed on the ${split} split only)`;
}

const listeners = {};
// toRows, fmt, fillTable and chartDrawer: headgeom/webpage/webpage.js
const show = chartDrawer(SPECS, listeners);

function note(id, text) {
  document.getElementById(id).textContent = text || "";
}

const same = (a, b) => a.task === b.task && a.split === b.split;

async function renderHeads() {
  const tables = runTables(state.run);
  const key = META.runs[state.run].key;
  const heads = (tables.heads || []).filter((r) => same(r, state));
  if (state.layer === null && heads.length) {
    const top = heads.reduce((a, b) => (Math.abs(b.e) > Math.abs(a.e) ? b : a));
    [state.layer, state.head] = [top.layer, top.head];
  }
  const vmax = Math.max(1e-12, ...heads.map((r) => Math.abs(r.e)));
  await show("grid", { heads }, { sel_layer: state.layer, sel_head: state.head, vmax });
  const h = heads.find((r) => r.layer === state.layer && r.head === state.head) || {};
  const g = (tables.geometry || []).find((r) => r.layer === state.layer && r.head === state.head) || {};
  fillTable("head-details", [
    ["run", "run", key], ["task", "task", state.task], ["split", "split", state.split],
    ["layer", "layer", state.layer], ["head", "head", state.head],
    ["e", "e (mean drop, logit)", h.e], ["p", "p = |e| / E", h.p],
    ["ci_low", "95% interval, low", h.ci_low], ["ci_high", "95% interval, high", h.ci_high],
    ["n", "examples", h.n], ["own_best", "own-best (V read)", g.own_best],
    ["rho_self", "ρ_self", g.rho_self], ["pk_self", "PK self", g.pk_self],
    ["idempotence", "idempotence P(T_h)", g.idempotence],
  ]);
  showSources("heads", key, state.task);
  showSources("geometry", key, null);
  document.getElementById("selected-head").textContent = `L${state.layer}.H${state.head}`;
}

async function renderLeakage() {
  const tables = runTables(state.run);
  const key = META.runs[state.run].key;
  const [task, split] = ofTask(tables.leakage || []);
  const rows = task.filter((r) => r.source_layer === state.layer && r.source_head === state.head)
    .map((r) => ({ ...r, label_rank: null }));
  rows.filter((r) => r.top_pair).sort((a, b) => b.leakage - a.leakage)
    .forEach((r, i) => { r.label_rank = i; });
  await show("leakage", { leakage: rows });
  note("leakage-note", !tables.leakage ? "Leakage is not computed for this run (config leakage.models)."
    : !rows.length ? `No leakage rows for this head, task and split (the last layer has no later readers).`
    : `${rows.length} (reader, read type) pairs${splitNote(split)}; the ${META.top_pairs} largest L are outlined and labelled.`);
  showSources("leakage", key, state.task);
}

async function renderClamps() {
  const tables = runTables(state.run);
  const key = META.runs[state.run].key;
  const row = (tables.clamps || []).find((r) => same(r, state)
    && r.layer === state.layer && r.head === state.head);
  const parts = row ? META.clamp_parts.map(([col, part]) => ({ part, value: row[col] })) : [];
  await show("clamps", { clamps: parts });
  note("clamps-note", !tables.clamps ? "Clamps are not computed for this run."
    : !row ? "Clamps run on each task's top-5 heads (evaluation split); this head is not one of them." : `rank ${row.rank} head of ${row.task}`);
  showSources("clamps", key, null);
}

function edgeLabel(r) {
  return `L${r.writer_layer}.H${r.writer_head}→L${r.reader_layer}.H${r.reader_head} ${r.read_type}`;
}

async function renderEdges() {
  const tables = runTables(state.run);
  const key = META.runs[state.run].key;
  const [edges, split] = ofTask(tables.edges || []);
  const top = (rows) => rows.slice().sort((a, b) => b.kl - a.kl).slice(0, META.top_edges)
    .map((r) => ({ ...r, edge: edgeLabel(r) }));
  const into = top(edges.filter((r) => r.reader_layer === state.layer && r.reader_head === state.head));
  const out = top(edges.filter((r) => r.writer_layer === state.layer && r.writer_head === state.head));
  await show("edges-in", { edges_in: into });
  await show("edges-out", { edges_out: out });
  note("edges-note", !tables.edges ? "Edges are not computed for this run (config edges.models)."
    : !edges.length ? "No edges for this task (edges are patched on SVA)."
    : `The ${META.top_edges} largest KL into and out of the head${splitNote(split)}.`);
  showSources("edges", key, state.task);
}

async function renderAtlas() {
  const tables = runTables(state.run);
  const key = META.runs[state.run].key;
  const all = tables.atlas || [];
  const klMax = Math.max(1e-12, ...all.map((r) => r.kl).filter(Number.isFinite));
  const rows = all.filter((r) => r.ablation === state.ablation).map((r) => ({
    ...r, row: r.block === "head" ? `H${r.head}` : r.block,
    row_order: r.block === "attn" ? -2 : r.block === "mlp" ? -1 : r.head,
  }));
  if (state.block === null && rows.length) state.block = rows[0].label;
  await show("atlas", { atlas: rows }, { sel_block: state.block || "", kl_max: klMax });
  const b = rows.find((r) => r.label === state.block) || {};
  fillTable("block-details", [
    ["label", "block", b.label], ["ablation", "ablation", state.ablation],
    ["kl", "KL (nats)", b.kl], ["delta_top1", "Δ top-1", b.delta_top1],
    ["top1_base", "top-1, unedited", b.top1_base],
    ["retention_sva", "retention SVA", b.retention_sva],
    ["retention_quote", "retention Quote", b.retention_quote],
    ["retention_plural", "retention Plural", b.retention_plural],
    ["size", "size (RMS ratio)", b.size], ["constant_part", "constant part", b.constant_part],
  ]);
  note("atlas-note", tables.atlas ? "" : "The atlas is not computed for this run (config ablation.atlas_models).");
  showSources("atlas", key, null);
}

async function renderTimeline() {
  const t = META.timeline_runs[state.timelineRun];
  const section = document.getElementById("timeline-section");
  if (!t) { section.hidden = true; return; }
  const rows = META.timeline.filter((r) => r.model === t.model && r.seed === t.seed)
    .sort((a, b) => a.step - b.step);
  const slider = document.getElementById("step");
  slider.max = rows.length - 1;
  if (state.step === null || state.step >= rows.length) state.step = rows.length - 1;
  slider.value = state.step;
  const at = rows[state.step];
  document.getElementById("step-label").textContent = `step ${at.step}`;
  await show("timeline", { timeline: rows, timeline_step: [{ step: at.step }] });
  fillTable("step-details", [
    ["step", "step", at.step], ["tokens_seen", "tokens seen", at.tokens_seen],
    ["val_loss", "validation loss", at.val_loss], ["sva_accuracy", "SVA accuracy", at.sva_accuracy],
    ["lambda_score", "Λ (SVA)", at.lambda_score], ["lambda_p", "Λ permutation p", at.lambda_p],
    ["own_best_fraction", "own-best fraction", at.own_best_fraction],
    ["rho_self_mean", "mean ρ_self", at.rho_self_mean],
    ["idempotence_median", "median P(T_h)", at.idempotence_median],
  ]);
  showSources("timeline", t.key, null);
}

async function renderHeadViews() {
  await renderHeads();
  await renderLeakage();
  await renderClamps();
  await renderEdges();
}

function options(id, values, labels) {
  const select = document.getElementById(id);
  values.forEach((v, i) => select.add(new Option(labels ? labels[i] : v, String(v))));
  return select;
}

async function main() {
  listeners.grid = (event, item) => {
    if (!item || !item.datum || item.datum.layer === undefined) return;
    state.layer = item.datum.layer;
    state.head = item.datum.head;
    renderHeadViews();
  };
  listeners.atlas = (event, item) => {
    if (!item || !item.datum || !item.datum.label) return;
    state.block = item.datum.label;
    renderAtlas();
  };
  const run = options("run", META.runs.map((_, i) => i), META.runs.map((r) => r.key));
  run.value = String(state.run);
  run.onchange = (e) => {
    state.run = Number(e.target.value);
    state.block = null;
    renderHeadViews();
    renderAtlas();
  };
  options("task", META.tasks).onchange = (e) => { state.task = e.target.value; renderHeadViews(); };
  const split = options("split", META.splits);
  split.value = state.split;
  split.onchange = (e) => { state.split = e.target.value; renderHeadViews(); };
  for (const radio of document.querySelectorAll('input[name="ablation"]')) {
    radio.onchange = (e) => { state.ablation = e.target.value; renderAtlas(); };
  }
  options("timeline-run", META.timeline_runs.map((_, i) => i), META.timeline_runs.map((r) => r.key))
    .onchange = (e) => { state.timelineRun = Number(e.target.value); state.step = null; renderTimeline(); };
  document.getElementById("step").oninput = (e) => { state.step = Number(e.target.value); renderTimeline(); };
  await renderHeadViews();
  await renderAtlas();
  await renderTimeline();
  document.body.dataset.ready = "true";
}

main().catch((err) => { console.error(err); document.body.dataset.ready = "error"; });
