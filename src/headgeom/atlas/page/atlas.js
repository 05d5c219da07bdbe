// The atlas page's state and links between views. The charts are Vega-Lite views
// (headgeom/atlas/page/views.py); this script owns the selection (edit, layer, compression
// corpus, pair, pair corpus, α), fills each chart's named datasets with the rows of that
// selection and writes the tables. It computes nothing the Parquets do not hold: it only
// selects, orders and labels their rows (and, in the probe strip, marks where an answer
// differs from the one at the α before).
//
// toRows, fmt, valueCell, fillTable and chartDrawer: headgeom/webpage/webpage.js.
"use strict";

// One block: its names cannot clash with the inlined Vega bundle's minified globals.
{
  const DATA = JSON.parse(document.getElementById("atlas-data").textContent);
  const listeners = {};
  const show = chartDrawer(DATA.specs, listeners);
  const decode = (tables) => Object.fromEntries(
    Object.entries(tables).map(([name, columns]) => [name, toRows(columns)]));
  const TABLES = decode(DATA.tables);
  const PAIRS = DATA.pairs.map((p) => ({ name: p.name, tables: decode(p.tables) }));
  const BLOCKS = ["attn", "mlp", "ple", "layer", "keys", "embed"];
  const EDITS = Object.keys(DATA.edit_names);
  const MODES = ["top", "random", "fraction", "minus_top"];
  const state = {
    edit: null, layer: null, compressionCorpus: null, pair: 0, pairCorpus: null, alpha: null,
  };

  // --- ordering and labels ------------------------------------------------------------------
  const rank = (order, v) => (order.includes(v) ? order.indexOf(v) : order.length);
  const unique = (values) => [...new Set(values)];
  const byKeys = (...keys) => (a, b) => {
    for (const k of keys) {
      const d = k(a) < k(b) ? -1 : k(a) > k(b) ? 1 : 0;
      if (d) return d;
    }
    return 0;
  };
  const editName = (e) => DATA.edit_names[e] || e;
  // the corpora of some rows, the mean over them first
  const corporaOf = (rows) => {
    const all = unique(rows.map((r) => r.corpus));
    return all.includes("mean") ? ["mean", ...all.filter((c) => c !== "mean")] : all;
  };
  const layerLabel = (layer) => (layer < 0 ? "all" : String(layer));

  function note(id, text) {
    document.getElementById(id).textContent = text || "";
  }

  function hide(id, hidden) {
    document.getElementById(id).hidden = hidden;
  }

  function showSources(table, pair) {
    const el = document.querySelector(`.sources[data-view="${table}"]`);
    const rows = DATA.sources.filter((s) => s.table === table && s.pair === pair);
    listSources(el, rows, "(no Parquet)");
  }

  // A header cell spanning `span` columns (and `rows` rows).
  function headCell(tr, text, span = 1, rows = 1) {
    const th = document.createElement("th");
    th.textContent = text;
    th.colSpan = span;
    th.rowSpan = rows;
    tr.appendChild(th);
    return th;
  }

  function textCell(tr, text) {
    const td = tr.insertCell();
    td.className = "text";
    td.textContent = text;
    return td;
  }

  // A number as the tables print it: four significant digits, no trailing zeros.
  function short(x) {
    if (typeof x !== "number" || Number.isInteger(x)) return fmt(x);
    return Math.abs(x) >= 1000 ? x.toFixed(0) : String(Number(x.toPrecision(4)));
  }

  // A value cell tagged with what it shows (data-quantity and the row's keys), so a test
  // can find the number of one (block, edit, corpus) and compare it with the Parquet; the
  // exact value is in data-value.
  function tagged(tr, value, tags, text) {
    const td = valueCell(tr, value, text === undefined ? short(value) : text);
    Object.assign(td.dataset, tags);
    return td;
  }

  // --- the single model -------------------------------------------------------------------
  // An edit's rows (effects.parquet, headgeom.atlas.results): its kind and target, its layer
  // (-1: every layer at once, or the token embedding, which has no layer); its scope on the
  // page: "everywhere" or "block" (one layer, or the embedding's table). The mean over the
  // corpora is summary.parquet's row of the edit, shown as corpus "mean"; the mean over the
  // skills, its mean_retention, as skill "mean".
  const scope = (r) => (r.layer < 0 && r.target !== "embed" ? "everywhere" : "block");
  const EDIT_ROWS = [...TABLES.effects, ...TABLES.summary.map((r) => ({ ...r, corpus: "mean" }))]
    .map((r) => ({ ...r, scope: scope(r) }));
  const BLOCK_ROWS = EDIT_ROWS.filter((r) => r.scope === "block");
  const CORPORA = corporaOf(EDIT_ROWS);
  // the profile's KL: the mean over the corpora, or the only corpus there is
  const PROFILE_CORPUS = CORPORA[0];
  const SWITCH = unique(BLOCK_ROWS.map((r) => r.kind))
    .sort(byKeys((e) => rank(EDITS, e), (e) => e));
  const LAYERS = unique([...TABLES.profile.map((r) => r.layer), ...BLOCK_ROWS.map((r) => r.layer)]
    .filter((l) => l >= 0)).sort((a, b) => a - b);
  const KL_MAX = Math.max(1e-12, ...BLOCK_ROWS.map((r) => r.kl).filter(Number.isFinite));
  const RETENTION = TABLES.retention ? [...TABLES.retention, ...TABLES.summary
    .map((r) => ({ ...r, skill: "mean", retention: r.mean_retention }))]
    .map((r) => ({ ...r, scope: scope(r) })) : [];
  const SKILLS = (() => {
    const all = unique(RETENTION.map((r) => r.skill));
    return all.includes("mean") ? ["mean", ...all.filter((s) => s !== "mean")] : all;
  })();

  // The table of some edits' effects: one row per (target, kind), KL and Δ top-1 per corpus,
  // retention per skill; rows of the selected edit marked.
  function effectsTable(id, rows, retention) {
    const table = document.getElementById(id);
    table.replaceChildren();
    const head = table.createTHead();
    const top = head.insertRow();
    const sub = head.insertRow();
    headCell(top, "target", 1, 2);
    headCell(top, "edit", 1, 2);
    for (const c of CORPORA) {
      headCell(top, c, 2);
      headCell(sub, "KL");
      headCell(sub, "Δ top-1");
    }
    if (SKILLS.length) {
      headCell(top, "retention", SKILLS.length);
      for (const s of SKILLS) headCell(sub, s);
    }
    const body = table.createTBody();
    const keys = unique(rows.map((r) => `${r.target}\u0000${r.kind}`)).map((k) => k.split("\u0000"))
      .sort(byKeys(([b]) => rank(BLOCKS, b), ([b]) => b, ([, e]) => rank(EDITS, e), ([, e]) => e));
    for (const [target, kind] of keys) {
      const tr = body.insertRow();
      if (kind === state.edit) tr.className = "current";
      tr.dataset.target = target;
      tr.dataset.kind = kind;
      textCell(tr, target);
      textCell(tr, editName(kind));
      for (const corpus of CORPORA) {
        const r = rows.find((x) => x.target === target && x.kind === kind && x.corpus === corpus) || {};
        const tags = { target, kind, corpus };
        tagged(tr, r.kl, { ...tags, quantity: "kl" });
        tagged(tr, r.delta_top1, { ...tags, quantity: "delta_top1" });
      }
      for (const skill of SKILLS) {
        const r = retention.find((x) => x.target === target && x.kind === kind && x.skill === skill) || {};
        tagged(tr, r.retention, { target, kind, skill, quantity: "retention" });
      }
    }
    return keys.length;
  }

  function renderSwitch() {
    const el = document.getElementById("edit-switch");
    el.replaceChildren();
    for (const edit of SWITCH) {
      const label = document.createElement("label");
      const radio = document.createElement("input");
      radio.type = "radio";
      radio.name = "edit";
      radio.value = edit;
      radio.checked = edit === state.edit;
      radio.onchange = () => { state.edit = edit; renderEdit(); };
      label.append(radio, ` ${editName(edit)} `);
      el.appendChild(label);
    }
  }

  async function renderProfile() {
    const profile = TABLES.profile.slice().sort(byKeys((r) => r.layer, (r) => rank(BLOCKS, r.block)));
    const oldState = LAYERS.map((layer) => profile.find((r) => r.layer === layer))
      .filter((r) => r && Number.isFinite(r.old_state_carried))
      .map((r) => ({ layer: r.layer, old_state_carried: r.old_state_carried }));
    const kl = BLOCK_ROWS.filter((r) => r.kind === state.edit && r.corpus === PROFILE_CORPUS
      && r.layer >= 0).map((r) => ({ ...r, block: r.target }));
    await show("profile", { layers: LAYERS.map((layer) => ({ layer })), profile, old_state: oldState,
      profile_kl: kl }, { sel_layer: state.layer });
    note("profile-note", PROFILE_CORPUS === "mean" ? ""
      : `No mean over the corpora: the KL panel shows corpus ${PROFILE_CORPUS}.`);
    showSources("profile", null);
  }

  function renderLayer() {
    document.getElementById("selected-layer").textContent = layerLabel(state.layer);
    document.getElementById("layer-title").textContent = layerLabel(state.layer);
    const rows = EDIT_ROWS.filter((r) => r.scope === "block" && r.layer === state.layer);
    const retention = RETENTION.filter((r) => r.scope === "block" && r.layer === state.layer);
    const n = effectsTable("layer-edits", rows, retention);
    note("layer-note", n ? "" : `No edit of layer ${state.layer} in effects.parquet.`);
    const table = document.getElementById("layer-profile");
    table.replaceChildren();
    const head = table.createTHead().insertRow();
    for (const h of ["block", "write size", "constant part", "volume knob", "old state carried"]) {
      headCell(head, h);
    }
    const body = table.createTBody();
    for (const r of TABLES.profile.filter((x) => x.layer === state.layer)
      .sort(byKeys((x) => rank(BLOCKS, x.block)))) {
      const tr = body.insertRow();
      textCell(tr, r.block);
      for (const q of ["write_size", "constant_part", "knob_rms", "old_state_carried"]) {
        tagged(tr, r[q], { block: r.block, quantity: q });
      }
    }
    showSources("effects", null);
    showSources("summary", null);
    showSources("retention", null);
  }

  async function renderHeat() {
    const rows = BLOCK_ROWS.filter((r) => r.kind === state.edit)
      .map((r) => ({ ...r, block: r.target, corpus_order: CORPORA.indexOf(r.corpus) }));
    await show("heat", { heat: rows }, { sel_layer: state.layer, kl_max: KL_MAX });
    note("heat-note", `${editName(state.edit)}: ${rows.length} (block, corpus) cells; `
      + "one colour scale for every edit. Click a cell to select its layer.");
  }

  function renderEverywhere() {
    const rows = EDIT_ROWS.filter((r) => r.scope === "everywhere");
    hide("everywhere-section", !rows.length);
    if (rows.length) effectsTable("everywhere", rows, RETENTION.filter((r) => r.scope === "everywhere"));
  }

  async function selectLayer(layer) {
    state.layer = layer;
    renderLayer();
    await renderProfile();
    await renderHeat();
  }

  async function renderEdit() {
    renderLayer();
    renderEverywhere();
    await renderProfile();
    await renderHeat();
  }

  // --- compression ----------------------------------------------------------------------
  async function renderCompression() {
    const all = TABLES.compression || [];
    hide("compression-section", !all.length);
    if (!all.length) return;
    const rows = all.filter((r) => r.corpus === state.compressionCorpus)
      .sort(byKeys((r) => r.bytes, (r) => r.method, (r) => r.group, (r) => r.setting));
    await show("compression-chart", { compression: rows.filter((r) => r.bytes > 0) });
    const table = document.getElementById("compression-table");
    table.replaceChildren();
    const head = table.createTHead().insertRow();
    for (const h of ["method", "group", "setting", "bytes", "of original", "KL", "Δ top-1",
      "retention"]) headCell(head, h);
    const body = table.createTBody();
    for (const r of rows) {
      const tr = body.insertRow();
      const tags = { method: r.method, group: r.group, setting: r.setting };
      Object.assign(tr.dataset, tags);
      textCell(tr, r.method);
      textCell(tr, r.group);
      textCell(tr, r.setting);
      tagged(tr, r.bytes, { ...tags, quantity: "bytes" }, r.bytes.toLocaleString("en"));
      const share = r.bytes_original ? r.bytes / r.bytes_original : null;
      tagged(tr, r.bytes_original, { ...tags, quantity: "bytes_original" },
        share === null ? "—" : `${(100 * share).toFixed(1)}%`);
      tagged(tr, r.kl, { ...tags, quantity: "kl" });
      tagged(tr, r.delta_top1, { ...tags, quantity: "delta_top1" });
      tagged(tr, r.retention, { ...tags, quantity: "retention" });
    }
    showSources("compression", null);
  }

  // --- two checkpoints --------------------------------------------------------------------
  const pair = () => PAIRS[state.pair];
  const pairTable = (name) => pair().tables[name] || [];

  function alphas() {
    return unique([...pairTable("blend"), ...pairTable("probes")].map((r) => r.alpha))
      .sort((a, b) => a - b);
  }

  async function renderBlend() {
    const all = pairTable("blend");
    hide("blend-section", !all.length && !pairTable("probes").length);
    const grid = alphas();
    const at = grid[state.alpha];
    document.getElementById("alpha-label").textContent = at === undefined ? "" : `α = ${at}`;
    const rows = all.filter((r) => r.corpus === state.pairCorpus).sort((a, b) => a.alpha - b.alpha);
    await show("blend-chart", { blend: rows, blend_at: [{ alpha: at }] });
    const r = rows.find((x) => x.alpha === at) || {};
    fillTable("blend-details", [
      ["alpha", "α", at], ["corpus", "corpus", state.pairCorpus],
      ["kl_to_a", "KL to A (nats)", r.kl_to_a], ["kl_to_b", "KL to B (nats)", r.kl_to_b],
      ["retention", "retention (mean over skills)", r.retention],
    ], short);
    note("blend-note", !all.length ? "No blend.parquet for this pair."
      : !rows.length ? `No blend rows for corpus ${state.pairCorpus}.` : "");
    showSources("blend", pair().name);
  }

  function renderProbes() {
    const all = pairTable("probes");
    hide("probes-section", !all.length);
    const table = document.getElementById("probes");
    table.replaceChildren();
    if (!all.length) return;
    const grid = alphas();
    const at = grid[state.alpha];
    const head = table.createTHead().insertRow();
    for (const h of ["probe", "prompt", "expected", "answer at α", "correct", "lead",
      "answer changes at α", `answers, α = ${grid[0]} … ${grid[grid.length - 1]}`]) headCell(head, h);
    const body = table.createTBody();
    for (const probe of unique(all.map((r) => r.probe))) {
      const rows = all.filter((r) => r.probe === probe);
      const answerAt = (a) => rows.find((r) => r.alpha === a);
      const switches = grid.filter((a, i) => i > 0 && answerAt(a) && answerAt(grid[i - 1])
        && answerAt(a).answer !== answerAt(grid[i - 1]).answer);
      const now = answerAt(at) || {};
      const before = state.alpha > 0 ? answerAt(grid[state.alpha - 1]) : undefined;
      const tr = body.insertRow();
      tr.dataset.probe = probe;
      if (before && now.answer !== undefined && before.answer !== now.answer) tr.className = "switched";
      textCell(tr, probe);
      textCell(tr, rows[0].prompt);
      textCell(tr, rows[0].expected);
      tagged(tr, now.answer, { probe, quantity: "answer" }).className = "text";
      tagged(tr, now.correct, { probe, quantity: "correct" }, now.correct === undefined ? "—"
        : now.correct ? "✓" : "✗");
      tagged(tr, now.lead, { probe, quantity: "lead" });
      textCell(tr, switches.length ? switches.join(", ") : "—").dataset.quantity = "switches";
      const strip = tr.insertCell();
      strip.className = "strip";
      grid.forEach((a, i) => {
        const r = answerAt(a);
        const cell = document.createElement("span");
        const classes = [r ? (r.correct ? "ok" : "miss") : ""];
        if (switches.includes(a)) classes.push("switch");
        if (i === state.alpha) classes.push("at");
        cell.className = classes.filter(Boolean).join(" ");
        cell.title = r ? `α = ${a}: ${JSON.stringify(r.answer)}${r.correct ? " ✓" : " ✗"}` : `α = ${a}: —`;
        strip.appendChild(cell);
      });
    }
    showSources("probes", pair().name);
  }

  function endsTable(id, rows, keys) {
    const table = document.getElementById(id);
    table.replaceChildren();
    const head = table.createTHead().insertRow();
    for (const [, label] of keys) headCell(head, label);
    for (const h of ["KL to A", "KL to B", "retention"]) headCell(head, h);
    const body = table.createTBody();
    rows.forEach((r, i) => {
      const tr = body.insertRow();
      tr.dataset.row = String(i);
      for (const [key, , label] of keys) {
        const td = textCell(tr, label ? label(r[key]) : String(r[key]));
        td.dataset.key = key;
        td.dataset.value = String(r[key]);
      }
      for (const q of ["kl_to_a", "kl_to_b", "retention"]) tagged(tr, r[q], { quantity: q });
    });
  }

  function renderGrafts() {
    const rows = pairTable("grafts").filter((r) => r.corpus === state.pairCorpus)
      .sort(byKeys((r) => r.direction, (r) => r.group, (r) => r.layer, (r) => r.part));
    hide("grafts-section", !pairTable("grafts").length);
    endsTable("grafts", rows, [
      ["direction", "direction", (d) => (d === "b_into_a" ? "B into A" : d === "a_into_b" ? "A into B" : d)],
      ["group", "group"], ["layer", "layer", layerLabel], ["part", "part"],
    ]);
    showSources("grafts", pair().name);
  }

  async function renderDrift() {
    const all = pairTable("drift");
    hide("drift-section", !all.length);
    // a per-layer tensor's kind: its name after the layer index (self_attn.q_proj.weight)
    const layers = all.filter((r) => r.layer >= 0)
      .map((r) => ({ ...r, kind: r.tensor.replace(/^.*?\.\d+\./, "") }));
    await show("drift-layers", { drift_layers: layers });
    await show("drift-other", { drift_other: all.filter((r) => r.layer < 0) });
    showSources("drift", pair().name);
  }

  function renderLowrank() {
    const rows = pairTable("lowrank").filter((r) => r.corpus === state.pairCorpus)
      .sort(byKeys((r) => rank(MODES, r.mode), (r) => r.mode, (r) => r.k ?? 0,
        (r) => r.fraction ?? 0));
    hide("lowrank-section", !pairTable("lowrank").length);
    const orDash = (v) => (v === null || v === undefined ? "—" : String(v));
    endsTable("lowrank", rows, [["mode", "mode"], ["k", "k", orDash], ["fraction", "f", orDash],
      ["delta_share", "share of ‖ΔW‖²", (v) => (v === null || v === undefined ? "—" : short(v))]]);
    showSources("lowrank", pair().name);
  }

  async function renderAlpha() {
    await renderBlend();
    renderProbes();
  }

  async function renderPair() {
    const corpora = corporaOf(["blend", "grafts", "lowrank"].flatMap(pairTable));
    const select = document.getElementById("pair-corpus");
    select.replaceChildren(...corpora.map((c) => new Option(c, c)));
    if (!corpora.includes(state.pairCorpus)) state.pairCorpus = corpora[0] || null;
    select.value = state.pairCorpus;
    const grid = alphas();
    const slider = document.getElementById("alpha");
    slider.max = String(Math.max(0, grid.length - 1));
    if (state.alpha === null || state.alpha >= grid.length) {
      // the dial opens on A (α = 0), or the α nearest it
      const zero = grid.reduce((best, a, i) => (Math.abs(a) < Math.abs(grid[best]) ? i : best), 0);
      state.alpha = grid.length ? zero : 0;
    }
    slider.value = String(state.alpha);
    await renderAlpha();
    renderGrafts();
    await renderDrift();
    renderLowrank();
  }

  // --- wiring ---------------------------------------------------------------------------
  function defaultLayer() {
    const rows = BLOCK_ROWS.filter((r) => r.kind === state.edit && r.corpus === PROFILE_CORPUS
      && r.layer >= 0 && Number.isFinite(r.kl));
    if (!rows.length) return LAYERS[0] ?? 0;
    return rows.reduce((a, b) => (b.kl > a.kl ? b : a)).layer;
  }

  async function main() {
    state.edit = SWITCH.includes("zero") ? "zero" : SWITCH[0];
    state.layer = defaultLayer();
    const pick = (datum) => {
      if (datum && typeof datum.layer === "number" && LAYERS.includes(datum.layer)) selectLayer(datum.layer);
    };
    listeners.profile = (event, item) => pick(item && item.datum);
    listeners.heat = (event, item) => pick(item && item.datum);
    renderSwitch();
    await renderEdit();

    const corpora = corporaOf(TABLES.compression || []);
    state.compressionCorpus = corpora[0] || null;
    const compression = document.getElementById("compression-corpus");
    compression.replaceChildren(...corpora.map((c) => new Option(c, c)));
    compression.onchange = (e) => { state.compressionCorpus = e.target.value; renderCompression(); };
    await renderCompression();

    hide("pairs-section", !PAIRS.length);
    if (PAIRS.length) {
      const select = document.getElementById("pair");
      select.replaceChildren(...PAIRS.map((p, i) => new Option(p.name, String(i))));
      select.onchange = (e) => { state.pair = Number(e.target.value); state.alpha = null; renderPair(); };
      document.getElementById("pair-corpus").onchange = (e) => {
        state.pairCorpus = e.target.value;
        renderAlpha();
        renderGrafts();
        renderLowrank();
      };
      document.getElementById("alpha").oninput = (e) => { state.alpha = Number(e.target.value); renderAlpha(); };
      await renderPair();
    }
    document.body.dataset.ready = "true";
  }

  main().catch((err) => { console.error(err); document.body.dataset.ready = "error"; });
}
