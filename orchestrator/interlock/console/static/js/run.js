// A run: its diagram, what it waits for now (and buttons to move it), outputs or error, and
// the timeline of its log, kept live by the log stream while it runs.
import { api, ApiError, config, follow } from "./api.js";
import { diagram, takenEdges } from "./diagram.js";
import { add, ask, between, duration, errorBox, h, json, status, table, timeCell, toast } from "./dom.js";
import { Timeline } from "./timeline.js";

const PAGE = 5000;

// The whole log: the first page at once, the others as soon as the run's description
// (asked for at the same time) says how many records there are, all at the same time.
async function wholeLog(runId, described) {
  const page = (offset) =>
    api(`/runs/${encodeURIComponent(runId)}/log`, { params: { limit: PAGE, offset } });
  const first = page(0);
  const { records: count } = await described;
  const rest = [];
  for (let offset = PAGE; offset < count; offset += PAGE) rest.push(page(offset));
  const pages = await Promise.all([first, ...rest]);
  const records = pages.flatMap((p) => p.records);
  // Records appended meanwhile: the pages after the counted ones.
  let next = pages[pages.length - 1].next_offset;
  while (next !== null) {
    const more = await page(next);
    records.push(...more.records);
    next = more.next_offset;
  }
  return records;
}

function workflowPath(desc) {
  return `/workflows/${encodeURIComponent(desc.namespace)}/${encodeURIComponent(desc.workflow)}`;
}

function traceLink(template, runId, records) {
  if (!template) return null;
  const withTrace = records.find((r) => r.traceparent);
  if (!withTrace) return null;
  const traceId = withTrace.traceparent.split("-")[1];
  const href = template.replaceAll("{trace_id}", traceId).replaceAll("{run_id}", runId);
  return h("a", { href, target: "_blank", rel: "noopener noreferrer" }, `trace ${traceId.slice(0, 12)}…`);
}

