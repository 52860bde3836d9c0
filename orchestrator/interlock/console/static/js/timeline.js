// A run's log for people: records in order, grouped by state visit, each explained.
import { between, duration, h, json, timeCell } from "./dom.js";

export const PREFIX = "io.interlock.";

export function short(type) {
  return type.startsWith(PREFIX) ? type.slice(PREFIX.length) : type;
}

const code = (text) => h("code", {}, text);

// What a queued run waits for, one slot of its run.queued.
function slotText(s) {
  return s.limit.endsWith("@paused")
    ? ["until ", code(s.limit.slice(0, -"@paused".length)), " is resumed"]
    : ["a slot of ", code(s.limit), s.key ? [" for key ", code(s.key)] : null];
}

// What a held request waits for (its action.queued).
function heldFor(d) {
  if (d.limit.endsWith("@paused")) return ["waits until capability ", code(d.limit.slice(4, -"@paused".length)), " is resumed"];
  return [d.limit.endsWith(":rate") ? "waits for a token of " : "waits for a slot of ", code(d.limit), d.key ? [" for key ", code(d.key)] : null];
}

const joined = (parts) => parts.flatMap((p, i) => (i ? [", ", p] : [p]));

// What a cancel of attempts at work under a capability's concurrency limit says of their
// slots: held while their workers stop, until freed.stopping_until at the latest (as
// `interlock logs` says it).
function stopping(freed) {
  return freed.filter((f) => f?.stopping_until).map((f) => {
    const held = f.limits.filter((c) => !c.per_s && !c.limit.endsWith("@paused"));
    const slots = held.length ? joined(held.map((c) => [code(c.limit), " for key ", code(c.key)])) : ["its limits"];
    return h("span", { class: "stopping" }, "; the slot of ", slots, ` (${f.action_id}, attempt ${f.attempt}) stays held until its worker stops, `,
      timeCell(f.stopping_until), " at the latest");
  });
}

// What a run.admitted took, as explain words it: "default/hello resumed" for a workflow's
// pause (a line nobody holds a slot of), "holds a slot of default/api" for a limit.
function admittedText(limits) {
  const resumed = limits.filter((l) => l.endsWith("@paused")).map((l) => [code(l.slice(0, -"@paused".length)), " resumed"]);
  const slots = limits.filter((l) => !l.endsWith("@paused"));
  const parts = [...resumed, ...(slots.length ? [["holds a slot of ", joined(slots.map(code))]] : [])];
  return parts.length ? [": ", parts.flatMap((p, i) => (i ? ["; ", p] : [p]))] : null;
}

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
          d.admitted_at ? " admitted at once, dispatched" : null,
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
        return [`action ${d.action_id} cancelled`, d.reason ? `: ${d.reason}` : "", stopping([d.freed])];
      case "map.started":
        return [
          // Defaults are left out of the record: parallelism 1, join all.
          `map over ${(d.items || []).length} items (parallelism ${d.parallelism ?? 1}, join ${d.completion || "all"})`,
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
          d.retry_after_s != null
            ? `: the later of the backoff ${d.backoff_s ?? 0}s and the agent's retry-after ${d.retry_after_s}s`
            : "",
        ];
      case "timer.fired":
        return [`timer ${d.purpose || d.timer_id} fired`];
      case "run.completed":
        return [h("span", { class: "good" }, "completed"), json(d.outputs, "outputs")];
      case "run.failed":
        return [h("span", { class: "bad" }, "failed"), `: ${d.error?.class || ""} ${d.error?.message || ""}`];
      case "run.cancelled":
        return [h("span", { class: "bad" }, "cancelled"), d.reason ? `: ${d.reason}` : "", stopping(d.freed || [])];
      case "run.continued":
        return ["continued as new as ", h("a", { href: `#/runs/${encodeURIComponent(d.run_id)}`, class: "mono" }, d.run_id),
          ` in ${d.state} (${d.reason || "transition"})`];
      case "run.forked":
        return ["forked from ", h("a", { href: `#/runs/${encodeURIComponent(d.origin_run_id)}` }, d.origin_run_id), ` at #${d.origin_seq}`];
      case "run.migrated":
        return [`migrated v${d.from_version} → v${d.version}`];
      case "run.queued":
        return d.rate
          ? ["queued until ", timeCell(d.rate.until), " by the rate of ", code(d.rate.trigger), d.rate.key ? [" for key ", code(d.rate.key)] : null]
          : ["queued: waits for ", joined((d.slots || []).map(slotText))];
      case "run.admitted":
        return ["admitted", admittedText(d.limits || [])];
      case "action.queued":
        return [`action ${d.action_id} `, heldFor(d), d.place ? ` (place ${d.place})` : null];
      case "action.admitted":
        return [`action ${d.action_id} admitted${d.at_once ? " at once" : ""}, dispatched`, d.deadline ? [" deadline ", timeCell(d.deadline)] : null];
      case "run.paused":
        return [h("span", { class: "status status-paused" }, "paused"), d.workflow ? " with its workflow" : null, d.reason ? `: ${d.reason}` : null];
      case "event.held": {
        const e = d.event || {};
        return ["held ", code(e.type || "?"), " for when it is resumed", json(e.data, "data")];
      }
      case "run.resumed":
        return [`resumed: ${d.held ?? 0} held event(s) decided on`];
      default:
        return [json(d, "data")];
    }
  }
}

