// Encoder inspector: draws what the service's public API returns. No libraries, nothing from the network.
// This module holds the page's state and wires its controls; each view's drawing is in its view-*.js
// module, every size in layout.js.

import {api, useModel} from "./api.js";
import {paint, placeGridButtons, pngOf, sizeCanvas} from "./canvas.js";
import {headColour} from "./colour.js";
import {
  HEAD, ROW, crossLayout, explanationCell, explanationLayout, gridCell, headLayout, heatmapLayout, modelLayout, neuronLayout,
  peLayout, rerankLayout, similarityLayout, statsLayout,
} from "./layout.js";
import {drawHeadView, fillTokenColumns, highlightTokens} from "./view-head.js";
import {drawHeatmap, heatmapText} from "./view-heatmap.js";
import {drawModelView, placeCellButtons} from "./view-model.js";
import {
  biasText, drawNeuronView, fillNeuronSteps, fillNeuronTable, fillQueryTokens, markQueryToken, neuronData, neuronSummary, neuronText,
} from "./view-neuron.js";
import {drawPositionalEncoding, positionalLegend, positionalText} from "./view-positional.js";
import {drawRerank, fillRerankList, rerankText, sharedTerms, termText} from "./view-rerank.js";
import {
  drawExplanation, drawSimilarity, explanationOf, explanationText, explanationTitle, fillExplanationTable, fillSimilarityTable,
  similarityText,
} from "./view-similarity.js";
import {drawHeadStatistics, fillStatsTable, statisticName, statsData, statsText} from "./view-stats.js";
import {explainSummary, fillExplainTokens} from "./view-explain.js";

const $ = (id) => document.getElementById(id);

const state = {
  info: null,
  request: null,      // {text, text_pair}
  attention: null,    // {model, tokens, token_details, layers, heads, weighting, level}: what every view shares
  norm: false,        // the views' "Norm-weighted" box: /attention's weighting "norm" instead of "attention"
  words: false,       // their "Words" box: /attention's level "word" instead of "token"
  byLayer: new Map(), // layer index → (heads, T, T) weights, fetched one layer at a time
  aggregates: {},     // "mean" | "rollout" → /attention response (all layers, heads averaged)
  layer: 0,
  heads: new Set(),
  focus: null,        // {side: "left"|"right", index}
  view: "head",
  heatmap: null,      // {matrix, title, tokens}
  pe: null,
  similarity: null,   // {model, texts, matrix, selected: {row, col} | null}
  explanation: null,  // the selected pair's score, explained: explanationOf(...)
  stats: null,        // {response: /attention/heads's answer, texts}
  neuron: null,       // {response: /attention/neuron's answer, request, layer, head}
  neuronQuery: null,  // the neuron view's query token (an index into the response's tokens)
  rerank: null,       // {model, query, results, selected}: /rerank's answer, best first
  pair: null,         // {model, title, rowTokens, colTokens, matrix}: query × document attention
  explain: null,      // /explain's answer for the text (and second sentence) of the form
  figures: {},        // view → the figure last drawn on screen, {data, layout, draw}: what its PNG redraws
};

// ---------- errors, busy state, tooltip ----------

function showError(message) {
  const box = $("error");
  box.textContent = message;
  box.hidden = false;
}

function clearError() {
  $("error").hidden = true;
  $("error").textContent = "";
  document.querySelectorAll(".view.stale").forEach((view) => view.classList.remove("stale"));
}

// After an error the view on show no longer answers what the form says: its drawing is put away (.stale) until
// the next request, rather than left under the error as if it were that input's.
function markStale() {
  document.querySelectorAll(".view:not([hidden])").forEach((view) => view.classList.add("stale"));
}

// The page is busy (aria-busy) while any of the work it started is under way, not just the latest.
let busy = 0;

async function guarded(button, work) {
  clearError();
  if (button) button.disabled = true;
  busy += 1;
  document.body.setAttribute("aria-busy", "true");
  try {
    await work();
  } catch (error) {
    showError(error.message);
    markStale();
  } finally {
    if (button) button.disabled = false;
    busy -= 1;
    if (busy === 0) document.body.removeAttribute("aria-busy");
  }
}

// event: a pointer event, or any {clientX, clientY} the tooltip should sit next to.
function showTooltip(event, text) {
  const tip = $("tooltip");
  tip.textContent = text;
  tip.hidden = false;
  tip.style.left = `${event.clientX + 12}px`;
  tip.style.top = `${event.clientY + 12}px`;
}

function hideTooltip() { $("tooltip").hidden = true; }

// Draws a view's figure on its canvas and keeps it for the view's PNG.
function show(view, canvasId, figure) {
  paint($(canvasId), figure);
  state.figures[view] = figure;
  const panel = $(canvasId).closest(".view");  // drawn anew: an earlier request's failure no longer hides it
  if (panel) panel.classList.remove("stale");
}

