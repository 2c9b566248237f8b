// The token form: shown on its own page (#/token) and wherever a read answers 401.
// `tunefarm serve` prints a URL carrying a session token; `tunefarm token create` makes lasting ones.

import { setToken, token } from "../api.js";
import { field, h } from "../dom.js";

export const title = "API token";

/** A panel with `message` and a form that stores the pasted token, then calls `done`. */
export function tokenPanel(message, done) {
  const input = h("input", { type: "password", name: "token", autocomplete: "off", spellcheck: "false", placeholder: "tf_…", required: true });
  const form = h("form", {
    class: "grid",
    onsubmit: (ev) => {
      ev.preventDefault();
      setToken(input.value);
      done();
    },
  },
  field("API token", input, "a read token to look, a submit token to submit, cancel and resume jobs", "span2"),
  h("div", { class: "actions" }, h("button", { type: "submit" }, "Use this token")));
  return h("section", { class: "panel", "aria-labelledby": "token-heading", "data-token-panel": "" },
    h("h2", { id: "token-heading" }, "Paste a token"),
    message ? h("p", { class: "error", role: "alert" }, message) : null,
    h("p", {}, "Open the URL that ", h("code", {}, "tunefarm serve"), " printed (it carries a session token), or create one with ",
      h("code", {}, "tunefarm token create --scope submit"), " and paste it here. It is kept in this browser tab only."),
    form);
}

export async function render(main) {
  const state = h("p", { "aria-live": "polite" }, token() ? "A token is set for this tab." : "No token is set: only a --public-read server answers.");
  const clear = h("button", {
    type: "button",
    class: "secondary",
    onclick: () => {
      setToken("");
      state.textContent = "Token cleared.";
    },
  }, "Forget the token");
  main.append(h("h1", {}, "API token"), state, h("div", { class: "actions" }, clear),
    tokenPanel(null, () => {
      window.location.hash = "#/jobs";
    }));
}
