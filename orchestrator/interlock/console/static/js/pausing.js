// Pausing from the console: a paused badge, and the buttons that pause and resume a run, a
// workflow or a capability through the REST API with the caller's token (operators; a
// reader is told no).
import { api } from "./api.js";
import { h, toast } from "./dom.js";

// "paused" beside a status, saying since when and why in its title.
export function pausedBadge(pause) {
  if (!pause) return null;
  const why = [pause.at ? `since ${pause.at}` : "", pause.reason || "", pause.held ? `${pause.held} event(s) held` : ""];
  return h("span", { class: "status status-paused", title: why.filter(Boolean).join(" · ") }, "paused");
}

// Pause (or resume) what `path` names (/runs/<id>, /workflows/<ns>/<name>,
// /capabilities/<name>), say what came of it, then `onDone` (which redraws the page).
export async function pauseOrResume(path, what, paused, onDone, body = {}) {
  try {
    const r = await api(`${path}/${paused ? "resume" : "pause"}`, { method: "POST", body: paused ? undefined : body });
    toast(r.changed ? `${what} ${paused ? "resumed" : "paused"}.` : `${what} was ${paused ? "not paused" : "paused already, or has ended"}.`, "good");
  } catch (e) {
    toast(e.message, "bad");
  }
  onDone?.();
}

export function pauseButton(path, what, paused, onDone, { id, body = {} } = {}) {
  const label = `${paused ? "Resume" : "Pause"} ${what.charAt(0).toLowerCase()}${what.slice(1)}`;
  return h("button", { type: "button", id, onclick: () => pauseOrResume(path, what, paused, onDone, body) }, label);
}
