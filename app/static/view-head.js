// Head view: lines join each token (left) to the tokens it attends to (right); thicker and darker is
// more weight, one colour per head. Norm-weighted values have no bound of 1: they are drawn relative
// to the largest (data.scale).

import {headColour, INK} from "./colour.js";
import {FONTS, HEAD, TITLE} from "./layout.js";

// The one draw function, for the screen (lines only, the labels are page elements) and the PNG
// (layout.labels: a title and both token columns as well).
// data: {title, tokens, heads: [{head, matrix}] (the heads shown), scale: the value drawn as weight 1,
// focus: {side: "left"|"right", index} | null}
export function drawHeadView(ctx, data, layout) {
  const {tokens, heads, focus} = data;
  const scale = data.scale || 1;
  const {row, left, top, linesWidth} = layout;
  if (layout.labels) {
    ctx.fillStyle = INK; ctx.font = FONTS.title; ctx.textAlign = "left"; ctx.textBaseline = "alphabetic";
    ctx.fillText(data.title, TITLE.x, TITLE.baseline);
    ctx.font = FONTS.token; ctx.textBaseline = "middle";
    tokens.forEach((t, i) => {
      const y = top + i * row + row / 2;
      ctx.textAlign = "right"; ctx.fillText(t, left - HEAD.labelPadding, y);
      ctx.textAlign = "left"; ctx.fillText(t, left + linesWidth + HEAD.labelPadding, y);
    });
  }
  const n = tokens.length;
  const threshold = focus ? 0.005 : 0.02;  // with one token focused, fainter lines are worth showing
  ctx.lineCap = "round";
  for (const {head, matrix} of heads) {
    ctx.strokeStyle = headColour(head);
    for (let i = 0; i < n; i++) {
      if (focus && focus.side === "left" && focus.index !== i) continue;
      for (let j = 0; j < n; j++) {
        if (focus && focus.side === "right" && focus.index !== j) continue;
        const w = matrix[i][j] / scale;
        if (w < threshold) continue;
        ctx.globalAlpha = Math.min(1, 0.15 + w);
        ctx.lineWidth = 0.5 + 2.5 * w;
        ctx.beginPath();
        ctx.moveTo(left + HEAD.inset, top + i * row + row / 2);
        ctx.lineTo(left + linesWidth - HEAD.inset, top + j * row + row / 2);
        ctx.stroke();
      }
    }
  }
  ctx.globalAlpha = 1;
}

// Fills both token columns; hovering or focusing a token calls onFocus({side, index}), leaving it onFocus(null).
export function fillTokenColumns(columns, tokens, details, onFocus) {
  for (const [side, column] of Object.entries(columns)) {
    column.innerHTML = "";
    tokens.forEach((token, index) => {
      const cell = document.createElement("div");
      cell.className = "token" + (details[index].special ? " special" : "");
      cell.textContent = token;
      cell.tabIndex = 0;
      cell.dataset.index = String(index);
      const focus = () => onFocus({side, index});
      const blur = () => onFocus(null);
      cell.addEventListener("mouseenter", focus);
      cell.addEventListener("mouseleave", blur);
      cell.addEventListener("focus", focus);
      cell.addEventListener("blur", blur);
      column.append(cell);
    });
  }
}

// Marks the focused token, and dims the others in its column.
export function highlightTokens(columns, focus) {
  for (const [side, column] of Object.entries(columns)) {
    for (const cell of column.children) {
      const index = Number(cell.dataset.index);
      const active = focus && focus.side === side && focus.index === index;
      cell.classList.toggle("active", Boolean(active));
      cell.classList.toggle("dim", Boolean(focus && focus.side === side && !active));
    }
  }
}
