// #/records/7: one record: its task, the candidate, the measurement, and its schedule lowered
// to loop IR on the server (cached there per record).

import { api } from "../api.js";
import { errorName, fmt, fmtCost, fmtTime, h, prettyJSON, replace, targetDetails, workloadText } from "../dom.js";

export const title = "Record";

export async function render(main, { match }, ctx) {
  const id = Number(match[1]);
  document.title = `Record ${id} · tunefarm`;
  const r = await api(`/records/${id}`, { signal: ctx.signal });
  const res = r.result;
  const facts = [
    ["Workload", workloadText(r.workload)], ["Workload key", h("code", {}, r.workload.key)],
    ["Device key", r.device_key], ["Job", r.job_id ? h("a", { href: `#/jobs/${r.job_id}` }, `job ${r.job_id}`) : "—"],
    ["Candidate kind", r.candidate.kind], ["Mean time", fmtCost(res.mean_cost)], ["Re-measured", fmtCost(r.retimed_cost)],
    ["Timings", res.costs.length ? res.costs.map(fmtCost).join(", ") : "—"],
    ["Result", res.error_code ? `${errorName(res.error_code)} (${res.error_code})` : "valid"],
    ["Build", res.build_seconds === null ? "—" : `${fmt(res.build_seconds, 3)} s`],
    ["Run", res.run_seconds === null ? "—" : `${fmt(res.run_seconds, 3)} s`],
    ["Measured by", (res.measured_by || "—") + (res.emulated ? " (emulated: the emulator's speed, not the device's)" : "")], ["Stored", fmtTime(r.created_at)], ["Target", targetDetails(r.target), "wide"],
  ];
  const ir = h("pre", { "aria-label": "Loop IR", tabindex: "0" }, "Lowering…");
  replace(main,
    h("h1", {}, `Record ${id}`),
    h("dl", { class: "facts" }, facts.map(([k, v, cls]) => h("div", { class: cls || null }, h("dt", {}, k), h("dd", {}, v)))),
    res.error_msg ? h("section", {}, h("h2", {}, "Error message"), h("pre", {}, res.error_msg)) : null,
    h("section", { "aria-labelledby": "cand-h" }, h("h2", { id: "cand-h" }, "Candidate"), h("pre", { tabindex: "0" }, prettyJSON(r.candidate.payload))),
    h("section", { "aria-labelledby": "ir-h" }, h("h2", { id: "ir-h" }, "Loop IR"), ir),
    h("p", {}, h("a", { href: `#/records?workload_key=${encodeURIComponent(r.workload.key)}` }, "Other records of this workload")),
  );
  try {
    const low = await api(`/records/${id}/ir`, { signal: ctx.signal });
    replace(ir, low.loop_ir !== null ? low.loop_ir : `Cannot be lowered: ${low.loop_ir_error}`);
  } catch (e) {
    if (e.name !== "AbortError") replace(ir, `Loop IR unavailable: ${e.message}`);
  }
}
