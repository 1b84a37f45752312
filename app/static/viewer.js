// Encoder inspector: draws what the service's public API returns. No libraries, nothing from the network.
"use strict";

const $ = (id) => document.getElementById(id);
const HEAD_COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
                      "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#ad494a"];
const ROW = 18; // px per token row in the head view

const state = {
  info: null,
  request: null,      // {text, text_pair}
  attention: null,    // {model, tokens, token_details, layers, heads}: what every view shares
  byLayer: new Map(), // layer index → (heads, T, T) weights, fetched one layer at a time
  aggregates: {},     // "mean" | "rollout" → /attention response (all layers, heads averaged)
  layer: 0,
  heads: new Set(),
  focus: null,        // {side: "left"|"right", index}
  view: "head",
  pe: null,
  similarity: null,   // {texts, matrix}
};

// ---------- talking to the API ----------

function headers() {
  const h = {"Content-Type": "application/json"};
  const key = $("api-key").value.trim();
  if (key) h.Authorization = `Bearer ${key}`;
  return h;
}

async function api(path, body) {
  let response;
  try {
    response = await fetch(path, body === undefined ? {headers: headers()} : {method: "POST", headers: headers(), body: JSON.stringify(body)});
  } catch (error) {
    throw new Error(`The service could not be reached (${error.message}). Is it still running?`);
  }
  let data = null;
  try { data = await response.json(); } catch (error) { /* reported below */ }
  if (!response.ok) throw new Error(describeError(response, data));
  if (data === null) throw new Error(`The service answered ${response.status} without a JSON body.`);
  return data;
}

function describeError(response, data) {
  const error = (data && data.error) || {};
  const message = error.message || `HTTP ${response.status}`;
  switch (response.status) {
    case 401:
      $("key-box").open = true;
      return `This service needs an API key: enter it under “API key” and try again. (${message})`;
    case 413: return `That request is too large for the service: ${message}.`;
    case 422: return `The service did not accept the request: ${message}.`;
    case 429: return `The service is busy; try again in ${response.headers.get("Retry-After") || "a few"} seconds.`;
    case 503: return `The model is not ready yet: ${message}. Try again in a moment.`;
    default: return `The service answered ${response.status}: ${message}.`;
  }
}

function showError(message) {
  const box = $("error");
  box.textContent = message;
  box.hidden = false;
}

function clearError() {
  $("error").hidden = true;
  $("error").textContent = "";
}

async function guarded(button, work) {
  clearError();
  if (button) button.disabled = true;
  document.body.setAttribute("aria-busy", "true");
  try {
    await work();
  } catch (error) {
    showError(error.message);
  } finally {
    if (button) button.disabled = false;
    document.body.removeAttribute("aria-busy");
  }
}

// ---------- colours ----------

function headColour(h) {
  return h < HEAD_COLOURS.length ? HEAD_COLOURS[h] : `hsl(${(h * 137.5) % 360}, 60%, 45%)`;
}

// white → deep blue, for weights in [0, max]
function sequential(t) {
  t = Math.max(0, Math.min(1, t));
  return [Math.round(255 - 231 * t), Math.round(255 - 168 * t), Math.round(255 - 58 * t)];
}

// blue (−1) → white (0) → red (+1)
function diverging(v) {
  v = Math.max(-1, Math.min(1, v));
  if (v < 0) { const t = -v; return [Math.round(255 - 222 * t), Math.round(255 - 153 * t), Math.round(255 - 83 * t)]; }
  return [Math.round(255 - 77 * v), Math.round(255 - 231 * v), Math.round(255 - 212 * v)];
}

const rgb = (c) => `rgb(${c[0]},${c[1]},${c[2]})`;

// ---------- canvas helpers ----------

function sizeCanvas(canvas, width, height) {
  const ratio = window.devicePixelRatio || 1;
  canvas.width = Math.round(width * ratio);
  canvas.height = Math.round(height * ratio);
  canvas.style.width = `${width}px`;
  canvas.style.height = `${height}px`;
  const ctx = canvas.getContext("2d");
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  return ctx;
}

