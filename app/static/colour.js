// Colours: one per attention head, and the two scales the heatmaps use (as [r, g, b]).

export const INK = "#1d2330";    // text, as --ink in viewer.css
export const MUTED = "#5d6675";  // axis labels, as --muted
export const LINE = "#dde1e8";   // cell frames, as --line

const HEAD_COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
                      "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#ad494a"];

export function headColour(h) {
  return h < HEAD_COLOURS.length ? HEAD_COLOURS[h] : `hsl(${(h * 137.5) % 360}, 60%, 45%)`;
}

// white → deep blue, for weights in [0, max]
export function sequential(t) {
  t = Math.max(0, Math.min(1, t));
  return [Math.round(255 - 231 * t), Math.round(255 - 168 * t), Math.round(255 - 58 * t)];
}

// blue (−1) → white (0) → red (+1)
export function diverging(v) {
  v = Math.max(-1, Math.min(1, v));
  if (v < 0) { const t = -v; return [Math.round(255 - 222 * t), Math.round(255 - 153 * t), Math.round(255 - 83 * t)]; }
  return [Math.round(255 - 77 * v), Math.round(255 - 231 * v), Math.round(255 - 212 * v)];
}

export const rgb = (c) => `rgb(${c[0]},${c[1]},${c[2]})`;
