// Runs: the run index as a table, filtered, paged, kept live by the run index's stream.
import { api, ApiError, watchRuns } from "./api.js";
import { add, between, duration, errorBox, h, status, table, timeCell, waitingText } from "./dom.js";
import { pausedBadge } from "./pausing.js";

const STATUSES = ["running", "completed", "failed", "cancelled", "continued"];
const WAITS = ["approval", "event", "agent", "workflow", "timer", "slot"];
const LIMIT = 50;
// After a change, the page is listed again at most this often.
const RELIST_MS = 500;

// A time from a datetime-local field ("2026-12-01T09:30"), read as UTC as the table shows
// times; a date alone (older links) is the start of that day.
function utc(value) {
  if (!value) return undefined;
  return value.includes("T") ? `${value}Z` : value;
}

// A datetime-local field leaves the seconds out of its value when they are zero
// ("2026-12-01T09:30"); the filters keep them, so a link says the same second the same way.
function toSecond(value) {
  return /T\d\d:\d\d$/.test(value) ? `${value}:00` : value;
}

function queryOf(filters) {
  return {
    workflow: filters.workflow,
    status: filters.status,
    waiting: filters.waiting,
    since: utc(filters.since),
    until: utc(filters.until),
    limit: LIMIT,
    offset: filters.offset || undefined,
  };
}

