// An Interlock agent worker in JavaScript, with the official `nats` client and nothing else.
// It follows docs/agents-any-language.md step by step; the comments name the steps.
//
//   INTERLOCK_URL=nats://127.0.0.1:4222 INTERLOCK_CREDS=greet.creds node worker.mjs
//
// Environment: INTERLOCK_URL (default nats://127.0.0.1:4222), INTERLOCK_CREDS (an agent
// credential: `interlock creds issue agent --capability demo.greet -o greet.creds`),
// INTERLOCK_PREFIX (default il), WORKER_NAME (default greeter-js), CONCURRENCY (default 4),
// INTERLOCK_OBJECT_THRESHOLD (bytes; default 262144: a larger answer goes by reference),
// CAPABILITIES (comma-separated; default every handler's: the credential must allow each).
import { readFileSync } from "node:fs";
import { hostname } from "node:os";
import { createHash, randomBytes } from "node:crypto";
import { connect, credsAuthenticator, headers as natsHeaders } from "nats";

// --- the work: one handler per capability ----------------------------------------------

// A handler gets the task's input (a JSON object) and the task; it returns
// { data } (answered task.completed), { type, data } (its own event type), or throws a
// TaskError (task.failed with that class, retryable flag and code; retryAfter, seconds or
// an RFC 3339 instant, passes an API's 429 Retry-After on: no retry goes before it).
class TaskError extends Error {
  constructor(errorClass, message, { retryable = false, code, retryAfter } = {}) {
    super(message);
    this.errorClass = errorClass;
    this.retryable = retryable;
    this.code = code;
    this.retryAfter = retryAfter;
  }
}

const HANDLERS = {
  "demo.greet": async (input, task) => {
    if (!input.name) throw new TaskError("agent_error", "nobody to greet", { code: "no_name" });
    if (input.flaky && task.attempt === 1) {
      throw new TaskError("agent_error", "flaky on the first attempt", { retryable: true });
    }
    if (input.wait_seconds) await sleep(input.wait_seconds * 1000, task.signal);
    if (input.emit) return { type: "greet.emitted", data: { name: input.name } };
    // A large answer (`size` exclamation marks) goes by reference: see byReference.
    const greeting = `hello ${input.name}` + "!".repeat(input.size ?? 0);
    return { data: { greeting, attempt: task.attempt } };
  },
  // A call to an API that allows one call at once and 5 a second per account. The AgentDef
  // says so (concurrency and rate keyed on input.account) and the orchestrator keeps to it:
  // this handler never counts. What it must do is stop when cancelled (task.signal), since
  // the next call of the account waits for this one's answer.
  "demo.quote": async (input, task) => {
    log("quote start", input.account, task.actionId);
    await sleep((input.wait_seconds ?? 0) * 1000, task.signal);
    log("quote end", input.account, task.actionId);
    return { data: { quote: `quote for ${input.account}` } };
  },
};

// --- configuration ---------------------------------------------------------------------

const URL = process.env.INTERLOCK_URL ?? "nats://127.0.0.1:4222";
const CREDS = process.env.INTERLOCK_CREDS;
const PREFIX = process.env.INTERLOCK_PREFIX ?? "il";
const NAME = process.env.WORKER_NAME ?? "greeter-js";
const CONCURRENCY = Number(process.env.CONCURRENCY ?? 4);
const INSTANCE = `${hostname()}-${process.pid}-${randomBytes(3).toString("hex")}`;
const HEARTBEAT_MS = 5000;
const THRESHOLD = Number(process.env.INTERLOCK_OBJECT_THRESHOLD ?? 256 * 1024);
const CHUNK = 128 * 1024;
const GRACE_MS = 10000;
const CANCEL_CLEANUP_MS = 5000; // how long a stopped handler has to end before the answer

// Names (contracts/asyncapi.yaml): streams and buckets follow the prefix.
const STREAM_BASE = PREFIX.toUpperCase().replace(/[.-]/g, "_");
const TASKS_STREAM = `${STREAM_BASE}_TASKS`;
const WORKERS_BUCKET = `${STREAM_BASE.toLowerCase()}_workers`;
const token = (s) => s.replace(/[^A-Za-z0-9_-]/g, "_"); // a capability as one subject token

// --- CloudEvents binary mode: ce- headers, percent-encoded -----------------------------

