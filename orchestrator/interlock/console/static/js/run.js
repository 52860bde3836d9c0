// A run: its diagram, what it waits for now (and buttons to move it), outputs or error, and
// the timeline of its log, kept live by the log stream while it runs.
//
// The page reads what it shows. First the run's description (from its snapshot and the
// records after it: the same cost at any log length), which says its workflow and version,
// status and state, and how many records its log holds; then, together, the diagram's
// version and the newest page of its log (the records before them are read a page at a
// time when the reader asks for them, with "Earlier records"); then, while it runs, the
// records appended, live. A run of 100,000 records reads one page of them.
import { forkDialog, signalDialog } from "./acting.js";
import { api, ApiError, config, follow } from "./api.js";
import { diagram, takenEdges } from "./diagram.js";
import { add, ask, between, duration, errorBox, h, json, status, table, timeCell, toast } from "./dom.js";
import { mapSection } from "./mapitems.js";
import { pauseButton, pausedBadge, pausedText } from "./pausing.js";
import { CHUNK, Timeline } from "./timeline.js";

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
  const [described, settings] = await Promise.all([api(path), config()]);
  performance.mark("run:fetched");
  let desc = described;

  // The workflow version the diagram draws (undefined: not asked for yet; null: not stored).
  let detail;
  let detailOf = null;
  async function fetchDetail(of) {
    const key = `${of.namespace}/${of.workflow}@${of.version}`;
    if (detailOf === key) return;
    detailOf = key;
    try {
      detail = await api(workflowPath(of), { params: { version: of.version } });
    } catch (e) {
      if (!(e instanceof ApiError && e.status === 404)) throw e;
      detail = null;
    }
  }
  // A page of the log: the records from `from` up to `to` (at most one page).
  const logPage = async (from, to) =>
    (await api(`${path}/log`, { params: { offset: from, limit: Math.max(1, to - from) } })).records;
  // The newest page, and the diagram's version, together.
  let base = Math.max(0, desc.records - CHUNK);
  const tailed = desc.records ? logPage(base, desc.records) : Promise.resolve([]);
  const detailed = fetchDetail(desc);
  for (const p of [tailed, detailed]) p.catch(() => {}); // awaited below; a failure is shown there
  // The records read: the log's from `base` on.
  let seen = [];

  const header = h("div", { class: "title-row" });
  const meta = h("dl", { class: "meta" });
  // What reading the log found wrong: messages in it Interlock did not write (skipped).
  const warned = h("div", { class: "log-warnings", role: "status" });
  const now = h("section", { "aria-labelledby": "now-h" });
  const ending = h("section", { "aria-labelledby": "end-h" });
  const picture = h("div", { class: "diagram-box", tabindex: "-1" });
  const visitsPanel = h("div", { class: "visits", "aria-live": "polite" });
  const timeline = new Timeline({
    onEarlier: async (from, to) => {
      const earlier = await logPage(from, to);
      if (!live()) return [];
      base = from;
      seen = [...earlier, ...seen];
      return earlier;
    },
    onPrepend: () => {
      drawHeader();
      drawDiagram();
      drawMap();
    },
  });
  // What the last signal sent from this page did (kept across redraws).
  const signalOut = h("div", { id: "signal-outcome", role: "status" });
  const mapBox = h("div");
  function drawMap() {
    mapBox.replaceChildren(...[mapSection(seen)].filter(Boolean));
  }
  const inputs = h("div");
  const replayBox = h("div", { class: "replay" });
  now.hidden = true;
  ending.hidden = true;

  function drawHeader() {
    const known = desc;
    header.replaceChildren(
      h("h1", {}, "Run ", h("span", { class: "mono" }, known.run_id || runId)),
      desc ? status(desc.status) : h("span", { class: "muted", id: "run-reading" }, "reading its log…"),
      // (replaceChildren writes a null as the text "null")
      ...[pausedBadge(desc?.paused)].filter(Boolean),
    );
    const wf = known.namespace === "default" ? known.workflow : `${known.namespace}/${known.workflow}`;
    const items = [
      known.workflow ? ["Workflow", h("a", { href: `#/workflows/${known.namespace}/${known.workflow}?version=${known.version}` }, `${wf} v${known.version}`)] : null,
      desc ? ["State", h("code", {}, desc.state || "—")] : null,
      known.started_at ? ["Started", timeCell(known.started_at)] : null,
      desc?.forked_from
        ? ["Forked from", h("span", { id: "forked-from" },
            h("a", { href: `#/runs/${encodeURIComponent(desc.forked_from.run_id)}`, class: "mono" }, desc.forked_from.run_id),
            ` at #${desc.forked_from.seq}`,
            ...(desc.forked_from.started_at ? [", which started ", timeCell(desc.forked_from.started_at)] : []))]
        : null,
      desc?.finished_at ? ["Finished", timeCell(desc.finished_at)] : null,
      desc ? ["Duration", duration(between(desc.started_at, desc.finished_at || new Date().toISOString()))] : null,
      desc ? ["Records", String(desc.records)] : null,
      desc?.chain?.previous
        ? ["Continues", h("span", {},
            h("a", { href: `#/runs/${encodeURIComponent(desc.chain.previous)}`, id: "chain-previous", class: "mono" }, desc.chain.previous),
            ` (run ${desc.chain.link + 1} of its chain; ${desc.chain.reason || "transition"})`)]
        : null,
      desc?.chain?.next
        ? ["Continued as", h("a", { href: `#/runs/${encodeURIComponent(desc.chain.next)}`, id: "chain-next", class: "mono" }, desc.chain.next)]
        : null,
      desc?.history?.suggested
        ? ["History", h("span", { class: "warning" },
            `${desc.history.records} records, ${desc.history.bytes} bytes: near its limit (${desc.history.max_records} records, ${desc.history.max_bytes} bytes); ` +
            (desc.history.continue_as_new === "auto" ? "it continues as new at its next transition" : "it fails at the limit"))]
        : null,
      desc?.parent_run ? ["Parent run", h("a", { href: `#/runs/${encodeURIComponent(desc.parent_run)}` }, desc.parent_run)] : null,
      desc?.correlation_key ? ["Correlation key", h("code", {}, desc.correlation_key)] : null,
    ];
    const trace = traceLink(settings.trace_url, runId, seen);
    if (trace) items.push(["Trace", trace]);
    meta.replaceChildren(...items.filter(Boolean).flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
    warned.replaceChildren(...(desc?.warnings || []).map((w) => h("p", { class: "warning" }, w)));
  }

  function drawNow() {
    if (!desc || desc.status !== "running") {
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
    const timers = desc.timers.map((t) => [t.purpose, timeCell(t.fire_at), t.state || "", t.action_id || "", timerGoes(t)]);
    now.replaceChildren(...[
      h("h2", { id: "now-h" }, "Waiting for"),
      h("div", { class: "actions" },
        h("button", { type: "button", id: "signal", onclick: () => signalDialog(path, desc.waiting_for, signalOut, refresh) }, "Send signal…"),
        h("button", { type: "button", id: "cancel", class: "danger", onclick: cancel }, "Cancel run…"),
        pauseButton(path, "Run", !!desc.paused, refresh, { id: "pause-run" }),
      ),
      desc.paused ? h("p", { class: "warning", id: "run-paused" }, `Paused ${pausedText(desc.paused.at, desc.paused.reason)}${desc.paused.workflow ? " (with its workflow)" : ""}. It takes no transition until resumed; ${desc.paused.held} event(s) held.`) : null,
      desc.map ? h("p", {}, `Map: ${desc.map.done} of ${desc.map.items} items done, ${desc.map.failed} failed (parallelism ${desc.map.parallelism}, join ${desc.map.completion}).`) : null,
      table("Pending actions", ["Capability", "Action", "Attempt", "Item", "Requested", "Deadline"], pending, { empty: "No pending actions." }),
      table("Events that move it", ["Event", "Kind", "Guard", "Goes to"], waits, { empty: "No transitions wait here." }),
      table("Timers", ["Purpose", "Fires at", "State", "Action", "Then"], timers, { empty: "No timers." }),
      slotsTable(),
      signalOut,
    ].filter(Boolean));
    warnUnserved();
  }

  // The concurrency slots the run needs: held, or its place in line (under a fair-share
  // limit, among its fairness key's runs).
  function slotsTable() {
    if (!desc.slots?.length) return null;
    const rows = desc.slots.map((slot) => [
      h("code", {}, slot.limit),
      h("code", {}, slot.key),
      String(slot.size),
      slot.holding ? "holds one" : slot.place != null ? `waits, ${slot.place === 1 ? "next" : `place ${slot.place}`} in line${slot.fair ? ` among ${slot.fair}'s runs` : ""}` : "waits",
      slot.running == null ? "—" : String(slot.running),
    ]);
    return h("div", {},
      desc.queued ? h("p", { class: "warning", id: "queued" }, "Queued: the run enters its first state once it holds a slot of every limit below.") : null,
      table("Concurrency slots", ["Limit", "Key", "Slots", "This run", "Runs holding one"], rows));
  }

  // What a timer does when it fires: a state timeout's target, from the diagram's version.
  function timerGoes(t) {
    if (t.purpose === "state-timeout") {
      const edge = detail?.transitions?.find((e) => e.kind === "timeout" && e.from === t.state);
      return edge ? ["goes to ", h("code", {}, edge.to)] : "leaves the state";
    }
    if (t.purpose === "action-timeout") return "fails the attempt (timeout)";
    if (t.purpose === "retry") return "asks again";
    if (t.purpose === "run-deadline") return "ends the run's deadline";
    return "";
  }

  // A pending action whose capability no live worker serves waits until one starts: say so.
  let workersOf = null;
  async function warnUnserved() {
    const asked = [...new Set((desc?.pending || []).map((p) => p.capability).filter((c) => !c.startsWith("workflow:")))];
    if (!asked.length) return;
    if (!workersOf) {
      try {
        const agents = await api("/agents");
        workersOf = new Map(agents.flatMap((a) => a.capabilities.map((c) => [c.name, c.workers])));
      } catch {
        return;
      }
    }
    if (!current() || now.hidden) return;
    const idle = asked.filter((c) => !workersOf.get(c));
    now.querySelector("#unserved")?.remove();
    if (!idle.length) return;
    now.querySelector("h2").after(
      h("p", { class: "warning", id: "unserved", role: "alert" },
        `No live worker serves ${idle.join(", ")}: `,
        "the run waits until one starts (see ", h("a", { href: "#/agents" }, "Agents"), ")."),
    );
  }

  function drawEnding() {
    const parts = [];
    if (!desc) return;
    if (desc.outputs && Object.keys(desc.outputs).length) {
      // Collapsed when long: the diagram and the timeline stay near the top.
      const text = JSON.stringify(desc.outputs, null, 2);
      const lines = text.split("\n").length;
      parts.push(
        h("h2", { id: "end-h" }, "Outputs"),
        h("details", { class: "outputs", open: lines <= 12 },
          h("summary", {}, `${Object.keys(desc.outputs).length} output${Object.keys(desc.outputs).length === 1 ? "" : "s"}, ${lines} lines`),
          h("pre", { tabindex: "0" }, text)),
      );
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

  function drawDiagram() {
    const of = desc;
    if (detail === undefined) {
      picture.replaceChildren(h("p", { class: "muted" }, "Drawing the diagram…"));
      return;
    }
    if (!detail) {
      picture.replaceChildren(h("p", { class: "muted" }, `Version ${of.version} of ${of.workflow} is not stored: no diagram.`));
      return;
    }
    // The run's path as far as the records read say (a long log's earlier records add
    // theirs when read); its current state from the description.
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

  // The diagram scrolled (inside its box) to the state the run is in: on a phone the
  // box is narrower than the diagram.
  function showCurrent() {
    const node = picture.querySelector(".node.current");
    if (!node) return;
    const box = picture.getBoundingClientRect();
    const at = node.getBoundingClientRect();
    picture.scrollLeft += at.left + at.width / 2 - (box.left + box.width / 2);
    picture.scrollTop += at.top + at.height / 2 - (box.top + box.height / 2);
  }

  function showVisits(state) {
    const visits = timeline.visits.get(state) || [];
    for (const n of picture.querySelectorAll(".node.selected")) n.classList.remove("selected");
    picture.querySelector(`.node[data-state="${CSS.escape(state)}"]`)?.classList.add("selected");
    visitsPanel.replaceChildren(
      // Of a log read from its middle, the visits counted from the first record read.
      h("h3", {}, "Visits of ", h("code", {}, state), timeline.base > 0 ? " in the records read" : ""),
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

  function drawReplay() {
    if (!desc) return;
    const fork = h("div", { class: "actions" },
      h("button", { type: "button", id: "fork", onclick: () => forkDialog(path, desc, detail?.versions || [desc.version]) }, "Fork…"),
      h("span", { class: "hint" }, "a new run from this run's first records, on this or another version, previewed before it is made"));
    if (!detail || detail.versions.length < 2) {
      replayBox.replaceChildren(h("p", { class: "muted" }, "No other stored version to replay this run against."), fork);
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
      fork,
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
      drawMap();
      if (desc.status !== "running") explain();
    }, 150);
  }

  function drawInputs() {
    if (desc) inputs.replaceChildren(json(desc.inputs, "inputs"), json(desc.context, "context"));
    else inputs.replaceChildren(h("p", { class: "muted" }, "Reading the run's log…"));
  }

  drawHeader();
  drawDiagram();
  drawInputs();
  add(root,
    header,
    meta,
    warned,
    now,
    h("section", { "aria-labelledby": "diagram-h" },
      h("h2", { id: "diagram-h" }, "Diagram"),
      h("p", { class: "hint" }, "Visited states are shaded, taken transitions drawn bold (as far as the timeline's records go), the current state outlined. Choose a state to list its visits."),
      h("div", { class: "diagram-row" }, picture, visitsPanel)),
    ending,
    mapBox,
    h("section", { "aria-labelledby": "timeline-h" }, h("h2", { id: "timeline-h" }, "Timeline"), timeline.el),
    h("section", { "aria-labelledby": "inputs-h" }, h("h2", { id: "inputs-h" }, "Inputs and context"), inputs),
    h("section", { "aria-labelledby": "replay-h" }, h("h2", { id: "replay-h" }, "Replay and fork"), replayBox),
  );
  performance.mark("run:built");

  let stop = null;
  let closed = false;
  const live = () => !closed && current();
  // The newest records and the diagram's version.
  (async () => {
    try {
      [seen] = await Promise.all([tailed, detailed]);
    } catch (e) {
      if (!live()) return;
      header.querySelector("#run-reading")?.remove();
      now.hidden = false;
      now.replaceChildren(errorBox(e));
      return;
    }
    if (!live()) return;
    timeline.load(seen, { base });
    performance.mark("run:painted");
    drawHeader();
    drawNow();
    drawEnding();
    drawDiagram();
    requestAnimationFrame(showCurrent);
    drawMap();
    drawReplay();
    drawInputs();
    performance.mark("run:complete");
    explain();
    if (desc.status === "running") {
      stop = follow(runId, base + seen.length, {
        onRecord: (r, position) => {
          if (!current() || position < base + seen.length) return;
          seen.push(r);
          timeline.add(r, position + 1);
          refresh();
        },
        onEnd: refresh,
      });
    }
  })();

  return () => {
    closed = true;
    stop?.();
    timeline.stop();
    clearTimeout(pending);
  };
}
