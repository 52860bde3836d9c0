// The gateway's REST API and its live log stream, with the caller's bearer token.
// Everything the console shows comes through here.

const KEY = "interlock.token";
// The console is served at <gateway>/ui/; the API is the gateway's root.
export const BASE = new URL("../", document.baseURI);

export class ApiError extends Error {
  constructor(status, problem) {
    super(problem?.detail || problem?.title || `HTTP ${status}`);
    this.status = status;
    this.problem = problem || {};
  }
}

// A token the gateway knows whose role reads nothing (a publisher's): the console can show
// nothing with it, so it is sent back to the sign-in form, which says why.
export function cannotRead(err) {
  return err instanceof ApiError && err.status === 403 && err.problem.role === "publisher";
}

export function token() {
  return sessionStorage.getItem(KEY) || "";
}

export function setToken(value) {
  if (value) sessionStorage.setItem(KEY, value);
  else sessionStorage.removeItem(KEY);
}

function headers(extra) {
  const out = { Accept: "application/json", ...extra };
  const t = token();
  if (t) out.Authorization = `Bearer ${t}`;
  return out;
}

export function url(path, params) {
  const u = new URL(path.replace(/^\//, ""), BASE);
  for (const [k, v] of Object.entries(params || {})) {
    if (v !== undefined && v !== null && v !== "") u.searchParams.set(k, v);
  }
  return u;
}

// GET (or another method with a JSON body); the decoded answer, or an ApiError.
export async function api(path, options = {}) {
  return (await call(path, options)).data;
}

// GET a listing a page at a time: { data, next }, `next` the `after` of the next page as
// the answer's Link header (rel="next") names it, null on the last page.
export async function apiPage(path, params) {
  const { data, response } = await call(path, { params });
  const link = /<([^>]*)>\s*;\s*rel="next"/.exec(response.headers.get("Link") || "");
  const next = link ? new URL(link[1], url(path)).searchParams.get("after") : null;
  return { data, next };
}

async function call(path, { params, method = "GET", body, signal } = {}) {
  const init = { method, headers: headers(), signal };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const r = await fetch(url(path, params), init);
  const text = await r.text();
  let data = null;
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = { detail: text };
    }
  }
  if (!r.ok) {
    const err = new ApiError(r.status, data);
    if (r.status === 401 || cannotRead(err)) document.dispatchEvent(new CustomEvent("interlock:unauthenticated", { detail: err }));
    throw err;
  }
  return { data, response: r };
}

// Server-Sent Events from `path`, read with fetch (EventSource cannot send a bearer
// token): onEvent(kind, data, id) for each event. A dropped connection is opened again
// (with backoff), from `resume()`'s parameters; an event for which onEvent returns true
// ends the stream for good. Returns a function that stops it.
function stream(path, resume, onEvent) {
  const abort = new AbortController();
  let tries = 0;
  async function read() {
    const r = await fetch(url(path, resume()), {
      headers: headers({ Accept: "text/event-stream" }),
      signal: abort.signal,
    });
    if (!r.ok) throw new ApiError(r.status, null);
    tries = 0;
    const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return false;
      buffer += value;
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        let id = null;
        let kind = "message";
        const data = [];
        for (const line of block.split("\n")) {
          if (line.startsWith("id: ")) id = Number(line.slice(4));
          else if (line.startsWith("event: ")) kind = line.slice(7);
          else if (line.startsWith("data: ")) data.push(line.slice(6));
        }
        if (!data.length) continue;
        if (onEvent(kind, JSON.parse(data.join("\n")), id)) return true;
      }
    }
  }
  (async () => {
    while (!abort.signal.aborted) {
      try {
        if (await read()) return;
      } catch (e) {
        if (abort.signal.aborted) return;
        if (e instanceof ApiError && e.status < 500) return;
      }
      tries += 1;
      await new Promise((done) => setTimeout(done, Math.min(500 * 2 ** tries, 10000)));
    }
  })();
  return () => abort.abort();
}

// The run's log from `offset`: onRecord(record, position) for each record, onEnd() when
// the run has ended; a dropped connection resumes after the last position.
export function follow(runId, offset, { onRecord, onEnd }) {
  let next = offset;
  return stream(`/runs/${encodeURIComponent(runId)}/log/stream`, () => ({ offset: next }), (kind, data, id) => {
    if (kind === "end") {
      onEnd?.();
      return true;
    }
    if (id !== null) {
      next = id + 1;
      onRecord(data, id);
    }
    return false;
  });
}

// The run index's changes (GET /live/runs): onChange(kind, data) for "ready" (following:
// list now), "run" (a RunSummary written), "gone" ({run_id}) and "reset" (changes were
// missed: list again; the stream reconnects by itself).
export function watchRuns(onChange) {
  return stream("/live/runs", () => ({}), (kind, data) => {
    onChange(kind, data);
    return false;
  });
}

let settings = null;
export async function config() {
  if (settings === null) {
    try {
      const r = await fetch(new URL("config.json", document.baseURI));
      settings = r.ok ? await r.json() : {};
    } catch {
      settings = {};
    }
  }
  return settings;
}
