// Agents: each AgentDef's capabilities, live workers, queue depth and recent failures.
import { api } from "./api.js";
import { names } from "./deadletters.js";
import { add, h, table, timeCell } from "./dom.js";

export async function agentsPage(root) {
  const [agents, letters, failed] = await Promise.all([
    api("/agents"),
    api("/dead-letters"),
    // Failed attempts per capability (an older gateway has no such endpoint: none shown).
    api("/agents/failures").catch(() => ({ capabilities: [], since: null })),
  ]);
  const failures = new Map(failed.capabilities.map((f) => [f.capability, f]));
  add(root, h("h1", {}, "Agents"));
  if (failed.since) {
    const hours = failed.window_s / 3600;
    // The counts are read from the run logs; complete from `since` when that is later than
    // the window's start (a gateway still reading them back, or a very busy hour).
    const partial = new Date(failed.since).getTime() > Date.now() - failed.window_s * 1000 + 60_000;
    add(root, h("p", { class: "hint" },
      `Recent failures: the failed attempts of the last ${hours === 1 ? "hour" : `${hours} hours`}, read from the run logs`,
      partial ? [" (complete since ", timeCell(failed.since), ")"] : null,
      ", and the dead letters naming the capability."));
  }
  if (!agents.length) {
    add(root, h("p", { class: "muted" }, "No AgentDef is applied."));
    return;
  }
  // One table of every AgentDef's capabilities, one of the live worker processes (each
  // once, with all its capabilities, however many AgentDefs it serves).
  const caps = agents.flatMap((agent) => agent.capabilities.map((c, i) => {
    const dead = letters.filter((d) => names(d, c.name));
    const attempts = failures.get(c.name);
    return [
      i === 0 ? h("strong", {}, agent.name) : h("span", { class: "visually-hidden" }, agent.name),
      h("code", {}, c.name),
      c.description || "",
      h("span", { class: c.workers ? "good" : "bad" }, String(c.workers)),
      c.queued == null ? "—" : String(c.queued),
      c.in_progress == null ? "—" : String(c.in_progress),
      c.timeout_s == null ? "—" : `${c.timeout_s} s`,
      c.max_retries == null ? "—" : String(c.max_retries),
      attempts || dead.length
        ? [
            attempts
              ? h("span", { class: "failures", title: `last: ${attempts.last.error}: ${attempts.last.message}` },
                  `${attempts.failed} failed attempt${attempts.failed === 1 ? "" : "s"}, last `,
                  h("a", { href: `#/runs/${encodeURIComponent(attempts.last.run_id)}` }, attempts.last.error),
                  " ", timeCell(attempts.last.at))
              : null,
            attempts && dead.length ? h("br") : null,
            dead.length ? h("a", { href: `#/dead-letters?capability=${encodeURIComponent(c.name)}` }, `${dead.length} dead letters`) : null,
          ]
        : "none",
    ];
  }));
  const seen = new Map();
  for (const agent of agents) {
    for (const w of agent.workers) {
      const known = seen.get(w.instance);
      if (known) known.agents.add(agent.name);
      else seen.set(w.instance, { w, agents: new Set([agent.name]) });
    }
  }
  const workers = [...seen.values()].map(({ w, agents: of }) => [
    h("code", {}, w.instance),
    w.name || "",
    h("span", { class: "caps" }, (w.capabilities || []).map((c) => h("code", { class: "chip" }, c))),
    [...of].join(", "),
    w.host || "",
    w.pid == null ? "" : String(w.pid),
    w.in_flight == null ? "" : `${w.in_flight}${w.concurrency ? ` of ${w.concurrency}` : ""}`,
    timeCell(w.started_at),
    timeCell(w.heartbeat_at),
  ]);
  add(root,
    h("h2", { id: "caps-h" }, "Capabilities"),
    table("!Capabilities", ["AgentDef", "Capability", "Description", "Live workers", "Queued", "In progress", "Timeout", "Retries", "Recent failures"], caps, { stacked: true }),
    h("h2", { id: "workers-h" }, "Live workers"),
    table("!Live workers", ["Instance", "Worker", "Capabilities", "AgentDefs", "Host", "PID", "In flight", "Started", "Last heartbeat"], workers, { empty: "No live worker.", stacked: true }),
  );
}
