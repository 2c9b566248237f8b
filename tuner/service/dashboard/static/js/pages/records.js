// #/records?workload_key=&target=&device_key=&error_code=&job_id=&order=: measured records,
// one server page at a time (keyset cursors: newest first by `before`, oldest first by `after`,
// fastest first by the (cost, id) pair), never the whole table.

import { api } from "../api.js";
import { errorName, ERROR_NAMES, field, fmtCost, fmtTime, h, replace, select, targetCell, workloadText } from "../dom.js";
import { dataTable, Pager } from "../table.js";

export const title = "Records";

const PAGE = 50;
const FILTERS = ["workload_key", "target", "device_key", "error_code", "job_id"];

export async function render(main, { params }, ctx) {
  const f = Object.fromEntries(FILTERS.map((k) => [k, params.get(k) || ""]));
  let order = params.get("order") || "newest";
  let notice = null;
  if (!["newest", "oldest", "fastest"].includes(order) || (order === "fastest" && !f.workload_key)) {
    notice = order === "fastest" ? "Fastest first ranks the records of one workload: choose a workload key." : `Unknown order ${order}.`;
    order = "newest";
  }

  const go = (changes) => {
    const q = new URLSearchParams();
    const all = { ...f, order, ...changes };
    for (const [k, v] of Object.entries(all)) if (v && !(k === "order" && v === "newest")) q.set(k, v);
    window.location.hash = `#/records${q.toString() ? `?${q}` : ""}`;
  };

  const c = {
    workload_key: h("input", { name: "workload_key", value: f.workload_key, list: "tf-workloads", autocomplete: "off", placeholder: "any" }),
    target: h("input", { name: "target", value: f.target, list: "tf-targets", autocomplete: "off", placeholder: "any" }),
    device_key: h("input", { name: "device_key", value: f.device_key, autocomplete: "off", placeholder: "any" }),
    error_code: select("error_code", [["", "any"], ["0", "valid only"], ...Object.entries(ERROR_NAMES).filter(([k]) => k !== "0")], f.error_code),
    job_id: h("input", { name: "job_id", type: "number", min: "1", value: f.job_id, placeholder: "any" }),
    order: select("order", [["newest", "newest first"], ["oldest", "oldest first"], ["fastest", "fastest first (needs a workload)"]], order),
  };
  const workloads = h("datalist", { id: "tf-workloads" });
  const targets = h("datalist", { id: "tf-targets" });
  const form = h("form", {
    class: "grid panel", role: "search", "aria-label": "Filter records",
    onsubmit: (ev) => {
      ev.preventDefault();
      for (const k of FILTERS) f[k] = c[k].value.trim();
      go({ order: c.order.value });
    },
  }, workloads, targets,
  field("Workload key", c.workload_key), field("Target", c.target), field("Device key", c.device_key),
  field("Error", c.error_code), field("Job", c.job_id), field("Order", c.order),
  h("div", { class: "actions" }, h("button", { type: "submit" }, "Apply"),
    h("a", { class: "button secondary", href: "#/records" }, "Clear")));

  const status = h("div", { "aria-live": "polite" }, notice ? h("p", { class: "error", role: "alert" }, notice) : null);
  const table = dataTable(columns(order, f.workload_key, go), [], {
    label: "Records", key: (r) => r.id, href: (r) => `#/records/${r.id}`,
    caption: "Rows open the record: its candidate, loop IR and measurement (Enter or click).", empty: "No records match.",
  });
  const pager = new Pager(() => load());
  const body = h("div", {}, table.el);
  main.append(h("h1", {}, "Records"), form, status, body, pager.el);

  async function load() {
    const cursor = pager.cursor || {};
    try {
      const page = await api("/records", { params: { ...f, order, limit: PAGE, ...cursor }, signal: ctx.signal });
      table.update(page.items);
      performance.mark("tunefarm:records-rows");
      const next = order === "newest" ? (page.next_before ? { before: page.next_before } : null)
        : order === "oldest" ? (page.next_after ? { after: page.next_after } : null)
          : (page.next_after ? { after: page.next_after, after_cost: page.next_after_cost } : null);
      pager.arrived(next, page.items.length);
      if (!notice) replace(status);
    } catch (e) {
      if (e.status === 401) ctx.fail(body, e);
      else replace(status, h("p", { class: "error", role: "alert" }, `${e.message}${e.field ? ` (field: ${e.field})` : ""}`));
    }
  }

  await load();
  suggestions(workloads, targets, ctx);
}

/** Datalist suggestions from the first pages of /workloads and /targets (best effort). */
async function suggestions(workloads, targets, ctx) {
  try {
    const [w, t] = await Promise.all([api("/workloads", { params: { limit: 200 }, signal: ctx.signal }),
      api("/targets", { params: { limit: 50 }, signal: ctx.signal })]);
    replace(workloads, w.items.map((x) => h("option", { value: x.key }, `${workloadText(x)} · ${x.records} records`)));
    replace(targets, t.items.map((x) => h("option", { value: x.target }, `${x.records} records`)));
  } catch {
    // suggestions only: the filters work without them
  }
}

function columns(order, workloadKey, go) {
  return [
    {
      label: "ID", num: true, render: (r) => String(r.id),
      sort: { dir: order === "newest" ? "descending" : order === "oldest" ? "ascending" : null,
        onclick: () => go({ order: order === "newest" ? "oldest" : "newest" }), title: "sort by id (newest or oldest first)" },
    },
    { label: "Workload", render: (r) => workloadText(r.workload) },
    { label: "Target", cls: "hide-narrow", render: (r) => targetCell(r.target) },
    { label: "Device key", render: (r) => r.device_key },
    { label: "Job", num: true, render: (r) => (r.job_id ? String(r.job_id) : "—") },
    { label: "Kind", render: (r) => r.candidate.kind },
    {
      label: "Mean time", num: true, render: (r) => fmtCost(r.result.mean_cost) + (r.result.emulated ? " (emulated)" : ""),
      sort: { dir: order === "fastest" ? "ascending" : null, disabled: !workloadKey,
        title: workloadKey ? "fastest first" : "choose a workload key to sort by time",
        onclick: () => go({ order: "fastest" }) },
    },
    { label: "Error", render: (r) => (r.result.error_code ? errorName(r.result.error_code) : "—") },
    { label: "Measured by", cls: "hide-narrow", render: (r) => r.result.measured_by || "—" },
    { label: "Stored", cls: "hide-narrow", render: (r) => fmtTime(r.created_at) },
  ];
}
