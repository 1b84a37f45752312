// Similarity: the cosine similarity of every pair of texts' sentence embeddings; blue is −1, red is +1. On a
// multi-vector model (`maxsim`), MaxSim of each row's text read as a query with each column's read as a
// document, coloured against the largest score.
// Selecting a pair explains its score: what each pair of tokens contributes to it (/similarity with
// `explain`), with the total of each token beside and under the matrix; blue is negative, red positive.

import {INK, LINE, MUTED, diverging, rgb} from "./colour.js";
import {drawScaled, fitText, matrixImage} from "./canvas.js";
import {EXPLAIN, FONTS, HEATMAP, SIMILARITY, TITLE, similarityLegend} from "./layout.js";

const textColour = (v) => (Math.abs(v) > 0.6 ? "#fff" : INK);  // legible on the cell's colour

// What the matrix holds, in words.
export const similarityTitle = (data) =>
  (data.maxsim ? "MaxSim of token vectors (rows read as queries, columns as documents)" : "cosine similarity of sentence embeddings");

// The value a colour of +1 stands for: 1 for cosines, the largest score for MaxSim.
const scaleOf = (data) => (data.maxsim ? Math.max(1e-9, ...data.matrix.flat().map(Math.abs)) : 1);

// The one draw function, for the screen and the PNG. data: {model, texts, matrix: (n, n), selected: {row, col} | null,
// maxsim: whether the scores are MaxSim}
export function drawSimilarity(ctx, data, layout) {
  const {texts, matrix, selected} = data;
  const {left, top, cellW: cell} = layout;
  const scale = scaleOf(data);
  ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, layout.width, layout.height);
  ctx.fillStyle = INK; ctx.font = FONTS.title; ctx.textAlign = "left"; ctx.textBaseline = "alphabetic";
  ctx.fillText(fitText(ctx, similarityTitle(data), layout.width - 2 * TITLE.x), TITLE.x, TITLE.baseline);
  ctx.font = FONTS.value; ctx.textAlign = "center"; ctx.textBaseline = "middle";
  matrix.forEach((row, i) => {
    ctx.fillStyle = INK;
    ctx.fillText(String(i + 1), left + i * cell + cell / 2, top - 10);
    ctx.fillText(String(i + 1), left - 14, top + i * cell + cell / 2);
    row.forEach((v, j) => {
      ctx.fillStyle = rgb(diverging(v / scale)); ctx.fillRect(left + j * cell, top + i * cell, cell - SIMILARITY.gap, cell - SIMILARITY.gap);
      ctx.fillStyle = textColour(v / scale); ctx.fillText(v.toFixed(2), left + j * cell + cell / 2, top + i * cell + cell / 2);
    });
  });
  if (selected) {
    ctx.strokeStyle = INK; ctx.lineWidth = 2;
    ctx.strokeRect(left + selected.col * cell - 1, top + selected.row * cell - 1, cell - SIMILARITY.gap + 2, cell - SIMILARITY.gap + 2);
  }
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
  table.createCaption().textContent = data.maxsim ? "MaxSim of the texts' token vectors, rows read as queries and columns as documents" : "Cosine similarity of the texts' sentence embeddings";
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

// ---------- one score, explained ----------

const sum = (values) => values.reduce((total, v) => total + v, 0);

// An explanation as the views use it, from /similarity's item for the pair: each token's total (its
// row's or column's sum) added.
export function explanationOf(model, source, text, item) {
  const {contributions} = item.explanation;
  const words = (list) => list.map((t) => (typeof t === "string" ? t : t.text));  // strings, or /tokenize's objects
  const sourceTokens = words(item.explanation.source_tokens), tokens = words(item.explanation.tokens);
  const method = item.explanation.method || item.method || null;
  return {
    model, source, text, score: item.score, method, sourceTokens, tokens, contributions,
    sourceTotals: contributions.map(sum),
    tokenTotals: tokens.map((_, j) => sum(contributions.map((row) => row[j]))),
  };
}

// The explanation's title: the score, and how it was split when the service names a method.
export function explanationTitle(data) {
  return `${data.model} · similarity ${data.score.toFixed(4)}, the sum of every cell` + (data.method ? ` (method: ${data.method})` : "");
}

