// Agents: each AgentDef's capabilities, live workers, queue depth and recent failures.
import { api } from "./api.js";
import { names } from "./deadletters.js";
import { add, h, table, timeCell } from "./dom.js";

export async function agentsPage(root) {
  const [agents, letters] = await Promise.all([api("/agents"), api("/dead-letters")]);
  add(root, h("h1", {}, "Agents"));
  if (!agents.length) {
    add(root, h("p", { class: "muted" }, "No AgentDef is applied."));
    return;
  }
  for (const agent of agents) {
    const caps = agent.capabilities.map((c) => {
      const failures = letters.filter((d) => names(d, c.name));
      return [
        h("code", {}, c.name),
        c.description || "",
        h("span", { class: c.workers ? "good" : "bad" }, String(c.workers)),
        c.queued == null ? "—" : String(c.queued),
        c.in_progress == null ? "—" : String(c.in_progress),
        c.timeout_s == null ? "—" : `${c.timeout_s} s`,
        c.max_retries == null ? "—" : String(c.max_retries),
        failures.length ? h("a", { href: `#/dead-letters?capability=${encodeURIComponent(c.name)}` }, `${failures.length} dead letters`) : "none",
      ];
    });
    const workers = agent.workers.map((w) => [
      h("code", {}, w.instance),
      w.host || "",
      w.pid == null ? "" : String(w.pid),
      w.in_flight == null ? "" : `${w.in_flight}${w.concurrency ? ` of ${w.concurrency}` : ""}`,
      timeCell(w.started_at),
      timeCell(w.heartbeat_at),
    ]);
    add(root, 
      h("section", { class: "agent", "aria-labelledby": `agent-${agent.name}` },
        h("h2", { id: `agent-${agent.name}` }, agent.name),
        table(`Capabilities of ${agent.name}`, ["Capability", "Description", "Live workers", "Queued", "In progress", "Timeout", "Retries", "Recent failures"], caps),
        table(`Live workers of ${agent.name}`, ["Instance", "Host", "PID", "In flight", "Started", "Last heartbeat"], workers, { empty: "No live worker." }),
      ),
    );
  }
}
