// The part of #/jobs/12 a model job (POST /jobs/model) adds: the model, the estimated end-to-end
// latency curve (Σ weight × best of its tasks, as the worker wrote it) and the task scheduler's
// allocation of trials, a bar per task. Built once, updated on every poll of the job.

import { Chart, latencyCurve } from "../chart.js";
import { fmt, fmtCost, fmtSpeedup, h, replace } from "../dom.js";

export function modelSection(ctx) {
  const facts = h("dl", { class: "facts" });
  const chart = new Chart("Estimated end-to-end latency against trials");
  ctx.onClose(() => chart.close());
  const note = h("p", { class: "muted" },
    "The estimate is the sum over the tasks of weight × best kernel latency: kernel timings added up, not a timing of ",
    "the whole model (tunefarm model run times that).");
  const bars = h("tbody");
  const allocation = h("div", { class: "table-wrap" },
    h("table", { "aria-label": "Allocation of trials per task", class: "allocation" },
      h("caption", {}, "Trials the task scheduler gave each task (its gradient rule weighs each task by how often the model runs it)."),
      h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "Task"), h("th", { scope: "col", class: "num" }, "Weight"),
        h("th", { scope: "col", class: "num" }, "Trials"), h("th", { scope: "col" }, "Share of the trials"))),
      bars));
  const el = h("section", { "aria-labelledby": "model-h" },
    h("h2", { id: "model-h" }, "Model"), facts,
    h("div", { class: "charts" }, chart.el), note,
    h("h3", {}, "Allocation"), allocation);
  let drawn = null;

  function update(job) {
    const m = job.model;
    const inputs = Object.entries(m.input_shapes).map(([k, v]) => `${k}: ${v.join("×")}`).join(", ");
    replace(facts, [
      ["Model", m.file_name ? `${m.name} (${m.file_name})` : m.name], ["File", `${fmtBytes(m.bytes)}, sha256 ${m.sha256.slice(0, 12)}…`],
      ["Nodes · kernels per run", `${m.nodes} · ${m.kernels}`], ["Unique workloads (tasks)", String(job.tasks.length)],
      ["Inputs", inputs || "—"], ["Estimated latency", fmtCost(m.estimated_seconds)],
      ["Default schedules", fmtCost(m.default_seconds)], ["Speed-up (estimated)", fmtSpeedup(m.speedup)],
    ].map(([k, v]) => h("div", {}, h("dt", {}, k), h("dd", {}, v))));
    const key = JSON.stringify([m.curve.length, m.default_seconds]);
    if (key !== drawn) {
      drawn = key;
      const last = m.curve.length ? m.curve[m.curve.length - 1] : null;
      // the speed-up is against the default schedules' latency as measured beside it (the first
      // point of the curve comes from other timings, so a ratio to it mixes runs)
      const summary = last
        ? `${last.final ? "Final (re-measured)" : "Now"}: ${fmtCost(last.seconds)} after ${last.trials} trials` +
          (m.default_seconds ? `; default schedules ${fmtCost(m.default_seconds)} (${fmtSpeedup(m.default_seconds / last.seconds)})` : "") + "."
        : job.state === "queued" ? "Waiting for a worker." : "No estimate yet: every task needs a valid time first.";
      chart.set({ ...latencyCurve(m.curve, m.default_seconds), summary });
    }
    const most = Math.max(1, ...m.allocation.map((a) => a.trials));
    replace(bars, m.allocation.map((a) => h("tr", {},
      h("td", {}, `${a.position}: ${a.workload}`), h("td", { class: "num" }, fmt(a.weight, 0)),
      h("td", { class: "num" }, String(a.trials)),
      h("td", {}, h("div", { class: "bar", role: "img", "aria-label": `${a.share === null ? 0 : fmt(100 * a.share, 0)} % of the trials` },
        h("span", { style: `width: ${(100 * a.trials) / most}%` }),
        h("em", {}, a.share === null ? "—" : `${fmt(100 * a.share, 0)} %`))))));
  }

  return { el, update };
}

function fmtBytes(n) {
  if (n >= 1e6) return `${fmt(n / 1e6, 1)} MB`;
  if (n >= 1e3) return `${fmt(n / 1e3, 1)} kB`;
  return `${n} bytes`;
}
