// Dead letters: what could not be handled and why; one in full; redrive.
import { api } from "./api.js";
import { add, ask, h, json, table, timeCell, toast } from "./dom.js";

// Whether a dead letter is about a capability: its subject names it (a task request, an
// answer) or its reason does (an agent's own dead letters).
export function names(letter, capability) {
  return `.${letter.subject}.`.includes(`.${capability}.`) || `.${letter.reason}.`.includes(`.${capability}.`);
}

export async function deadLettersPage(root, _arg, params) {
  const reason = params.get("reason") || "";
  const capability = params.get("capability") || "";
  let letters = await api("/dead-letters", { params: { reason } });
  if (capability) letters = letters.filter((d) => names(d, capability));
  const rows = letters
    .slice()
    .reverse()
    .map((d) => [
      h("a", { href: `#/dead-letters/${d.seq}` }, `#${d.seq}`),
      timeCell(d.time),
      h("code", {}, d.reason),
      d.detail,
      h("code", {}, d.subject),
    ]);
  add(root, 
    h("h1", {}, "Dead letters"),
    reason || capability ? h("p", {}, `Only ${reason ? `reason ${reason}` : ""}${capability ? ` capability ${capability}` : ""}. `, h("a", { href: "#/dead-letters" }, "Show all")) : null,
    table("!Dead letters, newest first", ["Seq", "Time", "Reason", "Detail", "Subject"], rows, { empty: "No dead letters." }),
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
  add(root, 
    h("div", { class: "title-row" }, h("h1", {}, `Dead letter #${d.seq}`),
      d.redrive_refusal
        ? h("button", { type: "button", id: "redrive", disabled: true, "aria-describedby": "not-redrivable" }, "Redrive…")
        : h("button", { type: "button", id: "redrive", class: "primary", onclick: redrive }, "Redrive…")),
    d.redrive_refusal ? h("p", { id: "not-redrivable", class: "hint" }, `Not redrivable: ${d.redrive_refusal}.`) : null,
    h("dl", { class: "meta" },
      h("dt", {}, "Time"), h("dd", {}, timeCell(d.time)),
      h("dt", {}, "Reason"), h("dd", {}, h("code", {}, d.reason)),
      h("dt", {}, "Detail"), h("dd", {}, d.detail),
      h("dt", {}, "Subject"), h("dd", {}, h("code", {}, d.subject)),
    ),
    h("h2", {}, "Headers"),
    table("!Headers", ["Header", "Value"], Object.entries(d.headers).map(([k, v]) => [h("code", {}, k), v]), { empty: "No headers." }),
    h("h2", {}, "Data"),
    d.data_base64 ? h("pre", { tabindex: "0" }, d.data_base64) : h("pre", { tabindex: "0" }, typeof d.data === "string" ? d.data : JSON.stringify(d.data, null, 2)),
  );
}
