// Workflows: each one's versions, triggers, diagram, and a diff of two versions' manifests.
import "../vendor/diff/diff.min.js";
import { migrateDialog, startDialog } from "./acting.js";
import { api } from "./api.js";
import { diagram } from "./diagram.js";
import { add, errorBox, h, json, table, toast } from "./dom.js";
import { pauseButton, pausedBadge, pausedText, reasonField } from "./pausing.js";

export async function workflowsPage(root) {
  const workflows = await api("/workflows");
  const rows = workflows.map((w) => {
    const ref = `${w.namespace}/${w.name}`;
    return [
      [h("a", { href: `#/workflows/${ref}` }, w.namespace === "default" ? w.name : ref), pausedBadge(w.paused)],
      `v${w.version}`,
      w.triggers.length ? w.triggers.map((t) => h("code", { class: "chip" }, t)) : "—",
      w.description || "",
      h("a", { href: `#/runs?workflow=${encodeURIComponent(w.namespace === "default" ? w.name : ref)}` }, "runs"),
      // Its inputs are asked for when the form opens (the list does not carry them).
      h("button", { type: "button", class: "start", "aria-label": `Start a run of ${ref}`, onclick: async () => {
        try {
          const detail = await api(`/workflows/${encodeURIComponent(w.namespace)}/${encodeURIComponent(w.name)}`);
          await startDialog(w.namespace === "default" ? w.name : ref, detail.inputs);
        } catch (e) {
          toast(e.message, "bad");
        }
      } }, "Start…"),
    ];
  });
  add(root, 
    h("h1", {}, "Workflows"),
    table("!Workflows", ["Workflow", "Newest", "Triggers", "Description", "Runs", "Start"], rows, { empty: "No workflow is applied (interlock apply FILE).", stacked: true }),
  );
}

// Manifests as YAML-like text for a line diff: keys sorted, one value per line.
function lines(value, indent = "") {
  if (Array.isArray(value)) {
    if (!value.length) return ["[]"];
    return value.flatMap((v) => {
      const inner = lines(v, `${indent}  `);
      return [`${indent}- ${inner[0].trimStart()}`, ...inner.slice(1)];
    });
  }
  if (value && typeof value === "object") {
    const keys = Object.keys(value).sort();
    if (!keys.length) return [`${indent}{}`];
    return keys.flatMap((k) => {
      const v = value[k];
      if (v && typeof v === "object" && (Array.isArray(v) ? v.length : Object.keys(v).length)) {
        return [`${indent}${k}:`, ...lines(v, `${indent}  `)];
      }
      return [`${indent}${k}: ${JSON.stringify(v)}`];
    });
  }
  return [`${indent}${JSON.stringify(value)}`];
}

export function manifestText(manifest) {
  return `${lines(manifest).join("\n")}\n`;
}

function diffView(older, newer, a, b) {
  const parts = globalThis.Diff.diffLines(manifestText(older), manifestText(newer));
  let added = 0;
  let removed = 0;
  const rows = [];
  for (const p of parts) {
    const sign = p.added ? "+" : p.removed ? "-" : " ";
    if (p.added) added += p.count;
    if (p.removed) removed += p.count;
    const text = p.value.replace(/\n$/, "").split("\n");
    // Unchanged runs longer than 6 lines keep 3 lines of context each side.
    const shown = !p.added && !p.removed && text.length > 6 ? [...text.slice(0, 3), null, ...text.slice(-3)] : text;
    for (const line of shown) {
      if (line === null) rows.push(h("span", { class: "diff-gap" }, "  …\n"));
      else rows.push(h(p.added ? "ins" : p.removed ? "del" : "span", {}, `${sign} ${line}\n`));
    }
  }
  return [
    h("p", { role: "status" }, added || removed ? `v${a} → v${b}: ${added} lines added, ${removed} removed.` : `v${a} and v${b} have the same manifest.`),
    h("pre", { class: "diff", tabindex: "0", "aria-label": `Manifest diff v${a} to v${b}` }, rows),
  ];
}

