// The flink-memory page: reads an agent's memory through the service's /v1 API with the key in a header.
// The key lives in this tab only (sessionStorage); it is never put in a URL. Text is set with textContent only.
"use strict";

const KEY = "flink-memory-key";
const PAGE = 100; // children or history entries asked at a time
const state = { key: sessionStorage.getItem(KEY) || "", agents: [], agent: null, view: "tree", historyOffset: 0 };
const $ = (selector) => document.querySelector(selector);
const enc = encodeURIComponent;

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (name === "text") node.textContent = value;
    else if (name === "class") node.className = value;
    else node.setAttribute(name, value);
  }
  for (const child of children) if (child != null) node.append(child);
  return node;
}

class ApiError extends Error {
  constructor(status, detail) { super(detail); this.status = status; }
}

async function api(path, body) {
  const headers = { Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (state.key) headers.Authorization = "Bearer " + state.key;
  let answer;
  try {
    answer = await fetch(path, { method: body === undefined ? "GET" : "POST", headers, cache: "no-store",
      credentials: "omit", body: body === undefined ? undefined : JSON.stringify(body) });
  } catch (exc) {
    throw new ApiError(0, "the service cannot be reached (" + exc.message + ")");
  }
  let data = null;
  try { data = await answer.json(); } catch (_) { data = null; }
  if (!answer.ok) throw new ApiError(answer.status, (data && data.detail) || answer.statusText);
  return data;
}

function agentPath(suffix) { return "/v1/agents/" + enc(state.agent) + suffix; }

// --- the key and what it may read ------------------------------------------------------------------------

function refuse(message) {
  $("#app").hidden = true;
  const box = $("#refusal");
  box.textContent = message;
  box.hidden = false;
}

function showError(message) {
  const box = $("#error");
  box.textContent = message || "";
  box.hidden = !message;
}

async function start() {
  $("#refusal").hidden = true;
  showError("");
  let listing;
  try {
    listing = await api("/v1/agents");
  } catch (exc) {
    if (exc.status === 401) {
      refuse(state.key ? "Refused: the service does not accept this key (401: " + exc.message + "). Enter a valid " +
        "key above." : "Refused: this service needs a key (401). Enter a service key above; it is sent in a " +
        "header and kept in this tab only.");
    } else {
      refuse("The service cannot answer (" + (exc.status || "no connection") + "): " + exc.message);
    }
    return;
  }
  state.agents = listing.agents;
  $("#app").hidden = false;
  const list = $("#agents");
  list.textContent = "";
  for (const agent of state.agents) {
    const link = el("a", { href: "#agent=" + enc(agent), text: agent, "data-agent": agent });
    list.append(el("li", {}, link));
  }
  if (!state.agents.length) list.append(el("li", { class: "hint", text: "This key reads no agent with memory here." }));
  loadHealth();
  route();
}

// --- navigation: #agent=ID&view=tree|history|recall --------------------------------------------------------

function route() {
  const params = new URLSearchParams(location.hash.slice(1));
  const view = ["tree", "history", "recall"].includes(params.get("view")) ? params.get("view") : "tree";
  const agent = params.get("agent") || state.agents[0] || null;
  const changed = agent !== state.agent;
  state.agent = agent;
  state.view = view;
  for (const link of document.querySelectorAll("#agents a")) {
    link.classList.toggle("current", link.dataset.agent === agent);
  }
  for (const tab of document.querySelectorAll("#tabs button")) {
    tab.setAttribute("aria-selected", String(tab.dataset.view === view));
  }
  for (const name of ["tree", "history", "recall"]) $("#view-" + name).hidden = name !== view;
  $("#content").hidden = !agent;
  if (!agent) return;
  $("#agent-title").textContent = agent;
  if (!state.agents.includes(agent)) { // (never asked: the page reads only what the key lists)
    showError("No memory for agent '" + agent + "' that this key may read.");
    $("#tree").textContent = "";
    $("#facts-agent")?.remove();
    return;
  }
  if (changed) {
    showError("");
    $("#tree").textContent = "";
    $("#hits").textContent = "";
    $("#history tbody").textContent = "";
    state.historyOffset = 0;
    loadTree();
    loadAgentStore();
  }
  if (view === "history" && !$("#history tbody").children.length) loadHistory();
}

function go(view) {
  location.hash = "agent=" + enc(state.agent || "") + "&view=" + view;
}

// --- the job and the store -----------------------------------------------------------------------------------

function fact(list, name, value) {
  list.append(el("dt", { text: name }), el("dd", { text: value == null ? "-" : String(value) }));
}

function flatten(prefix, value, out) {
  if (value !== null && typeof value === "object" && !Array.isArray(value)) {
    for (const [name, inner] of Object.entries(value)) flatten(prefix ? prefix + "." + name : name, inner, out);
  } else {
    out.push([prefix, Array.isArray(value) ? value.join(", ") : value]);
  }
}

async function loadHealth() {
  const list = $("#facts");
  list.querySelector("#facts-health")?.remove();
  const group = el("div", { id: "facts-health" });
  list.prepend(group);
  try {
    const pairs = [];
    flatten("", await api("/v1/health"), pairs); // (whatever the health answer holds: the applier's lag too)
    for (const [name, value] of pairs) fact(group, name, value);
  } catch (exc) {
    fact(group, "health", exc.message);
  }
}

async function loadAgentStore() {
  $("#facts-agent")?.remove();
  const group = el("div", { id: "facts-agent" });
  $("#facts").append(group);
  try {
    const facts = await api(agentPath("/store"));
    const share = facts.rows ? (100 * facts.rows_with_vectors / facts.rows).toFixed(1) + " %" : "-";
    fact(group, "agent rows", facts.rows);
    fact(group, "rows with vectors", facts.rows_with_vectors + " (" + share + ")");
    fact(group, "embedding model", facts.embedding_model ? facts.embedding_model +
      (facts.embedding_dim ? " (" + facts.embedding_dim + " dims)" : "") : "none");
    fact(group, "merger log applied", facts.merger_seq);
    fact(group, "batcher log applied", facts.batcher_seq);
  } catch (exc) {
    fact(group, "store", exc.message);
  }
}

// --- the tree, one level at a time ------------------------------------------------------------------------------

function describe(item) {
  const version = item.version != null ? " v" + item.version : "";
  return item.node_id + " (" + item.kind + version + ", level " + item.level + ", " + item.item_count + " units, " +
    (item.first_ts || "?") + " .. " + (item.last_ts || "?") + ")";
}

function badges(item) {
  const out = el("span", { class: "badges" });
  const marks = [...(item.marks || [])];
  if (item.provisional && !marks.includes("provisional")) marks.push("provisional");
  if (item.replaces && item.replaces.length && !marks.includes("remade")) marks.push("remade");
  if (item.superseded || item.superseded_by) marks.push("superseded");
  for (const mark of marks) out.append(el("span", { class: "badge " + mark, text: mark }));
  if (item.superseded_by) out.append(el("span", { class: "badge superseded", text: "by " + item.superseded_by }));
  if (item.replaces && item.replaces.length) {
    out.append(el("span", { class: "replaces", text: "replaces " + item.replaces.join(", ") }));
  }
  return out;
}

function nodeItem(item, depth) {
  const li = el("li", { class: "node " + item.kind, "data-id": item.node_id, "data-kind": item.kind,
    "data-depth": String(depth) });
  const row = el("div", { class: "row" });
  if (item.children > 0) {
    const toggle = el("button", { type: "button", class: "toggle", "aria-expanded": "false",
      "aria-label": "open " + item.node_id, text: "+" });
    toggle.addEventListener("click", () => toggleNode(li));
    row.append(toggle);
  } else {
    row.append(el("span", { class: "leaf" }));
  }
  row.append(el("span", { class: "kind", text: item.kind }), el("span", { class: "desc", text: describe(item) }),
    badges(item));
  li.append(row, el("p", { class: "text", title: "click: all of it", text: item.text }),
    el("ul", { class: "children", hidden: "" }));
  li.item = item;
  return li;
}

async function loadChildren(li, offset) {
  const item = li.item;
  const list = li.querySelector(":scope > ul.children");
  const page = await api(agentPath("/nodes/" + enc(item.node_id) + "/children?offset=" + offset + "&limit=" + PAGE));
  list.querySelector(":scope > li.more")?.remove();
  const depth = Number(li.dataset.depth) + 1;
  for (const child of page.children) list.append(nodeItem(child, depth));
  li.loaded = offset + PAGE;
  li.missing = (li.missing || 0) + page.missing;
  if (li.missing && item.kind !== "batch") {
    li.querySelector(":scope > .row .missing")?.remove();
    li.querySelector(":scope > .row").append(el("span", { class: "missing",
      text: "[" + li.missing + " children not stored]" }));
  }
  if (page.total > li.loaded) {
    const more = el("button", { type: "button", text: "more (" + (page.total - li.loaded) + " left)" });
    more.addEventListener("click", () => loadChildren(li, li.loaded).catch((exc) => showError(exc.message)));
    list.append(el("li", { class: "more" }, more));
  }
}

async function openNode(li) {
  const toggle = li.querySelector(":scope > .row .toggle");
  if (!toggle) return;
  if (li.loaded === undefined) await loadChildren(li, 0);
  li.querySelector(":scope > ul.children").hidden = false;
  toggle.setAttribute("aria-expanded", "true");
  toggle.textContent = "-";
}

function toggleNode(li) {
  const toggle = li.querySelector(":scope > .row .toggle");
  if (toggle.getAttribute("aria-expanded") === "true") {
    li.querySelector(":scope > ul.children").hidden = true;
    toggle.setAttribute("aria-expanded", "false");
    toggle.textContent = "+";
  } else {
    openNode(li).catch((exc) => showError(exc.message));
  }
}

async function loadTree() {
  const tree = $("#tree");
  delete tree.dataset.ready;
  try {
    const answer = await api(agentPath("/memory"));
    tree.textContent = "";
    if (!answer.memory) {
      tree.append(el("li", { class: "hint", text: "No global summary yet (recall finds the units already)." }));
    } else {
      const node = answer.memory;
      const root = nodeItem({ ...node, children: node.children.length }, 0);
      tree.append(root);
      await openNode(root);
    }
    tree.dataset.ready = "1";
  } catch (exc) {
    showError(exc.message);
  }
}

async function revealInTree(path, target) {
  go("tree");
  const tree = $("#tree");
  for (let waited = 0; !tree.dataset.ready && waited < 100; waited++) await new Promise((r) => setTimeout(r, 50));
  let scope = tree;
  for (const id of [...path, target]) {
    let found = null;
    for (;;) {
      found = [...scope.children].find((li) => li.dataset && li.dataset.id === id);
      const parent = scope.closest("li.node");
      if (found || !parent || !scope.querySelector(":scope > li.more")) break;
      await loadChildren(parent, parent.loaded);
    }
    if (!found) break;
    if (id !== target) { await openNode(found); scope = found.querySelector(":scope > ul.children"); }
    else {
      document.querySelectorAll("li.node.found").forEach((li) => li.classList.remove("found"));
      found.classList.add("found");
      found.scrollIntoView({ block: "center" });
    }
  }
}

// --- history ------------------------------------------------------------------------------------------------------

async function loadHistory() {
  try {
    const page = await api(agentPath("/history?offset=" + state.historyOffset + "&limit=" + PAGE));
    $("#history-note").textContent = page.total + " live units and nodes; " + page.replaced +
      " earlier nodes were replaced (an update, a deletion or new units made them again).";
    const body = $("#history tbody");
    for (const event of page.events) {
      const row = el("tr", { class: event.kind, "data-id": event.node_id });
      row.append(el("td", { text: event.last_ts || "?" }), el("td", { text: event.kind }),
        el("td", { text: event.node_id }), el("td", {}, badges(event)),
        el("td", {}, el("div", { class: "text", title: "click: all of it", text: event.text })));
      body.append(row);
    }
    state.historyOffset += page.events.length;
    $("#history-more").hidden = state.historyOffset >= page.total;
  } catch (exc) {
    showError(exc.message);
  }
}

// --- recall -------------------------------------------------------------------------------------------------------

function number(value) { return value == null ? "-" : Number(value).toPrecision(4); }

async function recall(event) {
  event.preventDefault();
  showError("");
  const body = { question: $("#question").value, k: Number($("#k").value) || 5, mode: $("#mode").value,
    explain: true };
  if (!$("#as-of-label").hidden && $("#as-of").value) body.as_of = new Date($("#as-of").value).toISOString();
  const hits = $("#hits");
  hits.textContent = "";
  delete hits.dataset.ready;
  try {
    const answer = await api(agentPath("/recall"), body);
    for (const [rank, hit] of answer.hits.entries()) {
      const li = el("li", { class: "hit " + hit.kind, "data-id": hit.node_id });
      li.append(el("div", { class: "row" }, el("span", { class: "rank", text: "#" + (rank + 1) }),
        el("span", { class: "kind", text: hit.kind }), el("span", { class: "score", text: "score " + hit.score }),
        el("span", { class: "desc", text: hit.node_id + " (level " + hit.level + ", " + (hit.first_ts || "?") +
          " .. " + (hit.last_ts || "?") + ")" }), badges(hit)));
      if (hit.parts) {
        li.append(el("div", { class: "parts", text: "keyword " + number(hit.parts.keyword) + " · cosine " +
          number(hit.parts.cosine) + " · relevance " + number(hit.parts.relevance) + " × specificity " +
          number(hit.parts.specificity) }));
      }
      const path = (answer.paths && answer.paths[hit.node_id]) || [];
      const where = el("button", { type: "button", class: "path",
        text: "in the tree: " + (path.length ? path.join(" › ") + " › " : "") + hit.node_id });
      where.addEventListener("click", () => revealInTree(path, hit.node_id).catch((exc) => showError(exc.message)));
      li.append(where, el("p", { class: "text", text: hit.text }));
      if (hit.folds && hit.folds.length) li.append(el("div", { class: "folds", text: "stands for " + hit.folds.join(", ") }));
      hits.append(li);
    }
    if (!answer.hits.length) hits.append(el("li", { class: "hint", text: "Nothing in this memory matches." }));
    hits.dataset.ready = "1";
  } catch (exc) {
    showError("Recall refused (" + exc.status + "): " + exc.message);
  }
}

async function offerAsOf() {
  // as-of recall where the service offers it (its OpenAPI document says so)
  try {
    const doc = await api("/openapi.json");
    const request = doc.components.schemas.RecallRequest;
    $("#as-of-label").hidden = !(request && request.properties && request.properties.as_of);
  } catch (_) { /* no document: no as-of */ }
}

// --- wiring -------------------------------------------------------------------------------------------------------

document.addEventListener("DOMContentLoaded", () => {
  $("#key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    state.key = $("#key").value.trim();
    $("#key").value = "";
    if (state.key) sessionStorage.setItem(KEY, state.key); else sessionStorage.removeItem(KEY);
    state.agent = null;
    start();
  });
  $("#forget-key").addEventListener("click", () => {
    state.key = "";
    sessionStorage.removeItem(KEY);
    state.agent = null;
    start();
  });
  for (const tab of document.querySelectorAll("#tabs button")) tab.addEventListener("click", () => go(tab.dataset.view));
  $("#history-more").addEventListener("click", loadHistory);
  document.addEventListener("click", (event) => { // a long text opens whole on a click
    const text = event.target.closest(".tree .text, #history .text");
    if (text) text.classList.toggle("full");
  });
  $("#recall-form").addEventListener("submit", recall);
  window.addEventListener("hashchange", () => { if (!$("#app").hidden) route(); });
  offerAsOf();
  start();
});
