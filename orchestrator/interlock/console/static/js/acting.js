// Acting from the console, each through the REST API with the caller's token: a signal
// (showing the guards it must satisfy, and why it was declined), a fork at a record and a
// migration (each previewed by a dry run, then confirmed), a run started from a form
// built from the workflow's inputs.
import { api } from "./api.js";
import { ask, h, toast } from "./dom.js";

const code = (text) => h("code", {}, text);

// What a check of a guard found, as words: "data.score > 7 (data.score = 5): false".
function checkText(c) {
  const reads = Object.entries(c.reads || {}).map(([k, v]) => (v === "<absent>" ? `${k} is absent` : `${k} = ${JSON.stringify(v)}`));
  const verdict = c.outcome === "error" ? `error: ${c.error}` : c.outcome === "not_boolean" ? `${JSON.stringify(c.value)}, not a boolean` : c.outcome;
  return `on[${c.entry}] → ${c.goto}: ${c.guard || "no guard"}${reads.length ? ` (${reads.join(", ")})` : ""}: ${verdict}`;
}

// Why the run declined `event`: as the answer says it (each transition and why it did
// not fire), else the guards weighed on the run's last step for that event, with the
// values they read (GET /runs/{id}/explain).
async function whyDeclined(path, event, result) {
  if (result.declined?.length) return [...result.declined];
  const why = [...(result.guard_errors || [])];
  try {
    const report = await api(`${path}/explain`);
    const step = [...report.steps].reverse().find((s) => (s.checks || []).some((c) => c.event_type === event));
    if (step) why.push(...step.checks.filter((c) => c.event_type === event).map(checkText));
  } catch {
    // Without the explanation, the outcome alone.
  }
  return why;
}

// Send a signal. `waits`: the run's waiting_for (each event's guard and target).
export async function signalDialog(path, waits, out, onDone) {
  const events = [...new Set(waits.filter((w) => w.kind !== "answer").map((w) => w.event))];
  const guard = h("div", { id: "sig-guard", "aria-live": "polite" });
  const name = h("input", { id: "sig-name", name: "name", required: true, list: "signal-events", value: events[0] || "", spellcheck: "false", "aria-describedby": "sig-guard" });
  const showGuards = () => {
    const chosen = waits.filter((w) => w.event === name.value.trim());
    guard.replaceChildren(
      chosen.length
        ? h("ul", { class: "guard-list" }, chosen.map((w) => h("li", {}, "goes to ", code(w.goto), w.guard ? [" if ", code(w.guard), " is true"] : " (no guard)")))
        : h("p", { class: "hint" }, name.value.trim() ? "The run's state does not wait for this event: it would not be sent." : ""),
    );
  };
  name.addEventListener("input", showGuards);
  showGuards();
  let result = null;
  const values = await ask(
    "Send a signal",
    [
      h("label", { for: "sig-name" }, "Event type"),
      name,
      h("datalist", { id: "signal-events" }, events.map((e) => h("option", { value: e }))),
      guard,
      h("label", { for: "sig-data" }, "Data (JSON, optional)"),
      h("textarea", { id: "sig-data", name: "data", rows: 4, spellcheck: "false" }),
    ],
    "Send",
    {
      check: async (v) => {
        let data;
        try {
          data = v.data.trim() ? JSON.parse(v.data) : null;
        } catch (e) {
          return `The data is not JSON: ${e.message}`;
        }
        result = await api(`${path}/signals/${encodeURIComponent(v.name.trim())}`, { method: "POST", body: data, params: { wait: 5 } });
        return null;
      },
    },
  );
  if (!values || !result) return;
  const event = values.name.trim();
  const lines = [];
  let summary = `Signal ${event}: ${result.outcome}`;
  if (result.outcome === "moved") summary += ` to ${result.to_state}`;
  // The same decision may have ended the run: say how.
  if (result.after && result.after !== "running") summary += ` and ${result.after}${result.error ? `: ${result.error}` : ""}`;
  if (result.outcome === "declined") lines.push(...(await whyDeclined(path, event, result)));
  if (result.outcome === "not-waiting" && result.waiting_for?.length) lines.push(`It waits for ${result.waiting_for.join(", ")}.`);
  out.replaceChildren(h("p", {}, h("strong", {}, summary)), lines.length ? h("ul", {}, lines.map((l) => h("li", {}, l))) : null);
  toast(lines.length ? `${summary}: ${lines[0]}` : summary, result.outcome === "moved" ? "good" : "info");
  onDone();
}

