// Model view: every layer (rows) and head (columns) as a small attention heatmap; one is enlarged in
// the heatmap view when it is chosen.

import {INK, LINE, MUTED, sequential} from "./colour.js";
import {drawScaled, matrixImage} from "./canvas.js";
import {FONTS, TITLE, modelCell} from "./layout.js";

// The one draw function, for the screen and the PNG.
// data: {model, title, layers, heads (numbers, as the API names them), attention: [layer][head] → (T, T)
// weights, scale: the value drawn deepest blue (1 for attention weights, the largest for norms)}
export function drawModelView(ctx, data, layout) {
  const {layers, heads, attention} = data;
  const {cell} = layout;
  ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, layout.width, layout.height);
  ctx.fillStyle = INK; ctx.font = FONTS.title; ctx.textAlign = "left"; ctx.textBaseline = "alphabetic";
  ctx.fillText(data.title || `${data.model}: every layer and head`, TITLE.x, TITLE.baseline);
  const scale = data.scale || 1;
  ctx.fillStyle = MUTED; ctx.font = FONTS.value; ctx.textAlign = "center";
  heads.forEach((h, hi) => ctx.fillText(`head ${h}`, modelCell(layout, 0, hi).x + cell / 2, layout.top - 8));
  ctx.textAlign = "right"; ctx.textBaseline = "middle";
  layers.forEach((layer, li) => ctx.fillText(`layer ${layer}`, layout.left - 6, modelCell(layout, li, 0).y + cell / 2));
  ctx.strokeStyle = LINE; ctx.lineWidth = 1;
  layers.forEach((_, li) => heads.forEach((_, hi) => {
    const {x, y} = modelCell(layout, li, hi);
    drawScaled(ctx, matrixImage(attention[li][hi], (w) => sequential(w / scale)), x, y, cell, cell);
    ctx.strokeRect(x - 0.5, y - 0.5, cell + 1, cell + 1);
  }));
}

// One button over each cell of the drawn canvas, in reading order, so that a click or the keyboard
// picks a head: onPick(layer index, head).
export function placeCellButtons(container, data, layout, onPick) {
  container.querySelectorAll("button").forEach((button) => button.remove());
  data.layers.forEach((layer, li) => data.heads.forEach((h, hi) => {
    const {x, y} = modelCell(layout, li, hi);
    const button = document.createElement("button");
    button.type = "button";
    button.title = `layer ${layer}, head ${h}: enlarge`;
    button.setAttribute("aria-label", button.title);
    Object.assign(button.style, {left: `${x}px`, top: `${y}px`, width: `${layout.cell}px`, height: `${layout.cell}px`});
    button.addEventListener("click", () => onPick(li, h));
    container.append(button);
  }));
}
