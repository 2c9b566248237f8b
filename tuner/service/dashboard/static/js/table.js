// Tables whose rows are keyboard-navigable: Tab enters the table on one row (a roving
// tabindex, so a 500-row page is one Tab stop, not 500), the arrow keys, Home and End move
// between rows, Enter (or a click) opens the row's page.

import { h } from "./dom.js";

const INTERACTIVE = "a, button, input, select, textarea, label";

/**
 * columns: [{label, render(row) -> Node|string, num, cls, sort: {dir: "ascending"|"descending"|null,
 *            onclick, disabled, title}}]
 * opts: {label (names the table), caption, key(row), href(row) -> "#/..." or null, empty (text)}
 * Returns {el, update(rows)}.
 */
export function dataTable(columns, rows, opts) {
  const thead = h("thead", {}, h("tr", {}, columns.map((c) => headerCell(c))));
  const tbody = h("tbody");
  const table = h("table", { "aria-label": opts.label },
    opts.caption ? h("caption", {}, opts.caption) : null, thead, tbody);
  const el = h("div", { class: "table-wrap" }, table);

  tbody.addEventListener("keydown", (ev) => {
    const row = ev.target.closest("tr");
    if (!row || !tbody.contains(row)) return;
    const onRow = ev.target === row;
    const all = [...tbody.rows].filter((r) => r.dataset.key !== undefined);
    const i = all.indexOf(row);
    let next = null;
    if (ev.key === "ArrowDown") next = all[Math.min(all.length - 1, i + 1)];
    else if (ev.key === "ArrowUp") next = all[Math.max(0, i - 1)];
    else if (ev.key === "Home" && onRow) next = all[0];
    else if (ev.key === "End" && onRow) next = all[all.length - 1];
    else if ((ev.key === "Enter" || ev.key === " ") && onRow && row.dataset.href) {
      ev.preventDefault();
      window.location.hash = row.dataset.href;
      return;
    }
    if (next) {
      ev.preventDefault();
      focusRow(tbody, next);
    }
  });
  tbody.addEventListener("click", (ev) => {
    const row = ev.target.closest("tr");
    if (!row || !row.dataset.href || ev.target.closest(INTERACTIVE)) return;
    window.location.hash = row.dataset.href;
  });

  function update(newRows) {
    // a refresh rebuilds the rows: keep the keyboard focus on the same row (or the same control in it)
    const focused = document.activeElement;
    const focusedRow = focused && tbody.contains(focused) ? focused.closest("tr") : null;
    const focusedKey = focusedRow ? focusedRow.dataset.key : null;
    const inner = focusedRow && focused !== focusedRow ? [...focusedRow.querySelectorAll(INTERACTIVE)].indexOf(focused) : -1;
    const current = [...tbody.rows].find((r) => r.tabIndex === 0);
    const rovingKey = current ? current.dataset.key : null;
    tbody.replaceChildren();
    if (!newRows.length) {
      tbody.append(h("tr", {}, h("td", { colspan: String(columns.length), class: "muted" }, opts.empty || "Nothing here.")));
      return;
    }
    for (const row of newRows) {
      const href = opts.href ? opts.href(row) : null;
      const tr = h("tr", { tabindex: "-1", "data-key": String(opts.key(row)), "data-href": href || null },
        columns.map((c) => h("td", { class: [c.num ? "num" : "", c.cls || ""].join(" ").trim() || null }, c.render(row))));
      tbody.append(tr);
    }
    const keep = [...tbody.rows].find((r) => r.dataset.key === rovingKey) || tbody.rows[0];
    keep.tabIndex = 0;
    if (focusedKey !== null && focusedKey !== undefined) {
      const again = [...tbody.rows].find((r) => r.dataset.key === focusedKey);
      const target = again && inner >= 0 ? again.querySelectorAll(INTERACTIVE)[inner] : again;
      if (target) target.focus({ preventScroll: true });
    }
  }

  update(rows);
  return { el, table, update };
}

function focusRow(tbody, row) {
  for (const r of tbody.rows) r.tabIndex = -1;
  row.tabIndex = 0;
  row.focus();
}

function headerCell(c) {
  const attrs = { scope: "col", class: [c.num ? "num" : "", c.cls || ""].join(" ").trim() || null };
  if (!c.sort) return h("th", attrs, c.label);
  attrs["aria-sort"] = c.sort.dir || "none";
  const button = h("button", { type: "button", class: "sort", onclick: c.sort.onclick, disabled: !!c.sort.disabled, title: c.sort.title || null },
    c.label, c.sort.dir === "ascending" ? " ▲" : c.sort.dir === "descending" ? " ▼" : "");
  return h("th", attrs, button);
}

/** Previous/next buttons over keyset cursors: a stack of the cursors of the pages seen. */
export class Pager {
  constructor(onchange) {
    this.stack = [];           // cursors of the pages before this one
    this.cursor = null;        // this page's cursor (null: the first page)
    this.next = null;          // the next page's cursor, from the last answer
    this.onchange = onchange;
    this.prevButton = h("button", { type: "button", class: "secondary", onclick: () => this.back() }, "← Previous");
    this.nextButton = h("button", { type: "button", class: "secondary", onclick: () => this.forward() }, "Next →");
    this.status = h("span", { class: "muted", "aria-live": "polite" });
    this.el = h("div", { class: "pager", role: "group", "aria-label": "Pages" }, this.prevButton, this.nextButton, this.status);
    this.render(0);
  }

  reset() {
    this.stack = [];
    this.cursor = null;
    this.next = null;
  }

  /** After a page arrived: `next` is its cursor for the following page (null: last page). */
  arrived(next, count) {
    this.next = next;
    this.render(count);
  }

  render(count) {
    this.prevButton.disabled = this.stack.length === 0;
    this.nextButton.disabled = this.next === null || this.next === undefined;
    this.status.textContent = `page ${this.stack.length + 1}${count !== undefined ? `, ${count} rows` : ""}`;
  }

  forward() {
    if (this.next === null || this.next === undefined) return;
    this.stack.push(this.cursor);
    this.cursor = this.next;
    this.onchange(this.cursor);
  }

  back() {
    if (!this.stack.length) return;
    this.cursor = this.stack.pop();
    this.onchange(this.cursor);
  }
}