export async function runPage(root, runId, _params, current) {
  const path = `/runs/${encodeURIComponent(runId)}`;
  performance.mark("run:start");
  const described = api(path);
  // The workflow version the run is on (for the diagram), asked for once the description
  // names it, while the log is still coming.
  const drawn = described.then((d) =>
    api(workflowPath(d), { params: { version: d.version } }).catch((e) => {
      if (e instanceof ApiError && e.status === 404) return null;
      throw e;
    }),
  );
  const [first, settings, records, detail] = await Promise.all([
    described,
    config(),
    wholeLog(runId, described),
    drawn,
  ]);
  performance.mark("run:fetched");
  let desc = first;

  const header = h("div", { class: "title-row" });
  const meta = h("dl", { class: "meta" });
  const now = h("section", { "aria-labelledby": "now-h" });
  const ending = h("section", { "aria-labelledby": "end-h" });
  const picture = h("div", { class: "diagram-box", tabindex: "-1" });
  const visitsPanel = h("div", { class: "visits", "aria-live": "polite" });
  const timeline = new Timeline();
  timeline.load(records);
  performance.mark("run:timeline");

  function drawHeader() {
    header.replaceChildren(h("h1", {}, "Run ", h("span", { class: "mono" }, desc.run_id)), status(desc.status));
    const wf = desc.namespace === "default" ? desc.workflow : `${desc.namespace}/${desc.workflow}`;
    const items = [
      ["Workflow", h("a", { href: `#/workflows/${desc.namespace}/${desc.workflow}?version=${desc.version}` }, `${wf} v${desc.version}`)],
      ["State", h("code", {}, desc.state || "—")],
      ["Started", timeCell(desc.started_at)],
      desc.finished_at ? ["Finished", timeCell(desc.finished_at)] : null,
      ["Duration", duration(between(desc.started_at, desc.finished_at || new Date().toISOString()))],
      ["Records", String(desc.records)],
      desc.parent_run ? ["Parent run", h("a", { href: `#/runs/${encodeURIComponent(desc.parent_run)}` }, desc.parent_run)] : null,
      desc.correlation_key ? ["Correlation key", h("code", {}, desc.correlation_key)] : null,
    ];
    const trace = traceLink(settings.trace_url, desc.run_id, records);
    if (trace) items.push(["Trace", trace]);
    meta.replaceChildren(...items.filter(Boolean).flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
  }

  function drawNow() {
    if (desc.status !== "running") {
      now.replaceChildren();
      now.hidden = true;
      return;
    }
    now.hidden = false;
    const pending = desc.pending.map((p) => [
      h("code", {}, p.capability),
      p.action_id,
      `${p.attempt} of ${p.max_attempts}`,
      p.item != null ? `item ${p.item}` : p.iteration != null ? `iteration ${p.iteration}` : "",
      timeCell(p.requested_at),
      p.deadline ? timeCell(p.deadline) : "none",
    ]);
    const waits = desc.waiting_for.map((w) => [
      h("code", {}, w.event),
      w.kind,
      w.guard ? h("code", {}, w.guard) : "—",
      h("code", {}, w.goto),
    ]);
    const timers = desc.timers.map((t) => [t.purpose, timeCell(t.fire_at), t.state || "", t.action_id || ""]);
    const signals = [...new Set(desc.waiting_for.filter((w) => w.kind !== "answer").map((w) => w.event))];
    now.replaceChildren(...[
      h("h2", { id: "now-h" }, "Waiting for"),
      h("div", { class: "actions" },
        h("button", { type: "button", id: "signal", onclick: () => signal(signals) }, "Send signal…"),
        h("button", { type: "button", id: "cancel", class: "danger", onclick: cancel }, "Cancel run…"),
      ),
      desc.map ? h("p", {}, `Map: ${desc.map.done} of ${desc.map.items} items done, ${desc.map.failed} failed (parallelism ${desc.map.parallelism}, join ${desc.map.completion}).`) : null,
      table("Pending actions", ["Capability", "Action", "Attempt", "Item", "Requested", "Deadline"], pending, { empty: "No pending actions." }),
      table("Events that move it", ["Event", "Kind", "Guard", "Goes to"], waits, { empty: "No transitions wait here." }),
      table("Timers", ["Purpose", "Fires at", "State", "Action"], timers, { empty: "No timers." }),
    ].filter(Boolean));
  }

  function drawEnding() {
    const parts = [];
    if (desc.outputs && Object.keys(desc.outputs).length) {
      parts.push(h("h2", { id: "end-h" }, "Outputs"), h("pre", { class: "outputs", tabindex: "0" }, JSON.stringify(desc.outputs, null, 2)));
    }
    if (desc.error) {
      parts.push(
        h("h2", { id: "end-h" }, "Error"),
        h("p", { class: "error" }, h("strong", {}, desc.error.class), ": ", desc.error.message, desc.error.code ? ` (${desc.error.code})` : ""),
      );
    }
    if (desc.reason) parts.push(h("h2", { id: "end-h" }, "Cancelled"), h("p", {}, desc.reason));
    ending.replaceChildren(...parts);
    ending.hidden = !parts.length;
  }

  function visitedOf() {
    const visited = new Map();
    for (const [state, visits] of timeline.visits) visited.set(state, visits.length);
    return visited;
  }

  let seen = [...records];
  function drawDiagram() {
    if (!detail) {
      picture.replaceChildren(h("p", { class: "muted" }, `Version ${desc.version} of ${desc.workflow} is not stored: no diagram.`));
      return;
    }
    picture.replaceChildren(
      diagram(detail, {
        visited: visitedOf(),
        taken: takenEdges(detail, seen),
        current: desc.state,
        currentStatus: desc.status,
        onSelect: showVisits,
      }),
    );
  }

  function showVisits(state) {
    const visits = timeline.visits.get(state) || [];
    for (const n of picture.querySelectorAll(".node.selected")) n.classList.remove("selected");
    picture.querySelector(`.node[data-state="${CSS.escape(state)}"]`)?.classList.add("selected");
    visitsPanel.replaceChildren(
      h("h3", {}, "Visits of ", h("code", {}, state)),
      visits.length
        ? h("ol", {}, visits.map((v) =>
            h("li", {},
              h("button", { type: "button", class: "link", onclick: () => {
                const el = timeline.revealGroup(v.id);
                el.scrollIntoView({ block: "start" });
                el.focus({ preventScroll: true });
              } }, `Visit ${v.n}`),
              ": entered ", timeCell(v.entered),
              v.left ? `, left after ${duration(between(v.entered, v.left))}` : " (still there)",
            )))
        : h("p", { class: "muted" }, "The run never entered this state."),
    );
  }

  async function signal(events) {
    const list = "signal-events";
    const values = await ask(
      "Send a signal",
      [
        h("label", { for: "sig-name" }, "Event type"),
        h("input", { id: "sig-name", name: "name", required: true, list, value: events[0] || "", spellcheck: "false" }),
        h("datalist", { id: list }, events.map((e) => h("option", { value: e }))),
        h("label", { for: "sig-data" }, "Data (JSON, optional)"),
        h("textarea", { id: "sig-data", name: "data", rows: 4, spellcheck: "false" }),
      ],
      "Send",
    );
    if (!values) return;
    let data;
    try {
      data = values.data.trim() ? JSON.parse(values.data) : undefined;
    } catch (e) {
      toast(`The data is not JSON: ${e.message}`, "bad");
      return;
    }
    try {
      const result = await api(`${path}/signals/${encodeURIComponent(values.name)}`, { method: "POST", body: data ?? null, params: { wait: 5 } });
      const moved = result.outcome === "moved" ? ` to ${result.to_state}` : "";
      toast(`Signal ${values.name}: ${result.outcome}${moved}`, result.outcome === "moved" ? "good" : "info");
      refresh();
    } catch (e) {
      toast(e.message, "bad");
    }
  }

  async function cancel() {
    const values = await ask(
      `Cancel run ${desc.run_id}?`,
      [
        h("p", {}, "Its pending actions are cancelled and it ends as cancelled. This cannot be undone."),
        h("label", { for: "cancel-reason" }, "Reason"),
        h("input", { id: "cancel-reason", name: "reason", value: "cancelled in the console" }),
      ],
      "Cancel run",
      { danger: true },
    );
    if (!values) return;
    try {
      const r = await api(`${path}/cancel`, { method: "POST", body: { reason: values.reason || "cancelled in the console" } });
      toast(r.cancelled ? "The run was cancelled." : "The run had already ended.", "good");
      refresh();
    } catch (e) {
      toast(e.message, "bad");
    }
  }

  const replayBox = h("div", { class: "replay" });
  function drawReplay() {
    if (!detail || detail.versions.length < 2) {
      replayBox.replaceChildren(h("p", { class: "muted" }, "No other stored version to replay this run against."));
      return;
    }
    const select = h("select", { id: "replay-version", name: "version" },
      detail.versions.filter((v) => v !== desc.version).map((v) => h("option", { value: v }, `v${v}`)));
    const out = h("div", { "aria-live": "polite" });
    replayBox.replaceChildren(
      h("form", { class: "filters", onsubmit: async (ev) => {
        ev.preventDefault();
        out.replaceChildren(h("p", { class: "muted" }, "Replaying…"));
        try {
          const report = await api(`${path}/replay`, { params: { against: select.value } });
          out.replaceChildren(
            h("p", {}, report.agree
              ? `v${select.value} makes the same decisions on this run's inputs.`
              : `v${select.value} diverges at record #${report.divergence?.seq}: ${report.divergence?.reason || report.divergence?.kind || ""}`),
            json(report, "report"),
          );
        } catch (e) {
          out.replaceChildren(errorBox(e));
        }
      } },
        h("div", { class: "field" }, h("label", { for: "replay-version" }, "Replay against"), select),
        h("button", { type: "submit" }, "Replay"),
      ),
      out,
    );
  }

  let explainAsked = 0;
  async function explain() {
    const ticket = ++explainAsked;
    try {
      const report = await api(`${path}/explain`);
      if (ticket !== explainAsked || !current()) return;
      for (const step of report.steps) timeline.explain(step);
      performance.mark("run:explained");
    } catch {
      // Without the definition (or on a log it cannot re-drive) the timeline has no guards.
    }
  }

  let pending = null;
  function refresh() {
    clearTimeout(pending);
    pending = setTimeout(async () => {
      try {
        desc = await api(path);
      } catch {
        return;
      }
      if (!current()) return;
      drawHeader();
      drawNow();
      drawEnding();
      drawDiagram();
      if (desc.status !== "running") explain();
    }, 150);
  }

  drawHeader();
  drawNow();
  drawEnding();
  drawDiagram();
  drawReplay();
  add(root, 
    header,
    meta,
    now,
    ending,
    h("section", { "aria-labelledby": "diagram-h" },
      h("h2", { id: "diagram-h" }, "Diagram"),
      h("p", { class: "hint" }, "Visited states are shaded, taken transitions drawn bold, the current state outlined. Choose a state to list its visits."),
      h("div", { class: "diagram-row" }, picture, visitsPanel)),
    h("section", { "aria-labelledby": "timeline-h" }, h("h2", { id: "timeline-h" }, "Timeline"), timeline.el),
    h("section", { "aria-labelledby": "inputs-h" },
      h("h2", { id: "inputs-h" }, "Inputs and context"),
      json(desc.inputs, "inputs"),
      json(desc.context, "context")),
    h("section", { "aria-labelledby": "replay-h" }, h("h2", { id: "replay-h" }, "Replay"), replayBox),
  );
  performance.mark("run:built");
  explain();

  let stop = null;
  if (desc.status === "running") {
    stop = follow(runId, records.length, {
      onRecord: (r, position) => {
        if (!current() || position < seen.length) return;
        seen.push(r);
        timeline.add(r, position + 1);
        refresh();
      },
      onEnd: refresh,
    });
  }
  return () => {
    stop?.();
    timeline.stop();
    clearTimeout(pending);
  };
}
