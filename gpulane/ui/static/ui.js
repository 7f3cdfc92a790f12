// gpulane's web page: one view at a time, kept live by the server's event stream (/api/stream/VIEW).
// Every name on the page comes from the cluster, so the page is built with text nodes, never from HTML strings.
"use strict";

const HIDDEN = "(a job of another namespace)";
let stream = null;
let clockOffset = 0; // the server's clock minus this browser's, from each update's "now"

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.className = v;
    else if (k.startsWith("data-")) el.setAttribute(k, v);
    else if (k === "style") el.style.cssText = v; // through the CSSOM: the page's policy forbids style attributes
    else el[k] = v;
  }
  for (const c of children.flat()) {
    if (c !== null && c !== undefined && c !== false) el.append(c instanceof Node ? c : String(c));
  }
  return el;
}

function svg(tag, attrs, ...children) {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
  for (const c of children) el.append(c);
  return el;
}

function now() { return Date.now() / 1000 + clockOffset; }

function duration(s) {
  if (s === null || s === undefined || !isFinite(s)) return "-";
  s = Math.max(0, Math.round(s));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m${String(s % 60).padStart(2, "0")}s`;
  return `${Math.floor(s / 3600)}h${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}m`;
}

function clock(t) {
  if (!t) return "-";
  return new Date(t * 1000).toISOString().slice(11, 19);
}

function inFrom(t) { return t ? `${clock(t)} (in ${duration(t - now())})` : "-"; }

// A model's colour: the same on every lane and every visit.
function colour(name) {
  let x = 0;
  for (const ch of name || "") x = (x * 31 + ch.charCodeAt(0)) >>> 0;
  return `hsl(${x % 360}, 55%, 52%)`;
}

function jobLink(key) {
  if (!key) return h("span", { class: "hidden-job" }, HIDDEN);
  return h("a", { class: "job", href: `#job/${key}` }, key);
}

// -- views -------------------------------------------------------------------------------------------------------

function lanesView(lanes) {
  if (!lanes.length) return h("p", { class: "muted" }, "No GpuLane yet: create one (docs/operations.md).");
  return h("div", { class: "lanes" }, lanes.map(laneCard));
}

function laneCard(lane) {
  const running = lane.running.map((r) => {
    const started = r.elapsed === null ? null : now() - r.elapsed;
    const share = r.expected && r.elapsed !== null ? Math.min(1, r.elapsed / r.expected) : 0;
    return h("div", { class: "running-job" },
      jobLink(r.job), " ", h("span", { class: "muted" }, r.model),
      h("div", {}, r.phase === "Running"
        ? h("span", { "data-since": started }, duration(r.elapsed))
        : h("span", { class: "muted" }, "loading its model"),
        " of ", duration(r.expected), " expected"),
      h("div", { class: "bar" }, h("span", { style: `width:${(share * 100).toFixed(1)}%` })));
  });
  const next = lane.next.map((r) => h("div", {}, `${r.position}. `, jobLink(r.job), " ",
    h("span", { class: "muted" }, `${r.model}, starts ${inFrom(r.estimatedStart)}`)));
  const loaded = [lane.resident || "none", ...(lane.loaded || [])];
  return h("article", { class: "lane", "data-lane": lane.lane },
    h("div", { class: "lane-head" },
      h("h3", {}, lane.lane),
      h("span", { class: `badge ${lane.ready ? "ready" : "down"}` }, lane.ready ? "ready" : "not ready"),
      h("span", { class: "muted" }, lane.node ? `node ${lane.node}` : "no node"),
      h("span", {}, "serving ", h("b", {}, loaded[0]), loaded.length > 1 ? `, also loaded: ${loaded.slice(1).join(", ")}` : "")),
    h("div", { class: "cols" },
      h("div", {}, h("h4", {}, "Running"), running.length ? running : h("span", { class: "muted" }, "idle")),
      h("div", {}, h("h4", {}, "Next"), next.length ? next : h("span", { class: "muted" }, "nothing waits here")),
      h("div", {}, h("h4", {}, "Last hour"),
        h("div", {}, `${lane.dispatches} dispatches, ${lane.swaps} model loads`),
        h("div", {}, `busy ${Math.round(lane.utilisation * 100)}%`),
        lane.lastLoad && h("div", { class: "muted" }, `last load: ${lane.lastLoad.model} in ` +
          `${lane.lastLoad.loadSeconds.toFixed(2)}s (${lane.lastLoad.switch ? "its server switched" : "a new pod"})`))),
    timeline(lane));
}

