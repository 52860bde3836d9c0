// Dead letters: what could not be handled and why; one in full; redrive.
import { api } from "./api.js";
import { add, ask, h, table, timeCell, toast } from "./dom.js";

// Whether a dead letter is about a capability: its subject names it (a task request, an
// answer) or its reason does (an agent's own dead letters).
export function names(letter, capability) {
  return `.${letter.subject}.`.includes(`.${capability}.`) || `.${letter.reason}.`.includes(`.${capability}.`);
}

// The run a letter is about, when it names one (its ce-runid header), as a link.
function runLink(letter) {
  const id = letter.headers?.["ce-runid"];
  return id && /^[A-Za-z0-9_-]{1,128}$/.test(id) ? h("a", { href: `#/runs/${encodeURIComponent(id)}`, class: "mono" }, id) : "";
}

// Discard the letters of a reason and/or older than an age: asked, confirmed, done.
async function discardMany(reasons, reason) {
  const choose = h("select", { id: "discard-reason", name: "reason" }, h("option", { value: "" }, "any reason"), reasons.map((r) => h("option", { value: r, selected: r === reason }, r)));
  const age = h("input", { id: "discard-age", name: "older_than", placeholder: "e.g. 1h, 2d", spellcheck: "false" });
  let dropped = null;
  const values = await ask(
    "Discard dead letters",
    [
      h("p", {}, "The letters chosen are dropped; nothing is published. This cannot be undone."),
      h("label", { for: "discard-reason" }, "Reason"),
      choose,
      h("label", { for: "discard-age" }, "Kept longer than (30s, 5m, 2h, 1d; empty: any age)"),
      age,
    ],
    "Discard",
    {
      danger: true,
      check: async (v) => {
        if (!v.reason && !v.older_than.trim()) return "Choose a reason or an age (or both).";
        const r = await api("/dead-letters", { method: "DELETE", params: { reason: v.reason, older_than: v.older_than.trim() } });
        dropped = r.discarded;
        return null;
      },
    },
  );
  if (!values || !dropped) return false;
  toast(`Discarded ${dropped.length} dead letter${dropped.length === 1 ? "" : "s"}.`, "good");
  return true;
}

export async function deadLettersPage(root, _arg, params) {
  const reason = params.get("reason") || "";
  const capability = params.get("capability") || "";
  const every = await api("/dead-letters");
  const reasons = [...new Set(every.map((d) => d.reason))].sort();
  let letters = reason ? every.filter((d) => d.reason === reason) : every;
  if (capability) letters = letters.filter((d) => names(d, capability));
  const rows = letters
    .slice()
    .reverse()
    .map((d) => [
      h("a", { href: `#/dead-letters/${d.seq}` }, `#${d.seq}`),
      timeCell(d.time),
      h("code", {}, d.reason),
      runLink(d),
      d.detail,
      h("code", {}, d.subject),
    ]);
  const filter = h("select", { id: "f-reason", name: "reason" },
    h("option", { value: "" }, `any (${every.length})`),
    reasons.map((r) => h("option", { value: r, selected: r === reason }, `${r} (${every.filter((d) => d.reason === r).length})`)));
  filter.addEventListener("change", () => {
    const q = new URLSearchParams();
    if (filter.value) q.set("reason", filter.value);
    if (capability) q.set("capability", capability);
    location.hash = `#/dead-letters${q.toString() ? `?${q}` : ""}`;
  });
  const discard = h("button", { type: "button", id: "discard", class: "danger", disabled: !every.length, onclick: async () => {
    if (await discardMany(reasons, reason)) window.dispatchEvent(new HashChangeEvent("hashchange"));
  } }, "Discard…");
  add(root,
    h("div", { class: "title-row" }, h("h1", {}, "Dead letters"), discard),
    h("form", { class: "filters", role: "search", "aria-label": "Filter dead letters", onsubmit: (ev) => ev.preventDefault() },
      h("div", { class: "field" }, h("label", { for: "f-reason" }, "Reason"), filter)),
    capability ? h("p", {}, `Only capability ${capability}. `, h("a", { href: "#/dead-letters" }, "Show all")) : null,
    table("!Dead letters, newest first", ["Seq", "Time", "Reason", "Run", "Detail", "Subject"], rows, { empty: "No dead letters.", stacked: true }),
  );
}

export async function deadLetterPage(root, seq) {
  const d = await api(`/dead-letters/${encodeURIComponent(seq)}`);
  const redrive = async () => {
    const ok = await ask(
      `Redrive dead letter #${d.seq}?`,
      h("p", {}, "It is published again on ", h("code", {}, d.subject), " and removed from the dead letters."),
      "Redrive",
    );
    if (!ok) return;
    try {
      const r = await api(`/dead-letters/${d.seq}/redrive`, { method: "POST" });
      toast(`Dead letter #${r.seq} redriven (stored again as #${r.stored}).`, "good");
      location.hash = "#/dead-letters";
    } catch (e) {
      toast(e.message, "bad");
    }
  };
  const discard = async () => {
    const ok = await ask(
      `Discard dead letter #${d.seq}?`,
      h("p", {}, "It is dropped; nothing is published. This cannot be undone."),
      "Discard",
      { danger: true },
    );
    if (!ok) return;
    try {
      await api(`/dead-letters/${d.seq}`, { method: "DELETE" });
      toast(`Dead letter #${d.seq} discarded.`, "good");
      location.hash = "#/dead-letters";
    } catch (e) {
      toast(e.message, "bad");
    }
  };
  const run = runLink(d);
  add(root, 
    h("div", { class: "title-row" }, h("h1", {}, `Dead letter #${d.seq}`),
      d.redrive_refusal
        ? h("button", { type: "button", id: "redrive", disabled: true, "aria-describedby": "not-redrivable" }, "Redrive…")
        : h("button", { type: "button", id: "redrive", class: "primary", onclick: redrive }, "Redrive…"),
      h("button", { type: "button", id: "discard-one", class: "danger", onclick: discard }, "Discard…")),
    d.redrive_refusal ? h("p", { id: "not-redrivable", class: "hint" }, `Not redrivable: ${d.redrive_refusal}.`) : null,
    h("dl", { class: "meta" },
      h("dt", {}, "Time"), h("dd", {}, timeCell(d.time)),
      h("dt", {}, "Reason"), h("dd", {}, h("code", {}, d.reason)),
      h("dt", {}, "Detail"), h("dd", {}, d.detail),
      h("dt", {}, "Subject"), h("dd", {}, h("code", {}, d.subject)),
      run ? [h("dt", {}, "Run"), h("dd", {}, run)] : null,
    ),
    h("h2", {}, "Headers"),
    table("!Headers", ["Header", "Value"], Object.entries(d.headers).map(([k, v]) => [h("code", {}, k), v]), { empty: "No headers." }),
    h("h2", {}, "Data"),
    d.data_base64 ? h("pre", { tabindex: "0" }, d.data_base64) : h("pre", { tabindex: "0" }, typeof d.data === "string" ? d.data : JSON.stringify(d.data, null, 2)),
  );
}
