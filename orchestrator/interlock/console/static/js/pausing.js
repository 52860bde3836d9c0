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

// Since when and why, for a line of text: "since <time>: <reason>".
export function pausedText(at, reason) {
  return [at ? `since ${at}` : "", reason || ""].filter(Boolean).join(": ");
}

// The field a pause's reason is typed in (sent as `reason`; left empty, the server's default).
// `what` names it for assistive technology (null: a <label for> names it).
export function reasonField(id, what) {
  const name = what ? `Why pause ${what.charAt(0).toLowerCase()}${what.slice(1)}` : null;
  return h("input", {
    type: "text", id, name: "reason", class: "pause-reason", maxlength: 1024,
    placeholder: "reason (optional)", "aria-label": name,
  });
}

function withReason(body, field) {
  const reason = field?.value.trim();
  return reason ? { ...body, reason } : body;
}

// A button that resumes, or pauses with the reason typed beside it: its own field, or
// `reason` (a field from reasonField shared by several buttons, placed by the caller).
export function pauseButton(path, what, paused, onDone, { id, body = {}, reason } = {}) {
  const label = `${paused ? "Resume" : "Pause"} ${what.charAt(0).toLowerCase()}${what.slice(1)}`;
  if (paused) return h("button", { type: "button", id, onclick: () => pauseOrResume(path, what, true, onDone) }, label);
  const field = reason || reasonField(id ? `${id}-reason` : undefined, what);
  const button = h("button", { type: "button", id, onclick: () => pauseOrResume(path, what, false, onDone, withReason(body, field)) }, label);
  return reason ? button : h("span", { class: "pause-with-reason" }, field, button);
}
