// #/jobs/12: one job, live (a model job also shows its model, latency curve and allocation). Every 2 s: the job (state, per-task progress), its new events
// (`after=`) and its new measurements (`after=`), so a poll costs the same at the end of a long
// job as at its start; the charts get the appended points without a reload. "Re-taken
// measurements" lists the windows a measuring worker's calibration found slow (the job API's
// `retaken`): when, on which agent, at what speed, and whether they were measured again in a fresh
// worker or kept but marked (ranked after every unmarked figure).

import { api } from "../api.js";
import { Chart, jobConvergence } from "../chart.js";
import { badge, errorName, fmt, fmtDuration, fmtGflops, fmtSpeedup, fmtTime, h, jobTiming, replace, targetDetails, workloadText } from "../dom.js";
import { dataTable } from "../table.js";
import { modelSection } from "./model_section.js";
import { jobActions } from "./submit.js";

export const title = "Job";

const POLL_MS = 2000;
const MEASUREMENTS_PAGE = 5000;
const EVENTS_SHOWN = 200;

export async function render(main, { match }, ctx) {
  const id = Number(match[1]);
  document.title = `Job ${id} · tunefarm`;
  const heading = h("h1", {}, `Job ${id}`);
  const status = h("div", { "aria-live": "polite" });
  const actions = h("div", { class: "actions" });
  const facts = h("dl", { class: "facts" });
  const byTrials = new Chart("Best GFLOPS against trials");
  const byTime = new Chart("Best GFLOPS against time");
  ctx.onClose(() => { byTrials.close(); byTime.close(); });
  const tasks = dataTable(taskColumns(), [], {
    label: "Tasks of the job", key: (t) => t.position, href: (t) => (t.best_record_id ? `#/records/${t.best_record_id}` : null),
    caption: "Trials and batches are the scheduler's allocation so far; a row opens the task's best record.",
  });
  const events = dataTable(eventColumns(), [], { label: "Events of the job", key: (e) => e.id, empty: "No events yet." });
  const retaken = dataTable(retakenColumns(), [], {
    label: "Re-taken measurements", key: (w) => `${w.position}/${w.measured_by}/${w.kind}/${w.slow_index}/${w.first_at}`,
    empty: "None: every measuring worker calibrated at its device's usual speed.",
    caption: "Windows of measurements whose measuring worker calibrated slow afterwards (below 0.8 of its device's usual speed).",
  });
  const retakenNote = h("p", { class: "muted" });
  const errorsLine = h("p", { class: "muted" });
  const modelPart = h("div");       // a model job's model, latency curve and allocation (model_section.js)
  let model = null;

  main.append(heading, status, actions, facts, modelPart,
    h("section", { "aria-labelledby": "conv-h" }, h("h2", { id: "conv-h" }, "Convergence"), h("div", { class: "charts" }, byTrials.el, byTime.el), errorsLine),
    h("section", { "aria-labelledby": "tasks-h" }, h("h2", { id: "tasks-h" }, "Tasks"), tasks.el),
    h("section", { "aria-labelledby": "retaken-h" }, h("h2", { id: "retaken-h" }, "Re-taken measurements"), retakenNote, retaken.el),
    h("section", { "aria-labelledby": "events-h" }, h("h2", { id: "events-h" }, "Events"), events.el));

  let job = null;
  let eventsAfter = null;
  let measuredAfter = null;
  const measurements = [];
  const eventList = [];

  // one poll at a time (the timer's and a button's): two would both append what is after the same cursor
  let inFlight = null;
  function poll() {
    if (!inFlight) inFlight = pollOnce().finally(() => { inFlight = null; });
    return inFlight;
  }

  async function pollOnce() {
    const [j, ev, fresh] = await Promise.all([
      api(`/jobs/${id}`, { signal: ctx.signal }),
      api(`/jobs/${id}/events`, { params: { after: eventsAfter, limit: 500 }, signal: ctx.signal }),
      newMeasurements(),
    ]);
    job = j;
    eventsAfter = ev.next_after;
    eventList.push(...ev.items);
    showJob();
    if (ev.items.length || eventList.length === 0) events.update(eventList.slice(-EVENTS_SHOWN).reverse());
    if (fresh || !byTrials.u) drawCharts();
  }

  async function newMeasurements() {
    let got = 0;
    for (;;) {
      const page = await api(`/jobs/${id}/measurements`, { params: { after: measuredAfter, limit: MEASUREMENTS_PAGE }, signal: ctx.signal });
      measurements.push(...page.items);
      measuredAfter = page.next_after;
      got += page.items.length;
      if (page.items.length < MEASUREMENTS_PAGE) return got;
    }
  }

  let shownState = null;
  let target = null;

  function showJob() {
    replace(heading, `Job ${id}`, job.name ? ` · ${job.name}` : "", " ", badge(job.state));
    if (job.state !== shownState) {          // rebuilt only on a change: a focused button keeps its focus
      shownState = job.state;
      const buttons = jobActions(job, (msg) => replace(status, msg ? h("p", { class: "error", role: "alert" }, msg) : ""), () => poll());
      replace(actions, typeof buttons === "string" ? null : buttons,
        h("a", { class: "button secondary", href: `#/records?job_id=${id}` }, "Records of this job"),
        h("a", { class: "button secondary", href: `#/compare?ids=${id}` }, "Compare with other jobs"));
    }
    const t = jobTiming(job);
    const errors = measurements.filter((m) => m.error_code !== 0).length;
    const rows = [
      ["State", job.state], ["Trials", `${job.trials_done} of ${job.trials} (${fmt(job.progress * 100, 0)} %)`],
      ["Trials per second", t.rate ? fmt(t.rate, 2) : "—"], ["Elapsed", fmtDuration(t.elapsed)],
      ["ETA", job.state === "running" ? fmtDuration(t.eta) : "—"], ["Measurement errors", String(errors)],
      ["Device key", job.device_key], ["Space · strategy", `${job.space} · ${job.strategy}`],
      ["Scheduler", job.scheduler], ["Priority", String(job.priority)], ["Attempts", String(job.attempts)],
      ["Worker", job.lease_owner || "—"], ["Submitted", fmtTime(job.created_at)], ["Finished", fmtTime(job.finished_at)],
    ];
    if (job.error) rows.push(["Error", job.error, "wide"]);
    if (!target) target = targetDetails(job.target);       // built once: its open/closed state survives polls
    rows.push(["Target", target, "wide"]);
    replace(facts, rows.map(([k, v, cls]) => h("div", { class: cls || null }, h("dt", {}, k), h("dd", {}, v))));
    const summary = chartSummary(job, measurements);
    byTrials.summary.textContent = summary;
    byTime.summary.textContent = summary;
    if (job.model) {
      if (!model) {
        model = modelSection(ctx);
        modelPart.append(model.el);
      }
      model.update(job);
    }
    const total = job.tasks.reduce((a, x) => a + x.trials, 0);
    tasks.update(job.tasks.map((x) => ({ ...x, share: total ? x.trials / total : null })));
    const windows = job.retaken || [];
    retaken.update(windows);
    replace(retakenNote, retakenText(windows, job.retaken_capped));
  }

  function drawCharts() {
    if (!job) return;
    const summary = chartSummary(job, measurements);
    byTrials.set({ ...jobConvergence(measurements, job.tasks, "trials"), summary });
    byTime.set({ ...jobConvergence(measurements, job.tasks, "time"), summary });
    const codes = {};
    for (const m of measurements) if (m.error_code !== 0) codes[m.error_code] = (codes[m.error_code] || 0) + 1;
    const parts = Object.entries(codes).map(([c, n]) => `${errorName(Number(c))}: ${n}`);
    errorsLine.textContent = parts.length ? `Failed measurements (marked below zero): ${parts.join(", ")}.` : "No failed measurements.";
  }

  try {
    await poll();
  } catch (e) {
    ctx.fail(main, e);
    return;
  }
  ctx.every(POLL_MS, poll);
}

