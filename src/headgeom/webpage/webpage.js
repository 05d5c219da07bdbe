// What every offline page of the workspace shares (headgeom/webpage): tables read back from
// their JSON blocks, numbers formatted for the detail tables, and Vega-Lite charts drawn by
// the id of their element, each from its specification and its named datasets.
"use strict";

// {column: [values] | {levels, codes}} -> [{column: value}]
function toRows(encoded) {
  const columns = {};
  for (const [name, c] of Object.entries(encoded)) {
    columns[name] = Array.isArray(c) ? c : c.codes.map((i) => c.levels[i]);
  }
  const names = Object.keys(columns);
  const n = names.length ? columns[names[0]].length : 0;
  const rows = new Array(n);
  for (let r = 0; r < n; r++) {
    const row = {};
    for (const name of names) row[name] = columns[name][r];
    rows[r] = row;
  }
  return rows;
}

function fmt(x) {
  if (x === null || x === undefined) return "—";
  if (typeof x === "boolean") return x ? "yes" : "no";
  if (typeof x === "number") return Number.isInteger(x) ? String(x) : x.toPrecision(6);
  return String(x);
}

// A table cell showing `value`, the exact value kept in data-value, so what the page shows
// can be checked against the Parquet.
function valueCell(tr, value, text) {
  const td = tr.insertCell();
  td.dataset.value = value === null || value === undefined ? "" : String(value);
  td.textContent = text === undefined ? fmt(value) : text;
  return td;
}

// A two-column table of (label, value); each value cell carries its key in data-key and
// shows `format(value)`.
function fillTable(id, entries, format = fmt) {
  const table = document.getElementById(id);
  table.replaceChildren();
  for (const [key, label, value] of entries) {
    const tr = table.insertRow();
    const th = document.createElement("th");
    th.textContent = label;
    tr.appendChild(th);
    valueCell(tr, value, format(value)).dataset.key = key;
  }
}

// The view's "Drawn from" line: each source's path and SHA-256 (data-path, data-sha256),
// or `empty` when there is none.
function listSources(el, rows, empty) {
  el.replaceChildren(document.createTextNode("Drawn from: "));
  if (!rows.length) el.appendChild(document.createTextNode(empty));
  for (const s of rows) {
    const item = document.createElement("code");
    item.className = "source";
    item.textContent = `${s.path}  sha256:${s.sha256}`;
    item.dataset.path = s.path;
    item.dataset.sha256 = s.sha256;
    el.appendChild(item);
  }
}

// Put rows into every {"name": dataset} data of a spec (a chart is first drawn with its
// data, so no scale is ever computed from an empty table).
function withData(spec, datasets) {
  const walk = (node) => {
    if (Array.isArray(node)) node.forEach(walk);
    else if (node && typeof node === "object") {
      if (typeof node.name === "string" && node.name in datasets && !("values" in node)
          && Object.keys(node).length === 1) node.values = datasets[node.name];
      Object.values(node).forEach(walk);
    }
  };
  const copy = structuredClone(spec);
  walk(copy);
  return copy;
}

// show(id, datasets, signals): draw chart `id` of `specs` with `datasets` ({name: rows}) and
// set its `signals`; a chart whose first dataset is empty is hidden (its section's note says
// why). `listeners[id]`, if set when the chart is first drawn, receives its clicks.
function chartDrawer(specs, listeners) {
  const views = {};
  return async function show(id, datasets, signals = {}) {
    const el = document.getElementById(id);
    const empty = !Object.values(datasets)[0].length;
    el.hidden = empty;
    if (empty) return;
    if (!views[id]) {
      const result = await vegaEmbed(`#${id}`, withData(specs[id], datasets),
        { renderer: "svg", actions: false });
      views[id] = result.view;
      if (listeners[id]) views[id].addEventListener("click", listeners[id]);
    } else {
      for (const [name, rows] of Object.entries(datasets)) views[id].data(name, rows);
    }
    for (const [k, v] of Object.entries(signals)) views[id].signal(k, v);
    await views[id].runAsync();
  };
}