// A (rows × cols) matrix as an image, one pixel a cell, to be scaled up without smoothing.
function matrixImage(matrix, colour) {
  const rows = matrix.length, cols = matrix[0].length;
  const image = new ImageData(cols, rows);
  for (let i = 0; i < rows; i++) {
    for (let j = 0; j < cols; j++) {
      const c = colour(matrix[i][j]);
      const k = (i * cols + j) * 4;
      image.data[k] = c[0]; image.data[k + 1] = c[1]; image.data[k + 2] = c[2]; image.data[k + 3] = 255;
    }
  }
  const canvas = document.createElement("canvas");
  canvas.width = cols; canvas.height = rows;
  canvas.getContext("2d").putImageData(image, 0, 0);
  return canvas;
}

function drawScaled(ctx, source, x, y, width, height) {
  ctx.imageSmoothingEnabled = false;
  ctx.drawImage(source, x, y, width, height);
}

function showTooltip(event, text) {
  const tip = $("tooltip");
  tip.textContent = text;
  tip.hidden = false;
  tip.style.left = `${event.clientX + 12}px`;
  tip.style.top = `${event.clientY + 12}px`;
}

function hideTooltip() { $("tooltip").hidden = true; }

// ---------- attention: fetching ----------

// One layer per request keeps every response inside the service's limit on attention values
// (all heads of one layer of a 256-token text is 0.8 M weights; all six layers would be 4.7 M).
async function runAttention() {
  const text = $("text").value;
  const pair = $("text-pair").value;
  const request = {text, text_pair: pair === "" ? null : pair};
  const layer = Math.min(state.layer, state.info.architecture.layers - 1);
  const data = await api("/attention", {...request, layers: [layer], decimals: 5});
  state.request = request;
  state.layer = layer;
  state.attention = {
    model: data.model, tokens: data.tokens, token_details: data.token_details, heads: data.heads,
    layers: [...Array(state.info.architecture.layers).keys()],
  };
  state.byLayer = new Map([[layer, data.attention[0]]]);
  state.aggregates = {};
  if (state.heads.size === 0) data.heads.forEach((h) => state.heads.add(h));
  state.focus = null;
  buildControls();
  await render();
}

async function layerAttention(layer) {
  if (!state.byLayer.has(layer)) {
    const data = await api("/attention", {...state.request, layers: [layer], decimals: 5});
    state.byLayer.set(layer, data.attention[0]);
  }
  return state.byLayer.get(layer);
}

async function aggregate(kind) {
  if (!state.aggregates[kind]) {
    state.aggregates[kind] = await api("/attention", {...state.request, aggregate: kind});
  }
  return state.aggregates[kind];
}

function tokens() { return state.attention ? state.attention.tokens : []; }

function buildControls() {
  const {layers, heads} = state.attention;
  for (const id of ["head-layer", "heat-layer"]) {
    const select = $(id);
    const current = state.layer;
    select.innerHTML = "";
    layers.forEach((layer, index) => select.add(new Option(`${layer + 1} of ${layers.length}`, String(index))));
    select.value = String(current);
  }
  const heatHead = $("heat-head");
  const previous = heatHead.value;
  heatHead.innerHTML = "";
  heads.forEach((h) => heatHead.add(new Option(`head ${h + 1}`, String(h))));
  heatHead.add(new Option("mean over heads", "mean"));
  heatHead.add(new Option("rollout (layers 1…this one)", "rollout"));
  heatHead.value = previous && [...heatHead.options].some((o) => o.value === previous) ? previous : "0";

  const toggles = $("head-toggles");
  toggles.innerHTML = "";
  heads.forEach((h) => {
    const button = document.createElement("button");
    button.type = "button";
    button.textContent = String(h + 1);
    button.title = `head ${h + 1}`;
    button.style.borderColor = headColour(h);
    button.style.background = headColour(h);
    button.style.color = "#fff";
    button.setAttribute("aria-pressed", String(state.heads.has(h)));
    button.dataset.head = String(h);
    button.addEventListener("click", () => {
      if (state.heads.has(h)) state.heads.delete(h); else state.heads.add(h);
      button.setAttribute("aria-pressed", String(state.heads.has(h)));
      drawHeadLines();
    });
    toggles.append(button);
  });
}

// ---------- head view ----------