// Fork the run at a record, on a version: previewed (a dry run), then confirmed.
export async function forkDialog(path, desc, versions) {
  const at = h("input", { id: "fork-at", name: "at", type: "number", min: 1, max: desc.records, value: desc.records, required: true });
  const version = h("select", { id: "fork-version", name: "version" }, versions.map((v) => h("option", { value: v, selected: v === desc.version }, `v${v}`)));
  const preview = h("div", { id: "fork-preview", "aria-live": "polite" });
  const confirm = h("button", { value: "ok", type: "submit", class: "primary", disabled: true }, "Fork");
  let previewed = null;
  let forked = null;
  const key = () => `${at.value}@${version.value}`;
  const stale = () => {
    confirm.disabled = previewed !== key();
  };
  at.addEventListener("input", stale);
  version.addEventListener("change", stale);
  const body = () => ({ at: Number(at.value), version: Number(version.value), dry_run: true });
  const show = h("button", {
    type: "button",
    onclick: async () => {
      preview.replaceChildren(h("p", { class: "muted" }, "Previewing…"));
      try {
        const report = await api(`${path}/fork`, { method: "POST", body: body() });
        const items = [
          h("p", {}, `The fork copies records 1–${report.origin.seq}, then goes on in state `, code(report.state), ` on v${report.version}:`),
          h("ol", { class: "preview-records" }, report.records.slice(0, 12).map((r) => h("li", {}, `#${r.seq} ${r.summary}`))),
        ];
        if (report.version !== desc.version) {
          const replay = await api(`${path}/replay`, { params: { against: report.version } });
          items.push(h("p", {}, replay.agree
            ? `Replayed against v${report.version}, the run's inputs make the same decisions.`
            : `Replayed against v${report.version}, the run diverges at record #${replay.divergence?.seq}: ${replay.divergence?.reason || replay.divergence?.kind || ""}`));
        }
        preview.replaceChildren(...items);
        previewed = key();
      } catch (e) {
        preview.replaceChildren(h("p", { class: "error" }, e.message));
        previewed = null;
      }
      stale();
    },
  }, "Preview");
  const values = await ask(
    `Fork run ${desc.run_id}`,
    [
      h("p", { class: "hint" }, "A new run starts from this run's first records and goes on live; this run is not touched."),
      h("label", { for: "fork-at" }, `At record (1–${desc.records})`),
      at,
      h("label", { for: "fork-version" }, "On version"),
      version,
      show,
      preview,
    ],
    "Fork",
    {
      confirm,
      check: async () => {
        if (previewed !== key()) return "Preview the fork first.";
        forked = await api(`${path}/fork`, { method: "POST", body: { ...body(), dry_run: false } });
        return null;
      },
    },
  );
  if (!values || !forked) return;
  toast(`Forked as ${forked.run_id}.`, "good");
  location.hash = `#/runs/${encodeURIComponent(forked.run_id)}`;
}

