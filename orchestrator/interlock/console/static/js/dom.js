// Small helpers to build the DOM (text is always set as text, never parsed as HTML).

export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") el.className = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(el.dataset, v);
    else el.setAttribute(k, v === true ? "" : v);
  }
  append(el, children);
  return el;
}

export function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : String(c));
  }
  return el;
}

const SVG = "http://www.w3.org/2000/svg";
export function s(tag, attrs, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v);
  }
  append(el, children);
  return el;
}

export function status(value) {
  return h("span", { class: `status status-${value}` }, value);
}

export function when(iso) {
  if (!iso) return "";
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return iso;
  return d.toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

export function timeCell(iso) {
  return iso ? h("time", { datetime: iso, title: iso }, when(iso)) : "";
}

export function duration(ms) {
  if (ms === null || ms === undefined || Number.isNaN(ms)) return "";
  if (ms < 1000) return `${Math.round(ms)} ms`;
  const sec = ms / 1000;
  if (sec < 60) return `${sec.toFixed(sec < 10 ? 2 : 1)} s`;
  const min = Math.floor(sec / 60);
  if (min < 60) return `${min} min ${Math.round(sec % 60)} s`;
  const hours = Math.floor(min / 60);
  if (hours < 48) return `${hours} h ${min % 60} min`;
  return `${Math.floor(hours / 24)} d ${hours % 24} h`;
}

export function between(a, b) {
  if (!a || !b) return null;
  return new Date(b).getTime() - new Date(a).getTime();
}

// A JSON value, collapsed: the summary shows its start; the whole value is laid out only
// when opened (a 5,000-record log stays fast).
export function json(value, label) {
  const text = JSON.stringify(value);
  if (text === undefined) return h("code", {}, "—");
  if (text.length <= 60 && !label) return h("code", { class: "json-inline" }, text);
  const details = h(
    "details",
    { class: "json" },
    h("summary", {}, label ? `${label} ` : "", h("code", {}, text.length > 80 ? `${text.slice(0, 77)}…` : text)),
  );
  details.addEventListener(
    "toggle",
    () => {
      if (details.open && !details.querySelector("pre")) {
        details.append(h("pre", { tabindex: "0" }, JSON.stringify(value, null, 2)));
      }
    },
  );
  return details;
}

// A table; `stacked`: on a phone each row is a card of "column: value" lines (each cell
// says its column), so nothing is off screen.
export function table(caption, columns, rows, { empty = "None.", stacked = false } = {}) {
  if (!rows.length) return h("p", { class: "muted" }, empty);
  return h(
    "div",
    { class: "table-wrap" },
    h(
      "table",
      { class: stacked ? "stacked" : null },
      h("caption", { class: caption.startsWith("!") ? "visually-hidden" : "" }, caption.replace(/^!/, "")),
      h("thead", {}, h("tr", {}, columns.map((c) => h("th", { scope: "col" }, c)))),
      h("tbody", {}, rows.map((r) => h("tr", {}, r.map((cell, i) => h("td", { "data-label": columns[i] || null }, cell))))),
    ),
  );
}

// What a running run waits for, as words: "approval: approval.granted, approval.denied",
// "agent review", "event deploy.finished", "timer to gave-up".
export function waitingText(waiting) {
  const by = new Map();
  for (const w of waiting || []) {
    if (!by.has(w.kind)) by.set(w.kind, []);
    by.get(w.kind).push(w.kind === "timer" ? `to ${w.name}` : w.name);
  }
  return [...by].map(([kind, names]) => `${kind} ${names.join(", ")}`).join("; ");
}

export function toast(message, kind = "info") {
  const box = document.getElementById("toast");
  box.textContent = message;
  box.className = `show ${kind}`;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => (box.className = ""), 6000);
}

export function errorBox(e) {
  return h(
    "div",
    { class: "error", role: "alert" },
    h("strong", {}, e.status ? `${e.status} ${e.problem?.title || ""}` : "Error"),
    " ",
    e.message,
  );
}

// A modal question (native <dialog>): resolves to the form's values, or null.
// `check(values)` (or a promise of it): an error to show in the dialog, which then stays
// open with what was typed; null: it closes. `confirm`: the confirm button, to turn on
// and off.
export function ask(title, body, confirmLabel, { danger = false, check = null, confirm = null } = {}) {
  return new Promise((resolve) => {
    const problem = h("p", { class: "note", role: "alert", id: "dialog-problem" });
    const ok = confirm || h("button", { value: "ok", type: "submit", class: danger ? "danger" : "primary" }, confirmLabel);
    const form = h(
      "form",
      { method: "dialog" },
      h("h2", {}, title),
      body,
      problem,
      h(
        "div",
        { class: "buttons" },
        h("button", { value: "cancel", type: "submit", formnovalidate: true }, "Back"),
        ok,
      ),
    );
    form.addEventListener("submit", (ev) => {
      if (ev.submitter?.value !== "ok" || !check) return;
      ev.preventDefault();
      problem.textContent = "";
      ok.disabled = true;
      Promise.resolve()
        .then(() => check(Object.fromEntries(new FormData(form))))
        .catch((e) => e.message || String(e))
        .then((why) => {
          ok.disabled = false;
          if (why) problem.textContent = why;
          else dialog.close("ok");
        });
    });
    const dialog = h("dialog", { "aria-label": title }, form);
    document.body.append(dialog);
    dialog.addEventListener("close", () => {
      const ok = dialog.returnValue === "ok";
      const values = Object.fromEntries(new FormData(form));
      dialog.remove();
      resolve(ok ? values : null);
    });
    dialog.showModal();
  });
}

// el.append(...) that skips null/false and flattens arrays.
export function add(el, ...children) {
  return append(el, children);
}