async function renderHeadView() {
  await layerAttention(state.layer);
  const list = tokens();
  for (const side of ["left", "right"]) {
    const column = $(`head-${side}`);
    column.innerHTML = "";
    list.forEach((token, index) => {
      const cell = document.createElement("div");
      cell.className = "token" + (state.attention.token_details[index].special ? " special" : "");
      cell.textContent = token;
      cell.tabIndex = 0;
      cell.dataset.index = String(index);
      const focus = () => { state.focus = {side, index}; highlightTokens(); drawHeadLines(); };
      const blur = () => { state.focus = null; highlightTokens(); drawHeadLines(); };
      cell.addEventListener("mouseenter", focus);
      cell.addEventListener("mouseleave", blur);
      cell.addEventListener("focus", focus);
      cell.addEventListener("blur", blur);
      column.append(cell);
    });
  }
  drawHeadLines();
}

function highlightTokens() {
  for (const side of ["left", "right"]) {
    for (const cell of $(`head-${side}`).children) {
      const index = Number(cell.dataset.index);
      const active = state.focus && state.focus.side === side && state.focus.index === index;
      cell.classList.toggle("active", Boolean(active));
      cell.classList.toggle("dim", Boolean(state.focus && state.focus.side === side && !active));
    }
  }
}

function drawHeadLines(canvas = $("head-canvas"), width = parseInt(getComputedStyle($("head-view")).gridTemplateColumns.split(" ")[1]) || 320) {
  if (!state.attention || !state.byLayer.has(state.layer)) return;
  const matrices = state.byLayer.get(state.layer);
  const n = tokens().length;
  const ctx = sizeCanvas(canvas, width, n * ROW);
  ctx.clearRect(0, 0, width, n * ROW);
  const focus = state.focus;
  const threshold = focus ? 0.005 : 0.02;
  ctx.lineCap = "round";
  for (const h of state.heads) {
    const matrix = matrices[state.attention.heads.indexOf(h)];
    ctx.strokeStyle = headColour(h);
    for (let i = 0; i < n; i++) {
      if (focus && focus.side === "left" && focus.index !== i) continue;
      for (let j = 0; j < n; j++) {
        if (focus && focus.side === "right" && focus.index !== j) continue;
        const w = matrix[i][j];
        if (w < threshold) continue;
        ctx.globalAlpha = Math.min(1, 0.15 + w);
        ctx.lineWidth = 0.5 + 2.5 * w;
        ctx.beginPath();
        ctx.moveTo(2, i * ROW + ROW / 2);
        ctx.lineTo(width - 2, j * ROW + ROW / 2);
        ctx.stroke();
      }
    }
  }
  ctx.globalAlpha = 1;
}

function exportHeadView() {
  const list = tokens();
  const probe = document.createElement("canvas").getContext("2d");
  probe.font = "13px monospace";
  const labelWidth = Math.ceil(Math.max(...list.map((t) => probe.measureText(t).width))) + 12;
  const linesWidth = 320;
  const width = labelWidth * 2 + linesWidth, height = list.length * ROW + 30;
  const canvas = document.createElement("canvas");
  const ctx = sizeCanvas(canvas, width, height);
  ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, width, height);
  ctx.fillStyle = "#1d2330"; ctx.font = "600 13px sans-serif";
  ctx.fillText(`${state.attention.model} · layer ${state.attention.layers[state.layer] + 1}`, 6, 18);
  ctx.font = "13px monospace"; ctx.textBaseline = "middle";
  list.forEach((t, i) => {
    ctx.textAlign = "right"; ctx.fillText(t, labelWidth - 6, 30 + i * ROW + ROW / 2);
    ctx.textAlign = "left"; ctx.fillText(t, labelWidth + linesWidth + 6, 30 + i * ROW + ROW / 2);
  });
  const lines = document.createElement("canvas");
  drawHeadLines(lines, linesWidth);
  ctx.drawImage(lines, labelWidth, 30, linesWidth, list.length * ROW);
  return canvas;
}

// ---------- model view ----------

function cellSize(n) { return Math.max(48, Math.min(96, Math.floor(900 / state.attention.heads.length) - 6)); }

async function allLayers() {
  for (const layer of state.attention.layers) await layerAttention(layer);
  return state.attention.layers.map((layer) => state.byLayer.get(layer));
}

