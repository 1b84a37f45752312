// Explain: which tokens made a model's score (/explain), each token shaded by its attribution: blue where it
// raised the score, red where it lowered it, the shade its share of the largest attribution.

// The background of a token with attribution `value`, where `largest` is the largest in absolute value.
export function shade(value, largest) {
  const alpha = largest > 0 ? Math.min(1, Math.abs(value) / largest) : 0;
  return value >= 0 ? `rgba(33, 102, 172, ${alpha.toFixed(3)})` : `rgba(178, 24, 43, ${alpha.toFixed(3)})`;
}

// One line for the readout: the score explained, the baseline's score and the delta.
export function explainSummary(data) {
  const what = data.target ? `label ${data.target.label}` : "yes − no";
  const how = data.method === "integrated_gradients" ? `integrated gradients, ${data.steps} steps` : "gradient × input";
  let line = `${data.model} · ${what} · ${how}: score ${data.score.toFixed(4)}`;
  if (data.baseline_score !== null) {
    line += `, baseline ${data.baseline_score.toFixed(4)}; the attributions sum to their difference within ${Math.abs(data.convergence_delta).toExponential(1)}`;
  }
  return `${line}.`;
}

// The tokens as spans, each shaded and labelled with its attribution (its title and its accessible name).
export function fillExplainTokens(container, data) {
  container.innerHTML = "";
  const largest = Math.max(0, ...data.attributions.map(Math.abs));
  data.tokens.forEach((token, k) => {
    const span = document.createElement("span");
    const value = data.attributions[k];
    span.className = "explain-token";
    span.textContent = token;
    span.dataset.attribution = String(value);
    span.style.background = shade(value, largest);
    if (largest > 0 && Math.abs(value) / largest > 0.6) span.style.color = "#fff";
    span.title = `${token}: ${value >= 0 ? "+" : ""}${value.toFixed(4)}`;
    span.setAttribute("aria-label", span.title);
    container.append(span, " ");
  });
}