function chartSummary(job, measurements) {
  const search = measurements.filter((m) => m.kind !== "default");
  const best = job.tasks.map((t) => t.best_gflops).filter((v) => v !== null && v !== undefined);
  if (!search.length) return job.state === "queued" ? "Waiting for a worker." : "No measurements yet.";
  // the tasks' best as the worker last wrote it: re-measured with the default schedule at the end
  const what = job.state === "done" ? "Final best (re-measured)" : "Best so far";
  const head = best.length ? `${what}: ${best.map(fmtGflops).join(", ")} GFLOPS` : "No valid measurement yet";
  const sp = job.tasks.length === 1 && job.tasks[0].speedup ? `, ${fmtSpeedup(job.tasks[0].speedup)} the default schedule` : "";
  return `${head} after ${search.length} trials${sp}.${busyNote(job)}`;
}

// the share of a task's timings that other processes disturbed even after retries: said plainly,
// because those figures are not what the kernel does on a quiet machine
function busyNote(job) {
  const worst = Math.max(0, ...job.tasks.map((t) => t.disturbed_fraction || 0));
  if (worst <= 0) return "";
  return ` Measured on a busy machine: up to ${fmt(100 * worst, 0)} % of a task's timings were disturbed by other processes; re-run on a quiet machine before trusting these figures.`;
}

