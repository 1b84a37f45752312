// Similarity: the cosine similarity of every pair of texts' sentence embeddings; blue is −1, red is +1.

import {INK, diverging, rgb} from "./colour.js";
import {fitText} from "./canvas.js";
import {FONTS, SIMILARITY, TITLE, similarityLegend} from "./layout.js";

const textColour = (v) => (Math.abs(v) > 0.6 ? "#fff" : INK);  // legible on the cell's colour

// The one draw function, for the screen and the PNG. data: {model, texts, matrix: (n, n)}
export function drawSimilarity(ctx, data, layout) {
  const {texts, matrix} = data;
  const {left, top, cellW: cell} = layout;
  ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, layout.width, layout.height);
  ctx.fillStyle = INK; ctx.font = FONTS.title; ctx.textAlign = "left"; ctx.textBaseline = "alphabetic";
  ctx.fillText("cosine similarity of sentence embeddings", TITLE.x, TITLE.baseline);
  ctx.font = FONTS.value; ctx.textAlign = "center"; ctx.textBaseline = "middle";
  matrix.forEach((row, i) => {
    ctx.fillStyle = INK;
    ctx.fillText(String(i + 1), left + i * cell + cell / 2, top - 10);
    ctx.fillText(String(i + 1), left - 14, top + i * cell + cell / 2);
    row.forEach((v, j) => {
      ctx.fillStyle = rgb(diverging(v)); ctx.fillRect(left + j * cell, top + i * cell, cell - SIMILARITY.gap, cell - SIMILARITY.gap);
      ctx.fillStyle = textColour(v); ctx.fillText(v.toFixed(2), left + j * cell + cell / 2, top + i * cell + cell / 2);
    });
  });
  ctx.textAlign = "left"; ctx.fillStyle = INK;
  similarityLegend(texts).forEach((line, i) => ctx.fillText(fitText(ctx, line, layout.width - 2 * TITLE.x), TITLE.x, layout.legendTop + i * SIMILARITY.legendRow));
}

// What the readout says for the pair (i, j).
export function similarityText(data, i, j) {
  return `${data.texts[i]} ↔ ${data.texts[j]}: ${data.matrix[i][j].toFixed(4)}`;
}

// The same numbers as a table, the drawing's text equivalent for screen readers.
export function fillSimilarityTable(table, data) {
  const {texts, matrix} = data;
  table.innerHTML = "";
  table.createCaption().textContent = "Cosine similarity of the texts' sentence embeddings";
  const head = table.createTHead().insertRow();
  head.append(document.createElement("th"));
  texts.forEach((_, i) => { const th = document.createElement("th"); th.textContent = String(i + 1); th.scope = "col"; head.append(th); });
  const body = table.createTBody();
  texts.forEach((text, i) => {
    const row = body.insertRow();
    const th = document.createElement("th");
    th.scope = "row"; th.textContent = `${i + 1}. ${text}`;
    row.append(th);
    matrix[i].forEach((value) => { row.insertCell().textContent = value.toFixed(2); });
  });
}