function ceEncode(value) {
  // Printable ASCII stays, except space, '"' and '%'; every other UTF-8 byte is %XX.
  return Array.from(new TextEncoder().encode(String(value)), (b) =>
    b > 0x20 && b < 0x7f && b !== 0x22 && b !== 0x25
      ? String.fromCharCode(b)
      : "%" + b.toString(16).toUpperCase().padStart(2, "0"),
  ).join("");
}

function readHeaders(msg) {
  // Header names compared case-insensitively; ce- values percent-decoded.
  const out = {};
  if (!msg.headers) return out;
  for (const key of msg.headers.keys()) {
    const value = msg.headers.get(key);
    out[key.toLowerCase()] = key.toLowerCase().startsWith("ce-") ? decodeURIComponent(value) : value;
  }
  return out;
}

function writeHeaders(map) {
  const h = natsHeaders();
  for (const [key, value] of Object.entries(map)) {
    if (value !== undefined && value !== null) {
      h.set(key, key.startsWith("ce-") ? ceEncode(value) : String(value));
    }
  }
  return h;
}

const json = (value) => new TextEncoder().encode(JSON.stringify(value));
const now = () => new Date().toISOString(); // RFC 3339, UTC, milliseconds, Z

// --- step 1: connect with the agent credential and its own inbox ------------------------

function userClaims(credsText) {
  // The creds file holds the user JWT: `sub` is the user's public key, `nats.tags` its tags.
  const jwt = credsText.match(/-----BEGIN NATS USER JWT-----\s*([^\s-][^\s]*)\s*------END/);
  if (!jwt) throw new Error("no user JWT in the creds file");
  return JSON.parse(Buffer.from(jwt[1].split(".")[1], "base64url").toString());
}

// The JetStream API prefix: an agent credential is a user of an account of its own, which
// imports the API subjects it may use under `<prefix>.js.API` (its `js-api:` tag says so);
// `$JS.API` there answers "JetStream not enabled for account".
let jsApi = "$JS.API";
// The credential's own object bucket (its `objects:` tag), for answers by reference.
let objectsBucket;

async function open() {
  const options = { servers: URL, name: `${NAME} ${INSTANCE}` };
  if (CREDS) {
    const text = readFileSync(CREDS, "utf8");
    options.authenticator = credsAuthenticator(new TextEncoder().encode(text));
    const claims = userClaims(text);
    // The only inbox an agent credential may subscribe to: _INBOX.<user public key>.
    options.inboxPrefix = `_INBOX.${claims.sub}`;
    const tag = (claims.nats?.tags ?? []).find((t) => t.startsWith("js-api:"));
    if (tag) jsApi = tag.slice("js-api:".length);
    const own = (claims.nats?.tags ?? []).find((t) => t.startsWith("objects:"));
    if (own) objectsBucket = own.slice("objects:".length);
  }
  return connect(options);
}

// --- the worker ------------------------------------------------------------------------

const cancelled = new Map(); // action id -> {attempt, time, at}: recent cancel notices
const running = new Map(); // action id -> [{attempt, abort}]
const held = new Set(); // tasks taken and not yet answered
let inFlight = 0;
let stopping = false;
const startedAt = now();
const log = (...words) => console.log(new Date().toISOString(), ...words);

function covers(notice, attempt, requestedAt) {
  // With an attempt: that one only. Without: the first attempt, and attempts requested
  // before the notice.
  if (notice.attempt !== undefined) return notice.attempt === attempt;
  return attempt === 1 || (requestedAt && notice.time && requestedAt < notice.time);
}

// Steps 2 and 7: cancel notices, on core NATS (not stored): subscribe before taking tasks.
function onCancel(msg) {
  const h = readHeaders(msg);
  if (h["ce-type"] !== "io.interlock.task.cancel" || !h["ce-actionid"]) return;
  const notice = {
    attempt: h["ce-attempt"] ? Number(h["ce-attempt"]) : undefined,
    time: h["ce-time"],
    at: Date.now(),
  };
  cancelled.set(h["ce-actionid"], notice);
  for (const [id, seen] of cancelled) if (Date.now() - seen.at > 15 * 60_000) cancelled.delete(id);
  for (const flight of running.get(h["ce-actionid"]) ?? []) {
    if (notice.attempt === undefined || notice.attempt === flight.attempt) {
      log("cancel notice for", h["ce-actionid"], "attempt", flight.attempt);
      flight.abort.abort(new TaskError("cancelled", "cancelled by the orchestrator"));
    }
  }
}