function timeline(lane) {
  // The last hours at most; a lane with a short past is shown from its first job (ten minutes at least).
  const end = now(), first = lane.timeline.length ? lane.timeline[0].start : end;
  const span = Math.min(lane.window, Math.max(600, end - first + 60)), start = end - span, width = 1000;
  const x = (t) => ((Math.max(t, start) - start) / span) * width;
  const box = svg("svg", { viewBox: `0 0 ${width} 46`, preserveAspectRatio: "none", role: "img",
    "aria-label": `${lane.lane}: the last ${duration(span)}` });
  box.append(svg("rect", { x: 0, y: 8, width, height: 24, fill: "#f0f1f4" }));
  const models = new Set();
  for (const s of lane.timeline) {
    const x0 = x(s.start), w = Math.max(1, x(s.end) - x0);
    const load = s.kind === "load";
    if (!load) models.add(s.model);
    const title = svg("title", {});
    title.textContent = `${load ? "loading " + s.model : s.job || HIDDEN} ${clock(s.start)}-${clock(s.end)}`;
    box.append(svg("rect", { x: x0, y: load ? 14 : 8, width: w, height: load ? 12 : 24,
      fill: load ? "#9aa0aa" : colour(s.model), "data-kind": s.kind }, title));
  }
  for (let i = 0; i <= 6; i++) {
    const t = start + (span * i) / 6, label = svg("text", { x: Math.min(i * width / 6, width - 40), y: 44,
      "font-size": 9, fill: "#888" });
    label.textContent = clock(t).slice(0, 5);
    box.append(label);
  }
  const legend = h("div", { class: "legend" },
    [...models].map((m) => h("span", {}, h("span", { class: "swatch", style: `background:${colour(m)}` }), m)),
    h("span", {}, h("span", { class: "swatch", style: "background:#9aa0aa" }), "model load"),
    h("span", {}, h("span", { class: "swatch", style: "background:#f0f1f4" }), "idle"));
  return h("div", { class: "timeline" }, box, legend);
}

const TERMS = [["priority", "#2f6fdf"], ["tier", "#8e44ad"], ["affinity", "#16a085"], ["aging", "#e67e22"]];

function termsBar(score) {
  if (!score) return "-";
  const parts = TERMS.map(([k]) => Math.max(0, score[k] || 0));
  const total = parts.reduce((a, b) => a + b, 0) || 1;
  return h("span", { class: "terms", title: TERMS.map(([k]) => `${k} ${(score[k] || 0).toFixed(1)}`).join(", ") },
    TERMS.map(([k, c], i) => h("span", { style: `width:${(parts[i] / total) * 100}%;background:${c}` })));
}

