// Small DOM and formatting helpers. Everything the API returns is put in the page as text
// (textContent, never innerHTML): a workload name or an error message cannot become markup.

/** h("div", {class: "x", onclick: f}, child, "text", [more]) */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else if (k === "text") el.textContent = v;
    else if (k === "value") el.value = v;
    else if (k in el && typeof v !== "string") el[k] = v;
    else el.setAttribute(k, v === true ? "" : v);
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

let uid = 0;
export function newId(prefix) {
  uid += 1;
  return `${prefix}-${uid}`;
}

/** A labelled form control: {label, control, hint}. The label's `for` points at the control. */
export function field(labelText, control, hint = null, cls = "") {
  if (!control.id) control.id = newId("f");
  const parts = [h("label", { for: control.id }, labelText), control];
  if (hint) {
    const hid = newId("hint");
    control.setAttribute("aria-describedby", hid);
    parts.push(h("span", { class: "hint", id: hid }, hint));
  }
  return h("div", { class: `field ${cls}`.trim() }, parts);
}

export function select(name, options, value) {
  const s = h("select", { name });
  for (const opt of options) {
    const [v, label] = Array.isArray(opt) ? opt : [opt, opt];
    const o = h("option", { value: v }, label);
    if (String(v) === String(value ?? "")) o.selected = true;
    s.append(o);
  }
  return s;
}

export function badge(state) {
  return h("span", { class: `badge state-${state}` }, state);
}

export const ERROR_NAMES = {
  0: "NO_ERROR", 1: "INSTANTIATION_ERROR", 2: "COMPILE_ERROR", 3: "BUILD_TIMEOUT", 4: "RUNTIME_ERROR",
  5: "WRONG_ANSWER", 6: "RUN_TIMEOUT", 7: "RUNNER_ERROR", 8: "UNSUPPORTED_TARGET",
};

export function errorName(code) {
  return ERROR_NAMES[code] || `error ${code}`;
}

export function fmt(x, digits = 1) {
  if (x === null || x === undefined || Number.isNaN(x)) return "—";
  return Number(x).toLocaleString("en-US", { minimumFractionDigits: digits, maximumFractionDigits: digits });
}

export function fmtGflops(x) {
  if (x === null || x === undefined) return "—";
  return x >= 100 ? fmt(x, 0) : x >= 10 ? fmt(x, 1) : fmt(x, 2);
}

export function fmtSpeedup(x) {
  return x === null || x === undefined ? "—" : `${fmt(x, 2)}×`;
}

/** Seconds as "850 µs", "3.2 ms", "1.5 s" (kernel times). */
export function fmtCost(s) {
  if (s === null || s === undefined) return "—";
  if (s < 1e-3) return `${fmt(s * 1e6, 1)} µs`;
  if (s < 1) return `${fmt(s * 1e3, 2)} ms`;
  return `${fmt(s, 2)} s`;
}

/** Seconds as "42 s", "3 min 5 s", "2 h 10 min" (elapsed times). */
export function fmtDuration(s) {
  if (s === null || s === undefined || !Number.isFinite(s)) return "—";
  s = Math.max(0, Math.round(s));
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
}

export function fmtTime(iso) {
  if (!iso) return "—";
  const d = new Date(iso);
  return d.toLocaleString("en-GB", { year: "numeric", month: "2-digit", day: "2-digit", hour: "2-digit", minute: "2-digit", second: "2-digit" });
}

/** A target string with its -mattr list (often 40+ features, one long word) shortened to a count. */
export function shortTarget(target) {
  return String(target || "").replace(/-mattr=(\S+)/, (_, list) => `-mattr=(${list.split(",").length} features)`);
}

/** A target in a table cell: the short form, the whole string as its tooltip. */
export function targetCell(target) {
  return h("span", { class: "ellipsis", title: target }, shortTarget(target));
}

/** A target where there is room: the short form, expandable to the whole string. */
export function targetDetails(target) {
  const short = shortTarget(target);
  if (short === target) return h("code", { class: "target" }, target);
  return h("details", { class: "target" }, h("summary", {}, short), h("code", {}, target));
}

export function fmtParams(params) {
  return Object.entries(params || {}).map(([k, v]) => `${k}=${Array.isArray(v) ? v.join("×") : v}`).join(", ");
}

export function workloadText(w) {
  const p = fmtParams(w.params);
  return p ? `${w.name} (${p})` : w.name;
}

/** Elapsed seconds, trials per second and ETA of a job (running jobs extrapolate). */
export function jobTiming(job, now = Date.now()) {
  const start = job.started_at ? Date.parse(job.started_at) : null;
  const end = job.finished_at ? Date.parse(job.finished_at) : job.state === "running" ? now : job.updated_at ? Date.parse(job.updated_at) : null;
  const elapsed = start !== null && end !== null ? Math.max(0, (end - start) / 1000) : null;
  const rate = elapsed && job.trials_done ? job.trials_done / elapsed : null;
  const left = Math.max(0, job.trials - job.trials_done);
  const eta = job.state === "running" && rate ? left / rate : null;
  return { elapsed, rate, eta };
}

/** JSON indented, with arrays of plain values kept on one line ("tile_i": [30, 6]). */
export function prettyJSON(value) {
  return JSON.stringify(value, null, 2).replace(/\[\s*([^\[\]{}]*?)\s*\]/g,
    (_, inner) => `[${inner.replace(/\s*\n\s*/g, " ")}]`);       // JSON strings hold no raw newline: only layout goes
}

/** Replace the children of `el`. */
export function replace(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

/** A message box for an error, with role=alert so screen readers announce it. */
export function errorBox(err) {
  const msg = err && err.message ? err.message : String(err);
  const field = err && err.field ? ` (field: ${err.field})` : "";
  return h("p", { class: "error", role: "alert" }, msg + field);
}
