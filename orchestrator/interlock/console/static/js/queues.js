// Queues: each concurrency limit and key with runs holding a slot or waiting (GET /queues),
// and the paused workflows, each with a button to resume it.
import { api } from "./api.js";
import { add, h, table, timeCell } from "./dom.js";
import { pauseButton, pausedBadge } from "./pausing.js";

function wait(seconds) {
  if (seconds == null) return "—";
  if (seconds < 60) return `${seconds.toFixed(1)} s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min ${Math.round(seconds % 60)} s`;
  return `${(seconds / 3600).toFixed(1)} h`;
}

export async function queuesPage(root, _arg, _params, current) {
  const [queues, workflows] = await Promise.all([api("/queues"), api("/workflows")]);
  const paused = workflows.filter((w) => w.paused);
  // Redrawn as the router draws a page (the same hash, drawn again).
  const draw = () => current() && window.dispatchEvent(new HashChangeEvent("hashchange"));
  // A line for runs of a paused workflow is named <namespace>/<workflow>@paused.
  const rows = queues.map((q) => {
    const held = q.limit.endsWith("@paused");
    return [
      h("code", {}, q.limit),
      held ? "—" : h("code", {}, q.key),
      held ? "—" : `${q.running}/${q.size}`,
      String(q.queued),
      q.oldest_queued_at ? [wait(q.oldest_wait_s), " (since ", timeCell(q.oldest_queued_at), ")"] : "—",
      held ? h("span", { class: "status status-paused" }, "paused") : "no",
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
  add(root,
    h("h1", {}, "Queues"),
    h("p", { class: "hint" }, "Per concurrency limit and key: the runs holding a slot of the limit, the runs waiting, and how long the first in line has waited."),
    table("!Queues", ["Limit", "Key", "Running", "Queued", "Oldest wait", "Paused"], rows, { empty: "Nothing holds or waits for a slot.", stacked: true }),
    h("h2", { id: "paused-h" }, "Paused workflows"),
    table("!Paused workflows", ["Workflow", "State", "Reason", "Runs paused with it", "Since", "Act"], pausedRows, { empty: "No workflow is paused.", stacked: true }),
  );
}
