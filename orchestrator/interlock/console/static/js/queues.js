// Queues: each line of GET /queues (a concurrency limit and key, a capability's limit or
// rate, a trigger's window, what a paused workflow or capability holds), with a button to
// pause or resume each capability; the paused workflows, each with a button to resume it;
// and a form to pause a capability that holds nothing yet. The lines come a page at a time
// (GET /queues?after=&limit=, its Link header naming the next): #/queues?after=TOKEN&limit=N.
import { api, apiPage } from "./api.js";
import { add, h, table, timeCell } from "./dom.js";
import { pauseButton, pausedBadge, reasonField } from "./pausing.js";

function wait(seconds) {
  if (seconds == null) return "—";
  if (seconds < 60) return `${seconds.toFixed(1)} s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min ${Math.round(seconds % 60)} s`;
  return `${(seconds / 3600).toFixed(1)} h`;
}

const capPath = (name) => `/capabilities/${encodeURIComponent(name)}`;

export async function queuesPage(root, _arg, params, current) {
  const after = params.get("after") || "";
  const limit = params.get("limit") || "";
  const [page, workflows, agents] = await Promise.all([
    apiPage("/queues", { after, limit }), api("/workflows"), api("/agents"),
  ]);
  const at = (token) => {
    const q = new URLSearchParams();
    if (token) q.set("after", token);
    if (limit) q.set("limit", limit);
    location.hash = `#/queues${q.size ? `?${q}` : ""}`;
  };
  const queues = page.data;
  const paused = workflows.filter((w) => w.paused);
  // Redrawn as the router draws a page (the same hash, drawn again).
  const draw = () => current() && window.dispatchEvent(new HashChangeEvent("hashchange"));
  const pausedCaps = new Set(queues.filter((q) => q.capability && q.paused).map((q) => q.capability));
  const buttoned = new Set();
  const rows = queues.map((q) => {
    // A line for what a paused workflow or capability holds is named ...@paused.
    const held = q.kind === "paused" || q.limit.endsWith("@paused");
    const first = q.capability && !buttoned.has(q.capability);
    if (first) buttoned.add(q.capability);
    return [
      h("code", {}, q.limit),
      q.kind || "concurrency",
      held || !q.key ? "—" : h("code", {}, q.key), // no key: one line for the limit (the CLI's -)
      held ? "—" : `${q.running}/${q.size}`,
      String(q.queued),
      q.oldest_queued_at ? [wait(q.oldest_wait_s), " (since ", timeCell(q.oldest_queued_at), ")"] : "—",
      q.paused || held
        ? [h("span", { class: "status status-paused" }, "paused"),
           q.paused_since ? [" since ", timeCell(q.paused_since)] : null,
           q.paused_reason ? `${q.paused_since ? ":" : ""} ${q.paused_reason}` : null]
        : "no",
      first ? pauseButton(capPath(q.capability), `Capability ${q.capability}`, pausedCaps.has(q.capability), draw) : "",
    ];
  });
  const pausedRows = paused.map((w) => {
    const ref = `${w.namespace}/${w.name}`;
    return [
      h("a", { href: `#/workflows/${ref}` }, ref),
      pausedBadge(w.paused),
      w.paused.reason || "",
      w.paused.runs ? "yes" : "no",
      timeCell(w.paused.at),
      pauseButton(`/workflows/${encodeURIComponent(w.namespace)}/${encodeURIComponent(w.name)}`, "Workflow", true, draw),
    ];
  });
  const names = [...new Set(agents.flatMap((a) => a.capabilities.map((c) => c.name)))].filter((n) => !pausedCaps.has(n)).sort();
  const choice = h("select", { id: "pause-cap", name: "capability" }, names.map((n) => h("option", { value: n }, n)));
  const why = reasonField("pause-cap-reason", null); // named by its <label>
  const go = () => pauseButton(capPath(choice.value), `Capability ${choice.value}`, false, draw, { reason: why }).click();
  const pauseForm = names.length
    ? h("form", { class: "filters", onsubmit: (ev) => { ev.preventDefault(); go(); } },
        h("div", { class: "field" }, h("label", { for: "pause-cap" }, "Capability"), choice),
        h("div", { class: "field" }, h("label", { for: "pause-cap-reason" }, "Reason"), why),
        h("button", { type: "button", id: "pause-cap-go", onclick: go }, "Pause capability"))
    : null;
  add(root,
    h("h1", {}, "Queues"),
    h("p", { class: "hint" }, "Per concurrency limit and key: the runs (or a capability's requests) holding a slot of the limit, those waiting, and how long the first in line has waited."),
    table("!Queues", ["Limit", "Kind", "Key", "Running", "Queued", "Oldest wait", "Paused", "Act"], rows, { empty: "Nothing holds or waits for a slot.", stacked: true }),
    after || page.next
      ? h("nav", { class: "pager", "aria-label": "Pages of queues" },
          h("button", { type: "button", id: "queues-first", disabled: !after, onclick: () => at("") }, "← First"),
          h("span", { role: "status" }, after ? "Lines further on" : "First lines"),
          h("button", { type: "button", id: "queues-next", disabled: !page.next,
                        onclick: () => at(page.next) }, "Next →"))
      : null,
    h("h2", { id: "paused-h" }, "Paused workflows"),
    table("!Paused workflows", ["Workflow", "State", "Reason", "Runs paused with it", "Since", "Act"], pausedRows, { empty: "No workflow is paused.", stacked: true }),
    h("h2", { id: "pause-cap-h" }, "Pause a capability"),
    h("p", { class: "hint" }, "Nothing more of a paused capability is dispatched; its requests wait, in order, until it is resumed."),
    pauseForm || h("p", { class: "muted" }, "No capability to pause."),
  );
}
