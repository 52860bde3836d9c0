// A workflow's state machine drawn as SVG. The layout (a layered, Sugiyama-style one: ranks,
// crossing reduction, coordinates, edge routes) comes from dagre; this file only draws it.
import { graphlib, layout } from "../vendor/dagre/dagre.esm.js";
import { s } from "./dom.js";
import { short } from "./timeline.js";

const FONT = 13;
const CHAR = 7.6; // average width of a 13px sans-serif character
const EDGE_CHAR = 6.4; // 11px edge labels
let serial = 0;
const PLAIN = new Set(["normal", "task", ""]); // kinds not written under the name

// A smooth path through dagre's edge points: a uniform cubic B-spline, ending on the last
// point (the arrowhead), as d3's curveBasis draws it.
function basis(points) {
  const f = (v) => v.toFixed(1);
  if (points.length < 3) return points.map((p, i) => `${i ? "L" : "M"}${f(p.x)},${f(p.y)}`).join(" ");
  const [first, ...rest] = points;
  let out = `M${f(first.x)},${f(first.y)}`;
  let [x0, y0, x1, y1] = [first.x, first.y, first.x, first.y];
  const curve = (x, y) => {
    out += ` C${f((2 * x0 + x1) / 3)},${f((2 * y0 + y1) / 3)} ${f((x0 + 2 * x1) / 3)},${f((y0 + 2 * y1) / 3)} ${f((x0 + 4 * x1 + x) / 6)},${f((y0 + 4 * y1 + y) / 6)}`;
  };
  rest.forEach((p, i) => {
    if (i === 1) out += ` L${f((5 * x0 + x1) / 6)},${f((5 * y0 + y1) / 6)}`;
    if (i >= 1) curve(p.x, p.y);
    [x0, y0, x1, y1] = [x1, y1, p.x, p.y];
  });
  curve(x1, y1);
  out += ` L${f(x1)},${f(y1)}`;
  return out;
}

// A transition back into its own state: a loop off the node's right side around the place
// dagre kept for its label.
function selfLoop(n, label) {
  const right = n.x + n.width / 2;
  const reach = Math.max(label.x - label.width / 2, right + 18);
  const f = (v) => v.toFixed(1);
  return `M${f(right)},${f(n.y - 7)} C${f(reach)},${f(n.y - 30)} ${f(reach)},${f(n.y + 30)} ${f(right + 1)},${f(n.y + 7)}`;
}

export function edgeLabel(t) {
  if (t.kind === "catch") return `catch ${t.event}`;
  if (t.kind === "timeout") return "timeout";
  const guard = t.guard ? ` [${t.guard.length > 28 ? `${t.guard.slice(0, 27)}…` : t.guard}]` : "";
  return `${t.event}${guard}`;
}

export function edgeKey(t) {
  return t.kind === "on" ? `${t.from}|on|${t.index}` : `${t.from}|${t.kind}|${t.to}`;
}

// Which edges a run took, from its transition.fired records: the `on` entry it names, or
// (a catch or a timeout) the edges between the two states.
export function takenEdges(detail, records) {
  const taken = new Set();
  for (const r of records) {
    if (short(r.type) !== "transition.fired") continue;
    const d = r.data;
    const exact = detail.transitions.find(
      (t) => t.kind === "on" && t.from === d.from && t.to === d.to && t.index === d.transition,
    );
    if (exact) taken.add(edgeKey(exact));
    else
      for (const t of detail.transitions) if (t.from === d.from && t.to === d.to) taken.add(edgeKey(t));
  }
  return taken;
}

/**
 * @param detail a WorkflowDetail (states, kinds, initial_state, transitions)
 * @param marks {visited: Map<state, visits>, taken: Set<edgeKey>, current: state|null,
 *               currentStatus: string, onSelect(state)}
 */