// The one draw function, for the screen and the PNG. data: explanationOf(...)
export function drawExplanation(ctx, data, layout) {
  const {sourceTokens, tokens, contributions, sourceTotals, tokenTotals} = data;
  const {left, top, cellW: cell, rows, cols, stripX, stripY} = layout;
  ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, layout.width, layout.height);
  ctx.fillStyle = INK; ctx.font = FONTS.title; ctx.textAlign = "left"; ctx.textBaseline = "alphabetic";
  ctx.fillText(explanationTitle(data), TITLE.x, TITLE.baseline);
  ctx.font = FONTS.value; ctx.fillStyle = MUTED; ctx.textBaseline = "middle";
  [`rows: ${data.source}`, `columns: ${data.text}`].forEach((line, k) => {
    ctx.fillText(fitText(ctx, line, layout.width - 2 * TITLE.x), TITLE.x, layout.textsTop + (k + 0.5) * EXPLAIN.textRow);
  });
  if (rows === 0 || cols === 0) return;
  const most = Math.max(1e-12, ...contributions.map((row) => Math.max(...row.map(Math.abs))));
  drawScaled(ctx, matrixImage(contributions, (v) => diverging(v / most)), left, top, cols * cell, rows * cell);

  // The totals: bars from a zero line, one scale for both strips so that their lengths compare.
  const half = EXPLAIN.strip / 2 - 2;
  const largest = Math.max(1e-12, ...sourceTotals.map(Math.abs), ...tokenTotals.map(Math.abs));
  const barColour = (v) => rgb(diverging(v >= 0 ? 0.85 : -0.85));
  const zeroX = stripX + EXPLAIN.strip / 2, zeroY = stripY + EXPLAIN.strip / 2;
  sourceTotals.forEach((v, i) => {
    const length = (v / largest) * half;
    ctx.fillStyle = barColour(v);
    ctx.fillRect(Math.min(zeroX, zeroX + length), top + i * cell + 1, Math.abs(length), Math.max(1, cell - 2));
  });
  tokenTotals.forEach((v, j) => {
    const length = (v / largest) * half;
    ctx.fillStyle = barColour(v);
    ctx.fillRect(left + j * cell + 1, Math.min(zeroY, zeroY - length), Math.max(1, cell - 2), Math.abs(length));
  });
  ctx.strokeStyle = LINE; ctx.lineWidth = 1;
  ctx.beginPath();
  ctx.moveTo(zeroX + 0.5, top); ctx.lineTo(zeroX + 0.5, top + rows * cell);
  ctx.moveTo(left, zeroY + 0.5); ctx.lineTo(left + cols * cell, zeroY + 0.5);
  ctx.stroke();

  ctx.font = `${Math.min(HEATMAP.labelSize, cell)}px monospace`;
  ctx.fillStyle = INK; ctx.textBaseline = "middle"; ctx.textAlign = "right";
  ctx.fillText("total", left - HEATMAP.labelGap, zeroY);
  const columnLabel = (t, x) => {
    ctx.save(); ctx.translate(x, top - HEATMAP.labelGap); ctx.rotate(-Math.PI / 2);
    ctx.textAlign = "left"; ctx.fillText(t, 0, 0); ctx.restore();
  };
  columnLabel("total", zeroX);
  if (layout.labels) {
    sourceTokens.forEach((t, i) => ctx.fillText(t, left - HEATMAP.labelGap, top + i * cell + cell / 2));
    tokens.forEach((t, j) => columnLabel(t, left + j * cell + cell / 2));
  }
}

// What the readout says for a cell (i, j), a source token's total (j = columns) or a text token's (i = rows).
export function explanationText(data, i, j) {
  const rows = data.sourceTokens.length, cols = data.tokens.length;
  if (j === cols) return `“${data.sourceTokens[i]}” (source), total: ${data.sourceTotals[i].toFixed(4)}`;
  if (i === rows) return `“${data.tokens[j]}” (text), total: ${data.tokenTotals[j].toFixed(4)}`;
  return `“${data.sourceTokens[i]}” · “${data.tokens[j]}”: ${data.contributions[i][j].toFixed(5)}`;
}

// The contributions as a table, the drawing's text equivalent: a row per source token ending in its
// total, a column per text token, and a last row of the text tokens' totals ending in the score.
export function fillExplanationTable(table, data) {
  table.innerHTML = "";
  table.createCaption().textContent = `Contributions of token pairs to the similarity of “${data.source}” and “${data.text}”: ${explanationTitle(data)}`;
  const header = (row, text, scope, className = "") => {
    const th = document.createElement("th");
    th.scope = scope; th.textContent = text;
    if (className) th.className = className;
    row.append(th);
  };
  const cell = (row, value, className = "") => {
    const td = row.insertCell();
    td.textContent = value.toFixed(5);
    if (className) td.className = className;
  };
  const head = table.createTHead().insertRow();
  header(head, "source token \\ text token", "col");
  data.tokens.forEach((t) => header(head, t, "col"));
  header(head, "total", "col");
  const body = table.createTBody();
  data.sourceTokens.forEach((t, i) => {
    const row = body.insertRow();
    header(row, t, "row");
    data.contributions[i].forEach((v) => cell(row, v));
    cell(row, data.sourceTotals[i], "source-total");
  });
  const foot = table.createTFoot().insertRow();
  header(foot, "total", "row");
  data.tokenTotals.forEach((v) => cell(foot, v, "token-total"));
  cell(foot, data.score, "score");
}