// A cell of a view's figure in words, `text(data, row, col)`, in a tooltip by `point` and in the readout
// (with `context(data)` after it there).
function readCell(view, readout, text, row, col, point, context = () => "") {
  const figure = state.figures[view];
  if (!figure) return;
  const words = (figure.text || text)(figure.data, row, col);
  $(readout).textContent = words + context(figure.data);
  showTooltip(point, words);
}

// Hovering a matrix view's canvas: the cell under the pointer, read out. The cells are where the view's
// figure has them: `hit(layout, x, y)` finds one. A figure may bring its own `hit` and `text` (a canvas that
// shows figures of more than one kind).
function hoverCells(view, canvasId, readout, text, {context = () => "", hit = gridCell} = {}) {
  const canvas = $(canvasId);
  canvas.addEventListener("mouseleave", hideTooltip);
  canvas.addEventListener("mousemove", (event) => {
    const figure = state.figures[view];
    if (!figure) return;
    const rect = canvas.getBoundingClientRect();
    const cell = (figure.hit || hit)(figure.layout, event.clientX - rect.left, event.clientY - rect.top);
    if (!cell) { hideTooltip(); return; }
    readCell(view, readout, text, cell.row, cell.col, event, context);
  });
}

// ---------- attention: fetching ----------

function formRequest() {
  const pair = $("text-pair").value;
  return {text: $("text").value, text_pair: pair === "" ? null : pair};
}

// What the Norm-weighted and Words boxes add to every /attention request of the attention views
// (nothing when they are clear, so that the service's defaults apply).
function attentionOptions() {
  return {...(state.norm ? {weighting: "norm"} : {}), ...(state.words ? {level: "word"} : {})};
}

// The weighting and level of what is on show, in words, for the figures' titles ("" for the defaults).
function optionsText() {
  const parts = [state.attention.weighting === "norm" ? "norm-weighted" : "", state.attention.level === "word" ? "words" : ""];
  return parts.filter(Boolean).map((p) => ` · ${p}`).join("");
}

// The details of each row and column: the tokens' own, or at word level each word's, from the tokens
// it lists (a special token stays a word of its own); failing both, what the text says.
const SPECIAL = /^(\[[A-Z]+\]|<\/?s>|<pad>|<mask>|<unk>)$/;
function tokenDetails(data) {
  const details = Array.isArray(data.token_details) ? data.token_details : [];
  if (Array.isArray(data.words) && data.words.length === data.tokens.length) {
    return data.words.map((word) => {
      const first = details[word.tokens[0]] || {};
      return {...first, text: word.text, special: word.tokens.every((k) => Boolean(details[k] && details[k].special))};
    });
  }
  if (details.length === data.tokens.length) return details;
  return data.tokens.map((text) => ({text, special: SPECIAL.test(text)}));
}

// A byte-level BPE tokenizer's tokens (GPT-2's, RoBERTa's, Qwen's) spell spaces and newlines as markers (Ġ, Ċ, ĉ):
// label each with the text it covers instead, from its offsets into its own segment's text (↵ for a newline, →
// for a tab); special tokens and the tokens of other tokenizers keep their own text.
const BYTE_LEVEL = /[ĠĊĉ]/;
function readableTokens(tokens, details, texts) {
  if (!tokens.some((t) => BYTE_LEVEL.test(t)) || details.length !== tokens.length) return tokens;
  return tokens.map((token, i) => {
    const d = details[i], text = texts[d.segment || 0];
    if (d.special || typeof text !== "string" || !(d.end > d.start)) return token;
    // The offsets count characters (code points), as Python does; a JavaScript string counts UTF-16 units.
    return Array.from(text).slice(d.start, d.end).join("").replace(/\n/g, "↵").replace(/\t/g, "→") || token;
  });
}

// One layer per request keeps every response inside the service's limit on attention values
// (all heads of one layer of a 256-token text is 0.8 M weights; all six layers would be 4.7 M).
// A request answered after a later one (the boxes ticked quickly, say) is dropped: the later one wins.
let attentionAsked = 0;

async function runAttention(request = formRequest()) {
  const layer = Math.min(state.layer, state.info.architecture.layers - 1);
  const options = attentionOptions();
  const asked = ++attentionAsked;
  const data = await api("/attention", {...request, ...options, layers: [layer], decimals: 5});
  if (asked !== attentionAsked) return;
  state.request = request;
  state.layer = layer;
  const words = Array.isArray(data.words) && data.words.length === data.tokens.length;
  const texts = [request.text, request.text_pair];
  state.attention = {
    model: data.model, heads: data.heads, token_details: tokenDetails(data),
    tokens: words ? data.tokens : readableTokens(data.tokens, data.token_details || [], texts),
    layers: [...Array(state.info.architecture.layers).keys()],
    weighting: options.weighting || "attention", level: options.level || "token",
  };
  state.byLayer = new Map([[layer, data.attention[0]]]);
  state.aggregates = {};
  if (state.heads.size === 0) data.heads.forEach((h) => state.heads.add(h));
  state.focus = null;
  buildControls();
  await render();
}

