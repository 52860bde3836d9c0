// A map's items as a table with a waterfall: each item's attempts (worker, start, duration,
// outcome), a bar per attempt from the map's start, so parallelism and stragglers show.
import { between, duration, h, timeCell } from "./dom.js";
import { short } from "./timeline.js";

// The attempts of each map visit in the log: [{state, started, items, attempts: [...]}].
export function mapRuns(records) {
  const maps = [];
  let map = null;
  const open = new Map(); // action id -> its latest attempt's row
  for (const r of records) {
    const d = r.data || {};
    switch (short(r.type)) {
      case "map.started":
        map = { state: d.state, started: r.time, items: (d.items || []).length, attempts: [] };
        maps.push(map);
        open.clear();
        break;
      case "map.completed":
        map = null;
        break;
      case "action.requested":
        if (map && d.item != null) {
          const row = { item: d.item, attempt: d.attempt || 1, capability: d.workflow ? `workflow ${d.workflow}` : d.capability, start: r.time, end: null, outcome: "running", worker: "" };
          map.attempts.push(row);
          open.set(d.action_id, row);
        }
        break;
      case "action.completed":
      case "action.failed":
      case "action.cancelled": {
        const row = open.get(d.action_id);
        if (!row) break;
        open.delete(d.action_id);
        row.end = r.time;
        row.worker = d.source || "";
        const kind = short(r.type);
        row.outcome = kind === "action.completed" ? "completed" : kind === "action.cancelled" ? "cancelled" : d.error?.class || "failed";
        break;
      }
      default:
    }
  }
  return maps;
}

export function mapSection(records, now = Date.now()) {
  const maps = mapRuns(records).filter((m) => m.attempts.length);
  if (!maps.length) return null;
  return h(
    "section",
    { "aria-labelledby": "map-h" },
    h("h2", { id: "map-h" }, "Map items"),
    maps.map((m, n) => {
      const t0 = new Date(m.started).getTime();
      const ends = m.attempts.map((a) => (a.end ? new Date(a.end).getTime() : now));
      const span = Math.max(1, ...ends.map((e) => e - t0));
      const rows = m.attempts.map((a, i) => {
        const from = new Date(a.start).getTime() - t0;
        const took = ends[i] - new Date(a.start).getTime();
        const fill = h("div", { class: `bar bar-${a.outcome === "completed" ? "good" : a.outcome === "running" ? "running" : "bad"}` });
        // Through the CSSOM: the page's Content-Security-Policy refuses style attributes.
        fill.style.marginLeft = `${(100 * from) / span}%`;
        fill.style.width = `${Math.max(0.5, (100 * took) / span)}%`;
        const bar = h("div", { class: "bar-track", "aria-hidden": "true" }, fill);
        return h("tr", {},
          h("td", {}, String(a.item)),
          h("td", {}, String(a.attempt)),
          h("td", {}, h("code", {}, a.capability)),
          h("td", {}, a.worker || "—"),
          h("td", {}, `+${duration(from) || "0 ms"}`, " ", timeCell(a.start)),
          h("td", {}, a.end ? duration(between(a.start, a.end)) : `${duration(took)} so far`),
          h("td", { class: `outcome-${a.outcome}` }, a.outcome),
          h("td", { class: "waterfall" }, bar));
      });
      return h("div", { class: "table-wrap" },
        h("table", { class: "map-items" },
          h("caption", {}, `Map of ${m.state}${maps.length > 1 ? ` (visit ${n + 1})` : ""}: ${m.items} items, ${m.attempts.length} attempts, from `, timeCell(m.started)),
          h("thead", {}, h("tr", {}, ["Item", "Attempt", "Capability", "Worker", "Start", "Duration", "Outcome", "Waterfall"].map((c) => h("th", { scope: "col" }, c)))),
          h("tbody", {}, rows)));
    }),
  );
}
