// Neuron view: how one head of one layer arrives at the attention of one query token i, step by step
// as the seed notebooks compute it: the query q_i, every key k_j, their elementwise products and dot
// products (omega), the scaled scores, the softmax (the attention weights) and the weighted sum of the
// values (the context vector z_i). The products and omega are computed here from the service's
// queries and keys; the scaled scores, weights and context are the service's own (/attention/neuron).
// Vectors are strips of cells, blue negative and red positive, each block on its own scale.

import {INK, LINE, MUTED, diverging, rgb, sequential} from "./colour.js";
import {FONTS, NEURON, ROW, TITLE, neuronContextLabel, neuronHeadings, neuronQueryLabel, neuronShapes, scaleText} from "./layout.js";

const sum = (values) => values.reduce((total, v) => total + v, 0);
const largest = (...vectors) => Math.max(1e-12, ...vectors.map((v) => Math.max(...v.map(Math.abs))));

// Scores further than this from scale · omega hold something more: the model's position bias.
export const BIAS_TOLERANCE = 1e-4;

// The view's data for query token i of /attention/neuron's answer `response`.
export function neuronData(response, i) {
  const {tokens, queries, keys, values, scale} = response;
  const q = queries[i];
  const products = keys.map((k) => k.map((x, d) => q[d] * x));
  const omega = products.map(sum);
  const scaled = response.scores[i];
  const bias = Math.max(0, ...scaled.map((s, j) => Math.abs(s - scale * omega[j])));
  const dh = q.length;
  return {
    model: response.model, tokens, layer: response.layer, head: response.head, scale, query: i, dh,
    q, keys, products, omega, scaled, attention: response.attention[i], values, context: response.context[i],
    bias, hasBias: bias > BIAS_TOLERANCE, shapes: neuronShapes(tokens.length, dh),
    headings: neuronHeadings(tokens.length, dh, scale, bias > BIAS_TOLERANCE),
    title: `${response.model} · layer ${response.layer}, head ${response.head} · query “${tokens[i]}” (token ${i + 1} of ${tokens.length})`,
  };
}

// What the page says when the scores hold a position bias, or "" when they do not.
export function biasText(data) {
  if (!data.hasBias) return "";
  return `This model adds a position bias to its scores: each scaled score is the service's score, which differs from ${data.scale.toFixed(3)} × omega by up to ${data.bias.toFixed(4)}.`;
}

function strip(ctx, vector, x, y, cell, most) {
  vector.forEach((v, d) => {
    ctx.fillStyle = rgb(diverging(v / most));
    ctx.fillRect(x + d * cell, y, cell, ROW - NEURON.cellGap);
  });
  ctx.strokeStyle = LINE; ctx.lineWidth = 1;
  ctx.strokeRect(x - 0.5, y - 0.5, vector.length * cell + 1, ROW - NEURON.cellGap + 1);
}

// The one draw function, for the screen and the PNG. data: neuronData(...); layout: neuronLayout(...)
export function drawNeuronView(ctx, data, layout) {
  const {tokens, q, keys, products, omega, scaled, attention, values, context, query, headings} = data;
  const {x, widths, cell, top} = layout;
  const half = (ROW - NEURON.cellGap) / 2;
  ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, layout.width, layout.height);
  ctx.fillStyle = INK; ctx.font = FONTS.title; ctx.textAlign = "left"; ctx.textBaseline = "alphabetic";
  ctx.fillText(data.title, TITLE.x, TITLE.baseline);
  if (data.hasBias) {
    ctx.font = FONTS.value; ctx.fillStyle = MUTED; ctx.textBaseline = "middle";
    ctx.fillText(`scaled scores = ${scaleText(data.scale, data.dh)} × omega + the model's position bias`, TITLE.x, layout.noteTop + NEURON.noteHeight / 2);
  }
  const keyScale = largest(q, ...keys), productScale = largest(...products), valueScale = largest(...values);

  // The query, above the keys.
  strip(ctx, q, x.keys, layout.queryTop, cell, keyScale);
  ctx.font = FONTS.value; ctx.fillStyle = INK; ctx.textAlign = "left"; ctx.textBaseline = "middle";
  ctx.fillText(neuronQueryLabel(tokens[query], data.dh), x.products, layout.queryTop + half);

  // The column headings.
  ctx.font = FONTS.axis; ctx.fillStyle = MUTED; ctx.textBaseline = "alphabetic";
  for (const [key, lines] of Object.entries(headings)) {
    const right = key === "token" || key === "omega" || key === "scaled";
    ctx.textAlign = right ? "right" : "left";
    const at = right ? x[key] + widths[key] : x[key];
    lines.forEach((line, k) => ctx.fillText(line, at, layout.headingTop + (k + 1) * NEURON.headingLine - 3));
  }

  // A row per key token j.
  tokens.forEach((token, j) => {
    const y = top + j * ROW;
    const middle = y + half;
    if (j === query) { ctx.fillStyle = "#ffe9a8"; ctx.fillRect(x.token - 4, y - 1, widths.token + 8, ROW - 1); }
    ctx.fillStyle = INK; ctx.font = FONTS.token; ctx.textAlign = "right"; ctx.textBaseline = "middle";
    ctx.fillText(token, x.token + widths.token, middle);
    strip(ctx, keys[j], x.keys, y, cell, keyScale);
    strip(ctx, products[j], x.products, y, cell, productScale);
    ctx.font = FONTS.value; ctx.fillStyle = INK;
    ctx.fillText(omega[j].toFixed(2), x.omega + widths.omega, middle);
    ctx.fillText(scaled[j].toFixed(3), x.scaled + widths.scaled, middle);
    ctx.fillStyle = LINE; ctx.fillRect(x.attention, y + 2, NEURON.bar, ROW - NEURON.cellGap - 4);
    ctx.fillStyle = rgb(sequential(0.85)); ctx.fillRect(x.attention, y + 2, attention[j] * NEURON.bar, ROW - NEURON.cellGap - 4);
    ctx.fillStyle = MUTED; ctx.textAlign = "left";
    ctx.fillText(attention[j].toFixed(3), x.attention + NEURON.bar + 6, middle);
    strip(ctx, values[j], x.values, y, cell, valueScale);
  });

  // The context vector, under the values.
  strip(ctx, context, x.values, layout.contextTop, cell, largest(context));  // a weighted mean: paler than the values
  ctx.font = FONTS.value; ctx.fillStyle = INK; ctx.textAlign = "right"; ctx.textBaseline = "middle";
  ctx.fillText(neuronContextLabel(data.dh), x.values - NEURON.gap / 2, layout.contextTop + half);
}

