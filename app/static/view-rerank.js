// Rerank: documents ranked by their relevance to a query, best first, one bar per document as long as its
// score (0 to 1, or to the largest where scores run past 1: MaxSim, a sparse dot product); the selected
// document's row is marked. For a sparse model, the terms a query and a document share, one bar each.

import {INK, LINE, MUTED, headColour} from "./colour.js";
import {fitText} from "./canvas.js";
import {FONTS, RERANK, TITLE, rerankLabels} from "./layout.js";

// The one draw function, for the screen and the PNG. data: {model, query, results: [{index,
// relevance_score, document}], selected: a row or null, title: in place of the usual one}; the shared terms
// (sharedTerms) draw the same way.
export function drawRerank(ctx, data, layout) {
  const {results, selected} = data;
  const {left, top, cellH: row} = layout;
  ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, layout.width, layout.height);
  ctx.fillStyle = INK; ctx.font = FONTS.title; ctx.textAlign = "left"; ctx.textBaseline = "alphabetic";
  const title = data.title || `${data.model} · relevance to “${data.query}”`;
  ctx.fillText(fitText(ctx, title, layout.width - 2 * TITLE.x), TITLE.x, TITLE.baseline);
  ctx.font = FONTS.value; ctx.textBaseline = "middle";
  const labels = rerankLabels(results);
  const full = barScale(results);
  results.forEach((result, k) => {
    const y = top + k * row;
    if (k === selected) { ctx.fillStyle = "#ffe9a8"; ctx.fillRect(0, y, layout.width, row); }
    const middle = y + row / 2;
    ctx.fillStyle = INK; ctx.textAlign = "left";
    ctx.fillText(fitText(ctx, labels[k], layout.labelWidth), TITLE.x, middle);
    ctx.fillStyle = LINE; ctx.fillRect(left, middle - RERANK.barHeight / 2, RERANK.barWidth, RERANK.barHeight);
    const score = Math.max(0, Math.min(1, result.relevance_score / full));
    ctx.fillStyle = headColour(0); ctx.fillRect(left, middle - RERANK.barHeight / 2, score * RERANK.barWidth, RERANK.barHeight);
    ctx.fillStyle = MUTED; ctx.fillText(result.relevance_score.toFixed(3), left + RERANK.barWidth + RERANK.labelGap, middle);
  });
}

// The score a full bar stands for: 1, or the largest score where one is larger.
const barScale = (results) => Math.max(1, ...results.map((r) => r.relevance_score));

// The vocabulary terms two sparse vectors (/encode/sparse items with `tokens`) share, each with the query's
// weight, the document's and their product (its part of the dot product), largest part first; as rows of
// the rerank drawing ({document: the term, relevance_score: the product}).
export function sharedTerms(query, document) {
  const weights = new Map(query.indices.map((id, k) => [id, k]));
  const terms = [];
  document.indices.forEach((id, k) => {
    if (!weights.has(id)) return;
    const q = query.values[weights.get(id)], d = document.values[k];
    terms.push({document: document.tokens[k], query: q, weight: d, relevance_score: q * d});
  });
  return terms.sort((a, b) => b.relevance_score - a.relevance_score);
}

// What the readout says for the shared term in row k.
export function termText(data, k) {
  const t = data.results[k];
  return `“${t.document}”: ${t.query.toFixed(3)} × ${t.weight.toFixed(3)} = ${t.relevance_score.toFixed(4)}`;
}

// What the readout says for the document in row k.
export function rerankText(data, k) {
  const r = data.results[k];
  return `${k + 1}. ${r.document}: ${r.relevance_score.toFixed(4)} (document ${r.index + 1} as given)`;
}

// The ranked documents as buttons, the drawing's text equivalent: selecting one (click, Enter or
// Space) calls `select(row)`.
export function fillRerankList(list, data, select) {
  list.innerHTML = "";
  data.results.forEach((result, k) => {
    const item = document.createElement("li");
    const button = document.createElement("button");
    button.type = "button";
    button.dataset.row = String(k);
    button.dataset.index = String(result.index);
    button.setAttribute("aria-pressed", String(k === data.selected));
    button.textContent = `${result.document} — ${result.relevance_score.toFixed(3)}`;
    button.addEventListener("click", () => select(k));
    item.append(button);
    list.append(item);
  });
}
