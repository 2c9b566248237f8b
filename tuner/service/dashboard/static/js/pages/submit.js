// Writes: the submit form, and the cancel / resume buttons of a job. They need a token with the
// `submit` scope; the API's reason (its `detail`, naming the `field`) is shown next to the form.

import { api, ApiError } from "../api.js";
import { field, h, replace, select } from "../dom.js";

const OPERATORS = ["matmul", "batch_matmul", "dense", "matmul_int8", "conv2d_nchw", "conv2d_nhwc", "depthwise_conv2d_nchw",
  "max_pool2d", "avg_pool2d", "softmax", "layer_norm", "add", "mul", "relu", "gelu", "bias_add", "reduce_sum", "reduce_max",
  "reduce_min", "transpose", "pad"];

/**
 * Operator parameters as JSON ({"M": 512}) or as key=value pairs separated by newlines, ";" or
 * ", " before the next key (so shape=128,256 keeps its comma). Values are JSON when they parse
 * (numbers, true, [1, 2]), a comma list of integers becomes a list, anything else stays text.
 */
export function parseParams(text) {
  const t = text.trim();
  if (!t) return {};
  if (t.startsWith("{")) {
    let v;
    try {
      v = JSON.parse(t);
    } catch (e) {
      throw new ApiError(422, `parameters: not valid JSON (${e.message})`, "params");
    }
    if (typeof v !== "object" || v === null || Array.isArray(v)) throw new ApiError(422, "parameters: a JSON object, e.g. {\"M\": 512}", "params");
    return v;
  }
  const out = {};
  for (const part of t.split(/[\n;]|,(?=\s*[A-Za-z_]\w*\s*=)/)) {
    const p = part.trim();
    if (!p) continue;
    const eq = p.indexOf("=");
    if (eq <= 0) throw new ApiError(422, `parameters: "${p}" is not key=value`, "params");
    const key = p.slice(0, eq).trim();
    const raw = p.slice(eq + 1).trim();
    out[key] = parseValue(raw);
  }
  return out;
}

function parseValue(raw) {
  if (/^-?\d+(\s*,\s*-?\d+)+$/.test(raw)) return raw.split(",").map((x) => parseInt(x, 10));
  try {
    return JSON.parse(raw);
  } catch {
    return raw;
  }
}

const FIELD_CONTROLS = { "workloads.0": ["op", "params", "compute"], workloads: ["op", "params", "compute"], params: ["params"],
  compute: ["compute"], target: ["target"], device_key: ["device_key"], trials: ["trials"], batch_size: ["batch_size"], space: ["space"],
  strategy: ["strategy"], scheduler: ["scheduler"], name: ["name"] };

/** The submit form; on success it opens the new job's page. */
export function submitForm(ctx) {
  const c = {
    name: h("input", { name: "name", autocomplete: "off", placeholder: "optional" }),
    op: h("input", { name: "op", value: "matmul", list: "tf-operators", autocomplete: "off" }),
    params: h("input", { name: "params", value: "M=256, N=256, K=256", autocomplete: "off", spellcheck: "false" }),
    compute: h("textarea", { name: "compute", rows: "3", placeholder: "{\"version\": 1, ...} or {\"workloads\": [...]}" }),
    target: h("input", { name: "target", autocomplete: "off", placeholder: "the server's host" }),
    device_key: h("input", { name: "device_key", value: "local", autocomplete: "off" }),
    trials: h("input", { name: "trials", type: "number", min: "1", max: "100000", value: "64" }),
    batch_size: h("input", { name: "batch_size", type: "number", min: "1", max: "256", value: "8" }),
    space: select("space", ["sketch", "template"], "sketch"),
    strategy: select("strategy", [["", "default for the space"], "evolutionary", "model", "genetic", "random", "grid"], ""),
    scheduler: select("scheduler", ["gradient", "round-robin"], "gradient"),
  };
  for (const el of Object.values(c)) el.addEventListener("input", () => el.removeAttribute("aria-invalid"));
  const message = h("div", { "aria-live": "assertive" });
  const button = h("button", { type: "submit" }, "Submit job");
  const datalist = h("datalist", { id: "tf-operators" }, OPERATORS.map((o) => h("option", { value: o })));

  const form = h("form", {
    class: "grid", "aria-label": "Submit a job", novalidate: true,
    onsubmit: async (ev) => {
      ev.preventDefault();
      for (const el of Object.values(c)) el.removeAttribute("aria-invalid");
      replace(message);
      button.disabled = true;
      try {
        const job = await api("/jobs", { method: "POST", body: spec(c), signal: ctx.signal });
        replace(message, h("p", { class: "note" }, `Job ${job.id} submitted.`));
        window.location.hash = `#/jobs/${job.id}`;
      } catch (e) {
        if (e.name === "AbortError") return;
        showWriteError(message, e);
        const usesCompute = c.compute.value.trim() !== "";
        for (const name of FIELD_CONTROLS[e.field] || FIELD_CONTROLS[(e.field || "").split(".").slice(0, 2).join(".")] || []) {
          if ((name === "compute") === usesCompute || !["op", "params", "compute"].includes(name)) c[name].setAttribute("aria-invalid", "true");
        }
      } finally {
        button.disabled = false;
      }
    },
  },
  datalist,
  field("Operator", c.op, "from the inventory"),
  field("Parameters", c.params, "key=value pairs, or JSON", "span2"),
  field("Job name", c.name),
  field("Trials", c.trials),
  field("Batch size", c.batch_size, "candidates built and measured together"),
  field("Space", c.space),
  field("Strategy", c.strategy),
  field("Scheduler", c.scheduler, "how several tasks share the trials"),
  field("Target", c.target, "empty: the server's host"),
  field("Device key", c.device_key, "local, or a farm device key"),
  h("details", {}, h("summary", {}, "Or a compute DAG as JSON"),
    field("Compute JSON (instead of the operator)", c.compute, "a compute DAG as JSON, or a whole spec with \"workloads\"")),
  h("div", { class: "actions wide" }, button),
  h("div", { class: "wide" }, message));
  return form;
}