export function diagram(detail, marks = {}) {
  const id = `d${++serial}`;
  const visited = marks.visited || new Map();
  const taken = marks.taken || new Set();
  const g = new graphlib.Graph({ multigraph: true });
  g.setGraph({ rankdir: "TB", nodesep: 28, ranksep: 44, edgesep: 12, marginx: 12, marginy: 12 });
  g.setDefaultEdgeLabel(() => ({}));
  g.setNode("\u0000start", { width: 14, height: 14, start: true });
  for (const name of detail.states) {
    const kind = detail.kinds?.[name] || "";
    const second = kind && !PLAIN.has(kind) ? kind.replaceAll("_", " ") : "";
    const width = Math.max(90, Math.max(name.length * CHAR, second.length * 6.2) + 28);
    g.setNode(name, { width, height: second ? 46 : 34, name, kind, second });
  }
  g.setEdge("\u0000start", detail.initial_state, { width: 0, height: 0, start: true }, "start");
  detail.transitions.forEach((t, i) => {
    if (!g.hasNode(t.to)) return;
    const label = edgeLabel(t);
    g.setEdge(
      t.from,
      t.to,
      { label, width: label.length * EDGE_CHAR + 6, height: 14, labelpos: "c", t, key: edgeKey(t) },
      `e${i}`,
    );
  });
  layout(g);
  const { width, height } = g.graph();

  const svg = s("svg", {
    class: "diagram",
    viewBox: `0 0 ${Math.ceil(width)} ${Math.ceil(height)}`,
    width: Math.ceil(width),
    height: Math.ceil(height),
    role: "group",
    "aria-label": `State diagram of ${detail.name}`,
  });
  svg.append(
    s(
      "defs",
      {},
      ["plain", "taken"].map((k) =>
        s(
          "marker",
          {
            id: `${id}-${k}`,
            viewBox: "0 0 10 10",
            refX: 9,
            refY: 5,
            markerWidth: 7,
            markerHeight: 7,
            orient: "auto-start-reverse",
          },
          s("path", { d: "M0,0 L10,5 L0,10 z", class: `arrow-${k}` }),
        ),
      ),
    ),
  );
  const edges = s("g", { class: "edges" });
  for (const e of g.edges()) {
    const data = g.edge(e);
    const isTaken = data.start ? visited.size > 0 : taken.has(data.key);
    const d = e.v === e.w ? selfLoop(g.node(e.v), data) : basis(data.points);
    const edge = s(
      "g",
      {
        class: `edge${isTaken ? " taken" : ""}${data.t ? ` edge-${data.t.kind}` : ""}`,
        "data-from": e.v,
        "data-to": e.w,
      },
      s("path", { d, "marker-end": `url(#${id}-${isTaken ? "taken" : "plain"})` }),
    );
    if (data.t) {
      const full = data.t.guard ? `${data.t.event} if ${data.t.guard}` : edgeLabel(data.t);
      edge.append(s("title", {}, `${e.v} → ${e.w}: ${full}${isTaken ? " (taken)" : ""}`));
      if (data.label) {
        edge.append(s("text", { x: data.x, y: data.y + 4, class: "edge-label", "text-anchor": "middle" }, data.label));
      }
    }
    edges.append(edge);
  }
  svg.append(edges);

  const nodes = s("g", { class: "nodes" });
  for (const name of g.nodes()) {
    const n = g.node(name);
    if (n.start) {
      nodes.append(s("circle", { cx: n.x, cy: n.y, r: 6, class: "start-dot" }, s("title", {}, "start")));
      continue;
    }
    const visits = visited.get(name) || 0;
    const isCurrent = marks.current === name;
    const classes = ["node", `kind-${n.kind || "normal"}`];
    if (visits) classes.push("visited");
    if (isCurrent) classes.push("current", `current-${marks.currentStatus || "running"}`);
    const words = [`state ${name}`];
    if (!PLAIN.has(n.kind)) words.push(n.kind.replaceAll("_", " "));
    if (marks.visited) words.push(visits ? `visited ${visits === 1 ? "once" : `${visits} times`}` : "not visited");
    if (isCurrent) words.push(marks.currentStatus === "running" ? "current state" : `ended here (${marks.currentStatus})`);
    const node = s("g", {
      class: classes.join(" "),
      "data-state": name,
      transform: `translate(${n.x - n.width / 2},${n.y - n.height / 2})`,
      "aria-label": words.join(", "),
    });
    if (marks.onSelect) {
      node.setAttribute("role", "button");
      node.setAttribute("tabindex", "0");
      node.addEventListener("click", () => marks.onSelect(name));
      node.addEventListener("keydown", (ev) => {
        if (ev.key === "Enter" || ev.key === ' ') {
          ev.preventDefault();
          marks.onSelect(name);
        }
      });
    } else {
      node.setAttribute("role", "img");
    }
    const rx = n.kind === "terminal" ? 17 : 6;
    node.append(
      s("title", {}, words.join(", ")),
      s("rect", { width: n.width, height: n.height, rx, ry: rx }),
      s("text", { x: n.width / 2, y: n.second ? 19 : 22, "text-anchor": "middle", class: "name" }, name),
    );
    if (n.second) {
      node.append(s("text", { x: n.width / 2, y: 36, "text-anchor": "middle", class: "kind" }, n.second));
    }
    if (visits > 1) {
      node.append(
        s("circle", { cx: n.width - 2, cy: 2, r: 9, class: "badge" }),
        s("text", { x: n.width - 2, y: 6, "text-anchor": "middle", class: "badge-text" }, `${visits}`),
      );
    }
    nodes.append(node);
  }
  svg.append(nodes);
  return svg;
}