// What the readout says for key row j.
export function neuronText(data, j) {
  return `“${data.tokens[data.query]}” → “${data.tokens[j]}”: omega ${data.omega[j].toFixed(4)}, scaled score ${data.scaled[j].toFixed(4)}, attention weight ${data.attention[j].toFixed(4)}`;
}

// The readout's summary of the query token's row.
export function neuronSummary(data) {
  const top = data.attention.indexOf(Math.max(...data.attention));
  return `Query “${data.tokens[data.query]}” (token ${data.query + 1} of ${data.tokens.length}) attends most to “${data.tokens[top]}” (${data.attention[top].toFixed(4)}). Hover a row to read it.`;
}

// The same numbers as a table, the drawing's text equivalent for screen readers.
export function fillNeuronTable(table, data) {
  table.innerHTML = "";
  table.createCaption().textContent = `${data.title}: for each key token, omega = q_i · k_j, the scaled score (${scaleText(data.scale, data.dh)}${data.hasBias ? ", plus the position bias" : ""}) and the attention weight`;
  const head = table.createTHead().insertRow();
  for (const name of ["key token", "omega", "scaled score", "attention weight"]) {
    const th = document.createElement("th"); th.scope = "col"; th.textContent = name; head.append(th);
  }
  const body = table.createTBody();
  data.tokens.forEach((token, j) => {
    const row = body.insertRow();
    const th = document.createElement("th");
    th.scope = "row"; th.textContent = token;
    row.append(th);
    [[data.omega[j], 4, "omega"], [data.scaled[j], 4, "scaled"], [data.attention[j], 6, "attention"]].forEach(([v, digits, name]) => {
      const td = row.insertCell(); td.className = name; td.textContent = v.toFixed(digits);
    });
  });
}

// The steps in words, each with its shape: the list under the drawing.
export function fillNeuronSteps(list, data) {
  const {shapes, tokens, query} = data;
  const steps = [
    ["query", `query q_i, the query vector of “${tokens[query]}”`],
    ["keys", "keys K, a key vector k_j for every token j"],
    ["products", "q_i ⊙ k_j, their elementwise products"],
    ["omega", "omega = q_i · k_j, each product's sum: the unnormalised attention weights"],
    ["scaled", `scaled scores, omega ${scaleText(data.scale, data.dh)}${data.hasBias ? " plus the position bias" : ""}`],
    ["attention", "attention weights α_i = softmax of the scaled scores"],
    ["values", "values V, a value vector v_j for every token j"],
    ["context", "context vector z_i = Σ_j α_ij v_j"],
  ];
  list.innerHTML = "";
  for (const [key, text] of steps) {
    const item = document.createElement("li");
    item.dataset.step = key;
    const shape = document.createElement("span");
    shape.className = "shape"; shape.textContent = shapes[key];
    item.append(`${text}: `, shape);
    list.append(item);
  }
}

// The query token picker: one radio button per token, arrow keys (and Home, End) move the choice.
// pick(i) runs when token i is chosen.
export function fillQueryTokens(group, tokens, details, selected, pick) {
  group.innerHTML = "";
  tokens.forEach((token, i) => {
    const button = document.createElement("button");
    button.type = "button";
    button.setAttribute("role", "radio");
    button.className = "token" + (details[i] && details[i].special ? " special" : "");
    button.textContent = token;
    button.dataset.index = String(i);
    button.title = `token ${i + 1}`;
    button.addEventListener("click", () => pick(i));
    button.addEventListener("keydown", (event) => {
      const moves = {ArrowRight: i + 1, ArrowDown: i + 1, ArrowLeft: i - 1, ArrowUp: i - 1, Home: 0, End: tokens.length - 1};
      if (!(event.key in moves)) return;
      event.preventDefault();
      const next = Math.max(0, Math.min(tokens.length - 1, moves[event.key]));
      pick(next);
      group.children[next].focus();
    });
    group.append(button);
  });
  markQueryToken(group, selected);
}

export function markQueryToken(group, selected) {
  for (const button of group.children) {
    const chosen = Number(button.dataset.index) === selected;
    button.setAttribute("aria-checked", String(chosen));
    button.tabIndex = chosen ? 0 : -1;
  }
}