/** The request body from the form (throws ApiError naming the field for what cannot parse). */
function spec(c) {
  const body = {
    device_key: c.device_key.value.trim() || "local",
    trials: Number(c.trials.value),
    space: c.space.value,
    scheduler: c.scheduler.value,
  };
  if (!Number.isInteger(body.trials) || body.trials < 1) throw new ApiError(422, "trials: a whole number of at least 1", "trials");
  const batch = Number(c.batch_size.value);
  if (!Number.isInteger(batch) || batch < 1) throw new ApiError(422, "batch size: a whole number of at least 1", "batch_size");
  body.batch_size = batch;
  if (c.name.value.trim()) body.name = c.name.value.trim();
  if (c.target.value.trim()) body.target = c.target.value.trim();
  if (c.strategy.value) body.strategy = c.strategy.value;
  const computeText = c.compute.value.trim();
  if (computeText) {
    let parsed;
    try {
      parsed = JSON.parse(computeText);
    } catch (e) {
      throw new ApiError(422, `compute JSON: not valid JSON (${e.message})`, "compute");
    }
    if (parsed && typeof parsed === "object" && Array.isArray(parsed.workloads)) return { ...body, ...parsed };   // a whole spec
    return { ...body, workloads: [{ compute: parsed, name: body.name || "custom" }] };
  }
  if (!c.op.value.trim()) throw new ApiError(422, "operator: give an operator, or a compute JSON", "workloads.0");
  return { ...body, workloads: [{ op: c.op.value.trim(), params: parseParams(c.params.value) }] };
}

/** The text of a write's error, with what to do about a missing or too small token. */
export function writeErrorText(e) {
  const hint = e.status === 401 ? " Writes need a token with the submit scope: set one on the Token page."
    : e.status === 403 ? " This token cannot write: use one with the submit scope (Token page)." : "";
  return `${e.message}${e.field ? ` (field: ${e.field})` : ""}${hint}`;
}

export function showWriteError(container, e) {
  replace(container, h("p", { class: "error", role: "alert" }, writeErrorText(e)));
}

/** Cancel (queued, running) or resume (failed, cancelled) buttons of a job. */
export function jobActions(job, onMessage, reload) {
  const act = async (action, button) => {
    button.disabled = true;
    try {
      await api(`/jobs/${job.id}/${action}`, { method: "POST" });
      onMessage(null);
      await reload();
    } catch (e) {
      onMessage(`job ${job.id}: ${writeErrorText(e)}`);
    } finally {
      button.disabled = false;
    }
  };
  const buttons = [];
  if (job.state === "queued" || job.state === "running") {
    const b = h("button", { type: "button", class: "danger", "aria-label": `Cancel job ${job.id}` }, "Cancel");
    b.addEventListener("click", () => act("cancel", b));
    buttons.push(b);
  }
  if (job.state === "failed" || job.state === "cancelled") {
    const b = h("button", { type: "button", class: "secondary", "aria-label": `Resume job ${job.id}` }, "Resume");
    b.addEventListener("click", () => act("resume", b));
    buttons.push(b);
  }
  return buttons.length ? h("span", { class: "actions" }, buttons) : "—";
}
