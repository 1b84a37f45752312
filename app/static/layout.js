// Layout: every size and position the views draw with, in CSS pixels, and the functions that turn a
// view's data into its layout. A layout is a plain object with the figure's width and height; for the
// matrix views it also says where the grid of cells lies (left, top, cellW, cellH, rows, cols), which
// is what drawing and hovering both use. The browser tests import this module to read the same figures.

export const FONTS = {
  title: "600 13px sans-serif",  // every figure's title
  token: "13px monospace",       // head view labels (the page's token columns use 13px too)
  axis: "11px sans-serif",       // positional-encoding axes
  value: "12px sans-serif",      // model view and similarity labels, similarity values
};

export const TITLE = {x: 6, baseline: 16};  // where every figure's title sits

export const ROW = 18;  // px per token row in the head view; the page's token labels get it as --row

export const HEAD = {
  linesWidth: 320,        // the band of lines between the two token columns
  linesWidthNarrow: 180,  // the same on a phone-width screen (viewer.css picks it, as --lines-narrow)
  inset: 2,               // lines start and end this far inside the band
  titleHeight: 30,        // PNG only: the title above the token columns
  labelPadding: 6,        // PNG only: each side of a token label
};

export const MODEL = {
  budget: 900,           // px the row of heads aims to fill
  minCell: 48, maxCell: 96,
  gap: 4,                // between cells
  left: 60,              // room for the layer labels
  top: 40,               // room for the title and the head labels
};

export const HEATMAP = {
  budget: 640,           // px the matrix aims to fill
  minCell: 4, maxCell: 28,
  labelsFrom: 9,         // token labels only when a cell is at least this tall,
  labelSize: 12,         // in monospace this many px high, or a cell's height if less
  padding: 10,           // round the matrix (beside its labels)
  labelGap: 4,           // between a label and the matrix
  titleHeight: 22,
  minWidth: 240,         // a block of few columns still has room for its title
};

export const PE = {
  budgetW: 900, budgetH: 600,  // px the matrix aims to fill, across (dimensions) and down (positions)
  maxCell: 12,
  left: 48, top: 28, right: 10, bottom: 24,
  tickSpacing: 16,             // px at least between position labels
  maxTicks: 12,
};

export const SIMILARITY = {
  cell: 56, gap: 2,            // each cell is drawn cell − gap wide, on white
  left: 40, top: 40, right: 10,
  legendGap: 20, legendRow: 18,  // the numbered texts under the matrix
  minWidth: 480, maxWidth: 960,  // longer texts are cut short with …
};

const clamp = (value, low, high) => Math.max(low, Math.min(high, value));

let probe = null;

// The width of the widest of `texts` in `font`, rounded up (0 for none).
export function textWidth(texts, font) {
  probe = probe || document.createElement("canvas").getContext("2d");
  probe.font = font;
  return Math.ceil(texts.reduce((widest, t) => Math.max(widest, probe.measureText(t).width), 0));
}

// The cell of a layout's grid under the point (x, y) of its canvas, or null outside the grid.
export function gridCell(layout, x, y) {
  const row = Math.floor((y - layout.top) / layout.cellH);
  const col = Math.floor((x - layout.left) / layout.cellW);
  return row >= 0 && col >= 0 && row < layout.rows && col < layout.cols ? {row, col} : null;
}

// Head view. On screen the token labels are page elements beside the canvas, which holds only the
// lines (`linesWidth` wide, as the page's grid column makes it); with `labels`, for the PNG, the
// canvas holds a title and both token columns round the same lines.
export function headLayout(tokens, {linesWidth = HEAD.linesWidth, labels = false} = {}) {
  const labelWidth = labels ? textWidth(tokens, FONTS.token) + 2 * HEAD.labelPadding : 0;
  const top = labels ? HEAD.titleHeight : 0;
  return {
    labels, row: ROW, rows: tokens.length, linesWidth, labelWidth, left: labelWidth, top,
    width: 2 * labelWidth + linesWidth, height: top + tokens.length * ROW,
  };
}

// Model view: one square cell per layer (rows) and head (columns).
export function modelLayout(layers, heads) {
  const cell = clamp(Math.floor(MODEL.budget / heads) - 6, MODEL.minCell, MODEL.maxCell);  // 6: a gap and a frame
  const pitch = cell + MODEL.gap;
  return {
    rows: layers, cols: heads, cell, pitch, left: MODEL.left, top: MODEL.top,
    width: MODEL.left + heads * pitch, height: MODEL.top + layers * pitch,
  };
}

