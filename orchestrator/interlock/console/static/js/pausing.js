// Pausing from the console: a paused badge, and the buttons that pause and resume a run or
// a workflow through the REST API with the caller's token (operators; a reader is told no).
import { api } from "./api.js";
import { h, toast } from "./dom.js";

// "paused" beside a status, saying since when and why in its title.
export function pausedBadge(pause) {
  if (!pause) return null;
  const why = [pause.at ? `since ${pause.at}` : "", pause.reason || "", pause.held ? `${pause.held} event(s) held` : ""];
  return h("span", { class: "status status-paused", title: why.filter(Boolean).join(" · ") }, "paused");
}

// A button that pauses (or resumes) what `path` names (/runs/<id>, /workflows/<ns>/<name>).
// `body`: the pause's body; `onDone` redraws the page.
export function pauseButton(path, what, paused, onDone, { id, body = {} } = {}) {
  const verb = paused ? "resume" : "pause";
  return h("button", {
    type: "button",
    id,
    onclick: async () => {
      try {
        const r = await api(`${path}/${verb}`, { method: "POST", body: paused ? undefined : body });
        const changed = r.changed;
        toast(changed ? `${what} ${paused ? "resumed" : "paused"}.` : `${what} was ${paused ? "not paused" : "paused already, or has ended"}.`, "good");
      } catch (e) {
        toast(e.message, "bad");
      }
      onDone?.();
    },
  }, paused ? `Resume ${what.toLowerCase()}` : `Pause ${what.toLowerCase()}`);
}
