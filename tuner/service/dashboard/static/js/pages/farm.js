// #/farm: agents per device key, queues, in-flight requests, busy fraction and last seen, from
// the tracker's live summary (or the agents the store last recorded); refreshed every 2 s. Each
// agent's health and speed index come from its measuring workers' calibrations: a degraded agent
// gets no work until a calibration shows it recovered, and the page says so above the tables.

import { api } from "../api.js";
import { fmt, fmtDuration, h, replace } from "../dom.js";
import { dataTable } from "../table.js";

export const title = "Farm";

export async function render(main, route, ctx) {
  const source = h("p", { class: "muted", "aria-live": "polite" });
  const problem = h("div");
  const health = h("div", { "aria-live": "polite" });
  const keys = dataTable(keyColumns(), [], { label: "Device keys", key: (k) => k.device_key, empty: "No device keys." });
  const agents = dataTable(agentColumns(), [], { label: "Agents", key: (a) => a.name, empty: "No agents." });
  const body = h("div", {}, h("h2", {}, "Device keys"), keys.el, h("h2", {}, "Agents"), agents.el);
  main.append(h("h1", {}, "Farm"), source, problem, health, body);

  async function load() {
    try {
      const farm = await api("/farm", { signal: ctx.signal });
      const live = farm.source === "tracker";
      source.textContent = live
        ? `Live from the tracker${farm.tracker_version ? ` ${farm.tracker_version}` : ""}, up ${fmtDuration(farm.uptime_seconds)}; refreshed every 2 s.`
        : "No tracker configured (tunefarm serve --tracker HOST:PORT): agents as the records database last saw them.";
      keys.update(farm.keys);
      agents.update(farm.agents);
      replace(health, healthNote(farm.agents));
      replace(problem);
    } catch (e) {
      if (e.name === "AbortError") return;
      if (e.status === 401) ctx.fail(body, e);
      else replace(problem, h("p", { class: "error", role: "alert" }, `${e.message} (retrying)`));
    }
  }

  await load();
  ctx.every(2000, load);
}

const n = (v) => (v === null || v === undefined ? "—" : String(v));

// degraded and slow agents, said in words: what the farm does about them
function healthNote(agents) {
  const degraded = agents.filter((a) => a.health === "degraded");
  const slow = agents.filter((a) => a.health === "slow");
  const parts = [];
  if (degraded.length) {
    parts.push(h("p", { class: "warning", role: "status" },
      `Degraded: ${degraded.map((a) => `${a.name} (speed index ${fmtIndex(a.speed_index)})`).join(", ")}. `
      + "Fresh measuring workers stayed slow there: it gets no work until a calibration shows it recovered."));
  }
  if (slow.length) {
    parts.push(h("p", { class: "muted" },
      `Slow: ${slow.map((a) => a.name).join(", ")}: its last window was measured again in a fresh worker; it is handed work after healthy agents.`));
  }
  return parts;
}

const fmtIndex = (v) => (v === null || v === undefined ? "—" : fmt(v, 2));

function healthCell(a) {
  if (!a.health) return "—";
  const title = {
    healthy: "its measuring workers calibrate at their host's usual speed",
    slow: "its last calibration was below 0.8 of its host's usual speed",
    degraded: "fresh workers stayed slow: no work until it recovers",
    unknown: "not judged yet (too little history), or an agent that does not calibrate",
  }[a.health];
  return h("span", { class: `badge health-${a.health}`, title }, a.health);
}

function keyColumns() {
  return [
    { label: "Device key", render: (k) => k.device_key },
    { label: "Agents", num: true, render: (k) => n(k.agents) },
    { label: "Degraded", num: true, render: (k) => n(k.degraded) },
    { label: "Queued", num: true, render: (k) => n(k.queued) },
    { label: "In flight", num: true, render: (k) => n(k.in_flight) },
    { label: "Completed", num: true, render: (k) => n(k.completed) },
  ];
}

function busy(a) {
  if (!a.slots || a.in_flight === null || a.in_flight === undefined) return "—";
  const frac = Math.min(1, a.in_flight / a.slots);
  return h("span", {}, h("span", { class: "busy", "aria-hidden": "true" }, h("span", { style: `width:${Math.round(frac * 100)}%` })),
    `${fmt(frac * 100, 0)} %`);
}

function agentColumns() {
  return [
    { label: "Agent", render: (a) => a.name },
    { label: "Device key", render: (a) => a.device_key },
    { label: "Health", render: healthCell },
    { label: "Speed index", num: true, render: (a) => fmtIndex(a.speed_index) },
    { label: "Slots", num: true, render: (a) => n(a.slots) },
    { label: "In flight", num: true, render: (a) => n(a.in_flight) },
    { label: "Busy", render: busy },
    { label: "Completed", num: true, render: (a) => n(a.completed) },
    { label: "Failed", num: true, render: (a) => n(a.failed) },
    { label: "Leases lost", num: true, render: (a) => n(a.leases_lost) },
    { label: "Re-measured", num: true, cls: "hide-narrow", render: (a) => n(a.remeasured) },
    { label: "State", render: (a) => (a.draining ? "draining" : a.draining === false ? "serving" : "—") },
    { label: "Last seen", num: true, render: (a) => (a.last_seen_seconds_ago === null ? "—" : `${fmt(a.last_seen_seconds_ago, 1)} s ago`) },
    { label: "CPU", cls: "hide-narrow", render: (a) => [a.info.cpu, a.info.cores ? `${a.info.cores} cores` : null].filter(Boolean).join(", ") || "—" },
    { label: "Emulated", render: (a) => (a.info.emulated ? "yes (qemu-user: timings are the emulator's)" : "no") },
  ];
}
