// #/jobs?state=&workload=: the job table (newest first, server-paged, refreshed every 3 s),
// the submit form, cancel and resume, and picking jobs to compare.

import { api } from "../api.js";
import { badge, errorBox, field, fmt, fmtDuration, fmtGflops, fmtSpeedup, h, jobTiming, replace, select, workloadText } from "../dom.js";
import { dataTable, Pager } from "../table.js";
import { jobActions, submitForm } from "./submit.js";

export const title = "Jobs";

const STATES = [["", "any state"], "queued", "running", "done", "failed", "cancelled"];
const PAGE = 25;

export async function render(main, { params }, ctx) {
  const state = params.get("state") || "";
  const workload = params.get("workload") || "";
  const selected = new Set();
  const status = h("div", { "aria-live": "polite" });
  const compareButton = h("button", { type: "button", class: "secondary", disabled: true,
    onclick: () => { window.location.hash = `#/compare?ids=${[...selected].join(",")}`; } }, "Compare selected");

  const table = dataTable(columns(selected, () => {
    compareButton.disabled = selected.size < 2;
    compareButton.textContent = selected.size ? `Compare selected (${selected.size})` : "Compare selected";
  }, status, () => load()), [], {
    label: "Jobs, newest first", key: (j) => j.id, href: (j) => `#/jobs/${j.id}`,
    caption: "Rows open the job (Enter or click); the arrow keys move between rows.", empty: "No jobs yet: submit one above.",
  });
  const pager = new Pager(() => load());
  const body = h("div", {}, table.el);

  async function load() {
    try {
      const page = await api("/jobs", { params: { state, workload, before: pager.cursor, limit: PAGE }, signal: ctx.signal });
      table.update(page.items);
      pager.arrived(page.next_before, page.items.length);
      if (body.firstChild !== table.el) replace(body, table.el);
      return page;
    } catch (e) {
      ctx.fail(body, e);
      return null;
    }
  }

  const stateSelect = select("state", STATES, state);
  const workloadInput = h("input", { name: "workload", value: workload, placeholder: "matmul or a workload key", autocomplete: "off" });
  const filters = h("form", {
    class: "grid panel", role: "search", "aria-label": "Filter jobs",
    onsubmit: (ev) => {
      ev.preventDefault();
      const q = new URLSearchParams();
      if (stateSelect.value) q.set("state", stateSelect.value);
      if (workloadInput.value.trim()) q.set("workload", workloadInput.value.trim());
      window.location.hash = `#/jobs${q.toString() ? `?${q}` : ""}`;
    },
  }, field("State", stateSelect), field("Workload", workloadInput), h("div", { class: "actions" }, h("button", { type: "submit" }, "Filter")));

  const details = h("details", { class: "panel" }, h("summary", {}, h("strong", {}, "Submit a job")), submitForm(ctx));
  main.append(h("h1", {}, "Jobs"), details, filters, status, h("div", { class: "actions" }, compareButton), body, pager.el);
  const first = await load();
  if (first && first.items.length === 0 && !state && !workload && pager.cursor === null) details.open = true;
  ctx.every(3000, load);
}

function columns(selected, onSelect, status, reload) {
  return [
    {
      label: h("span", { class: "visually-hidden" }, "Compare"),
      render: (j) => {
        const box = h("input", { type: "checkbox", name: "compare", value: String(j.id), checked: selected.has(j.id),
          onchange: (ev) => {
            if (ev.target.checked) selected.add(j.id);
            else selected.delete(j.id);
            onSelect();
          } });
        return h("label", {}, box, h("span", { class: "visually-hidden" }, `Compare job ${j.id}`));
      },
    },
    { label: "ID", num: true, render: (j) => String(j.id) },
    { label: "Name", cls: "wrap", render: (j) => jobName(j) },
    { label: "State", render: (j) => badge(j.state) },
    {
      label: "Progress",
      render: (j) => h("span", {}, h("progress", { max: String(Math.max(1, j.trials)), value: String(Math.min(j.trials_done, j.trials)),
        "aria-label": `job ${j.id}: ${j.trials_done} of ${j.trials} trials` }), ` ${j.trials_done}/${j.trials}`),
    },
    { label: "Best GFLOPS", num: true, render: (j) => bestGflops(j) },
    { label: "Speed-up", num: true, render: (j) => speedup(j) },
    { label: "Errors", num: true, render: (j) => (j.errors === null || j.errors === undefined ? "—" : String(j.errors)) },
    { label: "Elapsed", num: true, render: (j) => fmtDuration(jobTiming(j).elapsed) },
    { label: "ETA", num: true, render: (j) => (j.state === "running" ? fmtDuration(jobTiming(j).eta) : j.state === "done" ? "done" : "—") },
    { label: "Actions", render: (j) => jobActions(j, (msg) => replace(status, msg ? errorBox(msg) : ""), reload) },
  ];
}

export function jobName(j) {
  const first = j.tasks[0];
  const what = first ? workloadText(first.workload) + (j.tasks.length > 1 ? ` + ${j.tasks.length - 1} more` : "") : "";
  return j.name ? h("span", {}, h("strong", {}, j.name), h("br"), h("span", { class: "muted" }, what)) : what;
}

/** One task: its best GFLOPS; several: the range over tasks. */
export function bestGflops(j) {
  const values = j.tasks.map((t) => t.best_gflops).filter((v) => v !== null && v !== undefined);
  if (!values.length) return "—";
  if (j.tasks.length === 1) return fmtGflops(values[0]);
  return `${fmtGflops(Math.min(...values))}–${fmtGflops(Math.max(...values))}`;
}

/** One task: its speed-up over the default schedule; several: their geometric mean. */
export function speedup(j) {
  const values = j.tasks.map((t) => t.speedup).filter((v) => v !== null && v !== undefined && v > 0);
  if (!values.length) return "—";
  if (values.length === 1) return fmtSpeedup(values[0]);
  const geo = Math.exp(values.reduce((a, v) => a + Math.log(v), 0) / values.length);
  return h("span", { title: "geometric mean over the tasks" }, `${fmt(geo, 2)}× (geo-mean)`);
}
