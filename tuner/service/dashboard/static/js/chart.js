// Convergence charts on uPlot (vendored, global `uPlot`): best GFLOPS so far against trials or
// time, every measured candidate as a point, failed measurements as marks below the zero line,
// coloured by error code. Data arrive incrementally; a chart is rebuilt only when its series
// change (a new task or error code appears), otherwise uPlot just gets the longer arrays.

import { errorName, fmt, fmtGflops, h } from "./dom.js";

export const COLORS = ["#1d4ed8", "#c2410c", "#047857", "#7c3aed", "#b91c1c", "#0e7490", "#a16207", "#be185d"];
const ERROR_COLORS = { 1: "#6b7280", 2: "#dc2626", 3: "#d97706", 4: "#9333ea", 5: "#db2777", 6: "#ea580c", 7: "#0891b2" };
const MAX_TASK_SERIES = 8;       // more tasks than this: their points share one series, no lines
const AXIS = { stroke: "#374151", grid: { stroke: "#e5e7eb", width: 1 }, ticks: { stroke: "#d1d5db", width: 1 } };

function noPath() {
  return null;
}

/** A figure with a caption, a plot area and a one-line text summary; call set(spec) with data. */
export class Chart {
  constructor(caption, { height = 260 } = {}) {
    this.plot = h("div", { class: "plot" });
    this.summary = h("p", { class: "muted chart-summary" });
    this.el = h("figure", { class: "chart" }, h("figcaption", {}, caption), this.plot, this.summary);
    this.height = height;
    this.u = null;
    this.signature = null;
    this.observer = new ResizeObserver(() => this.resize());
    this.observer.observe(this.plot);
  }

  width() {
    return Math.max(240, Math.floor(this.plot.clientWidth || this.el.clientWidth || 600));
  }

  resize() {
    if (!this.u) return;
    const w = this.width();
    if (Math.abs(w - this.u.width) > 2) this.u.setSize({ width: w, height: this.heightFor(w) });
  }

  heightFor(w) {
    return w < 480 ? Math.round(this.height * 0.85) : this.height;
  }

  /** spec: {xLabel, series: [uPlot series options], data: [xs, ...ys], summary}; optional yLabel,
   * yFormat(v) and yRange(u, min, max) for a y axis other than GFLOPS (with its error band) */
  set(spec) {
    this.summary.textContent = spec.summary || "";
    if (typeof window.uPlot !== "function") {
      this.plot.textContent = "The chart library did not load.";
      return;
    }
    const signature = JSON.stringify([spec.xLabel, spec.series.map((s) => s.label)]);
    if (this.u && signature === this.signature) {
      this.u.setData(spec.data);
      return;
    }
    this.destroy();
    this.signature = signature;
    const w = this.width();
    const opts = {
      width: w,
      height: this.heightFor(w),
      // x from 0 (time: the wait in the queue shows) or from trial 1, to the last point
      scales: { x: { time: false, range: (u, min, max) => [spec.xMin, Math.max(max ?? spec.xMin + 1, spec.xMin + 1)] }, y: { range: spec.yRange || yRange } },
      axes: [
        { ...AXIS, label: spec.xLabel, labelSize: 22, ...(spec.xIncrs ? { incrs: spec.xIncrs } : {}) },
        { ...AXIS, label: spec.yLabel || "GFLOPS", labelSize: 22, size: spec.yLabel ? 70 : 50,
          values: (u, splits) => splits.map((v) => (v < 0 ? "" : (spec.yFormat || fmtGflops)(v))) },
      ],
      series: [{ label: spec.xLabel, value: (u, v) => (v === null || v === undefined ? "—" : spec.xFormat ? spec.xFormat(v) : String(v)) },
        ...spec.series],
      cursor: { drag: { x: true, y: false } },
      legend: { live: true },
    };
    this.u = new window.uPlot(opts, spec.data, this.plot);
  }

  destroy() {
    if (this.u) this.u.destroy();
    this.u = null;
    this.plot.replaceChildren();
  }

  close() {
    this.observer.disconnect();
    this.destroy();
  }
}

// The y range always starts below zero: the band under the zero line holds the error marks.
function yRange(u, min, max) {
  const top = max > 0 ? max * 1.08 : 1;
  return [-top * 0.07, top];
}

function bestLine(label, color) {
  return { label, stroke: color, width: 2, spanGaps: true, paths: window.uPlot ? window.uPlot.paths.stepped({ align: 1 }) : undefined,
    points: { show: false }, value: (u, v) => (v === null || v === undefined ? "—" : `${fmtGflops(v)} GFLOPS`) };
}