export async function workflowPage(root, ref, params) {
  const [ns, name] = ref.includes("/") ? ref.split("/", 2) : ["default", ref];
  const base = `/workflows/${encodeURIComponent(ns)}/${encodeURIComponent(name)}`;
  const version = params.get("version") || undefined;
  const detail = await api(base, { params: { version } });
  const label = ns === "default" ? name : `${ns}/${name}`;
  const versionLinks = detail.versions.map((v) =>
    h("a", { href: `#/workflows/${ns}/${name}?version=${v}`, "aria-current": v === detail.version ? "page" : null, class: "chip" }, `v${v}`),
  );
  const inputs = Object.entries(detail.inputs).map(([k, v]) => [h("code", {}, k), v.type, v.required ? "yes" : "no", v.default === undefined ? "" : JSON.stringify(v.default)]);
  const runsLink = (version, status, n) =>
    n ? h("a", { href: `#/runs?workflow=${encodeURIComponent(label)}${status ? `&status=${status}` : ""}` }, String(n)) : "0";
  const counts = (detail.runs || []).map((r) => [
    h("a", { href: `#/workflows/${ns}/${name}?version=${r.version}` }, `v${r.version}`),
    runsLink(r.version, "running", r.running),
    runsLink(r.version, "completed", r.completed),
    runsLink(r.version, "failed", r.failed),
    runsLink(r.version, "cancelled", r.cancelled),
    runsLink(r.version, "continued", r.continued || 0),
  ]);
  const running = (detail.runs || []).reduce((n, r) => n + r.running, 0);
  const redraw = () => window.dispatchEvent(new HashChangeEvent("hashchange"));
  const why = reasonField("pause-workflow-reason", "workflow"); // one reason for either pause
  const actions = h("div", { class: "actions" },
    h("button", { type: "button", id: "start", class: "primary", onclick: () => startDialog(label, detail.inputs) }, "Start a run…"),
    detail.versions.length > 1
      ? h("button", { type: "button", id: "migrate", disabled: !running, "aria-describedby": running ? null : "migrate-why", onclick: () => migrateDialog(base, detail) }, "Migrate running runs…")
      : null,
    detail.versions.length > 1 && !running ? h("span", { id: "migrate-why", class: "hint" }, "No run of this workflow is running.") : null,
    detail.paused ? null : why,
    pauseButton(`/workflows/${ns}/${name}`, "Workflow", !!detail.paused, redraw, { id: "pause-workflow", reason: why }),
    detail.paused ? null : pauseButton(`/workflows/${ns}/${name}`, "Workflow and its runs", false, redraw, { id: "pause-workflow-runs", body: { runs: true }, reason: why }),
  );
  // The manifest as it was applied (YAML, comments and all), else as stored.
  const manifest = detail.source
    ? h("details", { class: "manifest", open: true },
        h("summary", {}, `v${detail.version} as applied (YAML)`),
        h("pre", { tabindex: "0", "aria-label": `Manifest of v${detail.version} as applied` }, detail.source))
    : json(detail.manifest, `v${detail.version}`);

  const older = h("select", { id: "diff-a", name: "a" }, detail.versions.map((v) => h("option", { value: v, selected: v === detail.versions[Math.max(0, detail.versions.length - 2)] }, `v${v}`)));
  const newer = h("select", { id: "diff-b", name: "b" }, detail.versions.map((v) => h("option", { value: v, selected: v === detail.versions[detail.versions.length - 1] }, `v${v}`)));
  const diffOut = h("div", { class: "diff-out" });
  const diffForm = h(
    "form",
    {
      class: "filters",
      onsubmit: async (ev) => {
        ev.preventDefault();
        try {
          const [x, y] = await Promise.all([
            api(base, { params: { version: older.value } }),
            api(base, { params: { version: newer.value } }),
          ]);
          diffOut.replaceChildren(...diffView(x.manifest, y.manifest, older.value, newer.value));
        } catch (e) {
          diffOut.replaceChildren(errorBox(e));
        }
      },
    },
    h("div", { class: "field" }, h("label", { for: "diff-a" }, "From"), older),
    h("div", { class: "field" }, h("label", { for: "diff-b" }, "To"), newer),
    h("button", { type: "submit" }, "Show diff"),
  );

  add(root, 
    h("div", { class: "title-row" }, h("h1", {}, "Workflow ", h("span", { class: "mono" }, label)), h("span", { class: "chip" }, `v${detail.version}`), pausedBadge(detail.paused)),
    detail.paused ? h("p", { class: "warning", id: "workflow-paused" }, `Paused ${pausedText(detail.paused.at, detail.paused.reason)}. Its new runs wait until it is resumed${detail.paused.runs ? "; its runs in flight were paused with it" : ""}.`) : null,
    detail.description ? h("p", {}, detail.description) : null,
    actions,
    h("dl", { class: "meta" },
      h("dt", {}, "Versions"), h("dd", {}, versionLinks),
      h("dt", {}, "Triggers"), h("dd", {}, detail.triggers.length ? detail.triggers.map((t) => h("code", { class: "chip" }, t)) : "none (started by hand)"),
      h("dt", {}, "Spec hash"), h("dd", {}, h("code", {}, detail.spec_hash.slice(0, 16))),
      h("dt", {}, "Runs"), h("dd", {}, h("a", { href: `#/runs?workflow=${encodeURIComponent(label)}` }, "runs of this workflow")),
    ),
    h("h2", {}, "Runs per version"),
    table("Runs per version", ["Version", "Running", "Completed", "Failed", "Cancelled", "Continued"], counts, { empty: "No runs yet." }),
    h("h2", {}, "Inputs"),
    table("!Inputs", ["Input", "Type", "Required", "Default"], inputs, { empty: "No declared inputs." }),
    h("h2", {}, "Diagram"),
    h("div", { class: "diagram-box" }, diagram(detail)),
    h("h2", {}, "Manifest"),
    manifest,
    h("h2", {}, "Compare versions"),
    detail.versions.length > 1 ? [diffForm, diffOut] : h("p", { class: "muted" }, "Only one version is stored."),
  );
}
