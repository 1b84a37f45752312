// Rerank: documents ranked by a cross-encoder's relevance to a query, best first, one bar per document
// as long as its score (0 to 1); the selected document's row is marked.

import {INK, LINE, MUTED, headColour} from "./colour.js";
import {fitText} from "./canvas.js";
import {FONTS, RERANK, TITLE, rerankLabels} from "./layout.js";

// The one draw function, for the screen and the PNG. data: {model, query, results: [{index,
// relevance_score, document}], selected: a row or null}
export function drawRerank(ctx, data, layout) {
  const {results, selected} = data;
  const {left, top, cellH: row} = layout;
  ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, layout.width, layout.height);
  ctx.fillStyle = INK; ctx.font = FONTS.title; ctx.textAlign = "left"; ctx.textBaseline = "alphabetic";
  ctx.fillText(fitText(ctx, `${data.model} · relevance to “${data.query}”`, layout.width - 2 * TITLE.x), TITLE.x, TITLE.baseline);
  ctx.font = FONTS.value; ctx.textBaseline = "middle";
  const labels = rerankLabels(results);
  results.forEach((result, k) => {
    const y = top + k * row;
    if (k === selected) { ctx.fillStyle = "#ffe9a8"; ctx.fillRect(0, y, layout.width, row); }
    const middle = y + row / 2;
    ctx.fillStyle = INK; ctx.textAlign = "left";
    ctx.fillText(fitText(ctx, labels[k], layout.labelWidth), TITLE.x, middle);
    ctx.fillStyle = LINE; ctx.fillRect(left, middle - RERANK.barHeight / 2, RERANK.barWidth, RERANK.barHeight);
    const score = Math.max(0, Math.min(1, result.relevance_score));
    ctx.fillStyle = headColour(0); ctx.fillRect(left, middle - RERANK.barHeight / 2, score * RERANK.barWidth, RERANK.barHeight);
    ctx.fillStyle = MUTED; ctx.fillText(result.relevance_score.toFixed(3), left + RERANK.barWidth + RERANK.labelGap, middle);
  });
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
