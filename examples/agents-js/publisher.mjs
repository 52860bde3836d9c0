// An Interlock event publisher in JavaScript: one CloudEvent, over HTTP with a publisher
// token or over NATS with a publisher credential, with the official `nats` client and
// Node's own fetch. It follows docs/agents-any-language.md, "Publishing events".
//
//   INTERLOCK_HTTP=http://127.0.0.1:8480 INTERLOCK_TOKEN=ilt_... \
//     node publisher.mjs acme.quote.requested '{"account": "a1"}'
//   INTERLOCK_URL=nats://127.0.0.1:4222 INTERLOCK_CREDS=acme.creds \
//     node publisher.mjs acme.quote.requested '{"account": "a1"}'
//
// With INTERLOCK_TOKEN it posts to the HTTP gateway (`interlock tokens create NAME --role
// publisher --events 'acme.>'`), else it publishes on NATS (`interlock creds issue
// publisher --events 'acme.>' -o acme.creds`). EVENT_ID (default: a new one each time;
// the same source and id again is stored once) and EVENT_SOURCE (default
// https://publisher-js.example) name the event; INTERLOCK_PREFIX (default il),
// INTERLOCK_OBJECT_THRESHOLD (bytes; default 262144: larger data goes by reference).
// It prints one JSON line (the gateway's answer, or the stream's acknowledgement) and exits
// 0, or prints why the event was refused and exits 1.
import { readFileSync } from "node:fs";
import { createHash, randomBytes } from "node:crypto";
import { connect, credsAuthenticator, headers as natsHeaders } from "nats";

const [TYPE, DATA = "{}"] = process.argv.slice(2);
if (!TYPE) {
  console.error("usage: node publisher.mjs TYPE [JSON|@file]");
  process.exit(2);
}
// The data: JSON, or @file for a file of JSON (as `interlock emit --data @file`).
const data = JSON.parse(DATA.startsWith("@") ? readFileSync(DATA.slice(1), "utf8") : DATA);
const ID = process.env.EVENT_ID ?? randomBytes(8).toString("hex");
const SOURCE = process.env.EVENT_SOURCE ?? "https://publisher-js.example";
const PREFIX = process.env.INTERLOCK_PREFIX ?? "il";
const THRESHOLD = Number(process.env.INTERLOCK_OBJECT_THRESHOLD ?? 256 * 1024);
const CHUNK = 128 * 1024;
const json = (value) => new TextEncoder().encode(JSON.stringify(value));

// CloudEvents binary mode, as over HTTP: the attributes are ce- headers (values
// percent-encoded: printable ASCII stays, but for space, '"' and '%'), the data the body.
function ceEncode(value) {
  return Array.from(new TextEncoder().encode(String(value)), (b) =>
    b > 0x20 && b < 0x7f && b !== 0x22 && b !== 0x25
      ? String.fromCharCode(b)
      : "%" + b.toString(16).toUpperCase().padStart(2, "0"),
  ).join("");
}

const attributes = {
  "ce-specversion": "1.0",
  "ce-id": ID,
  "ce-source": SOURCE,
  "ce-type": TYPE,
  "ce-time": new Date().toISOString(),
  "ce-datacontenttype": "application/json",
};

// --- over HTTP: POST /events with a publisher token ------------------------------------

async function overHttp() {
  const headers = { Authorization: `Bearer ${process.env.INTERLOCK_TOKEN}`, "Content-Type": "application/json" };
  for (const [name, value] of Object.entries(attributes)) headers[name] = ceEncode(value);
  const response = await fetch(`${process.env.INTERLOCK_HTTP ?? "http://127.0.0.1:8480"}/events`, {
    method: "POST",
    headers,
    body: JSON.stringify(data),
  });
  const body = await response.json();
  if (response.status !== 202) {
    // An RFC 9457 problem: 403 for a type the token may not send, 400 for a bad event...
    console.log(JSON.stringify({ refused: response.status, type: body.type, detail: body.detail }));
    process.exit(1);
  }
  // The event as stored (seq, duplicate). A publisher's token is told no more (`unknown`
  // says so): which runs an event starts is for an operator's or a reader's eyes.
  console.log(JSON.stringify({ status: response.status, ...body.events[0] }));
}

