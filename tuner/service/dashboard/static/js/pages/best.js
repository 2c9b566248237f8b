// #/best?target=: the best schedule of every task (workload × target × device key), a server
// page at a time: GFLOPS, speed-up over the default schedule, its loop IR, and an export of the
// task's records as JSON lines.

import { api, API, download, query, token } from "../api.js";
import { field, fmtCost, fmtGflops, fmtSpeedup, h, replace, shortTarget, targetCell, workloadText } from "../dom.js";
import { dataTable, Pager } from "../table.js";

export const title = "Best schedules";

const PAGE = 50;

export async function render(main, { params }, ctx) {
  const target = params.get("target") || "";
  const input = h("input", { name: "target", value: target, list: "tf-best-targets", autocomplete: "off", placeholder: "any" });
  const targets = h("datalist", { id: "tf-best-targets" });
  const form = h("form", {
    class: "grid panel", role: "search", "aria-label": "Filter best schedules",
    onsubmit: (ev) => {
      ev.preventDefault();
      const v = input.value.trim();
      window.location.hash = v ? `#/best?target=${encodeURIComponent(v)}` : "#/best";
    },
  }, targets, field("Target", input), h("div", { class: "actions" }, h("button", { type: "submit" }, "Apply")));

  const irPanel = h("section", { "aria-live": "polite" });
  const status = h("div");
  const table = dataTable(columns(irPanel, status, ctx), [], {
    label: "Best schedule per task", key: (t) => t.task_id, href: (t) => (t.record_id ? `#/records/${t.record_id}` : null),
    caption: "Best as apply-best ranks: the re-measured time first, else the measured median; a figure timed in a window its calibration found slow ranks after every other. A row opens its record; Loop IR shows the schedule lowered.", empty: "No tasks yet.",
  });
  const pager = new Pager(() => load());
  const body = h("div", {}, table.el);
  main.append(h("h1", {}, "Best schedules"), form, status, body, pager.el, irPanel);

  async function load() {
    try {
      const page = await api("/best/all", { params: { target, after: pager.cursor, limit: PAGE }, signal: ctx.signal });
      table.update(page.items);
      pager.arrived(page.next_after, page.items.length);
    } catch (e) {
      ctx.fail(body, e);
    }
  }

  await load();
  api("/targets", { params: { limit: 50 }, signal: ctx.signal })
    .then((t) => replace(targets, t.items.map((x) => h("option", { value: x.target }))))
    .catch(() => {});
}

function columns(irPanel, status, ctx) {
  return [
    { label: "Workload", render: (t) => workloadText(t.workload) },
    { label: "Target", cls: "hide-narrow", render: (t) => targetCell(t.target) },
    { label: "Device key", cls: "hide-narrow", render: (t) => t.device_key },
    { label: "GFLOPS", num: true, render: (t) => fmtGflops(t.gflops) },
    { label: "Speed-up", num: true, render: (t) => fmtSpeedup(t.speedup) },
    { label: "Time", num: true, cls: "hide-narrow", render: (t) => fmtCost(t.cost) },
    { label: "Default time", num: true, cls: "hide-narrow", render: (t) => fmtCost(t.baseline_cost) },
    {
      label: "Schedule",
      render: (t) => {
        if (!t.record_id) return "no valid record yet";
        const show = h("button", { type: "button", class: "secondary", "aria-label": `Loop IR of the best ${t.workload.name} on task ${t.task_id}`,
          onclick: () => showIR(t, irPanel, ctx) }, "Loop IR");
        return h("span", { class: "actions" }, show, exportLink(t, status));
      },
    },
  ];
}

async function showIR(t, panel, ctx) {
  const pre = h("pre", { tabindex: "0", class: "loop-ir" }, "Lowering…");
  const heading = h("h2", { id: "ir-heading", tabindex: "-1" }, `Loop IR: ${workloadText(t.workload)} · record ${t.record_id}`);
  replace(panel, heading, h("p", { class: "muted" }, `${shortTarget(t.target)} · ${t.device_key} · ${fmtGflops(t.gflops)} GFLOPS`), pre);
  heading.focus();
  try {
    const low = await api(`/records/${t.record_id}/ir`, { signal: ctx.signal });
    replace(pre, low.loop_ir !== null ? low.loop_ir : `Cannot be lowered: ${low.loop_ir_error}`);
  } catch (e) {
    if (e.name !== "AbortError") replace(pre, `Loop IR unavailable: ${e.message}`);
  }
}

/** A link to the task's records as JSON lines; with a token it downloads through fetch (a plain
 * link cannot send the Authorization header). */
function exportLink(t, status) {
  const params = { workload_key: t.workload.key, target: t.target };
  const name = `${t.workload.name}-${t.workload.key.slice(0, 8)}.jsonl`;
  return h("a", {
    class: "button secondary", href: `${API}/records/export${query(params)}`, download: name,
    "aria-label": `Export the records of ${t.workload.name} on task ${t.task_id}`,
    onclick: (ev) => {
      if (!token()) return;                  // a public server: the plain link works
      ev.preventDefault();
      download("/records/export", params, name).catch((e) => replace(status, h("p", { class: "error", role: "alert" }, e.message)));
    },
  }, "Export");
}
