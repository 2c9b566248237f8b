// The REST API under /api/v1 with the user's bearer token.
//
// `tunefarm serve` prints a URL with ?token=...: the token is taken from the address once, kept in
// sessionStorage (this tab only, gone when it closes) and removed from the address bar so it is
// not bookmarked, shared in a screenshot or sent as a Referer.

const TOKEN_KEY = "tunefarm.token";
export const API = "/api/v1";

/** Move a ?token= from the address into sessionStorage. */
export function adoptTokenFromUrl() {
  const url = new URL(window.location.href);
  const token = url.searchParams.get("token");
  if (token === null) return;
  if (token.trim()) sessionStorage.setItem(TOKEN_KEY, token.trim());
  url.searchParams.delete("token");
  history.replaceState(null, "", url.pathname + url.search + url.hash);
}

export function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

export function setToken(value) {
  const v = (value || "").trim();
  if (v) sessionStorage.setItem(TOKEN_KEY, v);
  else sessionStorage.removeItem(TOKEN_KEY);
  window.dispatchEvent(new Event("tunefarm:token"));
}

/** An error response: status, the API's `detail` (text), `field` and job `state`. */
export class ApiError extends Error {
  constructor(status, detail, field = null, state = null) {
    super(detail);
    this.status = status;
    this.field = field;
    this.state = state;
  }
}

function detailText(detail) {
  // request validation gives a list of issues (FastAPI's format); ours give text
  if (Array.isArray(detail)) {
    return detail.map((d) => `${(d.loc || []).filter((p) => p !== "body" && p !== "query").join(".") || "request"}: ${d.msg}`).join("; ");
  }
  return String(detail ?? "");
}

function fieldOf(body) {
  if (body && body.field) return body.field;
  if (body && Array.isArray(body.detail) && body.detail.length) {
    return (body.detail[0].loc || []).filter((p) => p !== "body" && p !== "query").join(".") || null;
  }
  return null;
}

/** Build "?a=1&b=2" from an object, leaving out null, undefined and "". */
export function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params || {})) {
    if (v !== null && v !== undefined && v !== "") q.set(k, String(v));
  }
  const s = q.toString();
  return s ? `?${s}` : "";
}

function headers(extra) {
  const h = { Accept: "application/json", ...(extra || {}) };
  const t = token();
  if (t) h.Authorization = `Bearer ${t}`;
  return h;
}

/** Call the API; resolves to the JSON body, rejects with ApiError (status 0: no answer). */
export async function api(path, { method = "GET", params = null, body = undefined, signal = undefined } = {}) {
  let res;
  try {
    res = await fetch(API + path + query(params), {
      method,
      signal,
      headers: headers(body === undefined ? {} : { "Content-Type": "application/json" }),
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (e) {
    if (e.name === "AbortError") throw e;
    throw new ApiError(0, `the server does not answer (${e.message})`);
  }
  let data = null;
  try {
    data = await res.json();
  } catch {
    data = null;
  }
  if (!res.ok) {
    throw new ApiError(res.status, detailText(data && data.detail) || `${res.status} ${res.statusText}`, fieldOf(data), data && data.state);
  }
  return data;
}

/** Download `path` (a streamed export) with the token, as a file named `filename`. */
export async function download(path, params, filename) {
  const res = await fetch(API + path + query(params), { headers: headers() });
  if (!res.ok) {
    let data = null;
    try { data = await res.json(); } catch { data = null; }
    throw new ApiError(res.status, detailText(data && data.detail) || res.statusText, fieldOf(data));
  }
  const blob = await res.blob();
  const url = URL.createObjectURL(blob);
  const a = document.createElement("a");
  a.href = url;
  a.download = filename;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}