// Records drawn at once, and then at each step (scrolling near the end or "Show more").
export const CHUNK = 200;
// "Show all": records drawn per step, and the work done per animation frame.
const BATCH = 50;
const FRAME_MS = 10;
// Records per block of a visit's list (each block is laid out only when on screen).
const BLOCK = 100;

// The timeline of a run: the records read of its log, a window that ends at the newest
// record (a long log's earlier records are read a page at a time when asked for, with
// "Earlier records"). What the records read say (the visits of each state, for the
// diagram) is known at once; their DOM is built a chunk at a time, the first chunk at once
// and the next when the reader scrolls near the end of what is drawn (or asks for it).
export class Timeline {
  // onEarlier(from, to): the log's records from `from` up to `to` (a promise); onPrepend():
  // called once they are laid out.
  constructor({ chunk = CHUNK, onEarlier = null, onPrepend = null } = {}) {
    this.chunk = chunk;
    this.base = 0; // records of the log before the first one read
    this.onEarlier = onEarlier;
    this.onPrepend = onPrepend;
    this.explained = new Map(); // seq -> explain step, every one given
    this.earlierStatus = h("span", { class: "muted", id: "timeline-earlier-status", role: "status" });
    this.earlierButton = h("button", { type: "button", id: "timeline-earlier", onclick: () => this.askEarlier() }, "Earlier records");
    this.earlierEl = h("div", { class: "timeline-more actions", hidden: true }, this.earlierStatus, this.earlierButton);
    this.groupsEl = h("div", { class: "timeline-groups" });
    this.status = h("span", { class: "muted", role: "status" });
    this.moreButton = h("button", { type: "button", id: "timeline-more", onclick: () => this.showMore() }, "Show more");
    this.allButton = h("button", { type: "button", id: "timeline-all", onclick: () => this.showAll() }, "Show all");
    this.moreEl = h("div", { class: "timeline-more actions" }, this.status, this.moreButton, this.allButton);
    this.el = h("div", { class: "timeline" }, this.earlierEl, this.groupsEl, this.moreEl);
    this.reset();
    this.complete = true; // false while only the log's first records are known
    this.updateMore();
  }

  // Nothing read yet (and nothing drawn).
  reset() {
    this.stop();
    this.groupsEl.replaceChildren();
    const start = this.reading?.start ?? null;
    this.reading = new Reading();
    this.reading.start = start;
    this.visits = new Map(); // state -> [{n, id, group, entered, left}]
    this.groups = []; // {id, state, n, time}
    this.records = []; // {r, seq, group}
    this.lastState = null;
    this.count = 0;
    this.shown = 0; // records drawn
    this.drawnGroup = -1;
    this.list = null;
    this.checks = new Map(); // seq -> explain step, drawn with its record
    for (const [seq, step] of this.explained) this.checks.set(seq, step);
  }

  openGroup(state, time) {
    const index = this.groups.length;
    const id = `visit-${index + 1}`;
    let n = 0;
    if (state !== null) {
      const seen = this.visits.get(state) || [];
      n = seen.length + 1;
      seen.push({ n, id, group: index, entered: time, left: null });
      this.visits.set(state, seen);
      this.lastState = state;
    }
    // Before the first state entry read of a log read from its middle: the visit it
    // continues is in the records before.
    this.groups.push({ id, state, n, time, continued: state === null && this.base > 0 });
  }