async function renderModelView() {
  const grid = $("model-grid");
  const {layers, heads} = state.attention;
  const attention = await allLayers();
  const size = cellSize(tokens().length);
  grid.innerHTML = "";
  grid.style.gridTemplateColumns = `auto repeat(${heads.length}, ${size + 2}px)`;
  grid.append(document.createElement("span"));
  heads.forEach((h) => { const l = document.createElement("span"); l.className = "label"; l.textContent = `head ${h + 1}`; grid.append(l); });
  layers.forEach((layer, li) => {
    const label = document.createElement("span");
    label.className = "label"; label.textContent = `layer ${layer + 1}`;
    grid.append(label);
    heads.forEach((h, hi) => {
      const button = document.createElement("button");
      button.type = "button";
      button.title = `layer ${layer + 1}, head ${h + 1}: enlarge`;
      button.setAttribute("aria-label", button.title);
      const canvas = document.createElement("canvas");
      const ctx = sizeCanvas(canvas, size, size);
      drawScaled(ctx, matrixImage(attention[li][hi], (w) => sequential(w)), 0, 0, size, size);
      button.append(canvas);
      button.addEventListener("click", () => {
        state.layer = li;
        $("heat-layer").value = String(li);
        $("heat-head").value = String(h);
        selectView("heatmap");
      });
      grid.append(button);
    });
  });
}

function exportModelView() {
  const {layers, heads} = state.attention;
  const attention = layers.map((layer) => state.byLayer.get(layer));
  const size = 64, gap = 4, left = 60, top = 40;
  const width = left + heads.length * (size + gap), height = top + layers.length * (size + gap);
  const canvas = document.createElement("canvas");
  const ctx = sizeCanvas(canvas, width, height);
  ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, width, height);
  ctx.fillStyle = "#1d2330"; ctx.font = "11px sans-serif"; ctx.textAlign = "center";
  ctx.fillText(`${state.attention.model}: every layer and head`, width / 2, 14);
  heads.forEach((h, hi) => ctx.fillText(`head ${h + 1}`, left + hi * (size + gap) + size / 2, top - 8));
  layers.forEach((layer, li) => {
    ctx.textAlign = "right"; ctx.fillText(`layer ${layer + 1}`, left - 6, top + li * (size + gap) + size / 2);
    heads.forEach((h, hi) => drawScaled(ctx, matrixImage(attention[li][hi], sequential), left + hi * (size + gap), top + li * (size + gap), size, size));
  });
  return canvas;
}

// ---------- heatmap view ----------

async function currentHeatmap() {
  const choice = $("heat-head").value;
  const li = Number($("heat-layer").value || 0);
  const layer = state.attention.layers[li];
  if (choice === "mean" || choice === "rollout") {
    const data = await aggregate(choice);
    return {matrix: data.attention[li][0], title: `layer ${layer + 1}, ${choice === "mean" ? "mean over heads" : "rollout"}`};
  }
  const hi = state.attention.heads.indexOf(Number(choice));
  return {matrix: (await layerAttention(li))[hi], title: `layer ${layer + 1}, head ${Number(choice) + 1}`};
}

function heatmapLayout(n) {
  const probe = document.createElement("canvas").getContext("2d");
  probe.font = "12px monospace";
  const cell = Math.max(4, Math.min(28, Math.floor(640 / n)));
  const showLabels = cell >= 9;
  const margin = showLabels ? Math.ceil(Math.max(...tokens().map((t) => probe.measureText(t).width))) + 10 : 10;
  return {cell, margin, showLabels, size: margin + n * cell + 10};
}

