// A run's log for people: records in order, grouped by state visit, each explained.
import { between, duration, h, json, timeCell } from "./dom.js";

export const PREFIX = "io.interlock.";

export function short(type) {
  return type.startsWith(PREFIX) ? type.slice(PREFIX.length) : type;
}

const code = (text) => h("code", {}, text);

// What is known while reading the log front to back (durations need the request times).
export class Reading {
  constructor() {
    this.requested = new Map(); // action id -> time of its latest attempt's request
    this.start = null;
  }

  describe(r) {
    const d = r.data || {};
    switch (short(r.type)) {
      case "run.started":
        this.start = r.time;
        return [
          `run of ${d.namespace && d.namespace !== "default" ? `${d.namespace}/` : ""}${d.workflow} v${d.version ?? 1}`,
          d.inputs && Object.keys(d.inputs).length ? json(d.inputs, "inputs") : null,
          d.trigger ? json(d.trigger, "trigger") : null,
          d.parent ? [" child of ", h("a", { href: `#/runs/${encodeURIComponent(d.parent.run_id)}` }, d.parent.run_id)] : null,
        ];
      case "state.entered":
        return ["entered ", code(d.state)];
      case "action.requested": {
        this.requested.set(d.action_id, r.time);
        const what = d.workflow ? `workflow ${d.workflow}` : d.capability;
        const max = d.retry?.max_attempts || 1;
        return [
          "asked ",
          code(what),
          ` (action ${d.index}${d.item != null ? `, item ${d.item}` : ""}${d.iteration != null ? `, iteration ${d.iteration}` : ""}, attempt ${d.attempt || 1} of ${max})`,
          d.deadline ? [" deadline ", timeCell(d.deadline)] : null,
          json(d.input, "input"),
        ];
      }
      case "action.completed": {
        const took = duration(between(this.requested.get(d.action_id), r.time));
        return [
          `action ${d.index}${d.item != null ? ` item ${d.item}` : ""} answered`,
          d.event_type && d.event_type !== "task.completed" ? [" as ", code(d.event_type)] : null,
          took ? ` after ${took}` : null,
          d.source ? ` by ${d.source}` : null,
          json(d.result, "result"),
          d.context_writes && Object.keys(d.context_writes).length ? json(d.context_writes, "context writes") : null,
        ];
      }
      case "action.failed": {
        const took = duration(between(this.requested.get(d.action_id), r.time));
        return [
          `action ${d.index}${d.item != null ? ` item ${d.item}` : ""} failed (attempt ${d.attempt || 1})`,
          took ? ` after ${took}` : null,
          ": ",
          h("span", { class: "bad" }, d.error?.class || "error"),
          " ",
          d.error?.message || "",
          d.will_retry ? h("span", { class: "muted" }, " — will retry") : null,
        ];
      }
      case "action.cancelled":
        return [`action ${d.action_id} cancelled`, d.reason ? `: ${d.reason}` : ""];
      case "map.started":
        return [
          `map over ${(d.items || []).length} items (parallelism ${d.parallelism}, join ${d.completion})`,
          json(d.items, "items"),
        ];
      case "map.completed":
        return ["map joined", json(d.result, "result")];
      case "event.received": {
        const e = d.event || {};
        return ["event ", code(e.type || "?"), e.source ? ` from ${e.source}` : "", json(e.data, "data")];
      }
      case "guard.failed":
        return [
          h("span", { class: "bad" }, "guard error"),
          ` on[${d.transition}] ${d.event_type}: `,
          code(d.guard),
          ` — ${d.error} (fail-closed: counts as false)`,
        ];
      case "transition.fired":
        return [
          code(d.from),
          " → ",
          code(d.to),
          " on ",
          code(d.event_type),
          d.transition >= 0 ? ` (on[${d.transition}])` : "",
          d.set && Object.keys(d.set).length ? json(d.set, "set") : null,
        ];
      case "timer.scheduled":
        return [
          `timer ${d.purpose} due `,
          timeCell(d.fire_at),
          ` (in ${duration(between(r.time, d.fire_at))})`,
        ];
      case "timer.fired":
        return [`timer ${d.purpose || d.timer_id} fired`];
      case "run.completed":
        return [h("span", { class: "good" }, "completed"), json(d.outputs, "outputs")];
      case "run.failed":
        return [h("span", { class: "bad" }, "failed"), `: ${d.error?.class || ""} ${d.error?.message || ""}`];
      case "run.cancelled":
        return [h("span", { class: "bad" }, "cancelled"), d.reason ? `: ${d.reason}` : ""];
      case "run.forked":
        return ["forked from ", h("a", { href: `#/runs/${encodeURIComponent(d.origin_run_id)}` }, d.origin_run_id), ` at #${d.origin_seq}`];
      case "run.migrated":
        return [`migrated v${d.from_version} → v${d.version}`];
      default:
        return [json(d, "data")];
    }
  }
}