function queueView(q, query) {
  const filters = h("form", { class: "filters", id: "queue-filters" },
    h("input", { name: "namespace", placeholder: "namespace", value: query.get("namespace") || "" }),
    h("select", { name: "model" }, h("option", { value: "" }, "every model"),
      q.models.map((m) => h("option", { value: m, selected: query.get("model") === m }, m))),
    h("input", { name: "member", placeholder: "member", value: query.get("member") || "" }),
    h("button", { type: "submit" }, "Filter"),
    h("span", { class: "muted", id: "queue-count" }, `${q.total} waiting${q.total > q.waiting.length ? `, the first ${q.waiting.length} shown` : ""}`));
  filters.addEventListener("submit", (e) => {
    e.preventDefault();
    const params = new URLSearchParams();
    for (const [k, v] of new FormData(filters)) if (v) params.set(k, v);
    location.hash = `queue${params.size ? "?" + params : ""}`;
  });
  const running = q.running.map((r) => h("tr", { "data-job": r.job || "", class: "running" },
    h("td", {}, r.phase === "Running" ? "running" : "loading"), h("td", {}, jobLink(r.job)), h("td", {}, ""),
    h("td", {}, r.member || "-"), h("td", {}, r.model), h("td", {}, r.lane || "-"), h("td", {}, ""), h("td", {}, ""),
    h("td", { class: "num" }, duration(r.elapsed)), h("td", {}, "started")));
  const waiting = q.waiting.map((r) => h("tr", { "data-job": r.job || "" },
    h("td", { class: "num" }, r.position ? `${r.exact ? "" : "≤"}${r.position}` : "-"),
    h("td", {}, jobLink(r.job)), h("td", {}, r.band), h("td", {}, r.member || "-"), h("td", {}, r.model),
    h("td", {}, r.lane || "-"),
    h("td", { class: "num" }, r.score && r.score.total !== undefined ? r.score.total.toFixed(1) : "-"),
    h("td", {}, termsBar(r.score)), h("td", { class: "num" }, duration(r.waited)),
    h("td", {}, inFrom(r.estimatedStart))));
  return h("div", {}, filters,
    h("table", { id: "queue-table" },
      h("thead", {}, h("tr", {}, ["Pos", "Job", "Band", "Member", "Model", "Lane", "Score", "Terms", "Waited", "Starts"].map((t) => h("th", {}, t)))),
      h("tbody", {}, running, waiting)),
    h("p", { class: "legend" }, TERMS.map(([k, c]) => h("span", {}, h("span", { class: "swatch", style: `background:${c}` }), k))));
}

function chainsView(rows) {
  if (!rows.length) return h("p", { class: "muted" }, "No GpuChain that you may see.");
  return h("table", { id: "chains-table" },
    h("thead", {}, h("tr", {}, ["Chain", "Progress", "Phase", "Current step", "GPU time", "ETA"].map((t) => h("th", {}, t)))),
    h("tbody", {}, rows.map((r) => {
      const share = r.total ? r.completed / r.total : 0;
      return h("tr", { "data-chain": r.chain },
        h("td", {}, h("a", { class: "job", href: `#job/${r.chain}` }, r.chain)),
        h("td", {}, h("span", { class: "progress-text" }, r.progress),
          h("div", { class: "bar", style: "width:160px" }, h("span", { style: `width:${(share * 100).toFixed(1)}%` }))),
        h("td", {}, r.phase), h("td", {}, r.current === "-" ? "-" : jobLink(r.current), " ",
          h("span", { class: "muted" }, r.currentPhase)),
        h("td", { class: "num" }, duration(r.gpuSeconds)),
        h("td", {}, r.etaIn === null ? "-" : `in ${duration(r.etaIn)}`));
    })));
}

function jobView(job) {
  const parts = [h("h2", {}, job.job, " ", h("span", { class: "badge" }, job.phase || "-"))];
  if (job.score) {
    const max = Math.max(1, ...TERMS.map(([k]) => Math.abs(job.score[k] || 0)));
    parts.push(h("div", { class: "score-bars", id: "score" },
      TERMS.flatMap(([k, c]) => {
        const v = job.score[k] || 0, w = (Math.abs(v) / max) * 50;
        return [h("span", {}, k), h("span", { class: "track" },
          h("span", { style: `left:${v < 0 ? 50 - w : 50}%;width:${w}%;background:${c}` })),
          h("span", { class: "num" }, v.toFixed(1))];
      }),
      h("b", {}, "total"), h("span", {}), h("b", { class: "num" }, (job.score.total || 0).toFixed(1))));
  }
  parts.push(h("div", { class: "story", id: "story" }, job.story.map((line) => h("p", {}, line))));
  return h("div", {}, parts);
}

