// Head statistics: one number per layer (rows) and head (columns), from /attention/heads, averaged over
// the query positions and the texts: how spread out a head's attention is, how far it looks, and how
// much of it goes to [CLS], separators, punctuation, the token itself or its neighbours. White is 0,
// deep blue the largest value of the grid, grey a value the service could not compute (null: no query
// position it applies to); selecting a cell opens that head's heatmap.

import {INK, LINE, MUTED, sequential, rgb} from "./colour.js";
import {FONTS, STATS, TITLE} from "./layout.js";

// What each statistic the service names means, in words; a name not listed here is shown as it is.
const NAMES = {
  entropy: "entropy of each row (nats)",
  distance: "mean distance attended to (tokens)",
  to_cls: "attention to the first token ([CLS])",
  to_sep: "attention to separators",
  to_punctuation: "attention to punctuation",
  to_self: "attention to the token itself",
  to_previous: "attention to the previous token",
  to_next: "attention to the next token",
};

export const statisticName = (key) => NAMES[key] || key.replace(/_/g, " ");

// The grid's data for `statistic` of /attention/heads's answer `response`, for the texts it was asked about.
export function statsData(response, statistic, texts) {
  return {model: response.model, statistic, texts, nTexts: response.n_texts, values: response.statistics[statistic]};
}

const known = (v) => typeof v === "number" && Number.isFinite(v);
const largest = (values) => Math.max(1e-12, ...values.flat().filter(known));
const format = (v) => (!known(v) ? "–" : Math.abs(v) >= 10 ? v.toFixed(1) : v.toFixed(2));
const precise = (v) => (known(v) ? v.toFixed(4) : "none");

// The one draw function, for the screen and the PNG. data: statsData(...)
export function drawHeadStatistics(ctx, data, layout) {
  const {values} = data;
  const {left, top, cellW: cell} = layout;
  const max = largest(values);
  ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, layout.width, layout.height);
  ctx.fillStyle = INK; ctx.font = FONTS.title; ctx.textAlign = "left"; ctx.textBaseline = "alphabetic";
  const texts = data.nTexts === 1 ? "one text" : `mean over ${data.nTexts} texts`;
  ctx.fillText(`${data.model} · ${statisticName(data.statistic)}, per layer and head (${texts})`, TITLE.x, TITLE.baseline);
  ctx.font = FONTS.value; ctx.textAlign = "center"; ctx.textBaseline = "middle";
  ctx.fillStyle = MUTED;
  values[0].forEach((_, h) => ctx.fillText(`head ${h}`, left + h * cell + cell / 2, top - 10));
  ctx.textAlign = "right";
  values.forEach((_, l) => ctx.fillText(`layer ${l}`, left - 8, top + l * cell + cell / 2));
  ctx.textAlign = "center";
  values.forEach((row, l) => row.forEach((v, h) => {
    const t = known(v) ? v / max : 0;
    ctx.fillStyle = known(v) ? rgb(sequential(t)) : LINE;
    ctx.fillRect(left + h * cell, top + l * cell, cell - STATS.gap, cell - STATS.gap);
    ctx.fillStyle = t > 0.6 ? "#fff" : INK;
    ctx.fillText(format(v), left + h * cell + (cell - STATS.gap) / 2, top + l * cell + (cell - STATS.gap) / 2);
  }));
}

// What the readout says for layer index l, head index h.
export function statsText(data, l, h) {
  return `layer ${l}, head ${h}: ${statisticName(data.statistic)} ${precise(data.values[l][h])}`;
}

// The same numbers as a table, the drawing's text equivalent for screen readers.
export function fillStatsTable(table, data) {
  table.innerHTML = "";
  table.createCaption().textContent = `${statisticName(data.statistic)}, per layer (rows) and head (columns)`;
  const head = table.createTHead().insertRow();
  head.append(document.createElement("th"));
  data.values[0].forEach((_, h) => { const th = document.createElement("th"); th.scope = "col"; th.textContent = `head ${h}`; head.append(th); });
  const body = table.createTBody();
  data.values.forEach((row, l) => {
    const tr = body.insertRow();
    const th = document.createElement("th");
    th.scope = "row"; th.textContent = `layer ${l}`;
    tr.append(th);
    row.forEach((v) => { tr.insertCell().textContent = precise(v); });
  });
}
