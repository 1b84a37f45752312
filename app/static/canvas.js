// Canvas helpers every view shares. A figure is {data, layout, draw}: `draw(ctx, data, layout)` is the
// view's one draw function, and `layout.width` × `layout.height` (CSS pixels) is the canvas it needs.
// The screen and the PNG download both go through it.

// Sizes a canvas for `width` × `height` CSS pixels at the screen's pixel ratio (which clears it).
export function sizeCanvas(canvas, width, height) {
  const ratio = window.devicePixelRatio || 1;
  canvas.width = Math.round(width * ratio);
  canvas.height = Math.round(height * ratio);
  canvas.style.width = `${width}px`;
  canvas.style.height = `${height}px`;
  const ctx = canvas.getContext("2d");
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  return ctx;
}

// Draws a figure on a canvas of the page.
export function paint(canvas, figure) {
  figure.draw(sizeCanvas(canvas, figure.layout.width, figure.layout.height), figure.data, figure.layout);
}

// Draws a figure on an offscreen canvas, on white, and returns it as a PNG data URL.
export function pngOf(figure) {
  const {width, height} = figure.layout;
  const canvas = document.createElement("canvas");
  const ctx = sizeCanvas(canvas, width, height);
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, width, height);
  figure.draw(ctx, figure.data, figure.layout);
  return canvas.toDataURL("image/png");
}

// A (rows × cols) matrix as an image, one pixel a cell, to be scaled up without smoothing.
export function matrixImage(matrix, colour) {
  const rows = matrix.length, cols = matrix[0].length;
  const image = new ImageData(cols, rows);
  for (let i = 0; i < rows; i++) {
    for (let j = 0; j < cols; j++) {
      const c = colour(matrix[i][j]);
      const k = (i * cols + j) * 4;
      image.data[k] = c[0]; image.data[k + 1] = c[1]; image.data[k + 2] = c[2]; image.data[k + 3] = 255;
    }
  }
  const canvas = document.createElement("canvas");
  canvas.width = cols; canvas.height = rows;
  canvas.getContext("2d").putImageData(image, 0, 0);
  return canvas;
}

export function drawScaled(ctx, source, x, y, width, height) {
  ctx.imageSmoothingEnabled = false;
  ctx.drawImage(source, x, y, width, height);
}

// `text`, cut short with … to fit `maxWidth` in the context's current font.
export function fitText(ctx, text, maxWidth) {
  if (ctx.measureText(text).width <= maxWidth) return text;
  let low = 0, high = text.length;  // the longest prefix that fits with its …
  while (low < high) {
    const mid = Math.ceil((low + high) / 2);
    if (ctx.measureText(text.slice(0, mid) + "…").width <= maxWidth) low = mid; else high = mid - 1;
  }
  return text.slice(0, low) + "…";
}

// One button over each cell of a drawn grid (a layout's left, top, cellW, cellH, rows, cols), in
// reading order, so that the pointer and the keyboard both reach every cell. `label(row, col)` is its
// accessible name; `pick(row, col)` runs on a click, Enter or Space; `enter(row, col, point)` when the
// pointer moves over it (point: the pointer's clientX, clientY) or the focus comes to it (point: the
// cell's top right corner); `leave()` when either goes.
export function placeGridButtons(container, layout, {label, pick, enter = () => {}, leave = () => {}}) {
  container.querySelectorAll(":scope > button").forEach((button) => button.remove());
  for (let row = 0; row < layout.rows; row++) {
    for (let col = 0; col < layout.cols; col++) {
      const button = document.createElement("button");
      button.type = "button";
      button.dataset.row = String(row);
      button.dataset.col = String(col);
      button.setAttribute("aria-label", label(row, col));
      Object.assign(button.style, {
        left: `${layout.left + col * layout.cellW}px`, top: `${layout.top + row * layout.cellH}px`,
        width: `${layout.cellW}px`, height: `${layout.cellH}px`,
      });
      button.addEventListener("click", () => pick(row, col));
      button.addEventListener("mousemove", (event) => enter(row, col, event));
      button.addEventListener("focus", () => {
        const rect = button.getBoundingClientRect();
        enter(row, col, {clientX: rect.right, clientY: rect.top});
      });
      button.addEventListener("mouseleave", leave);
      button.addEventListener("blur", leave);
      container.append(button);
    }
  }
}
