// Positional encoding: rows are positions, columns are dimensions; blue is −1, red is +1 (a learned
// table is scaled by its largest magnitude). Rotary angles are drawn as cos θ; relative positions as the
// (query × key) matrix of the bucket each pair uses, white for the first bucket to deep blue for the last.

import {INK, MUTED, diverging, sequential} from "./colour.js";
import {drawScaled, matrixImage} from "./canvas.js";
import {FONTS, PE, TITLE} from "./layout.js";

// The one draw function, for the screen and the PNG.
// data: /positional-encoding's answer, {kind, length, d_model, encoding: (length, columns), buckets?}
export function drawPositionalEncoding(ctx, data, layout) {
  const {encoding, length, kind} = data;
  const columns = encoding[0].length;
  const {cellW, cellH, left, top} = layout;
  ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, layout.width, layout.height);
  ctx.fillStyle = INK; ctx.font = FONTS.title; ctx.textAlign = "left"; ctx.textBaseline = "alphabetic";
  ctx.fillText(title(data), TITLE.x, TITLE.baseline);
  let colour;
  if (kind === "relative") colour = (v) => sequential(v / Math.max(1, data.buckets - 1));
  else if (kind === "rotary") colour = (v) => diverging(Math.cos(v));
  else {
    const scale = kind === "learned" ? Math.max(1e-9, ...encoding.map((r) => Math.max(...r.map(Math.abs)))) : 1;
    colour = (v) => diverging(v / scale);
  }
  drawScaled(ctx, matrixImage(encoding, colour), left, top, columns * cellW, length * cellH);
  ctx.font = FONTS.axis; ctx.fillStyle = MUTED; ctx.textAlign = "right"; ctx.textBaseline = "middle";
  const step = Math.max(1, Math.ceil(PE.tickSpacing / cellH));
  for (let p = 0; p < length; p += step * Math.ceil(length / (step * PE.maxTicks))) ctx.fillText(String(p), left - 6, top + p * cellH + cellH / 2);
  ctx.textAlign = "center"; ctx.textBaseline = "top";
  const axis = {relative: "key →", rotary: "rotated pair →"}[kind] || "dimension →";
  ctx.fillText(axis, left + (columns * cellW) / 2, top + length * cellH + 6);
}

function title(data) {
  const {kind, length, d_model: width} = data;
  if (kind === "relative") return `relative positions: the bucket of each query (rows) and key, ${data.buckets} buckets`;
  if (kind === "rotary") return `rotary angles, base ${data.base}: ${length} positions × ${width / 2} pairs, as cos θ`;
  return `${kind} positional encoding: ${length} positions × ${width} dimensions`;
}

// What the page says under the drawing, for each kind.
export function positionalLegend(data) {
  if (data.kind === "relative") return "Each cell is the bucket query i and key j use: white is the first, deep blue the last.";
  if (data.kind === "rotary") return "Each cell is cos θ of the angle that rotates a pair of query and key components at a position: blue −1, red +1.";
  return "Rows are positions, columns are dimensions; blue is −1, red is +1.";
}

// What the readout says for position `pos`, column `k`.
export function positionalText(data, pos, k) {
  const value = data.encoding[pos][k];
  if (data.kind === "relative") return `query ${pos}, key ${k}: bucket ${value}`;
  if (data.kind === "rotary") return `position ${pos}, pair ${k}: θ = ${value.toFixed(4)} rad, cos θ = ${Math.cos(value).toFixed(4)}`;
  return `position ${pos}, dimension ${k}: ${value.toFixed(4)}`;
}