function usageView(u, query) {
  const picker = h("form", { class: "filters" }, "GPU time over the last ",
    h("select", { name: "window" }, ["1h", "6h", "24h", "168h"].map((w) =>
      h("option", { value: w, selected: (query.get("window") || "24h") === w }, w))));
  picker.addEventListener("change", () => { location.hash = `usage?window=${new FormData(picker).get("window")}`; });
  const rows = [];
  for (const t of u.teams) {
    rows.push(h("tr", { class: "team" }, h("td", {}, t.team === null ? h("span", { class: "hidden-job" }, "other namespaces") : h("b", {}, t.team)),
      h("td", {}, ""), h("td", { class: "num" }, t.weight), h("td", { class: "num" }, duration(t.gpuSeconds)),
      h("td", {}, h("div", { class: "bar", style: "width:160px" }, h("span", { style: `width:${(t.share * 100).toFixed(1)}%` }))),
      h("td", { class: "num" }, duration(t.usage))));
    for (const m of t.members) {
      rows.push(h("tr", {}, h("td", {}, ""), h("td", {}, m.member), h("td", { class: "num" }, m.weight),
        h("td", { class: "num" }, duration(m.gpuSeconds)), h("td", { class: "muted" }, `${Math.round(m.share * 100)}% of team`),
        h("td", { class: "num" }, duration(m.usage))));
    }
  }
  return h("div", {}, picker, h("table", { id: "usage-table" },
    h("thead", {}, h("tr", {}, ["Team", "Member", "Weight", "GPU time", "Share", "Usage (decayed)"].map((t) => h("th", {}, t)))),
    h("tbody", {}, rows)));
}

// -- the stream --------------------------------------------------------------------------------------------------

function route() {
  const hash = location.hash.slice(1) || "lanes";
  if (hash.startsWith("job/")) return { view: "job", query: new URLSearchParams({ job: hash.slice(4) }) };
  const [view, search] = hash.split("?");
  if (!["lanes", "queue", "chains", "usage"].includes(view)) return { view: "lanes", query: new URLSearchParams() };
  return { view, query: new URLSearchParams(search || "") };
}

function render(view, query, body) {
  clockOffset = body.now - Date.now() / 1000;
  document.getElementById("who").textContent = body.viewer;
  document.getElementById("logout").hidden = body.viewer === "anonymous";
  const el = document.getElementById("view");
  const d = body.data;
  const content = { lanes: () => lanesView(d), queue: () => queueView(d, query), chains: () => chainsView(d),
    job: () => jobView(d), usage: () => usageView(d, query) }[view]();
  const focused = document.activeElement && document.activeElement.name; // typing in a filter survives an update
  el.replaceChildren(content);
  if (focused) { const again = el.querySelector(`[name="${focused}"]`); if (again) again.focus(); }
  el.dataset.updated = String(body.now);
  if (!performance.getEntriesByName("gpulane-first-view").length) performance.mark("gpulane-first-view"); // bench/ui.py
}

function showLogin(message) {
  if (stream) stream.close();
  stream = null;
  document.getElementById("login").hidden = false;
  document.getElementById("view").replaceChildren();
  document.getElementById("live").className = "";
  document.getElementById("live").textContent = "logged out";
  document.getElementById("login-error").textContent = message || "";
}

function open() {
  const { view, query } = route();
  for (const a of document.querySelectorAll("#tabs a")) a.classList.toggle("active", a.dataset.view === view);
  if (stream) stream.close();
  document.getElementById("login").hidden = true;
  const live = document.getElementById("live");
  stream = new EventSource(`/api/stream/${view}?${query}`);
  stream.addEventListener("view", (e) => { live.className = "on"; live.textContent = "live"; render(view, query, JSON.parse(e.data)); });
  stream.addEventListener("missing", (e) => {
    document.getElementById("view").replaceChildren(h("p", { class: "error" }, JSON.parse(e.data).error));
  });
  stream.addEventListener("login", () => showLogin("Your session ended: log in again."));
  stream.onerror = async () => {
    live.className = ""; live.textContent = "reconnecting";
    const probe = await fetch(`/api/views/${view}?${query}`).catch(() => null);
    if (probe && probe.status === 401) showLogin();
  };
}

async function login(e) {
  e.preventDefault();
  const secret = document.getElementById("secret");
  const answer = await fetch("/api/login", { method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ secret: secret.value }) });
  secret.value = "";
  if (!answer.ok) { showLogin((await answer.json()).error); return; }
  open();
}

// Elapsed times count up between updates, from this browser's clock set to the server's.
setInterval(() => {
  for (const el of document.querySelectorAll("[data-since]")) el.textContent = duration(now() - Number(el.dataset.since));
}, 1000);

window.addEventListener("hashchange", open);
document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("login-form").addEventListener("submit", login);
  document.getElementById("logout").addEventListener("click", async () => {
    await fetch("/api/logout", { method: "POST" });
    showLogin();
  });
  open();
});