function drawHeatmap(canvas, matrix, title) {
  const n = matrix.length;
  const {cell, margin, showLabels, size} = heatmapLayout(n);
  const ctx = sizeCanvas(canvas, size, size + 22);
  ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, size, size + 22);
  ctx.fillStyle = "#1d2330"; ctx.font = "600 13px sans-serif"; ctx.textAlign = "left"; ctx.textBaseline = "alphabetic";
  ctx.fillText(title, 6, 15);
  const max = Math.max(1e-9, ...matrix.map((row) => Math.max(...row)));
  drawScaled(ctx, matrixImage(matrix, (w) => sequential(w / max)), margin, margin + 22, n * cell, n * cell);
  if (showLabels) {
    ctx.font = `${Math.min(12, cell)}px monospace`; ctx.fillStyle = "#1d2330"; ctx.textBaseline = "middle";
    tokens().forEach((t, i) => {
      ctx.textAlign = "right"; ctx.fillText(t, margin - 4, margin + 22 + i * cell + cell / 2);
      ctx.save(); ctx.translate(margin + i * cell + cell / 2, margin + 22 - 4); ctx.rotate(-Math.PI / 2);
      ctx.textAlign = "left"; ctx.fillText(t, 0, 0); ctx.restore();
    });
  }
  canvas.dataset.cell = String(cell);
  canvas.dataset.margin = String(margin);
}

async function renderHeatmap() {
  const {matrix, title} = await currentHeatmap();
  state.heatmap = {matrix, title};
  drawHeatmap($("heat-canvas"), matrix, title);
}

function heatmapHover(event) {
  if (!state.heatmap) return;
  const canvas = $("heat-canvas");
  const rect = canvas.getBoundingClientRect();
  const cell = Number(canvas.dataset.cell), margin = Number(canvas.dataset.margin);
  const j = Math.floor((event.clientX - rect.left - margin) / cell);
  const i = Math.floor((event.clientY - rect.top - margin - 22) / cell);
  const n = state.heatmap.matrix.length;
  if (i < 0 || j < 0 || i >= n || j >= n) { hideTooltip(); return; }
  const text = `“${tokens()[i]}” → “${tokens()[j]}”: ${state.heatmap.matrix[i][j].toFixed(4)}`;
  $("heat-readout").textContent = `${text} (${state.heatmap.title})`;
  showTooltip(event, text);
}

// ---------- positional encoding ----------

async function renderPositionalEncoding() {
  const kind = $("pe-kind").value;
  const params = new URLSearchParams({kind, length: $("pe-length").value});
  if (kind === "sinusoidal") params.set("d_model", $("pe-width").value);
  state.pe = await api(`/positional-encoding?${params}`);
  drawPositionalEncoding($("pe-canvas"));
}

function peLayout() {
  const {length, d_model: width} = state.pe;
  const cellW = Math.max(1, Math.min(12, Math.floor(900 / width)));
  const cellH = Math.max(1, Math.min(12, Math.floor(600 / length)));
  return {cellW, cellH, left: 48, top: 28};
}

function drawPositionalEncoding(canvas) {
  const {encoding, length, d_model: width, kind} = state.pe;
  const {cellW, cellH, left, top} = peLayout();
  const w = left + width * cellW + 10, h = top + length * cellH + 24;
  const ctx = sizeCanvas(canvas, w, h);
  ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, w, h);
  ctx.fillStyle = "#1d2330"; ctx.font = "600 13px sans-serif"; ctx.textAlign = "left";
  ctx.fillText(`${kind} positional encoding: ${length} positions × ${width} dimensions`, 6, 16);
  const scale = kind === "learned" ? Math.max(1e-9, ...encoding.map((r) => Math.max(...r.map(Math.abs)))) : 1;
  drawScaled(ctx, matrixImage(encoding, (v) => diverging(v / scale)), left, top, width * cellW, length * cellH);
  ctx.font = "11px sans-serif"; ctx.fillStyle = "#5d6675"; ctx.textAlign = "right"; ctx.textBaseline = "middle";
  const step = Math.max(1, Math.ceil(16 / cellH));
  for (let p = 0; p < length; p += step * Math.ceil(length / (step * 12))) ctx.fillText(String(p), left - 6, top + p * cellH + cellH / 2);
  ctx.textAlign = "center"; ctx.textBaseline = "top";
  ctx.fillText("dimension →", left + (width * cellW) / 2, top + length * cellH + 6);
}

function peHover(event) {
  if (!state.pe) return;
  const rect = $("pe-canvas").getBoundingClientRect();
  const {cellW, cellH, left, top} = peLayout();
  const k = Math.floor((event.clientX - rect.left - left) / cellW);
  const pos = Math.floor((event.clientY - rect.top - top) / cellH);
  if (pos < 0 || k < 0 || pos >= state.pe.length || k >= state.pe.d_model) { hideTooltip(); return; }
  const text = `position ${pos}, dimension ${k}: ${state.pe.encoding[pos][k].toFixed(4)}`;
  $("pe-readout").textContent = text;
  showTooltip(event, text);
}