// Where the model view's cell for layer index `li` and head index `hi` starts.
export function modelCell(layout, li, hi) {
  return {x: layout.left + hi * layout.pitch, y: layout.top + li * layout.pitch};
}

// Heatmap of one (n × n) attention matrix, with the tokens along both edges when the cells are big
// enough; wide enough for its `title` too.
export function heatmapLayout(tokens, title = "") {
  const n = tokens.length;
  const cell = clamp(Math.floor(HEATMAP.budget / n), HEATMAP.minCell, HEATMAP.maxCell);
  const labels = cell >= HEATMAP.labelsFrom;
  const margin = (labels ? textWidth(tokens, `${HEATMAP.labelSize}px monospace`) : 0) + HEATMAP.padding;
  const size = margin + n * cell + HEATMAP.padding;
  return {
    labels, rows: n, cols: n, cellW: cell, cellH: cell, left: margin, top: HEATMAP.titleHeight + margin,
    width: Math.max(size, textWidth([title], FONTS.title) + 2 * TITLE.x), height: HEATMAP.titleHeight + size,
  };
}

// Positional encoding: `length` positions (rows) × `dims` dimensions (columns).
export function peLayout(length, dims) {
  const cellW = clamp(Math.floor(PE.budgetW / dims), 1, PE.maxCell);
  const cellH = clamp(Math.floor(PE.budgetH / length), 1, PE.maxCell);
  return {
    rows: length, cols: dims, cellW, cellH, left: PE.left, top: PE.top,
    width: PE.left + dims * cellW + PE.right, height: PE.top + length * cellH + PE.bottom,
  };
}

// The numbered texts under the similarity matrix, one per line.
export const similarityLegend = (texts) => texts.map((t, i) => `${i + 1}. ${t}`);

// Similarity of every pair of `texts`: the matrix, then the texts it numbers.
export function similarityLayout(texts) {
  const n = texts.length;
  const gridWidth = SIMILARITY.left + n * SIMILARITY.cell + SIMILARITY.right;
  const legendWidth = textWidth(similarityLegend(texts), FONTS.value) + 2 * TITLE.x;
  const legendTop = SIMILARITY.top + n * SIMILARITY.cell + SIMILARITY.legendGap;
  return {
    rows: n, cols: n, cellW: SIMILARITY.cell, cellH: SIMILARITY.cell, left: SIMILARITY.left, top: SIMILARITY.top,
    legendTop, width: Math.max(gridWidth, clamp(legendWidth, SIMILARITY.minWidth, SIMILARITY.maxWidth)),
    height: legendTop + n * SIMILARITY.legendRow,
  };
}

// Heatmap of a (rows × cols) block of an attention matrix, `rowTokens` down the left and `colTokens`
// along the top, when the cells are big enough for them; wide enough for its `title` too.
export function crossLayout(rowTokens, colTokens, title = "") {
  const rows = rowTokens.length, cols = colTokens.length;
  const cell = clamp(Math.floor(HEATMAP.budget / Math.max(rows, cols, 1)), HEATMAP.minCell, HEATMAP.maxCell);
  const labels = cell >= HEATMAP.labelsFrom;
  const font = `${HEATMAP.labelSize}px monospace`;
  const left = (labels ? textWidth(rowTokens, font) : 0) + HEATMAP.padding;
  const top = HEATMAP.titleHeight + (labels ? textWidth(colTokens, font) : 0) + HEATMAP.padding;
  return {
    labels, rows, cols, cellW: cell, cellH: cell, left, top,
    width: Math.max(left + cols * cell + HEATMAP.padding, HEATMAP.minWidth, textWidth([title], FONTS.title) + 2 * TITLE.x),
    height: top + rows * cell + HEATMAP.padding,
  };
}

export const RERANK = {
  row: 26,               // px per document
  barHeight: 16,         // the bar inside its row
  barWidth: 360,         // a relevance score of 1
  top: 28,               // room for the title
  labelGap: 8,           // between a document's label and its bar
  scoreWidth: 56,        // the score written after the bar
  minLabel: 120, maxLabel: 420,  // longer documents are cut short with …
};

// The label of each ranked document, best first: its rank and its text.
export const rerankLabels = (results) => results.map((r, k) => `${k + 1}. ${r.document}`);

