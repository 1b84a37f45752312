// Heatmap: one attention matrix (a head, the mean over heads, or the rollout), the tokens along both
// edges when there is room; white is 0, deep blue the matrix's largest weight. A block of a matrix
// (the rerank view's query × document) is drawn the same way, its row tokens down the left and its
// column tokens along the top.

import {INK, sequential} from "./colour.js";
import {drawScaled, matrixImage} from "./canvas.js";
import {FONTS, HEATMAP, TITLE} from "./layout.js";

// The one draw function, for the screen and the PNG. data: {matrix: (T, T), title, tokens}, or for a
// block {matrix: (R, C), title, rowTokens, colTokens}.
export function drawHeatmap(ctx, data, layout) {
  const {matrix, title} = data;
  const rowTokens = data.rowTokens || data.tokens, colTokens = data.colTokens || data.tokens;
  const {left, top, cellW: cell, rows, cols} = layout;
  ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, layout.width, layout.height);
  ctx.fillStyle = INK; ctx.font = FONTS.title; ctx.textAlign = "left"; ctx.textBaseline = "alphabetic";
  ctx.fillText(title, TITLE.x, TITLE.baseline);
  if (rows === 0 || cols === 0) return;
  const max = Math.max(1e-9, ...matrix.map((row) => Math.max(...row)));
  drawScaled(ctx, matrixImage(matrix, (w) => sequential(w / max)), left, top, cols * cell, rows * cell);
  if (layout.labels) {
    ctx.font = `${Math.min(HEATMAP.labelSize, cell)}px monospace`;
    ctx.fillStyle = INK; ctx.textBaseline = "middle";
    ctx.textAlign = "right";
    rowTokens.forEach((t, i) => ctx.fillText(t, left - HEATMAP.labelGap, top + i * cell + cell / 2));
    colTokens.forEach((t, j) => {
      ctx.save(); ctx.translate(left + j * cell + cell / 2, top - HEATMAP.labelGap); ctx.rotate(-Math.PI / 2);
      ctx.textAlign = "left"; ctx.fillText(t, 0, 0); ctx.restore();
    });
  }
}

// What the readout says for the cell of row i, column j.
export function heatmapText(data, i, j) {
  const rowTokens = data.rowTokens || data.tokens, colTokens = data.colTokens || data.tokens;
  return `“${rowTokens[i]}” → “${colTokens[j]}”: ${data.matrix[i][j].toFixed(4)}`;
}