// ---------- similarity ----------

async function renderSimilarity() {
  const texts = $("sim-texts").value.split("\n").map((t) => t.trim()).filter((t) => t !== "");
  const data = await api("/encode", {texts, normalize: true});
  const vectors = data.data.map((d) => d.embedding);
  const matrix = vectors.map((a) => vectors.map((b) => a.reduce((sum, x, k) => sum + x * b[k], 0)));
  state.similarity = {model: data.model, texts, matrix};
  const table = $("sim-table");
  table.innerHTML = "";
  const head = table.createTHead().insertRow();
  head.append(document.createElement("th"));
  texts.forEach((_, i) => { const th = document.createElement("th"); th.textContent = String(i + 1); th.scope = "col"; head.append(th); });
  const body = table.createTBody();
  texts.forEach((text, i) => {
    const row = body.insertRow();
    const th = document.createElement("th");
    th.scope = "row"; th.textContent = `${i + 1}. ${text}`; th.title = text;
    row.append(th);
    matrix[i].forEach((value, j) => {
      const cell = row.insertCell();
      cell.textContent = value.toFixed(2);
      const c = diverging(value);
      cell.style.background = rgb(c);
      cell.style.color = Math.abs(value) > 0.6 ? "#fff" : "#1d2330";
      cell.title = `${texts[i]} ↔ ${texts[j]}: ${value.toFixed(4)}`;
    });
  });
}

function exportSimilarity() {
  const {texts, matrix} = state.similarity;
  const cell = 56, left = 40, top = 40, legend = texts.length * 18 + 20;
  const size = left + texts.length * cell + 10;
  const canvas = document.createElement("canvas");
  const ctx = sizeCanvas(canvas, Math.max(size, 480), top + texts.length * cell + legend);
  ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, canvas.width, canvas.height);
  ctx.fillStyle = "#1d2330"; ctx.font = "600 13px sans-serif"; ctx.fillText("cosine similarity of sentence embeddings", 6, 16);
  ctx.font = "12px sans-serif"; ctx.textAlign = "center"; ctx.textBaseline = "middle";
  matrix.forEach((row, i) => {
    ctx.fillStyle = "#1d2330"; ctx.fillText(String(i + 1), left + i * cell + cell / 2, top - 10); ctx.fillText(String(i + 1), left - 14, top + i * cell + cell / 2);
    row.forEach((v, j) => {
      ctx.fillStyle = rgb(diverging(v)); ctx.fillRect(left + j * cell, top + i * cell, cell - 2, cell - 2);
      ctx.fillStyle = Math.abs(v) > 0.6 ? "#fff" : "#1d2330"; ctx.fillText(v.toFixed(2), left + j * cell + cell / 2, top + i * cell + cell / 2);
    });
  });
  ctx.textAlign = "left"; ctx.fillStyle = "#1d2330";
  texts.forEach((t, i) => ctx.fillText(`${i + 1}. ${t}`, 6, top + texts.length * cell + 20 + i * 18));
  return canvas;
}

// ---------- views, downloads ----------

const VIEWS = ["head", "model", "heatmap", "pe", "similarity"];

function selectView(view) {
  state.view = view;
  for (const v of VIEWS) {
    const selected = v === view;
    $(`tab-${v}`).setAttribute("aria-selected", String(selected));
    $(`tab-${v}`).tabIndex = selected ? 0 : -1;
    $(`view-${v}`).hidden = !selected;
  }
  guarded(null, render);
}

async function render() {
  if (state.view === "pe") { if (!state.pe) await renderPositionalEncoding(); return; }
  if (state.view === "similarity") { if (!state.similarity) await renderSimilarity(); return; }
  if (!state.attention) return;
  if (state.view === "head") await renderHeadView();
  else if (state.view === "model") await renderModelView();
  else if (state.view === "heatmap") await renderHeatmap();
}