// Relevance of each document: one row per document, best first, its label, then a bar as long as its
// score. The grid is the rows' bars (one column), what clicking and hovering use.
export function rerankLayout(results) {
  const labelWidth = clamp(textWidth(rerankLabels(results), FONTS.value), RERANK.minLabel, RERANK.maxLabel);
  const left = TITLE.x + labelWidth + RERANK.labelGap;
  const cellW = RERANK.barWidth + RERANK.scoreWidth;
  return {
    rows: results.length, cols: 1, cellW, cellH: RERANK.row, left, top: RERANK.top, labelWidth,
    width: left + cellW + TITLE.x, height: RERANK.top + results.length * RERANK.row + 4,
  };
}

// Explanation of one similarity score: the (source tokens × text tokens) contributions, the source's
// tokens down the left and the other text's along the top, under a title and a line naming each text;
// each source token's total (its row's sum) in a strip of bars right of the matrix, each text token's
// total (its column's sum) in a strip under it.
export const EXPLAIN = {
  textRow: 16,   // each of the two lines under the title that name the texts
  strip: 72,     // the depth of a strip of totals; its zero line runs down (or along) its middle
  stripGap: 8,   // between the matrix and a strip
};

export function explanationLayout(sourceTokens, tokens, title = "") {
  const rows = sourceTokens.length, cols = tokens.length;
  const cell = clamp(Math.floor(HEATMAP.budget / Math.max(rows, cols, 1)), HEATMAP.minCell, HEATMAP.maxCell);
  const labels = cell >= HEATMAP.labelsFrom;
  const font = `${HEATMAP.labelSize}px monospace`;
  const textsTop = HEATMAP.titleHeight;
  const left = textWidth(labels ? [...sourceTokens, "total"] : ["total"], font) + HEATMAP.padding;  // "total": the strip under
  const top = textsTop + 2 * EXPLAIN.textRow + textWidth(labels ? [...tokens, "total"] : ["total"], font) + HEATMAP.padding;
  const stripX = left + cols * cell + EXPLAIN.stripGap;
  const stripY = top + rows * cell + EXPLAIN.stripGap;
  return {
    labels, rows, cols, cellW: cell, cellH: cell, left, top, textsTop, stripX, stripY,
    width: Math.max(stripX + EXPLAIN.strip + HEATMAP.padding, HEATMAP.minWidth, textWidth([title], FONTS.title) + 2 * TITLE.x),
    height: stripY + EXPLAIN.strip + HEATMAP.padding,
  };
}

// The part of an explanation's figure under the point (x, y): a cell {row, col}, a source token's
// total {row, col: cols}, a text token's total {row: rows, col}, or null.
export function explanationCell(layout, x, y) {
  const cell = gridCell(layout, x, y);
  if (cell) return cell;
  const {rows, cols, cellW, cellH, left, top, stripX, stripY} = layout;
  const row = Math.floor((y - top) / cellH), col = Math.floor((x - left) / cellW);
  if (x >= stripX && x < stripX + EXPLAIN.strip && row >= 0 && row < rows) return {row, col: cols};
  if (y >= stripY && y < stripY + EXPLAIN.strip && col >= 0 && col < cols) return {row: rows, col};
  return null;
}

export const STATS = {
  cell: 56, gap: 2,            // each cell is drawn cell − gap wide, on white
  left: 64, top: 44, right: 10, bottom: 10,
};

// Head statistics: one cell per layer (rows) and head (columns).
export function statsLayout(layers, heads) {
  return {
    rows: layers, cols: heads, cellW: STATS.cell, cellH: STATS.cell, left: STATS.left, top: STATS.top,
    width: STATS.left + heads * STATS.cell + STATS.right, height: STATS.top + layers * STATS.cell + STATS.bottom,
  };
}

// Neuron view: one head's attention for one query token i, step by step. A row per key token j, in
// columns: the token, its key k_j, the elementwise product q_i ⊙ k_j, their dot product omega, the
// scaled score, the attention weight as a bar, and the value v_j; the query q_i above the keys, the
// context vector z_i under the values. Each vector of Dh numbers is a strip of Dh cells.
export const NEURON = {
  stripBudget: 160,      // px a strip of Dh cells aims to fill
  maxCell: 8,            // px across a strip's cell at most
  cellGap: 3,            // px between the strips of two rows (a strip is ROW − cellGap high)
  gap: 16,               // between two columns
  number: 64,            // a column of numbers, at least
  bar: 140,              // an attention weight of 1
  barValue: 52,          // the weight written after its bar
  titleHeight: 26,       // the title, and under it the query's row
  noteHeight: 18,        // the line saying the scores hold a position bias, when they do
  headingGap: 6,         // between the query's row and the column headings
  headingLine: 14,       // each of the two lines of a column's heading
  contextGap: 8,         // between the last key's row and the context vector's
  padding: 8,
};