function pointsOf(label, color, size = 5) {
  return { label, stroke: color, width: 0, paths: noPath, points: { show: true, size, width: 1, stroke: color, fill: `${color}66` },
    value: (u, v) => (v === null || v === undefined ? "—" : `${fmtGflops(v)} GFLOPS`) };
}

function baselineLine(label, color) {
  return { label, stroke: color, width: 1.5, dash: [6, 5], points: { show: false },
    value: (u, v) => (v === null || v === undefined ? "—" : `${fmtGflops(v)} GFLOPS`) };
}

function errorMarks(code) {
  const color = ERROR_COLORS[code] || "#111827";
  return { label: `error: ${errorName(code)}`, stroke: color, width: 0, paths: noPath,
    points: { show: true, size: 7, width: 1, stroke: color, fill: color }, value: (u, v) => (v === null || v === undefined ? "—" : "failed") };
}

/**
 * A job's convergence: measurements (oldest first, as /jobs/{id}/measurements gives them) and its
 * tasks. x: "trials" (search measurements, 1..n; baselines are not trials) or "time" (seconds since
 * submission). Returns a Chart spec.
 */
export function jobConvergence(measurements, tasks, x) {
  const shown = tasks.filter((t) => t.position < MAX_TASK_SERIES);
  const many = tasks.length > MAX_TASK_SERIES;
  const name = (t) => (tasks.length > 1 ? ` · ${t.position}: ${t.workload.name}` : "");
  const xs = [];
  const best = new Map(shown.map((t) => [t.position, []]));
  const points = new Map(shown.map((t) => [t.position, []]));
  const others = [];                               // points of tasks past MAX_TASK_SERIES
  const errors = new Map();                        // code -> array
  const running = new Map();
  const baseline = new Map();
  let maxG = 0;
  let lastX = 0;
  for (const m of measurements) {
    if (m.kind === "default") {
      if (m.gflops !== null) baseline.set(m.position, Math.max(baseline.get(m.position) || 0, m.gflops));
      continue;
    }
    const i = xs.length;
    // x strictly increasing: uPlot finds the visible points by binary search, which equal x values
    // (a batch is stored at one instant) would cut short
    lastX = x === "trials" ? i + 1 : Math.max(lastX + 1e-6, m.seconds);
    xs.push(lastX);
    const ok = m.error_code === 0 && m.gflops !== null;
    const failed = m.error_code !== 0;
    if (ok) {
      running.set(m.position, Math.max(running.get(m.position) || 0, m.gflops));
      maxG = Math.max(maxG, m.gflops);
    } else if (failed && !errors.has(m.error_code)) {
      errors.set(m.error_code, new Array(i).fill(null));
    }
    for (const [pos, arr] of best) arr.push(running.has(pos) ? running.get(pos) : null);
    for (const [pos, arr] of points) arr.push(ok && m.position === pos ? m.gflops : null);
    if (many) others.push(ok && !best.has(m.position) ? m.gflops : null);
    for (const [code, arr] of errors) arr.push(failed && m.error_code === code ? "E" : null);
  }
  for (const v of baseline.values()) maxG = Math.max(maxG, v);
  const floor = -(maxG > 0 ? maxG * 1.08 : 1) * 0.035;      // the error band's middle
  const series = [];
  const data = [xs];
  shown.forEach((t, k) => {
    const color = COLORS[k % COLORS.length];
    series.push(bestLine(`best${name(t)}`, color));
    data.push(best.get(t.position));
    series.push(pointsOf(`measured${name(t)}`, color));
    data.push(points.get(t.position));
    if (baseline.has(t.position) && shown.length <= 3) {
      series.push(baselineLine(`default schedule${name(t)}`, color));
      data.push(xs.map(() => baseline.get(t.position)));
    }
  });
  if (many) {
    series.push(pointsOf(`measured · tasks ${MAX_TASK_SERIES}+`, "#4b5563", 4));
    data.push(others);
  }
  for (const code of [...errors.keys()].sort((a, b) => a - b)) {
    series.push(errorMarks(code));
    data.push(errors.get(code).map((v) => (v === null ? null : floor)));
  }
  return { ...xAxis(x), series, data };
}

const TRIAL_STEPS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000];