  // What the record says, without drawing it.
  note(r, seq) {
    this.count = seq;
    const kind = short(r.type);
    if (!this.groups.length) this.openGroup(null, null);
    if (kind === "state.entered" || kind === "run.completed" || kind === "run.failed" || kind === "run.cancelled") {
      const prev = this.visits.get(this.lastState);
      if (prev) prev[prev.length - 1].left = r.time;
    }
    if (kind === "state.entered") this.openGroup(r.data.state, r.time);
    this.records.push({ r, seq, group: this.groups.length - 1 });
  }

  // The log as first read (the whole log, or its first records when `complete` is false
  // and the rest comes with extend): the first chunk drawn.
  // `base`: the records of the log before these (a window of its newest records).
  load(records, { complete = true, base = 0 } = {}) {
    this.complete = complete;
    this.base = base;
    records.forEach((r, i) => this.note(r, base + i + 1));
    this.drawTo(this.chunk);
    this.updateEarlier();
  }

  // The records just before the first one read: the timeline is laid out again from
  // them on, with as many records drawn as before (plus these).
  prepend(records) {
    const known = this.records.map((x) => x.r);
    const shown = this.shown;
    this.base -= records.length;
    this.reset();
    [...records, ...known].forEach((r, i) => this.note(r, this.base + i + 1));
    this.drawTo(shown + records.length);
    this.updateEarlier();
  }

  async askEarlier() {
    if (!this.onEarlier || this.base <= 0 || this.earlierButton.disabled) return;
    this.earlierButton.disabled = true;
    this.earlierStatus.textContent = "Reading earlier records…";
    try {
      const records = await this.onEarlier(Math.max(0, this.base - this.chunk), this.base);
      this.earlierButton.disabled = false;
      if (records.length) this.prepend(records);
      this.onPrepend?.();
    } catch (e) {
      this.earlierButton.disabled = false;
      this.earlierStatus.textContent = `Earlier records could not be read: ${e.message}`;
      return;
    }
    this.updateEarlier();
  }

  updateEarlier() {
    this.earlierEl.hidden = this.base <= 0;
    if (this.base > 0 && !this.earlierButton.disabled) {
      const first = this.records.length ? this.base + 1 : this.base;
      this.earlierStatus.textContent = `Records ${first}–${this.base + this.records.length} read; ${this.base} earlier.`;
      this.earlierButton.textContent = `Earlier records (${Math.min(this.base, this.chunk)})`;
    }
  }

  // The rest of a log whose first records were loaded: known at once, drawn as asked.
  extend(records) {
    this.complete = true;
    const drawnAll = this.shown === this.records.length && this.shown < this.chunk;
    for (const r of records) this.note(r, this.base + this.records.length + 1);
    if (drawnAll) this.drawTo(this.chunk);
    else this.updateMore();
  }

  // One more record (from the live stream): drawn at once when everything before it is.
  add(r, seq) {
    const drawnAll = this.shown === this.records.length;
    this.note(r, seq);
    if (drawnAll) this.drawTo(this.records.length);
    else this.updateMore();
  }

  showMore() {
    this.drawTo(this.shown + this.chunk);
  }

  // Every record: the next chunk at once, the rest a batch per animation frame (about
  // 10 ms of work each), so a 5,000-record log never blocks the page while it is drawn.
  showAll() {
    this.drawTo(this.shown + this.chunk);
    if (this.filling || this.shown >= this.records.length) return;
    this.filling = true;
    this.updateMore();
    const step = () => {
      if (!this.filling) return;
      const until = performance.now() + FRAME_MS;
      while (this.shown < this.records.length && performance.now() < until) this.drawTo(this.shown + BATCH, { quiet: true });
      if (this.shown < this.records.length) {
        this.frame = requestAnimationFrame(step);
        this.updateMore();
        return;
      }
      this.filling = false;
      this.updateMore();
      performance.mark("timeline:all");
    };
    this.frame = requestAnimationFrame(step);
  }

  // Draw records up to (and including) the one at position `seq`, and a chunk after it.
  reveal(seq) {
    if (seq > this.base + this.shown) this.drawTo(seq - this.base + this.chunk);
  }