// --- over NATS: a JetStream publish on <prefix>.events.<type> --------------------------

function userClaims(text) {
  const jwt = text.match(/-----BEGIN NATS USER JWT-----\s*([^\s-]+)/);
  if (!jwt) throw new Error("no user JWT in the creds file");
  return JSON.parse(Buffer.from(jwt[1].split(".")[1], "base64url").toString());
}

// Data over the threshold goes by reference: the JSON into the credential's own object
// bucket (its `objects:` tag), as an object store client writes it, and the event carries
// {"$object": {...}} as its data; runs read it whole. (An event over a quarter of the
// server's payload limit, 256 KiB on a default server, sent inline is dead-lettered
// `too-large`, which a publisher never hears of.)
const b64url = (bytes) => Buffer.from(bytes).toString("base64").replace(/\+/g, "-").replace(/\//g, "_");

async function byReference(js, bucket, bytes, name) {
  const nuid = randomBytes(11).toString("hex");
  const hash = createHash("sha256");
  let chunks = 0;
  for (let at = 0; at < bytes.length; at += CHUNK) {
    const part = bytes.subarray(at, at + CHUNK);
    hash.update(part);
    await js.publish(`$O.${bucket}.C.${nuid}`, part);
    chunks += 1;
  }
  const digest = `SHA-256=${b64url(hash.digest())}`;
  const info = { name, bucket, nuid, size: bytes.length, chunks, digest, mtime: new Date().toISOString() };
  const meta = `$O.${bucket}.M.${b64url(new TextEncoder().encode(name))}`;
  const rollup = natsHeaders();
  rollup.set("Nats-Rollup", "sub");
  await js.publish(meta, json(info), { headers: rollup });
  return { $object: { bucket, name, size: bytes.length, digest } };
}

async function overNats() {
  const text = readFileSync(process.env.INTERLOCK_CREDS, "utf8");
  const claims = userClaims(text);
  const tags = claims.nats?.tags ?? [];
  const bucket = tags.find((t) => t.startsWith("objects:"))?.slice("objects:".length);
  const nc = await connect({
    servers: process.env.INTERLOCK_URL ?? "nats://127.0.0.1:4222",
    authenticator: credsAuthenticator(new TextEncoder().encode(text)),
    // The only inbox the credential may subscribe to: the publish acks come there.
    inboxPrefix: `_INBOX.${claims.sub}`,
  });
  try {
    let payload = json(data);
    const inline = Math.min(THRESHOLD, Math.floor(nc.info.max_payload / 4));
    if (payload.length > inline) {
      if (!bucket) throw new Error(`the data takes ${payload.length} bytes and the credential has no object bucket`);
      payload = json(await byReference(nc.jetstream(), bucket, payload, `${ID}.data`));
    }
    const headers = natsHeaders();
    for (const [name, value] of Object.entries(attributes)) headers.set(name, ceEncode(value));
    headers.set("Content-Type", "application/json");
    // The same source and id within the stream's duplicate window (2 min) is stored once.
    headers.set("Nats-Msg-Id", `${SOURCE}:${ID}`);
    // A JetStream publish: the server answers once the event is stored (its ack names the
    // stream and sequence); a type outside the credential's patterns is refused by the
    // server ("Permissions Violation for Publish to ...").
    const ack = await nc.jetstream().publish(`${PREFIX}.events.${TYPE}`, payload, { headers });
    console.log(JSON.stringify({ stream: ack.stream, seq: ack.seq, duplicate: ack.duplicate }));
  } finally {
    await nc.close();
  }
}

try {
  await (process.env.INTERLOCK_TOKEN ? overHttp() : overNats());
} catch (err) {
  console.log(JSON.stringify({ refused: err.code ?? "error", detail: err.message }));
  process.exit(1);
}