function download(name, href) {
  const link = document.createElement("a");
  link.href = href; link.download = name;
  document.body.append(link); link.click(); link.remove();
}

function viewData() {
  switch (state.view) {
    case "pe": return state.pe;
    case "similarity": return state.similarity;
    case "heatmap": return state.heatmap && {...state.heatmap, tokens: tokens()};
    default: return state.attention && {
      ...state.attention,
      layers: [...state.byLayer.keys()].sort((a, b) => a - b),
      attention: [...state.byLayer.keys()].sort((a, b) => a - b).map((layer) => state.byLayer.get(layer)),
    };
  }
}

function viewCanvas() {
  switch (state.view) {
    case "head": return state.attention && exportHeadView();
    case "model": return state.attention && exportModelView();
    case "heatmap": return state.heatmap && $("heat-canvas");
    case "pe": return state.pe && $("pe-canvas");
    case "similarity": return state.similarity && exportSimilarity();
  }
  return null;
}

// ---------- wiring ----------

function wire() {
  $("input-form").addEventListener("submit", (event) => { event.preventDefault(); guarded($("submit"), runAttention); });
  for (const id of ["text", "text-pair"]) {
    $(id).addEventListener("keydown", (event) => {
      if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) { event.preventDefault(); $("input-form").requestSubmit(); }
    });
  }
  $("head-layer").addEventListener("change", (event) => {
    state.layer = Number(event.target.value);
    $("heat-layer").value = event.target.value;
    guarded(null, async () => { await layerAttention(state.layer); drawHeadLines(); });
  });
  $("heat-layer").addEventListener("change", (event) => { state.layer = Number(event.target.value); $("head-layer").value = event.target.value; guarded(null, renderHeatmap); });
  $("heat-head").addEventListener("change", () => guarded(null, renderHeatmap));
  $("heads-all").addEventListener("click", () => { state.attention.heads.forEach((h) => state.heads.add(h)); buildControls(); drawHeadLines(); });
  $("heads-none").addEventListener("click", () => { state.heads.clear(); buildControls(); drawHeadLines(); });
  $("heat-canvas").addEventListener("mousemove", heatmapHover);
  $("heat-canvas").addEventListener("mouseleave", hideTooltip);
  $("pe-canvas").addEventListener("mousemove", peHover);
  $("pe-canvas").addEventListener("mouseleave", hideTooltip);
  $("pe-form").addEventListener("submit", (event) => { event.preventDefault(); guarded(null, renderPositionalEncoding); });
  $("pe-kind").addEventListener("change", () => { $("pe-width").disabled = $("pe-kind").value === "learned"; });
  $("sim-form").addEventListener("submit", (event) => { event.preventDefault(); guarded(event.submitter, renderSimilarity); });
  $("download-png").addEventListener("click", () => {
    const canvas = viewCanvas();
    if (!canvas) { showError("Nothing is drawn in this view yet."); return; }
    download(`${state.view}.png`, canvas.toDataURL("image/png"));
  });
  $("download-json").addEventListener("click", () => {
    const data = viewData();
    if (!data) { showError("There is no data in this view yet."); return; }
    download(`${state.view}.json`, URL.createObjectURL(new Blob([JSON.stringify(data)], {type: "application/json"})));
  });
  const tabs = VIEWS.map((v) => $(`tab-${v}`));
  tabs.forEach((tab, index) => {
    tab.addEventListener("click", () => selectView(VIEWS[index]));
    tab.addEventListener("keydown", (event) => {
      const step = event.key === "ArrowRight" ? 1 : event.key === "ArrowLeft" ? -1 : 0;
      if (!step) return;
      const next = (index + step + tabs.length) % tabs.length;
      tabs[next].focus();
      selectView(VIEWS[next]);
    });
  });
  window.addEventListener("resize", () => { if (state.view === "head") drawHeadLines(); });
}

async function start() {
  wire();
  await guarded(null, async () => {
    state.info = await api("/info");
    const {model, architecture: a, device, dtype} = state.info;
    $("model-info").textContent = `${model} · ${a.layers} layers × ${a.heads} heads · ${a.hidden_size} wide · ${device}, ${dtype}`;
    state.layer = a.layers - 1;
  });
  if (state.info) await guarded($("submit"), runAttention);
}

start();