function taskColumns() {
  return [
    { label: "#", num: true, render: (t) => String(t.position) },
    { label: "Workload", cls: "wrap", render: (t) => workloadText(t.workload) },
    { label: "Weight", num: true, render: (t) => fmt(t.weight, 1) },
    { label: "Trials", num: true, render: (t) => String(t.trials) },
    { label: "Batches", num: true, render: (t) => String(t.batches) },
    { label: "Share of trials", num: true, render: (t) => (t.share === null ? "—" : `${fmt(100 * t.share, 0)} %`) },
    { label: "Best GFLOPS", num: true, render: (t) => fmtGflops(t.best_gflops) },
    { label: "Default GFLOPS", num: true, render: (t) => (t.flops && t.baseline_cost ? fmtGflops(t.flops / t.baseline_cost / 1e9) : "—") },
    { label: "Speed-up", num: true, render: (t) => fmtSpeedup(t.speedup) },
    { label: "Disturbed", num: true, render: (t) => (t.timings ? `${fmt(100 * (t.disturbed_fraction || 0), 0)} %` : "—") },
    { label: "Re-measured", num: true, render: (t) => String(t.remeasured || 0) },
    { label: "Marked slow", num: true, render: (t) => String(t.slow_window || 0) },
    { label: "Best record", num: true, render: (t) => (t.best_record_id ? String(t.best_record_id) : "—") },
  ];
}

// the re-taken windows in one sentence: how many records were measured again, how many kept marked
function retakenText(windows, capped) {
  if (!windows.length) return "";
  const again = windows.filter((w) => w.kind === "remeasured").reduce((a, w) => a + w.count, 0);
  const marked = windows.filter((w) => w.kind === "slow_window").reduce((a, w) => a + w.count, 0);
  const parts = [];
  if (again) parts.push(`${again} measurement${again === 1 ? " was" : "s were"} taken again in a fresh worker`);
  if (marked) parts.push(`${marked} ${marked === 1 ? "is" : "are"} kept but marked slow (ranked after every unmarked one)`);
  return `${parts.join("; ")}.${capped ? " Only the newest windows are listed." : ""}`;
}

function retakenColumns() {
  return [
    { label: "Time", render: (w) => fmtTime(w.last_at) },
    { label: "Task", num: true, render: (w) => (w.position === null || w.position === undefined ? "—" : String(w.position)) },
    { label: "Agent", render: (w) => w.measured_by },
    { label: "What", render: (w) => (w.kind === "remeasured" ? "measured again" : "marked slow") },
    { label: "Records", num: true, render: (w) => String(w.count) },
    { label: "Speed index", num: true, render: (w) => (w.slow_index === null ? "—" : fmt(w.slow_index, 2)) },
    { label: "Why", cls: "wrap", render: (w) => w.reason },
  ];
}

function eventColumns() {
  return [
    { label: "Time", render: (e) => fmtTime(e.at) },
    { label: "Event", render: (e) => e.kind },
    { label: "Message", cls: "wrap", render: (e) => e.message },
  ];
}