export async function runsPage(root, _arg, params, current) {
  const filters = {
    workflow: params.get("workflow") || "",
    status: params.get("status") || "",
    waiting: params.get("waiting") || "",
    since: params.get("since") || "",
    until: params.get("until") || "",
    offset: Number(params.get("offset") || 0),
  };
  // The table's first page and the workflow filter's choices, asked for together.
  const firstAsked = api("/runs", { params: queryOf(filters) });
  const workflowsAsked = api("/workflows");

  const select = (name, label, options) =>
    h(
      "div",
      { class: "field" },
      h("label", { for: `f-${name}` }, label),
      h(
        "select",
        { id: `f-${name}`, name },
        h("option", { value: "" }, "any"),
        // A value from the link that is not a choice (agent:review) is kept as one.
        [...new Set([...options, ...(filters[name] ? [filters[name]] : [])])].map((o) =>
          h("option", { value: o, selected: filters[name] === o }, o),
        ),
      ),
    );
  // Date and time, in UTC (as every time on the page), to the second.
  const timeField = (name, label) =>
    h(
      "div",
      { class: "field" },
      h("label", { for: `f-${name}` }, label),
      h("input", {
        id: `f-${name}`,
        name,
        type: "datetime-local",
        step: 1,
        value: filters[name] && !filters[name].includes("T") ? `${filters[name]}T00:00` : filters[name],
      }),
    );
  // The table does not wait for the workflow filter's choices: they are filled in when
  // they come.
  const workflowSelect = select("workflow", "Workflow", filters.workflow ? [filters.workflow] : []);
  workflowsAsked
    .then((workflows) => {
      const names = workflows.map((w) => (w.namespace === "default" ? w.name : `${w.namespace}/${w.name}`));
      const field = workflowSelect.querySelector("select");
      const chosen = field.value;
      field.replaceChildren(
        h("option", { value: "" }, "any"),
        [...new Set([...names, ...(chosen ? [chosen] : [])])].map((o) => h("option", { value: o, selected: chosen === o }, o)),
      );
    })
    .catch(() => {});
  const form = h(
    "form",
    { class: "filters", role: "search", "aria-label": "Filter runs" },
    workflowSelect,
    select("status", "Status", STATUSES),
    select("waiting", "Waiting for", WAITS),
    timeField("since", "Started at or after (UTC)"),
    timeField("until", "Started before (UTC)"),
  );
  const search = h(
    "form",
    { class: "filters", role: "search", "aria-label": "Find a run by id" },
    h(
      "div",
      { class: "field grow" },
      h("label", { for: "run-id" }, "Run id"),
      h("input", { id: "run-id", name: "run", type: "search", placeholder: "r8dafb…", spellcheck: "false" }),
    ),
    h("button", { type: "submit" }, "Open run"),
  );
  const searchNote = h("p", { class: "note", role: "status" });
  search.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const id = search.elements.run.value.trim();
    if (!id) return;
    try {
      await api(`/runs/${encodeURIComponent(id)}`);
      location.hash = `#/runs/${encodeURIComponent(id)}`;
    } catch (e) {
      searchNote.textContent = e instanceof ApiError && e.status === 404 ? `No run ${id}.` : e.message;
    }
  });
  const live = h("input", { id: "live", type: "checkbox", checked: true });
  const listing = h("div", { id: "runs-listing" });
  const pager = h("nav", { class: "pager", "aria-label": "Pages of runs" });
  add(root, 
    h("div", { class: "title-row" }, h("h1", {}, "Runs"), h("label", { class: "live" }, live, " Live updates")),
    form,
    search,
    searchNote,
    listing,
    pager,
  );

  let inFlight = null;
  async function load(asked) {
    inFlight?.abort();
    inFlight = new AbortController();
    let page;
    try {
      page = await (asked || api("/runs", { params: queryOf(filters), signal: inFlight.signal }));
    } catch (e) {
      if (e.name === "AbortError") return;
      listing.replaceChildren(errorBox(e));
      return;
    }
    if (!current()) return;
    const now = Date.now();
    const rows = page.runs.map((r) => [
      [
        h("a", { href: `#/runs/${encodeURIComponent(r.run_id)}`, class: "mono" }, r.run_id),
        r.forked_from
          ? h("div", { class: "origin" }, "forked from ",
              h("a", { href: `#/runs/${encodeURIComponent(r.forked_from.run_id)}`, class: "mono" }, r.forked_from.run_id),
              ` at #${r.forked_from.seq}`)
          : null,
        r.migrated_from ? h("div", { class: "origin" }, `migrated from v${r.migrated_from}`) : null,
        r.continued_from
          ? h("div", { class: "origin" }, "continues ",
              h("a", { href: `#/runs/${encodeURIComponent(r.continued_from)}`, class: "mono" }, r.continued_from))
          : null,
        r.continued_to
          ? h("div", { class: "origin" }, "continued as ",
              h("a", { href: `#/runs/${encodeURIComponent(r.continued_to)}`, class: "mono" }, r.continued_to))
          : null,
      ],
      r.namespace === "default" ? r.workflow : `${r.namespace}/${r.workflow}`,
      `v${r.version}`,
      [status(r.status), pausedBadge(r.paused)],
      r.state,
      r.waiting?.length ? h("span", { class: "waiting" }, waitingText(r.waiting)) : "",
      timeCell(r.started_at),
      duration(r.status === "running" ? now - new Date(r.started_at).getTime() : between(r.started_at, r.updated_at)),
    ]);
    // A row link that had the keyboard focus keeps it across a new listing.
    const focused = listing.contains(document.activeElement) ? document.activeElement.getAttribute("href") : null;
    listing.replaceChildren(
      table("!Runs, newest first", ["Run", "Workflow", "Version", "Status", "State", "Waiting for", "Started", "Duration"], rows, {
        empty: "No runs match.",
        stacked: true,
      }),
    );
    if (focused) listing.querySelector(`a[href="${CSS.escape(focused)}"]`)?.focus();
    const first = filters.offset + 1;
    const last = filters.offset + page.runs.length;
    pager.replaceChildren(
      h(
        "button",
        { type: "button", disabled: filters.offset === 0, onclick: () => go(Math.max(0, filters.offset - LIMIT)) },
        "← Newer",
      ),
      h("span", { role: "status" }, page.runs.length ? `Runs ${first}–${last}` : ""),
      h(
        "button",
        { type: "button", disabled: page.next_offset === null, onclick: () => go(page.next_offset) },
        "Older →",
      ),
    );
  }

  function remember() {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(filters)) if (v) q.set(k, v);
    const text = q.toString();
    history.replaceState(null, "", `#/runs${text ? `?${text}` : ""}`);
  }

  function go(offset) {
    filters.offset = offset;
    remember();
    load();
  }

  form.addEventListener("change", () => {
    const data = new FormData(form);
    filters.workflow = data.get("workflow") || "";
    filters.status = data.get("status") || "";
    filters.waiting = data.get("waiting") || "";
    filters.since = toSecond(data.get("since") || "");
    filters.until = toSecond(data.get("until") || "");
    go(0);
  });
  form.addEventListener("submit", (ev) => ev.preventDefault());

  await load(firstAsked);

  // Live: the gateway says when the run index changes (GET /live/runs); the page shown is
  // listed again then (once per burst of changes), not on a timer.
  let stopLive = null;
  let relist = null;
  let lastListed = 0;
  function changed() {
    if (relist) return;
    const wait = Math.max(0, lastListed + RELIST_MS - Date.now());
    relist = setTimeout(() => {
      relist = null;
      lastListed = Date.now();
      if (current()) load();
    }, wait);
  }
  function goLive() {
    stopLive?.();
    // "ready" too: what changed between the first listing and the stream's start.
    stopLive = live.checked ? watchRuns(changed) : null;
  }
  live.addEventListener("change", goLive);
  goLive();
  return () => {
    stopLive?.();
    clearTimeout(relist);
    inFlight?.abort();
  };
}