// Move a workflow's running runs onto a version: previewed (a dry run), then confirmed.
export async function migrateDialog(base, detail) {
  const to = h("select", { id: "migrate-to", name: "to" }, detail.versions.map((v) => h("option", { value: v, selected: v === detail.versions[detail.versions.length - 1] }, `v${v}`)));
  const preview = h("div", { id: "migrate-preview", "aria-live": "polite" });
  const confirm = h("button", { value: "ok", type: "submit", class: "primary", disabled: true }, "Migrate");
  let previewed = null;
  let report = null;
  to.addEventListener("change", () => (confirm.disabled = previewed !== to.value));
  const runLink = (r) => h("a", { href: `#/runs/${encodeURIComponent(r.run_id)}`, class: "mono" }, r.run_id);
  const show = h("button", {
    type: "button",
    onclick: async () => {
      preview.replaceChildren(h("p", { class: "muted" }, "Previewing…"));
      try {
        const dry = await api(`${base}/migrate`, { method: "POST", body: { to: Number(to.value), dry_run: true } });
        preview.replaceChildren(
          h("p", {}, `${dry.moved.length} running run${dry.moved.length === 1 ? "" : "s"} would move to v${to.value}; ${dry.stayed.length} would stay.`),
          dry.moved.length ? h("ul", {}, dry.moved.map((r) => h("li", {}, runLink(r), ` v${r.from_version} in `, code(r.state)))) : null,
          dry.stayed.length ? h("ul", {}, dry.stayed.map((r) => h("li", {}, runLink(r), `: ${r.reason}`))) : null,
        );
        previewed = to.value;
      } catch (e) {
        preview.replaceChildren(h("p", { class: "error" }, e.message));
        previewed = null;
      }
      confirm.disabled = previewed !== to.value;
    },
  }, "Preview");
  const values = await ask(
    `Migrate running runs of ${detail.name}`,
    [
      h("p", { class: "hint" }, "Each running run whose log agrees with the version so far moves onto it; the others stay, with the reason."),
      h("label", { for: "migrate-to" }, "To version"),
      to,
      show,
      preview,
    ],
    "Migrate",
    {
      confirm,
      check: async () => {
        if (previewed !== to.value) return "Preview the migration first.";
        report = await api(`${base}/migrate`, { method: "POST", body: { to: Number(to.value) } });
        return null;
      },
    },
  );
  if (!values || !report) return null;
  toast(`${report.moved.length} run${report.moved.length === 1 ? "" : "s"} moved to v${report.to.version}; ${report.stayed.length} stayed.`, "good");
  return report;
}

// A form field for an input of `type` (the manifest's: string, integer, number, boolean,
// list[...], map[...], object...).
function inputField(name, spec) {
  const id = `in-${name}`;
  const required = spec.required && spec.default === undefined;
  const hint = `${spec.type}${required ? ", required" : spec.default !== undefined ? `, default ${JSON.stringify(spec.default)}` : ", optional"}`;
  let field;
  if (spec.type === "boolean") {
    field = h("select", { id, name }, h("option", { value: "" }, "(default)"), h("option", { value: "true" }, "true"), h("option", { value: "false" }, "false"));
  } else if (spec.type === "integer" || spec.type === "number") {
    // step "any": a fraction typed for an integer gets the form's own message, which
    // names the input, not the browser's.
    field = h("input", { id, name, type: "number", step: "any", required });
  } else if (spec.type === "string") {
    field = h("input", { id, name, type: "text", required, spellcheck: "false" });
  } else {
    field = h("textarea", { id, name, rows: 3, required, spellcheck: "false", placeholder: spec.type.startsWith("list") ? "[ ]" : "{ }" });
  }
  return [h("label", { for: id }, name, " ", h("span", { class: "hint" }, `(${hint})`)), field];
}

// The form's values as the inputs' JSON; throws naming the first that is not its type.
function inputsOf(values, inputs) {
  const out = {};
  for (const [name, spec] of Object.entries(inputs)) {
    const raw = (values[name] ?? "").trim();
    if (raw === "") continue;
    if (spec.type === "string") out[name] = values[name];
    else if (spec.type === "boolean") out[name] = raw === "true";
    else if (spec.type === "integer" || spec.type === "number") {
      const n = Number(raw);
      if (Number.isNaN(n) || (spec.type === "integer" && !Number.isInteger(n))) throw new Error(`${name} must be ${spec.type === "integer" ? "a whole number" : "a number"}`);
      out[name] = n;
    } else {
      try {
        out[name] = JSON.parse(raw);
      } catch (e) {
        throw new Error(`${name} is not JSON (${spec.type}): ${e.message}`);
      }
    }
  }
  return out;
}

// Start a run of a workflow's newest version, its inputs from a form.
export async function startDialog(ref, inputs) {
  let started = null;
  const fields = Object.entries(inputs).map(([name, spec]) => inputField(name, spec));
  const values = await ask(
    `Start a run of ${ref}`,
    [fields.length ? fields : h("p", { class: "muted" }, "It declares no inputs.")],
    "Start",
    {
      check: async (v) => {
        const body = { workflow: ref, inputs: inputsOf(v, inputs) };
        started = await api("/runs", { method: "POST", body });
        return null;
      },
    },
  );
  if (!values || !started) return;
  toast(`Started ${started.run_id}.`, "good");
  location.hash = `#/runs/${encodeURIComponent(started.run_id)}`;
}
