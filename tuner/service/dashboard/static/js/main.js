// The dashboard's entry point: hash routes (#/jobs, #/jobs/12, #/compare?ids=3,4, #/records,
// #/records/7, #/best, #/farm, #/token), one page at a time. Each page gets a Context whose
// polling and fetches stop when the user navigates away, so a page left behind never writes
// into the next one.

import { adoptTokenFromUrl, token } from "./api.js";
import { errorBox, h, replace } from "./dom.js";
import * as best from "./pages/best.js";
import * as compare from "./pages/compare.js";
import * as farm from "./pages/farm.js";
import * as job from "./pages/job.js";
import * as jobs from "./pages/jobs.js";
import * as record from "./pages/record.js";
import * as records from "./pages/records.js";
import * as tokenPage from "./pages/token.js";

const ROUTES = [
  [/^\/jobs\/(\d+)$/, job, "jobs"],
  [/^\/jobs$/, jobs, "jobs"],
  [/^\/compare$/, compare, "compare"],
  [/^\/records\/(\d+)$/, record, "records"],
  [/^\/records$/, records, "records"],
  [/^\/best$/, best, "best"],
  [/^\/farm$/, farm, "farm"],
  [/^\/token$/, tokenPage, "token"],
];

/** What a page may use: an abort signal, polling that stops with the page, error display. */
class Context {
  constructor(rerender) {
    this.controller = new AbortController();
    this.signal = this.controller.signal;
    this.closed = false;
    this.timers = new Set();
    this.cleanups = [];
    this.rerender = rerender;
  }

  /** Run `fn` every `ms` after it finishes (never two at once), while this page is shown. */
  every(ms, fn) {
    const tick = async () => {
      if (this.closed) return;
      if (!document.hidden) {
        try {
          await fn();
        } catch (e) {
          if (e.name !== "AbortError") console.warn("poll failed", e);
        }
      }
      if (!this.closed) this.timers.add(setTimeout(tick, ms));
    };
    this.timers.add(setTimeout(tick, ms));
  }

  onClose(fn) {
    this.cleanups.push(fn);
  }

  /** Show `err` in `container`; a 401 shows the token form instead (reads need a token). */
  fail(container, err) {
    if (this.closed || (err && err.name === "AbortError")) return;
    if (err && err.status === 401) {
      if (container.querySelector("[data-token-panel]")) return;     // a poll must not wipe what is being typed
      replace(container, tokenPage.tokenPanel(err.message, () => this.rerender()));
    } else {
      replace(container, errorBox(err));
    }
  }

  close() {
    this.closed = true;
    this.controller.abort();
    for (const t of this.timers) clearTimeout(t);
    for (const fn of this.cleanups) {
      try { fn(); } catch (e) { console.warn(e); }
    }
  }
}

let current = null;
let firstRender = true;

function parseHash() {
  let raw = window.location.hash.replace(/^#/, "") || "/jobs";
  if (!raw.startsWith("/")) raw = "/jobs";
  const i = raw.indexOf("?");
  return i < 0 ? { path: raw, params: new URLSearchParams() } : { path: raw.slice(0, i), params: new URLSearchParams(raw.slice(i + 1)) };
}

async function render() {
  if (current) current.close();
  const main = document.getElementById("main");
  let { path, params } = parseHash();
  if (path === "/" || path === "") path = "/jobs";
  const hit = ROUTES.map(([re, page, nav]) => [path.match(re), page, nav]).find(([m]) => m);
  const ctx = new Context(render);
  current = ctx;
  for (const a of document.querySelectorAll("[data-nav]")) {
    if (hit && a.dataset.nav === hit[2]) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  main.replaceChildren();
  if (!hit) {
    document.title = "Not found · tunefarm";
    replace(main, h("h1", {}, "Not found"), h("p", {}, "No page here. ", h("a", { href: "#/jobs" }, "Go to the jobs.")));
    return;
  }
  const [match, page] = hit;
  document.title = `${page.title} · tunefarm`;
  if (!firstRender) main.focus({ preventScroll: true });      // screen readers start at the new page
  firstRender = false;
  try {
    await page.render(main, { match, params }, ctx);
  } catch (e) {
    ctx.fail(main, e);
  }
}

function showTokenState() {
  const link = document.getElementById("token-status");
  if (link) link.textContent = token() ? "Token ✓" : "Token";
  if (link) link.setAttribute("aria-label", token() ? "Token (set)" : "Token (none set)");
}

// the skip link moves the focus; following its "#main" would be a route change
document.querySelector(".skip").addEventListener("click", (ev) => {
  ev.preventDefault();
  document.getElementById("main").focus();
});

adoptTokenFromUrl();
showTokenState();
window.addEventListener("tunefarm:token", showTokenState);
window.addEventListener("hashchange", render);
render();
