// Positional encoding: rows are positions, columns are dimensions; blue is −1, red is +1 (a learned
// table is scaled by its largest magnitude).

import {INK, MUTED, diverging} from "./colour.js";
import {drawScaled, matrixImage} from "./canvas.js";
import {FONTS, PE, TITLE} from "./layout.js";

// The one draw function, for the screen and the PNG.
// data: /positional-encoding's answer, {kind, length, d_model, encoding: (length, d_model)}
export function drawPositionalEncoding(ctx, data, layout) {
  const {encoding, length, d_model: width, kind} = data;
  const {cellW, cellH, left, top} = layout;
  ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, layout.width, layout.height);
  ctx.fillStyle = INK; ctx.font = FONTS.title; ctx.textAlign = "left"; ctx.textBaseline = "alphabetic";
  ctx.fillText(`${kind} positional encoding: ${length} positions × ${width} dimensions`, TITLE.x, TITLE.baseline);
  const scale = kind === "learned" ? Math.max(1e-9, ...encoding.map((r) => Math.max(...r.map(Math.abs)))) : 1;
  drawScaled(ctx, matrixImage(encoding, (v) => diverging(v / scale)), left, top, width * cellW, length * cellH);
  ctx.font = FONTS.axis; ctx.fillStyle = MUTED; ctx.textAlign = "right"; ctx.textBaseline = "middle";
  const step = Math.max(1, Math.ceil(PE.tickSpacing / cellH));
  for (let p = 0; p < length; p += step * Math.ceil(length / (step * PE.maxTicks))) ctx.fillText(String(p), left - 6, top + p * cellH + cellH / 2);
  ctx.textAlign = "center"; ctx.textBaseline = "top";
  ctx.fillText("dimension →", left + (width * cellW) / 2, top + length * cellH + 6);
}

// What the readout says for position `pos`, dimension `k`.
export function positionalText(data, pos, k) {
  return `position ${pos}, dimension ${k}: ${data.encoding[pos][k].toFixed(4)}`;
}
