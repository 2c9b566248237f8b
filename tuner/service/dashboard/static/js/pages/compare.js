// #/compare?ids=3,4: the convergence curves of several jobs overlaid (e.g. two strategies on one
// workload), against trials and against time, with a table of where each ended. Jobs still
// running are followed every 3 s (new measurements only).

import { api } from "../api.js";
import { Chart, jobCurves, overlay } from "../chart.js";
import { badge, field, h } from "../dom.js";
import { dataTable } from "../table.js";
import { bestGflops, jobName, speedup } from "./jobs.js";

export const title = "Compare jobs";

const MAX_JOBS = 8;
const PAGE = 5000;

export async function render(main, { params }, ctx) {
  const ids = [...new Set((params.get("ids") || "").split(/[\s,]+/).map(Number).filter((n) => Number.isInteger(n) && n > 0))].slice(0, MAX_JOBS);
  const input = h("input", { name: "ids", value: ids.join(", "), placeholder: "3, 4", autocomplete: "off", inputmode: "numeric" });
  const form = h("form", {
    class: "grid panel", "aria-label": "Jobs to compare",
    onsubmit: (ev) => {
      ev.preventDefault();
      const list = input.value.split(/[\s,]+/).filter(Boolean).join(",");
      window.location.hash = `#/compare?ids=${list}`;
    },
  }, field("Job ids", input, "two or more, separated by commas"), h("div", { class: "actions" }, h("button", { type: "submit" }, "Compare")));
  main.append(h("h1", {}, "Compare jobs"), form);
  if (ids.length < 1) {
    main.append(h("p", { class: "muted" }, "Give two or more job ids, or tick jobs in the ", h("a", { href: "#/jobs" }, "jobs table"), "."));
    return;
  }
  const byTrials = new Chart("Best GFLOPS against trials");
  const byTime = new Chart("Best GFLOPS against time");
  ctx.onClose(() => { byTrials.close(); byTime.close(); });
  const table = dataTable(columns(), [], { label: "Compared jobs", key: (s) => s.job.id, href: (s) => `#/jobs/${s.job.id}` });
  const body = h("div", {}, h("div", { class: "charts" }, byTrials.el, byTime.el), h("h2", {}, "Jobs"), table.el);
  main.append(body);

  const state = ids.map((id) => ({ id, job: null, measurements: [], after: null }));

  async function refresh() {
    await Promise.all(state.map(async (s) => {
      if (s.job && ["done", "failed", "cancelled"].includes(s.job.state) && s.final) return;
      s.final = s.job && ["done", "failed", "cancelled"].includes(s.job.state);
      s.job = await api(`/jobs/${s.id}`, { signal: ctx.signal });
      for (;;) {
        const page = await api(`/jobs/${s.id}/measurements`, { params: { after: s.after, limit: PAGE }, signal: ctx.signal });
        s.measurements.push(...page.items);
        s.after = page.next_after;
        if (page.items.length < PAGE) break;
      }
    }));
    const curves = state.flatMap((s) => jobCurves(`job ${s.id} (${s.job.strategy})`, s.measurements, s.job.tasks));
    byTrials.set({ ...overlay(curves, "trials"), summary: summary(state) });
    byTime.set({ ...overlay(curves, "time"), summary: "" });
    table.update(state.map((s) => ({ ...s, trialsTo90: trialsTo(s, 0.9) })));
  }

  try {
    await refresh();
  } catch (e) {
    ctx.fail(body, e);
    return;
  }
  ctx.every(3000, async () => {
    if (state.every((s) => s.final)) return;
    await refresh();
  });
}

/** Trials the job needed to reach `frac` of its final best (its first task). */
function trialsTo(s, frac) {
  const [curve] = jobCurves("", s.measurements, s.job.tasks, 1);
  if (!curve || !curve.best.length) return null;
  const final = curve.best[curve.best.length - 1];
  if (!final) return null;
  const i = curve.best.findIndex((v) => v !== null && v >= frac * final);
  return i < 0 ? null : i + 1;
}

function summary(state) {
  const parts = state.map((s) => `job ${s.id}: ${bestGflops(s.job) === "—" ? "no valid measurement" : `${bestGflops(s.job)} GFLOPS`}`);
  return `${parts.join("; ")}.`;
}

function columns() {
  return [
    { label: "Job", num: true, render: (s) => String(s.job.id) },
    { label: "Name", cls: "wrap", render: (s) => jobName(s.job) },
    { label: "State", render: (s) => badge(s.job.state) },
    { label: "Space · strategy", render: (s) => `${s.job.space} · ${s.job.strategy}` },
    { label: "Trials", num: true, render: (s) => `${s.job.trials_done}/${s.job.trials}` },
    { label: "Best GFLOPS", num: true, render: (s) => bestGflops(s.job) },
    { label: "Speed-up", num: true, render: (s) => speedup(s.job) },
    { label: "Trials to 90 % of its best", num: true, render: (s) => (s.trialsTo90 === null ? "—" : String(s.trialsTo90)) },
  ];
}
