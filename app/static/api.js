// Talking to the service: JSON in and out, the key from the page's API key box, errors in words.

const $ = (id) => document.getElementById(id);

function headers() {
  const h = {"Content-Type": "application/json"};
  const key = $("api-key").value.trim();
  if (key) h.Authorization = `Bearer ${key}`;
  return h;
}

// The model every call asks for (the header's picker), or null for the service's default.
let model = null;

export function useModel(name) { model = name || null; }

// `path` and `body` with the picked model: `model` in a POST body (unless it names one), `?model=` on a GET.
function withModel(path, body) {
  if (!model || path.startsWith("/v1/models")) return [path, body];
  if (body === undefined) {
    const url = new URL(path, location.href);
    if (!url.searchParams.has("model")) url.searchParams.set("model", model);
    return [url.pathname + url.search, body];
  }
  return [path, "model" in body ? body : {...body, model}];
}

// GET `path` (no body) or POST `body` as JSON, for the picked model; resolves to the JSON answer, or
// throws an Error whose message says in words what went wrong.
export async function api(path, body) {
  [path, body] = withModel(path, body);
  let response;
  try {
    response = await fetch(path, body === undefined ? {headers: headers()} : {method: "POST", headers: headers(), body: JSON.stringify(body)});
  } catch (error) {
    throw new Error(`The service could not be reached (${error.message}). Is it still running?`);
  }
  let data = null;
  try { data = await response.json(); } catch (error) { /* reported below */ }
  if (!response.ok) throw new Error(describeError(response, data));
  if (data === null) throw new Error(`The service answered ${response.status} without a JSON body.`);
  return data;
}

export function describeError(response, data) {
  const error = (data && data.error) || {};
  const message = error.message || `HTTP ${response.status}`;
  switch (response.status) {
    case 401:
      $("key-box").open = true;
      return `This service needs an API key: enter it under “API key” and try again. (${message})`;
    case 413: return `That request is too large for the service: ${message}.`;
    case 422: return `The service did not accept the request: ${message}.`;
    case 429: return `The service is busy; try again in ${response.headers.get("Retry-After") || "a few"} seconds.`;
    case 503: return `The model is not ready yet: ${message}. Try again in a moment.`;
    default: return `The service answered ${response.status}: ${message}.`;
  }
}