// More of the attention on show: the same text, weighting and level. The caches are those of the
// attention on show when asked, so that an answer for a text or setting since replaced is not kept.
function sameAttention() {
  const {weighting, level} = state.attention;
  return {...state.request, ...(weighting === "norm" ? {weighting} : {}), ...(level === "word" ? {level} : {})};
}

async function layerAttention(layer) {
  const cache = state.byLayer;
  if (!cache.has(layer)) {
    const data = await api("/attention", {...sameAttention(), layers: [layer], decimals: 5});
    cache.set(layer, data.attention[0]);
  }
  return cache.get(layer);
}

async function aggregate(kind) {
  const cache = state.aggregates;
  if (!cache[kind]) cache[kind] = await api("/attention", {...sameAttention(), aggregate: kind});
  return cache[kind];
}

function tokens() { return state.attention ? state.attention.tokens : []; }

function buildControls() {
  const {layers, heads} = state.attention;
  for (const id of ["head-layer", "heat-layer"]) {
    const select = $(id);
    const current = state.layer;
    select.innerHTML = "";
    layers.forEach((layer, index) => select.add(new Option(`${layer} of 0–${layers.length - 1}`, String(index))));
    select.value = String(current);
  }
  const heatHead = $("heat-head");
  const previous = heatHead.value;
  heatHead.innerHTML = "";
  heads.forEach((h) => heatHead.add(new Option(`head ${h}`, String(h))));
  heatHead.add(new Option("mean over heads", "mean"));
  heatHead.add(new Option("rollout (layers 0…this one)", "rollout"));
  heatHead.value = previous && [...heatHead.options].some((o) => o.value === previous) ? previous : "0";
  fillNeuronSelects();

  const toggles = $("head-toggles");
  toggles.innerHTML = "";
  const group = headGroup();
  heads.forEach((h) => {
    const button = document.createElement("button");
    button.type = "button";
    button.textContent = String(h);
    button.title = group ? `head ${h} · key/value head ${group(h)}` : `head ${h}`;
    if (group) button.dataset.group = String(group(h));
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

// Under grouped-query attention, the key/value head each query head attends with (query head h uses key/value
// head h ÷ (heads / kv_heads)); null when every head has its own.
function headGroup() {
  const a = state.info && state.info.architecture;
  if (!a || !a.kv_heads || a.kv_heads >= a.heads) return null;
  const size = a.heads / a.kv_heads;
  return (h) => Math.floor(h / size);
}

// The sentence under the head toggles that says which query heads share a key/value head.
function describeGroups() {
  const a = state.info && state.info.architecture, note = $("head-groups");
  const group = headGroup();
  note.hidden = !group;
  if (!group) return;
  const size = a.heads / a.kv_heads;
  const groups = Array.from({length: a.kv_heads}, (_, g) =>
    size === 1 ? `head ${g}` : `heads ${g * size}–${(g + 1) * size - 1} share key/value head ${g}`);
  note.textContent = `Grouped-query attention: ${groups.join("; ")}. Heads of one group look with the same keys and values, each with its own queries.`;
}

// ---------- head view ----------

const tokenColumns = () => ({left: $("head-left"), right: $("head-right")});

async function renderHeadView() {
  await layerAttention(state.layer);
  fillTokenColumns(tokenColumns(), tokens(), state.attention.token_details, (focus) => {
    state.focus = focus;
    highlightTokens(tokenColumns(), focus);
    drawHeadLines();
  });
  drawHeadLines();
}

// The band of lines is as wide as the page's grid makes it (narrower on a phone).
function linesWidth() {
  return parseInt(getComputedStyle($("head-view")).gridTemplateColumns.split(" ")[1]) || HEAD.linesWidth;
}

// The weight the views draw as their strongest: 1 for attention weights, whose rows sum to 1; the
// largest value for norms, which have no such bound.
function fullScale(matrices) {
  if (state.attention.weighting !== "norm") return 1;
  let max = 1e-12;
  for (const matrix of matrices) for (const row of matrix) for (const v of row) if (v > max) max = v;
  return max;
}

function drawHeadLines() {
  if (!state.attention || !state.byLayer.has(state.layer)) return;
  const matrices = state.byLayer.get(state.layer);
  const heads = [...state.heads].map((head) => ({head, matrix: matrices[state.attention.heads.indexOf(head)]}));
  const data = {
    title: `${state.attention.model} · layer ${state.attention.layers[state.layer]}${optionsText()}`,
    tokens: tokens(),
    heads,
    scale: fullScale(heads.map((h) => h.matrix)),
    focus: state.focus,
  };
  show("head", "head-canvas", {data, layout: headLayout(data.tokens, {linesWidth: linesWidth()}), draw: drawHeadView});
}

// ---------- model view ----------

async function allLayers() {
  for (const layer of state.attention.layers) await layerAttention(layer);
  return state.attention.layers.map((layer) => state.byLayer.get(layer));
}

async function renderModelView() {
  const {model, layers, heads} = state.attention;
  const attention = await allLayers();
  const data = {model, layers, heads, attention, scale: fullScale(attention.flat()), title: `${model}: every layer and head${optionsText()}`};
  const layout = modelLayout(layers.length, heads.length);
  show("model", "model-canvas", {data, layout, draw: drawModelView});
  placeCellButtons($("model-grid"), data, layout, openHeatmap);
}

// The heatmap view, showing layer index `li`, head `h` of the text on show.
function openHeatmap(li, h) {
  state.layer = li;
  $("heat-layer").value = String(li);
  $("head-layer").value = String(li);
  $("heat-head").value = String(h);
  selectView("heatmap");
}

// ---------- heatmap view ----------

async function currentHeatmap() {
  const choice = $("heat-head").value;
  const li = Number($("heat-layer").value || 0);
  const layer = state.attention.layers[li];
  if (choice === "mean" || choice === "rollout") {
    const data = await aggregate(choice);
    return {matrix: data.attention[li][0], title: `layer ${layer}, ${choice === "mean" ? "mean over heads" : "rollout"}${optionsText()}`};
  }
  const hi = state.attention.heads.indexOf(Number(choice));
  return {matrix: (await layerAttention(li))[hi], title: `layer ${layer}, head ${Number(choice)}${optionsText()}`};
}

async function renderHeatmap() {
  const {matrix, title} = await currentHeatmap();
  state.heatmap = {matrix, title, tokens: tokens()};
  show("heatmap", "heat-canvas", {data: state.heatmap, layout: heatmapLayout(state.heatmap.tokens, title), draw: drawHeatmap});
}

// ---------- neuron view ----------

// The neuron view's layer and head selects, keeping their choice (the last layer and first head at first).
function fillNeuronSelects() {
  const {layers, heads} = state.attention;
  const fill = (select, options, initial) => {
    const previous = select.value;
    select.innerHTML = "";
    options.forEach(([label, value]) => select.add(new Option(label, value)));
    select.value = [...select.options].some((o) => o.value === previous) ? previous : initial;
  };
  fill($("neuron-layer"), layers.map((layer, index) => [`${layer} of 0–${layers.length - 1}`, String(index)]), String(layers.length - 1));
  fill($("neuron-head"), heads.map((h) => [`head ${h}`, String(h)]), String(heads[0]));
}

// A request answered after a later one (the layer changed quickly, say) is dropped: the later one wins.
let neuronAsked = 0;

async function renderNeuron() {
  const layer = Number($("neuron-layer").value), head = Number($("neuron-head").value);
  const request = state.request;
  const shown = state.neuron;
  if (shown && shown.request === request && shown.layer === layer && shown.head === head) { drawNeuron(); return; }
  const asked = ++neuronAsked;
  let response;
  try {
    response = await api("/attention/neuron", {...request, layer, head});
  } catch (error) {
    if (asked === neuronAsked) forgetNeuron();  // what is on show is no longer what the controls say
    throw error;
  }
  if (asked !== neuronAsked) return;
  response.tokens = readableTokens(response.tokens, response.token_details || [], [request.text, request.text_pair]);
  state.neuron = {response, request, layer, head};
  const T = response.tokens.length;
  state.neuronQuery = Math.min(state.neuronQuery === null ? 1 : state.neuronQuery, T - 1);
  fillQueryTokens($("neuron-tokens"), response.tokens, response.token_details || [], state.neuronQuery, pickQuery);
  drawNeuron();
}

function pickQuery(i) {
  state.neuronQuery = i;
  markQueryToken($("neuron-tokens"), i);
  drawNeuron();
}

function drawNeuron() {
  if (!state.neuron) return;
  const data = neuronData(state.neuron.response, state.neuronQuery);
  const layout = neuronLayout(data.tokens, data.dh, data.headings, {title: data.title, bias: data.hasBias});
  show("neuron", "neuron-canvas", {data, layout, draw: drawNeuronView});
  fillNeuronTable($("neuron-table"), data);
  fillNeuronSteps($("neuron-steps"), data);
  $("neuron-note").textContent = biasText(data);
  $("neuron-note").hidden = !data.hasBias;
  $("neuron-readout").textContent = neuronSummary(data);
}

function forgetNeuron() {
  state.neuron = null;
  state.figures.neuron = null;
  sizeCanvas($("neuron-canvas"), 0, 0);
  for (const id of ["neuron-tokens", "neuron-steps", "neuron-table", "neuron-note", "neuron-readout"]) $(id).innerHTML = "";
  $("neuron-note").hidden = true;
}

// ---------- positional encoding ----------

async function renderPositionalEncoding() {
  const kind = $("pe-kind").value;
  const params = new URLSearchParams({kind, length: $("pe-length").value});
  if (kind === "sinusoidal") params.set("d_model", $("pe-width").value);
  state.pe = await api(`/positional-encoding?${params}`);
  const columns = state.pe.encoding[0].length;  // rotary: the head width's half; relative: the positions
  show("pe", "pe-canvas", {data: state.pe, layout: peLayout(state.pe.length, columns), draw: drawPositionalEncoding});
  $("pe-readout").textContent = positionalLegend(state.pe);
}

// The kinds the picked model has: the sinusoid always; its own table, rotary angles or relative buckets.
function fillPositionalKinds() {
  const a = state.info.architecture, select = $("pe-kind"), previous = select.value;
  const kinds = [["sinusoidal", "sinusoidal"]];
  if (!["rotary", "disentangled"].includes(a.position_encoding)) kinds.push(["learned", "learned (the model's)"]);
  if (a.position_encoding === "rotary") kinds.push(["rotary", "rotary (the model's angles)"]);
  if (["relative_buckets", "disentangled"].includes(a.position_encoding)) kinds.push(["relative", "relative buckets (the model's)"]);
  select.innerHTML = "";
  kinds.forEach(([value, text]) => select.add(new Option(text, value)));
  select.value = kinds.some(([value]) => value === previous) ? previous : "sinusoidal";
  $("pe-width").disabled = select.value !== "sinusoidal";
}

// ---------- similarity ----------

function similarityFigure() {
  return {data: state.similarity, layout: similarityLayout(state.similarity.texts), draw: drawSimilarity};
}

async function renderSimilarity() {
  const texts = $("sim-texts").value.split("\n").map((t) => t.trim()).filter((t) => t !== "");
  forgetExplanation();
  if (state.info.multi_vector) {  // MaxSim, each text read as a query against all of them read as documents
    const rows = await Promise.all(texts.map((source) => api("/similarity", {source, texts})));
    const matrix = rows.map((row) => row.data.map((item) => item.score));
    state.similarity = {model: rows[0].model, texts, matrix, selected: null, maxsim: true};
  } else {
    const data = await api("/encode", {texts, normalize: true});
    const vectors = data.data.map((d) => d.embedding);
    const matrix = vectors.map((a) => vectors.map((b) => a.reduce((sum, x, k) => sum + x * b[k], 0)));
    state.similarity = {model: data.model, texts, matrix, selected: null};
  }
  const figure = similarityFigure();
  show("similarity", "sim-canvas", figure);
  fillSimilarityTable($("sim-table"), state.similarity);
  placeGridButtons($("sim-grid"), figure.layout, {
    label: (i, j) => `${similarityText(state.similarity, i, j)}: explain`,
    pick: (i, j) => guarded(null, () => explainPair(i, j)),
    enter: (i, j, point) => readCell("similarity", "sim-readout", similarityText, i, j, point),
    leave: hideTooltip,
  });
}

function forgetExplanation() {
  state.explanation = null;
  state.figures["similarity-explain"] = null;
  $("sim-explain-canvas").hidden = true;
  $("sim-explain-readout").textContent = "";
  $("sim-explain-table").innerHTML = "";
}

// What each pair of tokens contributes to the similarity of text `row` (the source) and text `col`.
async function explainPair(row, col) {
  const similarity = state.similarity;
  if (!similarity) return;
  similarity.selected = {row, col};
  show("similarity", "sim-canvas", similarityFigure());
  $("sim-grid").querySelectorAll("button").forEach((b) => {
    b.setAttribute("aria-pressed", String(Number(b.dataset.row) === row && Number(b.dataset.col) === col));
  });
  const source = similarity.texts[row], text = similarity.texts[col];
  const data = await api("/similarity", {source, texts: [text], explain: true});
  if (state.similarity !== similarity || similarity.selected.row !== row || similarity.selected.col !== col) return;  // superseded
  state.explanation = explanationOf(data.model, source, text, data.data[0]);
  const explanation = state.explanation;
  $("sim-explain-canvas").hidden = false;
  const layout = explanationLayout(explanation.sourceTokens, explanation.tokens, explanationTitle(explanation));
  show("similarity-explain", "sim-explain-canvas", {data: explanation, layout, draw: drawExplanation});
  fillExplanationTable($("sim-explain-table"), explanation);
  $("sim-explain-readout").textContent = `${row + 1} ↔ ${col + 1}: ${explanationTitle(explanation)}. Hover a cell or a total to read it.`;
}

// ---------- head statistics ----------

function statsTexts() {
  const more = $("stats-texts").value.split("\n").map((t) => t.trim()).filter((t) => t !== "");
  return [(state.request || formRequest()).text, ...more];
}

async function renderStats() {
  const texts = statsTexts();
  const response = await api("/attention/heads", {texts});
  state.stats = {response, texts};
  const select = $("stats-statistic");
  const previous = select.value;
  select.innerHTML = "";
  Object.keys(response.statistics).forEach((key) => select.add(new Option(statisticName(key), key)));
  if ([...select.options].some((o) => o.value === previous)) select.value = previous;
  drawStats();
}

function drawStats() {
  if (!state.stats) return;
  const data = statsData(state.stats.response, $("stats-statistic").value, state.stats.texts);
  const layout = statsLayout(data.values.length, data.values[0].length);
  show("stats", "stats-canvas", {data, layout, draw: drawHeadStatistics});
  fillStatsTable($("stats-table"), data);
  placeGridButtons($("stats-grid"), layout, {
    label: (l, h) => `${statsText(data, l, h)}: show its heatmap`,
    pick: (l, h) => openHeatmap(l, h),
    enter: (l, h, point) => readCell("stats", "stats-readout", statsText, l, h, point),
    leave: hideTooltip,
  });
}

// The statistics are of the text on show (and the view's other texts): asked again when either changed.
const statsCurrent = () => state.stats && state.stats.texts.join("\n") === statsTexts().join("\n");

// ---------- rerank ----------

// /rerank's `method`, in words.
const RERANK_METHODS = {
  "cross-encoder": "the cross-encoder's score of the pair",
  "yes-no": "the chance the model answers “yes” rather than “no” after the query and the document",
  "maxsim": "MaxSim: for each of the query's token vectors its best match among the document's",
  "sparse-dot": "the dot product of the query's and the document's sparse vectors",
  "cosine": "the cosine of the query's and the document's embeddings",
};

function rerankFigure() {
  return {data: state.rerank, layout: rerankLayout(state.rerank.results), draw: drawRerank};
}

async function renderRerank() {
  state.rerank = null;
  state.pair = null;
  state.figures.rerank = null;
  $("rerank-list").innerHTML = "";
  $("rerank-attn-canvas").hidden = true;
  sizeCanvas($("rerank-canvas"), 0, 0);
  const query = $("rerank-query").value;
  const documents = $("rerank-docs").value.split("\n").map((t) => t.trim()).filter((t) => t !== "");
  const data = await api("/rerank", {query, documents, return_documents: true});
  state.rerank = {model: data.model, method: data.method, query, results: data.results, selected: null};
  show("rerank", "rerank-canvas", rerankFigure());
  fillRerankList($("rerank-list"), state.rerank, (row) => guarded(null, () => selectDocument(row)));
  const how = data.method ? `Scored by ${RERANK_METHODS[data.method] || data.method}. ` : "";
  const between = {
    maxsim: "each query token's best match in it", "sparse-dot": "the terms it shares with the query",
    cosine: "which pairs of its tokens and the query's its cosine comes from",
  }[data.method] || (state.info.architecture.attention === "causal" ? "its attention to the query" : "the query's attention to it");
  $("rerank-readout").textContent = `${how}Select a document to see ${between}.`;
}

// The cross-encoder's attention (last layer, mean over heads) from the query's tokens (rows) to the
// document's (columns), special tokens left out, for the document in row `row` of the ranking. A causal model
// reads the query first and its query tokens never see the document: there the rows are the document's tokens
// and the columns the query's.
async function selectDocument(row) {
  const rerank = state.rerank;
  if (!rerank || !rerank.results[row]) return;
  rerank.selected = row;
  show("rerank", "rerank-canvas", rerankFigure());
  $("rerank-list").querySelectorAll("button").forEach((b) => b.setAttribute("aria-pressed", String(Number(b.dataset.row) === row)));
  const result = rerank.results[row];
  if (["maxsim", "sparse-dot", "cosine"].includes(rerank.method)) return explainDocument(rerank, row, result);
  const data = await api("/attention", {text: rerank.query, text_pair: result.document, layers: [-1], aggregate: "mean"});
  if (state.rerank !== rerank || rerank.selected !== row) return;  // superseded meanwhile
  const matrix = data.attention[0][0];
  const pick = (segment) => data.token_details.map((d, i) => (d.segment === segment && !d.special ? i : -1)).filter((i) => i >= 0);
  const causal = state.info.architecture.attention === "causal";
  const [rows, cols] = causal ? [pick(1), pick(0)] : [pick(0), pick(1)];
  const readable = readableTokens(data.tokens, data.token_details, [rerank.query, result.document]);
  const direction = causal ? `document ${row + 1} → query` : `query → document ${row + 1}`;
  state.pair = {
    model: data.model, query: rerank.query, document: result.document,
    title: `${data.model} · last layer, mean over heads: ${direction}`,
    rowTokens: rows.map((i) => readable[i]), colTokens: cols.map((j) => readable[j]),
    matrix: rows.map((i) => cols.map((j) => matrix[i][j])),
  };
  $("rerank-attn-canvas").hidden = false;
  show("rerank-pair", "rerank-attn-canvas", {data: state.pair, layout: crossLayout(state.pair.rowTokens, state.pair.colTokens, state.pair.title), draw: drawHeatmap});
  $("rerank-readout").textContent = `${rerankText(rerank, row)}. Hover a cell to read its weight.`;
}

// What made document `row` score as it did, for a model whose score splits into parts: MaxSim's terms (each
// query token's best match in the document, /similarity's explanation) or the sparse terms the two share.
async function explainDocument(rerank, row, result) {
  let figure;
  if (rerank.method === "maxsim" || rerank.method === "cosine") {  // /similarity scores as /rerank does
    const data = await api("/similarity", {source: rerank.query, texts: [result.document], explain: true});
    const explanation = explanationOf(data.model, rerank.query, result.document, data.data[0]);
    const layout = explanationLayout(explanation.sourceTokens, explanation.tokens, explanationTitle(explanation));
    figure = {data: explanation, layout, draw: drawExplanation, hit: explanationCell, text: explanationText};
  } else {
    const data = await api("/encode/sparse", {texts: [rerank.query, result.document], return_tokens: true});
    const terms = sharedTerms(data.data[0], data.data[1]);
    const title = `${data.model} · terms document ${row + 1} shares with the query: query weight × document weight`;
    const shared = {model: data.model, title, results: terms, selected: null};
    figure = {data: shared, layout: rerankLayout(terms), draw: drawRerank, text: (d, k) => termText(d, k)};
  }
  if (state.rerank !== rerank || rerank.selected !== row) return;  // superseded meanwhile
  state.pair = figure.data;
  $("rerank-attn-canvas").hidden = false;
  show("rerank-pair", "rerank-attn-canvas", figure);
  let sum = rerank.method === "sparse-dot" ? "the products sum to its score" : "the cells sum to its score";
  const total = figure.data && figure.data.score;
  if (rerank.method === "cosine" && typeof total === "number" && Math.abs(total - result.relevance_score) > 1e-4) {
    // /rerank puts the model's query and document prompts before the texts; /similarity, explaining, does not
    sum = `the cells sum to ${total.toFixed(4)}, the cosine without the model's query and document prompts`;
  }
  $("rerank-readout").textContent = `${rerankText(rerank, row)}; ${sum}. Hover a cell to read it.`;
}

// ---------- explain ----------

// Which tokens of the form's text (and second sentence) made the model's score; the page's address then links to it.
async function renderExplain() {
  state.explain = null;
  $("explain-tokens").innerHTML = "";
  $("explain-readout").textContent = "";
  const {text, text_pair} = formRequest();
  const method = $("explain-method").value;
  const body = {text, text_pair, method};
  if (method === "integrated_gradients") body.steps = Number($("explain-steps").value);
  const data = await api("/explain", body);
  state.explain = data;
  fillExplainTokens($("explain-tokens"), data);
  $("explain-readout").textContent = explainSummary(data);
  const link = new URLSearchParams({text});
  if (text_pair !== null) link.set("pair", text_pair);
  if (!$("model-picker").hidden) link.set("model", $("model-select").value);
  link.set("tab", "explain");
  history.replaceState(null, "", `?${link}`);
}

// ---------- models ----------

// The service's answer to /info for the picked model, in the header.
async function loadInfo() {
  state.info = await api("/info");
  const {model, architecture: a, device, dtype} = state.info;
  const shared = a.kv_heads && a.kv_heads < a.heads ? ` (${a.kv_heads} key/value)` : "";
  const causal = a.attention === "causal" ? " · causal: each token sees itself and those before it" : "";
  $("model-info").textContent = `${model} · ${a.layers} layers × ${a.heads} heads${shared} · ${a.hidden_size} wide${causal} · ${device}, ${dtype}`;
  state.layer = a.layers - 1;
  describeGroups();
  fillPositionalKinds();
}

// The picker lists every served model, the service's default first; with only one there is nothing to pick.
async function loadModels() {
  let names = [];
  try {
    names = (await api("/v1/models")).data.map((m) => m.id);
  } catch (error) {
    return;  // an older service, or one that wants a key: the default model, without a picker
  }
  const select = $("model-select");
  select.innerHTML = "";
  names.forEach((name) => select.add(new Option(name, name)));
  $("model-picker").hidden = names.length < 2;
  select.disabled = names.length < 2;
  if (names.length) useModel(names[0]);
}

// Everything on show came from the previous model: forget it, and draw the current view anew.
async function switchModel(name) {
  useModel(name);
  Object.assign(state, {
    info: null, attention: null, byLayer: new Map(), aggregates: {}, heatmap: null, pe: null,
    similarity: null, explanation: null, stats: null, rerank: null, pair: null, figures: {}, focus: null,
    neuronQuery: null, explain: null,
  });
  $("explain-tokens").innerHTML = "";
  $("explain-readout").textContent = "";
  forgetExplanation();
  forgetNeuron();
  state.heads.clear();
  $("rerank-list").innerHTML = "";
  $("rerank-attn-canvas").hidden = true;
  $("model-info").textContent = `loading ${name}…`;
  await loadInfo();
  await runAttention();
}

// ---------- views, downloads ----------

const VIEWS = ["head", "model", "heatmap", "neuron", "stats", "pe", "similarity", "rerank", "explain"];

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
  if (state.view === "rerank") { if (!state.rerank) await renderRerank(); return; }
  if (state.view === "explain") { if (!state.explain) await renderExplain(); return; }
  if (state.view === "stats") { if (!statsCurrent()) await renderStats(); return; }
  if (!state.attention) return;
  if (state.view === "head") await renderHeadView();
  else if (state.view === "model") await renderModelView();
  else if (state.view === "heatmap") await renderHeatmap();
  else if (state.view === "neuron") await renderNeuron();
}

function download(name, href) {
  const link = document.createElement("a");
  link.href = href; link.download = name;
  document.body.append(link); link.click(); link.remove();
}

function viewData() {
  switch (state.view) {
    case "pe": return state.pe;
    case "similarity": return state.similarity && {...state.similarity, explanation: state.explanation};
    case "stats": return state.stats && {...state.stats.response, texts: state.stats.texts};
    case "heatmap": return state.heatmap;
    case "neuron": return state.neuron && {...state.neuron.response, query: state.neuronQuery};
    case "rerank": return state.rerank && {...state.rerank, attention: state.pair};
    case "explain": return state.explain;
    default: return state.attention && {
      ...state.attention,
      layers: [...state.byLayer.keys()].sort((a, b) => a - b),
      attention: [...state.byLayer.keys()].sort((a, b) => a - b).map((layer) => state.byLayer.get(layer)),
    };
  }
}

// The figure a view's PNG redraws: the one on screen, with the same draw function. The head view's
// PNG lays out a title and the token columns round the lines, which on screen are page elements.
function pngFigure() {
  const figure = state.figures[state.view];
  if (!figure || state.view !== "head") return figure;
  return {...figure, layout: headLayout(figure.data.tokens, {labels: true})};
}

// ---------- wiring ----------

function wire() {
  $("input-form").addEventListener("submit", (event) => {
    event.preventDefault();
    state.explain = null;  // of the text before: the explain view asks again when it is drawn (render)
    guarded($("submit"), runAttention);
  });
  $("explain-form").addEventListener("submit", (event) => { event.preventDefault(); guarded(event.submitter, renderExplain); });
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
  hoverCells("heatmap", "heat-canvas", "heat-readout", heatmapText, {context: (data) => ` (${data.title})`});
  hoverCells("similarity-explain", "sim-explain-canvas", "sim-explain-readout", explanationText, {hit: explanationCell});
  // The two boxes of the head view and the two of the heatmap are one setting each: the views share the attention.
  for (const [key, ids] of [["norm", ["head-norm", "heat-norm"]], ["words", ["head-word", "heat-word"]]]) {
    ids.forEach((id) => $(id).addEventListener("change", (event) => {
      state[key] = event.target.checked;
      ids.forEach((other) => { $(other).checked = state[key]; });
      if (state.request && state.info) guarded(null, () => runAttention(state.request));
    }));
  }
  $("stats-form").addEventListener("submit", (event) => { event.preventDefault(); guarded(event.submitter, renderStats); });
  $("stats-statistic").addEventListener("change", drawStats);
  for (const id of ["neuron-layer", "neuron-head"]) $(id).addEventListener("change", () => guarded(null, renderNeuron));
  hoverCells("neuron", "neuron-canvas", "neuron-readout", (data, row) => neuronText(data, row));
  hoverCells("pe", "pe-canvas", "pe-readout", positionalText);
  hoverCells("similarity", "sim-canvas", "sim-readout", similarityText);
  hoverCells("rerank-pair", "rerank-attn-canvas", "rerank-readout", heatmapText);
  hoverCells("rerank", "rerank-canvas", "rerank-readout", (data, row) => rerankText(data, row));
  $("rerank-canvas").addEventListener("click", (event) => {
    const figure = state.figures.rerank;
    if (!figure) return;
    const rect = event.currentTarget.getBoundingClientRect();
    const cell = gridCell(figure.layout, event.clientX - rect.left, event.clientY - rect.top);
    if (cell) guarded(null, () => selectDocument(cell.row));
  });
  $("rerank-form").addEventListener("submit", (event) => { event.preventDefault(); guarded(event.submitter, renderRerank); });
  $("model-select").addEventListener("change", (event) => guarded(null, () => switchModel(event.target.value)));
  $("pe-form").addEventListener("submit", (event) => { event.preventDefault(); guarded(null, renderPositionalEncoding); });
  $("pe-kind").addEventListener("change", () => { $("pe-width").disabled = $("pe-kind").value !== "sinusoidal"; });
  $("sim-form").addEventListener("submit", (event) => { event.preventDefault(); guarded(event.submitter, renderSimilarity); });
  $("download-png").addEventListener("click", () => {
    const figure = pngFigure();
    if (!figure) { showError("Nothing is drawn in this view yet."); return; }
    download(`${state.view}.png`, pngOf(figure));
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
  // The head view's CSS sizes come from layout.js, like every other size.
  const root = document.documentElement.style;
  root.setProperty("--row", `${ROW}px`);
  root.setProperty("--lines", `${HEAD.linesWidth}px`);
  root.setProperty("--lines-narrow", `${HEAD.linesWidthNarrow}px`);
  wire();
  // A link may carry the text, the second sentence and the view: /?text=...&pair=...&tab=explain
  const asked = new URLSearchParams(location.search);
  if (asked.has("text")) $("text").value = asked.get("text");
  if (asked.has("pair")) $("text-pair").value = asked.get("pair");
  await guarded(null, async () => {
    await loadModels();
    const named = asked.get("model");
    if (named && [...$("model-select").options].some((option) => option.value === named)) {
      $("model-select").value = named;
      useModel(named);
    }
    await loadInfo();
  });
  if (state.info) await guarded($("submit"), runAttention);
  if (VIEWS.includes(asked.get("tab"))) selectView(asked.get("tab"));
}

start();
