// The console's router: #/runs, #/runs/<id>, #/workflows[/<ns>/<name>], #/agents,
// #/queues, #/dead-letters[/<seq>]. Each page renders into <main> and may return a cleanup function.
import { ApiError, cannotRead, setToken, token } from "./api.js";
import { errorBox, h } from "./dom.js";
import { agentsPage } from "./agents.js";
import { deadLetterPage, deadLettersPage } from "./deadletters.js";
import { queuesPage } from "./queues.js";
import { runPage } from "./run.js";
import { runsPage } from "./runs.js";
import { workflowPage, workflowsPage } from "./workflows.js";

const main = document.getElementById("main");
let cleanup = null;
let shown = 0;

function parse() {
  const raw = location.hash.replace(/^#\/?/, "") || "runs";
  const [path, query] = raw.split("?");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  return { parts, params: new URLSearchParams(query || "") };
}

function pageFor(parts) {
  const [section, ...rest] = parts;
  if (section === "runs" && rest.length === 1) return ["runs", runPage, rest[0]];
  if (section === "runs") return ["runs", runsPage];
  if (section === "workflows" && rest.length) return ["workflows", workflowPage, rest.join("/")];
  if (section === "workflows") return ["workflows", workflowsPage];
  if (section === "agents") return ["agents", agentsPage];
  if (section === "queues") return ["queues", queuesPage];
  if (section === "dead-letters" && rest.length === 1) return ["dead-letters", deadLetterPage, rest[0]];
  if (section === "dead-letters") return ["dead-letters", deadLettersPage];
  return [null, null];
}

export async function render() {
  const ticket = ++shown;
  if (cleanup) {
    cleanup();
    cleanup = null;
  }
  const { parts, params } = parse();
  const [section, page, arg] = pageFor(parts);
  for (const a of document.querySelectorAll("nav a[data-section]")) {
    if (a.dataset.section === section) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  const root = h("div", { class: "page" });
  main.setAttribute("aria-busy", "true");
  try {
    if (!page) throw new ApiError(404, { title: "Not found", detail: `no page ${location.hash}` });
    const done = await page(root, arg, params, () => ticket === shown);
    if (ticket !== shown) {
      if (typeof done === "function") done();
      return;
    }
    cleanup = typeof done === "function" ? done : null;
  } catch (e) {
    if (ticket !== shown) return;
    if (e instanceof ApiError && (e.status === 401 || cannotRead(e))) {
      if (ticket === shown) signIn(e);
      return;
    }
    root.replaceChildren(errorBox(e));
  } finally {
    if (ticket === shown) main.removeAttribute("aria-busy");
  }
  if (ticket !== shown) return;
  main.replaceChildren(root);
  performance.mark(`${section}:shown`);
  document.title = `${root.querySelector("h1")?.textContent || "Interlock"} · Interlock`;
}

// A page that catches its own errors (a table that shows them in its place) still ends
// here on a 401: any refused call puts the sign-in form in the page's place.
function signIn(e) {
  // The page being drawn, or shown, is dropped: its answer would replace the form.
  shown += 1;
  const publisher = cannotRead(e);
  if (publisher) {
    // Kept, it would bring every page back here: the person signs in again.
    setToken("");
    signOut.hidden = true;
  }
  if (cleanup) {
    cleanup();
    cleanup = null;
  }
  const input = h("input", {
    id: "token",
    name: "token",
    type: "password",
    autocomplete: "current-password",
    required: true,
    spellcheck: "false",
  });
  const form = h(
    "form",
    {
      class: "sign-in",
      onsubmit: (ev) => {
        ev.preventDefault();
        setToken(input.value.trim());
        signOut.hidden = !token();
        // The form goes: a refused token brings a new one that says so.
        main.replaceChildren(h("p", { class: "muted" }, "Signing in…"));
        render();
      },
    },
    h("h1", {}, "Sign in"),
    h(
      "p",
      {},
      publisher
        ? "That token is a publisher's: the console cannot use it. "
        : token() ? "That token was not accepted: " : "The gateway asks for a bearer token: ",
      e.message,
      publisher ? "." : "",
    ),
    h("label", { for: "token" }, "Bearer token"),
    input,
    h(
      "p",
      { class: "hint" },
      "interlock dev keeps an operator token in .interlock/creds/http-operator.token; ",
      "interlock tokens create NAME --role reader makes a read-only one. ",
      "The token stays in this browser tab only.",
    ),
    h("button", { type: "submit", class: "primary" }, "Sign in"),
  );
  main.replaceChildren(form);
  main.removeAttribute("aria-busy");
  document.title = "Sign in · Interlock";
  input.focus();
}

const signOut = document.getElementById("sign-out");
signOut.hidden = !token();
signOut.addEventListener("click", () => {
  setToken("");
  signOut.hidden = true;
  render();
});
document.addEventListener("interlock:unauthenticated", (ev) => {
  signOut.hidden = !token();
  if (!main.querySelector(".sign-in")) signIn(ev.detail);
});

let lastHash = location.hash;
window.addEventListener("hashchange", () => {
  // Moving between pages puts keyboard focus at the new page's start; a page that only
  // rewrote its own query (filters, paging) keeps focus where it was.
  const samePage = lastHash.split("?")[0] === location.hash.split("?")[0];
  lastHash = location.hash;
  render().then(() => {
    signOut.hidden = !token();
    // The new page from its top, the navigation in view (focusing <main> alone scrolled
    // the page down to it, the navigation off a phone's screen).
    if (!samePage) {
      window.scrollTo(0, 0);
      main.focus({ preventScroll: true });
    }
  });
});
render().then(() => (signOut.hidden = !token()));