// Step 8: heartbeats, one KV key per capability: a JetStream publish to $KV.<bucket>.<key>.
async function heartbeat(js, capabilities, remove = false) {
  const value = {
    name: NAME,
    instance: INSTANCE,
    capabilities,
    concurrency: CONCURRENCY,
    in_flight: inFlight,
    started_at: startedAt,
    heartbeat_at: now(),
    host: hostname(),
    pid: process.pid,
  };
  for (const cap of capabilities) {
    const subject = `$KV.${WORKERS_BUCKET}.${token(cap)}.${token(INSTANCE)}`;
    try {
      if (remove) await js.publish(subject, new Uint8Array(), { headers: writeHeaders({ "KV-Operation": "DEL" }) });
      else await js.publish(subject, json(value));
    } catch (err) {
      log("heartbeat failed:", err.message);
    }
  }
}

// Large payloads, by reference: the answer's JSON goes to the credential's own object
// bucket as an object store client writes it (128 KiB chunks on $O.<bucket>.C.<nuid>, then
// its info on $O.<bucket>.M.<name, base64url padded> with Nats-Rollup: sub), and the
// answer carries a reference. Each publish is a JetStream publish (its ack to our inbox).
const b64url = (bytes) => Buffer.from(bytes).toString("base64").replace(/\+/g, "-").replace(/\//g, "_");

async function byReference(js, bytes, name) {
  const nuid = randomBytes(11).toString("hex");
  const hash = createHash("sha256");
  let chunks = 0;
  for (let at = 0; at < bytes.length; at += CHUNK) {
    const part = bytes.subarray(at, at + CHUNK);
    hash.update(part);
    await js.publish(`$O.${objectsBucket}.C.${nuid}`, part);
    chunks += 1;
  }
  const digest = `SHA-256=${b64url(hash.digest())}`;
  const info = { name, bucket: objectsBucket, nuid, size: bytes.length, chunks, digest, mtime: now() };
  const meta = `$O.${objectsBucket}.M.${b64url(new TextEncoder().encode(name))}`;
  await js.publish(meta, json(info), { headers: writeHeaders({ "Nats-Rollup": "sub" }) });
  return { $object: { bucket: objectsBucket, name, size: bytes.length, digest } };
}

// Steps 4-6: one task: read it, keep it ours (progress acks), run the handler, answer, ack.
async function handle(js, capability, msg, ackWaitMs) {
  const h = readHeaders(msg);
  const runId = h["ce-runid"] ?? h["ce-subject"];
  if (!runId) {
    // Nothing to answer to: an agent dead letter, then never deliver it again.
    const dead = writeHeaders({
      "Interlock-Dead-Letter-Reason": "no-run-id",
      "Interlock-Dead-Letter-Detail": "the task has neither ce-runid nor ce-subject",
      "Interlock-Dead-Letter-Subject": msg.subject,
      "Interlock-Dead-Letter-Worker": NAME,
    });
    await js.publish(`${PREFIX}.dlq.agent.${capability}.no-run-id`, msg.data, { headers: dead });
    msg.term();
    return;
  }
  const task = {
    runId,
    actionId: h["ce-actionid"] ?? h["ce-id"],
    attempt: Number(h["ce-attempt"] ?? 1),
    deadline: h["ce-deadline"] ? Date.parse(h["ce-deadline"]) : undefined,
    abort: new AbortController(),
  };
  task.signal = task.abort.signal;
  const flights = running.get(task.actionId) ?? [];
  flights.push(task);
  running.set(task.actionId, flights);
  // Progress acks: three per ack wait restart the consumer's clock while we work.
  const ticker = setInterval(() => msg.working(), Math.max(ackWaitMs / 3, 50));
  let type, data, work, deadlineTimer;
  try {
    const notice = cancelled.get(task.actionId);
    if (notice && covers(notice, task.attempt, h["ce-time"])) {
      throw new TaskError("cancelled", "cancelled before it was taken");
    }
    if (task.deadline !== undefined && Date.now() >= task.deadline) {
      throw new TaskError("timeout", "the deadline had passed when the task was taken", { retryable: true });
    }
    const input = msg.data.length ? JSON.parse(new TextDecoder().decode(msg.data)) : {};
    log("working on", task.actionId, "attempt", task.attempt);
    // At its deadline the handler is told to stop as for a cancel notice (task.signal).
    if (task.deadline !== undefined) {
      const timeout = new TaskError("timeout", "the deadline passed", { retryable: true });
      deadlineTimer = setTimeout(() => task.abort.abort(timeout), Math.max(task.deadline - Date.now(), 0));
    }
    work = HANDLERS[capability](input, task);
    const result = await Promise.race([work, aborted(task.signal)]);
    type = result?.type ?? "task.completed";
    data = result?.data ?? {};
  } catch (err) {
    const error = err instanceof TaskError ? err : new TaskError("agent_error", String(err?.message ?? err), { retryable: true });
    // Stopped (cancelled, or past the deadline): answer once the handler has ended, for
    // a capability with a concurrency limit gives the slot on with the answer. A handler
    // that ignores task.signal is answered without, saying so (code handler_running):
    // the orchestrator then holds the slot a while longer.
    if (work && task.signal.aborted && !(await settles(work, CANCEL_CLEANUP_MS))) {
      log("the handler of", task.actionId, "ignores its cancellation; answering without it");
      if (error.errorClass === "cancelled") error.code = "handler_running";
    }
    if (stopping && !(err instanceof TaskError)) {
      msg.nak(); // shutting down: hand it back to another worker
      return;
    }
    type = "task.failed";
    data = { error: { class: error.errorClass, message: error.message, retryable: error.retryable } };
    if (error.code) data.error.code = error.code;
    if (error.retryAfter !== undefined) data.error.retry_after = error.retryAfter;
  } finally {
    clearInterval(ticker);
    clearTimeout(deadlineTimer);
    running.set(task.actionId, (running.get(task.actionId) ?? []).filter((f) => f !== task));
    if (!running.get(task.actionId).length) running.delete(task.actionId);
  }
  // The answer: a binary-mode CloudEvent echoing run, action, attempt and the task's
  // Interlock-Token, by request (way 1) or on <prefix>.results.<capability>.<run id>.
  const id = `${task.actionId}.${task.attempt}.result`;
  const source = `interlock://agent/${NAME}`;
  const answer = writeHeaders({
    "ce-specversion": "1.0",
    "ce-id": id,
    "ce-source": source,
    "ce-type": type,
    "ce-subject": runId,
    "ce-time": now(),
    "ce-datacontenttype": "application/json",
    "ce-runid": runId,
    "ce-actionid": task.actionId,
    "ce-attempt": String(task.attempt),
    "ce-traceparent": h["ce-traceparent"],
    traceparent: h["traceparent"],
    "Content-Type": "application/json",
    "Interlock-Token": h["interlock-token"],
    "Nats-Msg-Id": `${source}:${id}`,
  });
  try {
    let payload = json(data);
    if (payload.length > THRESHOLD && objectsBucket) {
      payload = json(await byReference(js, payload, `${token(task.actionId)}.${task.attempt}.result`));
    }
    // Way 1, by request: stored in the run's log once the orchestrator replies. Way 2, the
    // results stream, when none replies in time or it could not take the answer now.
    const taken = await answerByRequest(`${PREFIX}.answer.${capability}.${runId}`, payload, answer);
    if (!taken) await js.publish(`${PREFIX}.results.${capability}.${runId}`, payload, { headers: answer });
  } catch (err) {
    log("could not publish the answer:", err.message);
    msg.nak(1000); // the answer is not stored: let the task come again
    return;
  }
  msg.ack(); // only once the answer is stored
  log("answered", task.actionId, "attempt", task.attempt, type);
}

// Step 6, way 1: the answer as a request; the reply's Interlock-Answer says what became of
// it. recorded, refused (dead-lettered: sending it again changes nothing; the reply says
// why) and late (the run stopped waiting for it) are final; failed, no reply in 5 s or no
// orchestrator up (no responders) are not: the caller sends it the other way.
let conn;

async function answerByRequest(subject, payload, headers) {
  let reply;
  try {
    reply = await conn.request(subject, payload, { headers, timeout: 5000 });
  } catch (err) {
    log(`no reply to the answer on ${subject} (${err.message}): to the results stream`);
    return false;
  }
  const said = reply.headers?.get("Interlock-Answer");
  if (said === "refused") {
    const why = reply.headers.get("Interlock-Answer-Reason");
    log(`answer on ${subject} refused (${why}): ${reply.headers.get("Interlock-Answer-Detail")}`);
  }
  return Boolean(said) && said !== "failed";
}

// --- main ------------------------------------------------------------------------------

async function main() {
  const capabilities = process.env.CAPABILITIES?.split(",") ?? Object.keys(HANDLERS);
  const unknown = capabilities.filter((cap) => !HANDLERS[cap]);
  if (unknown.length) throw new Error(`no handler for ${unknown.join(", ")}`);
  const nc = await open();
  conn = nc;
  const js = nc.jetstream({ apiPrefix: jsApi });
  // Step 2: cancel notices first.
  for (const cap of capabilities) nc.subscribe(`${PREFIX}.control.${cap}.*`, { callback: (_, m) => onCancel(m) });

  // Step 3: bind to each capability's durable consumer (the orchestrator creates it).
  const consumers = [];
  for (const cap of capabilities) {
    const durable = `cap_${token(cap)}`;
    for (;;) {
      try {
        const consumer = await js.consumers.get(TASKS_STREAM, durable);
        const info = await consumer.info();
        consumers.push({ cap, consumer, ackWaitMs: info.config.ack_wait / 1e6 });
        break;
      } catch (err) {
        if (stopping) return;
        log(`waiting for the consumer ${durable} (apply the AgentDef first): ${err.message}`);
        await sleep(1000);
      }
    }
  }
  await heartbeat(js, capabilities);
  const beating = setInterval(() => heartbeat(js, capabilities), HEARTBEAT_MS);
  log(`${NAME} ${INSTANCE} serving ${capabilities.join(", ")}`);

  const tasks = new Set();
  const waiters = new Set();
  const freed = () => {
    for (const wake of waiters) wake();
    waiters.clear();
  };
  const pullLoop = async ({ cap, consumer, ackWaitMs }) => {
    while (!stopping) {
      const free = CONCURRENCY - inFlight;
      if (free <= 0) {
        await new Promise((resolve) => waiters.add(resolve));
        continue;
      }
      // One pull request for as many tasks as there are free slots, open for 5 s.
      let batch;
      try {
        batch = await consumer.fetch({ max_messages: free, expires: 5000 });
      } catch (err) {
        log("pull failed:", err.message);
        await sleep(1000);
        continue;
      }
      for await (const msg of batch) {
        inFlight += 1;
        held.add(msg);
        const work = handle(js, cap, msg, ackWaitMs)
          .catch((err) => log("internal error:", err))
          .finally(() => {
            inFlight -= 1;
            held.delete(msg);
            tasks.delete(work);
            freed();
          });
        tasks.add(work);
      }
    }
  };
  const loops = consumers.map(pullLoop);

  // Step 9: shut down cleanly.
  const stop = async () => {
    if (stopping) process.exit(1); // a second signal: leave at once (tasks come back)
    stopping = true;
    log("stopping: finishing", tasks.size, "task(s)");
    freed();
    clearInterval(beating);
    await Promise.race([Promise.all(tasks), sleep(GRACE_MS)]);
    for (const msg of held) msg.nak(); // given up: another worker takes them at once
    await heartbeat(js, capabilities, true);
    await nc.drain();
    process.exit(0);
  };
  process.on("SIGINT", stop);
  process.on("SIGTERM", stop);
  await Promise.all(loops);
}

function sleep(ms, signal) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(resolve, ms);
    signal?.addEventListener("abort", () => {
      clearTimeout(timer);
      reject(signal.reason);
    });
  });
}

const aborted = (signal) =>
  new Promise((_, reject) => {
    if (signal.aborted) reject(signal.reason);
    else signal.addEventListener("abort", () => reject(signal.reason));
  });

// Whether `promise` settles within `ms`.
const settles = (promise, ms) => {
  let timer;
  const late = new Promise((resolve) => (timer = setTimeout(() => resolve(false), ms)));
  const done = promise.then(() => true, () => true);
  return Promise.race([done, late]).finally(() => clearTimeout(timer));
};

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