// The timeline element; add(record, seq) appends one record (seq is 1-based).
export class Timeline {
  constructor() {
    this.el = h("div", { class: "timeline" });
    this.reading = new Reading();
    this.visits = new Map(); // state -> [{n, group, entered, left}]
    this.group = null;
    this.list = null;
    this.count = 0;
    this.groups = 0;
    this.open("start", null, null);
  }

  open(label, state, time) {
    this.groups += 1;
    const id = `visit-${this.groups}`;
    let n = 0;
    if (state !== null) {
      const seen = this.visits.get(state) || [];
      n = seen.length + 1;
      seen.push({ n, id, entered: time, left: null });
      this.visits.set(state, seen);
    }
    const heading = h(
      "h3",
      {},
      state === null ? "Start" : ["State ", code(state), n > 1 ? ` · visit ${n}` : ""],
      time ? [" · ", timeCell(time)] : null,
    );
    this.list = h("ol", { class: "records" });
    this.group = h("section", { class: "visit", id, tabindex: "-1", "data-state": state ?? "" }, heading, this.list);
    this.el.append(this.group);
    if (label !== "start") this.lastState = state;
  }

  add(r, seq) {
    this.count = seq;
    const kind = short(r.type);
    if (kind === "state.entered") {
      const prev = this.visits.get(this.lastState);
      if (prev) prev[prev.length - 1].left = r.time;
      this.open("state", r.data.state, r.time);
    }
    if (kind === "run.completed" || kind === "run.failed" || kind === "run.cancelled") {
      const prev = this.visits.get(this.lastState);
      if (prev) prev[prev.length - 1].left = r.time;
    }
    const offset = this.reading.start ? `+${duration(between(this.reading.start, r.time)) || "0 ms"}` : "";
    const li = h(
      "li",
      { id: `rec-${seq}`, class: `rec rec-${kind.replaceAll(".", "-")}`, "data-type": kind },
      h("span", { class: "seq" }, `#${seq}`),
      h("span", { class: "when", title: r.time }, kind === "run.started" ? timeCell(r.time) : offset),
      h("span", { class: "kind" }, kind),
      h("span", { class: "what" }, this.reading.describe(r)),
    );
    this.list.append(li);
  }

  // Guards weighed for a step (from GET /runs/{id}/explain), under the record that was
  // decided on.
  explain(step) {
    const li = this.el.querySelector(`#rec-${step.seq}`);
    if (!li || !step.checks?.length) return;
    li.querySelector(".guards")?.remove();
    const items = (step.checks || []).map((c) => {
      const where = c.entry < 0 ? "catch" : `on[${c.entry}]`;
      const reads = Object.entries(c.reads || {}).map(([k, v]) =>
        v === "<absent>" ? `${k} is absent` : `${k} = ${JSON.stringify(v)}`,
      );
      const verdict =
        c.outcome === "fired"
          ? "true, fired"
          : c.outcome === "false"
            ? "false"
            : c.outcome === "error"
              ? `error: ${c.error} (fail-closed)`
              : `${JSON.stringify(c.value)}, not a boolean (fail-closed)`;
      return h(
        "li",
        { class: `guard guard-${c.outcome}`, "data-outcome": c.outcome },
        `${where} ${c.event_type} → ${c.goto}: `,
        c.guard ? code(c.guard) : "no guard",
        reads.length ? ` (${reads.join(", ")})` : "",
        ": ",
        h("strong", {}, verdict),
      );
    });
    const box = h(
      "div",
      { class: "guards" },
      items.length ? h("ul", { "aria-label": "Guards weighed" }, items) : null,
      step.fired ? null : h("p", { class: "muted" }, `No transition: ${step.why_none || "none fired"}`),
    );
    li.append(box);
  }
}