// The shape of each step, as the seed notebooks print them, for T tokens and head width Dh.
export function neuronShapes(T, dh) {
  return {
    query: `(${dh},)`, keys: `(${T}, ${dh})`, products: `(${T}, ${dh})`, omega: `(${T},)`, scaled: `(${T},)`,
    attention: `(${T},)`, values: `(${T}, ${dh})`, context: `(${dh},)`,
  };
}

// How the scores are scaled, in words: 1/√Dh when that is the model's scale, else the number itself.
export function scaleText(scale, dh) {
  const root = Math.abs(scale - 1 / Math.sqrt(dh)) < 1e-6;
  return root ? `× 1/√Dh = ${scale.toFixed(3)}` : `× ${scale.toFixed(3)}`;
}

// Each column's heading, two lines: its name in the seed notebooks' words, then its shape or formula.
// bias: whether the model adds a position bias to the scaled scores.
export function neuronHeadings(T, dh, scale, bias = false) {
  const s = neuronShapes(T, dh);
  return {
    token: ["key token", "j"],
    keys: ["keys K", s.keys],
    products: ["q_i ⊙ k_j", s.products],
    omega: ["omega = q_i · k_j", s.omega],
    scaled: [bias ? "scaled + position bias" : "scaled score", `${scaleText(scale, dh)} ${s.scaled}`],
    attention: ["attention weights", `softmax ${s.attention}`],
    values: ["values V", s.values],
  };
}

// The labels beside the query's strip (right of it) and the context vector's (left of it).
export const neuronQueryLabel = (token, dh) => `query q_i of “${token}” ${neuronShapes(1, dh).query}`;
export const neuronContextLabel = (dh) => `context vector z_i = Σ_j α_ij v_j ${neuronShapes(1, dh).context}`;

// tokens: the T tokens; dh: the head width; headings: neuronHeadings(...); bias as there; title: the
// figure's. The grid is the key rows (one column across the whole figure): what hovering reads.
export function neuronLayout(tokens, dh, headings, {title = "", bias = false} = {}) {
  const T = tokens.length;
  const heading = (key) => textWidth(headings[key], FONTS.axis);
  const cell = clamp(Math.floor(NEURON.stripBudget / Math.max(dh, 1)), 1, NEURON.maxCell);
  const strip = Math.max(dh * cell, heading("keys"), heading("products"), heading("values"));
  const labelWidth = Math.max(textWidth(tokens, FONTS.token), heading("token"));
  const omegaWidth = Math.max(NEURON.number, heading("omega"));
  const scaledWidth = Math.max(NEURON.number, heading("scaled"));
  const barsWidth = Math.max(NEURON.bar + NEURON.barValue, heading("attention"));
  const x = {token: NEURON.padding};
  x.keys = x.token + labelWidth + NEURON.gap;
  x.products = x.keys + strip + NEURON.gap;
  x.omega = x.products + strip + NEURON.gap;
  x.scaled = x.omega + omegaWidth + NEURON.gap;
  x.attention = x.scaled + scaledWidth + NEURON.gap;
  x.values = x.attention + barsWidth + NEURON.gap;
  const widths = {token: labelWidth, keys: strip, products: strip, omega: omegaWidth, scaled: scaledWidth, attention: barsWidth, values: strip};
  const noteTop = NEURON.titleHeight;
  const queryTop = noteTop + (bias ? NEURON.noteHeight : 0);
  const headingTop = queryTop + ROW + NEURON.headingGap;
  const top = headingTop + 2 * NEURON.headingLine + NEURON.headingGap;
  const contextTop = top + T * ROW + NEURON.contextGap;
  const right = x.values + strip + NEURON.padding;
  return {
    rows: T, cols: 1, cellW: right - x.token, cellH: ROW, left: x.token, top,
    dh, cell, x, widths, noteTop, queryTop, headingTop, contextTop,
    width: Math.max(right, textWidth([title], FONTS.title) + 2 * TITLE.x),
    height: contextTop + ROW + NEURON.padding,
  };
}