  // Draw the records of a group (a state visit) and return its element.
  revealGroup(id) {
    const index = this.groups.findIndex((g) => g.id === id);
    const first = this.records.find((x) => x.group === index);
    if (first) this.reveal(first.seq);
    return document.getElementById(id);
  }

  drawTo(n, { quiet = false } = {}) {
    const end = Math.min(n, this.records.length);
    if (end <= this.shown) return;
    const fragment = document.createDocumentFragment();
    let list = this.list;
    for (; this.shown < end; this.shown += 1) {
      const { r, seq, group } = this.records[this.shown];
      if (group !== this.drawnGroup) {
        this.drawnGroup = group;
        const g = this.groups[group];
        const heading = h(
          "h3",
          {},
          g.continued
            ? "Continued from earlier records"
            : g.state === null
              ? "Start"
              : ["State ", code(g.state), g.n > 1 && this.base === 0 ? ` · visit ${g.n}` : ""],
          g.time ? [" · ", timeCell(g.time)] : null,
        );
        list = h("ol", { class: this.listClass() });
        this.section = h("section", { class: "visit", id: g.id, tabindex: "-1", "data-state": g.state ?? "" }, heading, list);
        fragment.append(this.section);
      } else if (list.childElementCount >= BLOCK) {
        // A long visit's records in blocks: past the first chunk, the browser lays out
        // and paints only the blocks on screen (content-visibility), so each step of
        // "Show all" costs what it adds, not what is already drawn.
        list = h("ol", { class: this.listClass() });
        if (this.section.isConnected) fragment.append(list);
        else this.section.append(list);
      }
      list.append(this.row(r, seq));
    }
    this.list = list;
    this.groupsEl.append(fragment);
    for (const [seq, step] of this.checks) if (seq <= this.base + this.shown) this.drawChecks(step);
    if (!quiet) this.updateMore();
  }

  listClass() {
    return this.shown >= this.chunk ? "records far" : "records";
  }

  row(r, seq) {
    const kind = short(r.type);
    const text = this.reading.describe(r);
    const offset = this.reading.start ? `+${duration(between(this.reading.start, r.time)) || "0 ms"}` : "";
    return h(
      "li",
      { id: `rec-${seq}`, class: `rec rec-${kind.replaceAll(".", "-")}`, "data-type": kind },
      h("span", { class: "seq" }, `#${seq}`),
      h("span", { class: "when", title: r.time }, kind === "run.started" ? timeCell(r.time) : offset),
      h("span", { class: "kind" }, kind),
      h("span", { class: "what" }, text),
    );
  }

  updateMore() {
    const left = this.records.length - this.shown;
    this.moreEl.hidden = left <= 0 && this.complete;
    this.moreButton.hidden = this.allButton.hidden = left <= 0;
    if (left <= 0) {
      this.status.textContent = this.complete ? "" : `Records ${this.base + 1}–${this.base + this.shown} shown; reading the rest of the log…`;
      this.observer?.disconnect();
      this.observer = null;
      return;
    }
    this.status.textContent = this.filling
      ? `Drawing records: ${this.base + 1}–${this.base + this.shown} of ${this.base + this.records.length} shown…`
      : `Records ${this.base + 1}–${this.base + this.shown} of ${this.base + this.records.length} shown.`;
    this.moreButton.textContent = `Show ${Math.min(left, this.chunk)} more`;
    this.allButton.textContent = `Show all ${this.records.length}`;
    // Scrolling near the end of what is drawn draws the next chunk.
    if (!this.observer && typeof IntersectionObserver === "function") {
      this.observer = new IntersectionObserver(
        (entries) => {
          if (entries.some((e) => e.isIntersecting)) this.showMore();
        },
        { rootMargin: "600px 0px" },
      );
      this.observer.observe(this.moreEl);
    }
  }

  stop() {
    this.observer?.disconnect();
    this.observer = null;
    this.filling = false;
    if (this.frame) cancelAnimationFrame(this.frame);
  }

  // Guards weighed for a step (from GET /runs/{id}/explain), under the record that was
  // decided on (kept until that record is drawn).
  explain(step) {
    if (!step.checks?.length) return;
    this.checks.set(step.seq, step);
    this.explained.set(step.seq, step);
    if (step.seq <= this.base + this.shown) this.drawChecks(step);
  }

  drawChecks(step) {
    const li = this.groupsEl.querySelector(`#rec-${step.seq}`);
    if (!li) return;
    this.checks.delete(step.seq);
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
