// The flame graph page: draws the call tree that flamegraph/html.rs embeds as
// JSON in #flamegraph-data (the format is described at its write_json).
//
// 1. Layout, once: each node's left edge `x` (in value units), its parent,
//    its self value, and `end`: its callees are the nodes i+1 .. end-1.
// 2. draw() paints, root at the top, the frames inside the zoomed node's
//    range that are at least MIN_WIDTH pixels wide, and keeps them in
//    `drawn` for hit testing (and for window.flamegraph, used by tests).
// 3. Events: hover shows a tooltip, a click zooms (and shows what holds the
//    frame's memory, with a retention report), the search box highlights,
//    the table of functions sorts by the clicked column.
"use strict";
(() => {
  const data = JSON.parse(document.getElementById("flamegraph-data").textContent);
  const { strings, nodes, functions } = data;
  const value = nodes.value;
  const count = value.length;
  const total = value[0];

  const ROW = 18; // pixels per stack level
  const MIN_WIDTH = 0.5; // narrower frames, and their callees, are not drawn
  const FONT = '12px system-ui, "DejaVu Sans", sans-serif';
  const TEXT_COLOR = "#1b1b1b";
  const ROOT_COLOR = "rgb(214,204,190)"; // flamegraph/svg.rs's ROOT_COLOR
  const MATCH_COLOR = "rgb(110,150,235)";
  const MAX_ROWS = 1000; // rows of the functions table

  // --- 1. Layout
  const x = new Float64Array(count);
  const parent = new Int32Array(count);
  const end = new Int32Array(count);
  const self = Float64Array.from(value);
  const nextChild = new Float64Array(count); // where a node's next callee starts
  const path = [0]; // path[d]: the latest node seen at depth d
  let maxDepth = 0;
  for (let i = 1; i < count; i++) {
    const depth = nodes.depth[i];
    const p = path[depth - 1];
    path[depth] = i;
    parent[i] = p;
    x[i] = nextChild[i] = nextChild[p];
    nextChild[p] += value[i];
    self[p] -= value[i];
    maxDepth = Math.max(maxDepth, depth);
  }
  for (let i = 0; i < count; i++) end[i] = i + 1;
  for (let i = count - 1; i > 0; i--) end[parent[i]] = Math.max(end[parent[i]], end[i]);

  // --- State
  let zoomed = 0; // the node whose range fills the width (0: the root)
  let matched = null; // Uint8Array, 1 for nodes whose name matches the search
  let drawn = []; // {node, x, y, width, context, label} in canvas pixels
  let width = 0;

  const canvas = document.getElementById("flame");
  const ctx = canvas.getContext("2d");
  const tooltip = document.getElementById("tooltip");
  const search = document.getElementById("search");
  const matches = document.getElementById("matches");
  const table = document.getElementById("functions");

  // --- 2. Drawing
  function resize() {
    const ratio = window.devicePixelRatio || 1;
    width = canvas.parentElement.clientWidth;
    const height = (maxDepth + 1) * ROW;
    canvas.style.width = `${width}px`;
    canvas.style.height = `${height}px`;
    canvas.width = Math.round(width * ratio);
    canvas.height = Math.round(height * ratio);
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    draw();
  }

  function draw() {
    ctx.clearRect(0, 0, width, (maxDepth + 1) * ROW);
    ctx.font = FONT;
    ctx.textBaseline = "middle";
    drawn = [];
    const start = x[zoomed];
    const span = value[zoomed];
    const scale = width / span;
    let i = 0;
    while (i < count) {
      // The part of node i inside the zoomed range, in pixels.
      const left = Math.max(x[i], start);
      const right = Math.min(x[i] + value[i], start + span);
      const w = (right - left) * scale;
      if (w < MIN_WIDTH) {
        i = end[i]; // skip its callees too: they are no wider
        continue;
      }
      // Nodes before the zoomed one that overlap its range are its callers.
      const frame = { node: i, x: (left - start) * scale, y: nodes.depth[i] * ROW, width: w, context: i < zoomed };
      ctx.globalAlpha = frame.context ? 0.55 : 1;
      ctx.fillStyle = matched && matched[i] ? MATCH_COLOR : i === 0 ? ROOT_COLOR : frameColor(nodes.name[i]);
      ctx.fillRect(frame.x, frame.y, Math.max(w - 1, MIN_WIDTH), ROW - 1);
      frame.label = fitText(labelOf(i), w - 6);
      if (frame.label) {
        ctx.fillStyle = TEXT_COLOR;
        ctx.fillText(frame.label, frame.x + 3, frame.y + ROW / 2);
      }
      drawn.push(frame);
      i++;
    }
    ctx.globalAlpha = 1;
  }

  function labelOf(i) {
    return i === 0 ? data.rootLabel : strings[nodes.name[i]];
  }

  // `text`, cut with an ellipsis to fit `room` pixels; "" if little fits.
  function fitText(text, room) {
    if (room < 18) return "";
    const full = ctx.measureText(text).width;
    if (full <= room) return text;
    const chars = Array.from(text); // whole code points: no half emoji
    for (let n = Math.floor((chars.length * room) / full); n > 1; n--) {
      const cut = `${chars.slice(0, n).join("")}\u2026`;
      if (ctx.measureText(cut).width <= room) return cut;
    }
    return "";
  }

  // A warm color picked by a hash of the name, the same as flamegraph/svg.rs's
  // frame_color (FNV-1a over UTF-16 code units), cached per name.
  const colors = [];
  function frameColor(nameId) {
    if (colors[nameId] === undefined) {
      const name = strings[nameId];
      let h = 0x811c9dc5;
      for (let k = 0; k < name.length; k++) {
        h ^= name.charCodeAt(k);
        h = Math.imul(h, 0x01000193) >>> 0;
      }
      const r = 205 + Math.floor((50 * (h & 255)) / 255);
      const g = 80 + Math.floor((120 * ((h >>> 8) & 255)) / 255);
      const b = 40 + Math.floor((50 * ((h >>> 16) & 255)) / 255);
      colors[nameId] = `rgb(${r},${g},${b})`;
    }
    return colors[nameId];
  }

  // The drawn frame at canvas pixel (px, py), or undefined.
  function hit(px, py) {
    return drawn.find((f) => py >= f.y && py < f.y + ROW && px >= f.x && px < f.x + f.width);
  }

  // --- 3. Zoom, tooltip, search
  function zoomTo(i) {
    zoomed = i;
    draw();
    showRetainers();
  }

  // --- What holds it: a retention report's paths, those of the sites in
  // the zoomed frame's function ("Foo#bar (app.rb:12)" is in Foo#bar), or
  // every site's at the root.
  const retainers = data.retainers || [];
  const retainersBox = document.getElementById("retainers");

  function showRetainers() {
    if (!retainersBox) return;
    const name = zoomed === 0 ? null : strings[nodes.name[zoomed]];
    const sites = name === null ? retainers : retainers.filter((r) => r.site === name || r.site.startsWith(name + " ("));
    document.getElementById("retainers-hint").textContent =
      name === null ? "The retention report's sites: click a frame for those in its function."
        : sites.length ? "What holds the memory allocated in " + name + "."
          : "The retention report has no site in " + name + ".";
    retainersBox.replaceChildren();
    for (const r of sites) {
      retainersBox.append(element("h3", r.site));
      const list = element("ul", "");
      for (const p of r.paths) list.append(element("li", p));
      retainersBox.append(list);
    }
  }

  canvas.addEventListener("click", (event) => {
    const frame = hit(event.offsetX, event.offsetY);
    if (frame) zoomTo(frame.node); // the root zooms out
  });
  document.getElementById("reset").addEventListener("click", () => zoomTo(0));
  document.addEventListener("keydown", (event) => {
    if (event.key !== "Escape") return;
    search.value = "";
    setSearch("");
    zoomTo(0);
  });

  canvas.addEventListener("mousemove", (event) => {
    const frame = hit(event.offsetX, event.offsetY);
    if (!frame) {
      tooltip.hidden = true;
      return;
    }
    const i = frame.node;
    const file = strings[nodes.file[i]];
    const lines = [["name", labelOf(i)]];
    if (file) lines.push(["file", nodes.line[i] > 0 ? `${file}:${nodes.line[i]}` : file]);
    lines.push(["", `${formatValue(value[i])} (${formatPercent(value[i], total)}) ${data.sampleType}`]);
    if (i > 0) lines.push(["", `self: ${formatValue(self[i])} (${formatPercent(self[i], total)})`]);
    tooltip.replaceChildren(...lines.map(([cls, text]) => element("div", text, cls)));
    tooltip.hidden = false;
    const left = Math.min(event.clientX + 14, window.innerWidth - tooltip.offsetWidth - 8);
    const below = event.clientY + 16;
    const top = below + tooltip.offsetHeight > window.innerHeight ? event.clientY - tooltip.offsetHeight - 8 : below;
    tooltip.style.left = `${Math.max(left, 0)}px`;
    tooltip.style.top = `${Math.max(top, 0)}px`;
  });
  canvas.addEventListener("mouseleave", () => {
    tooltip.hidden = true;
  });

  // Highlights frames whose name contains `term` (any case) and shows their
  // share of the total, each stack counted once (a match inside a match is
  // not added again).
  function setSearch(term) {
    const needle = term.trim().toLowerCase();
    if (!needle) {
      matched = null;
      matches.textContent = "";
      draw();
      return;
    }
    const hits = strings.map((s) => s.toLowerCase().includes(needle));
    matched = new Uint8Array(count);
    const inside = new Uint8Array(count); // in a matching frame or below one
    let frames = 0;
    let sum = 0;
    for (let i = 1; i < count; i++) {
      matched[i] = hits[nodes.name[i]] ? 1 : 0;
      if (matched[i]) {
        frames++;
        if (!inside[parent[i]]) sum += value[i];
      }
      inside[i] = inside[parent[i]] | matched[i];
    }
    matches.textContent = frames
      ? `Matched: ${formatPercent(sum, total)} (${formatValue(sum)})`
      : "No match";
    draw();
  }
  search.addEventListener("input", () => setSearch(search.value));

  // --- The functions table
  let sortKey = "flat";
  let descending = true;

  function renderTable() {
    const column = functions[sortKey];
    const numeric = sortKey === "flat" || sortKey === "cum";
    const order = column.map((_, k) => k);
    order.sort((a, b) => {
      const d = numeric ? column[a] - column[b] : compareText(strings[column[a]], strings[column[b]]);
      return (descending ? -d : d) || a - b;
    });
    const rows = document.createDocumentFragment();
    for (const k of order.slice(0, MAX_ROWS)) {
      const flat = functions.flat[k];
      const cum = functions.cum[k];
      const tr = document.createElement("tr");
      tr.dataset.function = k;
      tr.append(
        element("td", formatValue(flat)),
        element("td", formatPercent(flat, total)),
        element("td", formatValue(cum)),
        element("td", formatPercent(cum, total)),
        element("td", strings[functions.name[k]], "text name"),
        element("td", strings[functions.file[k]], "text file"),
      );
      rows.append(tr);
    }
    table.tBodies[0].replaceChildren(rows);
    const shown = Math.min(order.length, MAX_ROWS);
    document.getElementById("functions-note").textContent =
      shown < order.length ? `The first ${shown} of ${order.length} functions.` : `${order.length} functions.`;
    for (const th of table.tHead.rows[0].cells) {
      if (th.dataset.sort === sortKey) th.setAttribute("aria-sort", descending ? "descending" : "ascending");
      else th.removeAttribute("aria-sort");
    }
  }

  table.tHead.addEventListener("click", (event) => {
    const key = event.target.closest("th")?.dataset.sort;
    if (!key) return;
    descending = key === sortKey ? !descending : key === "flat" || key === "cum";
    sortKey = key;
    renderTable();
  });
  // A click on a row searches for that function.
  table.tBodies[0].addEventListener("click", (event) => {
    const row = event.target.closest("tr");
    if (!row) return;
    search.value = strings[functions.name[row.dataset.function]];
    setSearch(search.value);
    window.scrollTo({ top: 0 });
  });

  function compareText(a, b) {
    return a < b ? -1 : a > b ? 1 : 0;
  }

  function element(tag, text, className) {
    const el = document.createElement(tag);
    el.textContent = text;
    if (className) el.className = className;
    return el;
  }

  // --- Numbers, as units.rs's format_value and format_percent write them
  const BYTES = [[1, "B"], [1024, "kB"], [1024 ** 2, "MB"], [1024 ** 3, "GB"], [1024 ** 4, "TB"]];
  const NANOSECONDS = [[1, "ns"], [1e3, "\u00b5s"], [1e6, "ms"], [1e9, "s"]];
  const COUNTS = [[1, ""], [1e3, "k"], [1e6, "M"], [1e9, "G"]];

  function formatValue(v) {
    switch (data.unit) {
      case "bytes":
      case "byte":
      case "B":
        return formatScaled(v, BYTES, " ");
      case "nanoseconds":
      case "ns":
        return formatScaled(v, NANOSECONDS, " ");
      default:
        return Math.abs(v) < 10000 ? String(v) : formatScaled(v, COUNTS, "");
    }
  }

  // The largest step not above |v|; 3 significant digits.
  function formatScaled(v, steps, separator) {
    let [divisor, name] = steps[0];
    for (const step of steps) if (Math.abs(v) >= step[0]) [divisor, name] = step;
    if (divisor === 1) return `${v}${separator}${name}`;
    const scaled = v / divisor;
    const digits = Math.abs(scaled) >= 100 ? 0 : Math.abs(scaled) >= 10 ? 1 : 2;
    return `${scaled.toFixed(digits)}${separator}${name}`;
  }

  function formatPercent(part, whole) {
    return whole === 0 ? "-" : `${((part * 100) / whole).toFixed(1)}%`;
  }

  // --- For tests and the console: what is drawn, in viewport coordinates.
  function describe(frame) {
    const box = canvas.getBoundingClientRect();
    const i = frame.node;
    return {
      name: i === 0 ? "all" : strings[nodes.name[i]],
      label: frame.label,
      file: strings[nodes.file[i]],
      line: nodes.line[i],
      depth: nodes.depth[i],
      value: value[i],
      self: self[i],
      x: box.left + frame.x,
      y: box.top + frame.y,
      width: frame.width,
      height: ROW - 1,
      context: frame.context,
      zoomed: i === zoomed,
      highlighted: Boolean(matched && matched[i]),
    };
  }

  window.flamegraph = {
    visibleFrames: () => drawn.map(describe),
    frameAt(clientX, clientY) {
      const box = canvas.getBoundingClientRect();
      const frame = hit(clientX - box.left, clientY - box.top);
      return frame ? describe(frame) : null;
    },
    reset: () => zoomTo(0),
    search(term) {
      search.value = term;
      setSearch(term);
    },
    matchText: () => matches.textContent,
    retainersText: () => (retainersBox ? retainersBox.innerText : null),
    formatValue,
    formatPercent,
  };

  window.addEventListener("resize", resize);
  resize();
  renderTable();
  showRetainers();
})();