function xAxis(x) {
  return x === "trials"
    ? { xLabel: "trials", xMin: 1, xIncrs: TRIAL_STEPS, xFormat: (v) => `trial ${v}` }
    : { xLabel: "seconds since submission", xMin: 0, xIncrs: undefined, xFormat: (v) => `${v.toFixed(1)} s` };
}

/** The running best GFLOPS of a job's first `maxTasks` tasks, one curve each, against the job's
 * trials and times (for overlaying several jobs). */
export function jobCurves(label, measurements, tasks, maxTasks = 3) {
  const curves = [];
  for (const t of tasks.slice(0, maxTasks)) {
    curves.push({ label: tasks.length > 1 ? `${label} · ${t.workload.name}` : label, position: t.position, trials: [], times: [], best: [] });
  }
  let n = 0;
  const running = new Map();
  for (const m of measurements) {
    if (m.kind === "default") continue;
    n += 1;
    if (m.error_code === 0 && m.gflops !== null) running.set(m.position, Math.max(running.get(m.position) || 0, m.gflops));
    for (const c of curves) {
      c.trials.push(n);
      c.times.push(m.seconds);
      c.best.push(running.has(c.position) ? running.get(c.position) : null);
    }
  }
  return curves;
}

/** Overlay curves (from jobCurves) on one x axis: "trials" or "time". */
export function overlay(curves, x) {
  const key = x === "trials" ? "trials" : "times";
  const all = new Set();
  for (const c of curves) for (const v of c[key]) all.add(v);
  const xs = [...all].sort((a, b) => a - b);
  const data = [xs];
  const series = [];
  curves.forEach((c, k) => {
    const arr = new Array(xs.length).fill(null);
    let j = -1;
    const cx = c[key];
    const last = cx.length ? cx[cx.length - 1] : -Infinity;
    for (let i = 0; i < xs.length; i++) {
      while (j + 1 < cx.length && cx[j + 1] <= xs[i]) j += 1;
      arr[i] = j >= 0 && xs[i] <= last ? c.best[j] : null;
    }
    data.push(arr);
    series.push(bestLine(c.label, COLORS[k % COLORS.length]));
  });
  return { ...xAxis(x), series, data };
}

/**
 * A model job's estimated end-to-end latency (Σ weight × best of its tasks) against the job's
 * trials: `curve` as GET /jobs/{id} gives it (model.curve), `defaultSeconds` the same sum over the
 * default schedules (a dashed line). The y axis from zero, in ms (µs below a millisecond).
 */
export function latencyCurve(curve, defaultSeconds) {
  const top = Math.max(0, ...curve.map((p) => p.seconds), defaultSeconds || 0);
  const [scale, unit] = top > 0 && top < 1e-3 ? [1e6, "µs"] : [1e3, "ms"];
  const xs = [];
  const ys = [];
  const finals = [];
  let lastX = -1;
  for (const p of curve) {
    lastX = Math.max(lastX + 1e-6, p.trials);      // strictly increasing, as uPlot's search needs
    xs.push(lastX);
    ys.push(p.seconds * scale);
    finals.push(p.final ? p.seconds * scale : null);
  }
  const fmtY = (v) => (v === null || v === undefined ? "—" : `${v >= 10 ? fmt(v, 1) : v >= 1 ? fmt(v, 2) : fmt(v, 3)} ${unit}`);
  const color = COLORS[0];
  const series = [
    { label: "estimated latency", stroke: color, width: 2, spanGaps: true,
      paths: window.uPlot ? window.uPlot.paths.stepped({ align: 1 }) : undefined,
      points: { show: true, size: 5, stroke: color, fill: `${color}66` }, value: (u, v) => fmtY(v) },
    { label: "final (re-measured)", stroke: COLORS[2], width: 0, paths: noPath,
      points: { show: true, size: 9, width: 2, stroke: COLORS[2], fill: "#ffffff" }, value: (u, v) => fmtY(v) },
  ];
  const data = [xs, ys, finals];
  if (defaultSeconds) {
    series.push({ label: "default schedules", stroke: COLORS[1], width: 1.5, dash: [6, 5], points: { show: false },
      value: (u, v) => fmtY(v) });
    data.push(xs.map(() => defaultSeconds * scale));
  }
  return { xLabel: "trials", xMin: 0, xIncrs: TRIAL_STEPS, xFormat: (v) => `trial ${Math.round(v)}`,
    yLabel: `${unit} (estimated)`, yFormat: fmtY, yRange: () => [0, top > 0 ? top * scale * 1.1 : 1], series, data };
}
