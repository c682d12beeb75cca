// The reviewer console (ADR-0026). Plain JavaScript, no library, no inline code:
// the page's Content-Security-Policy allows only this file. Everything it shows comes from
// the public admin API with the token the reviewer pasted (kept in sessionStorage only).
"use strict";

const TOKEN_KEY = "fanout.console.token";
const POLL_MS = 1000;
const HISTORY = 120; // capacity samples kept for the chart
const SVG = "http://www.w3.org/2000/svg";
const DECISIONS = [
  ["enable_mention_only", "enable mention_only (needs both alpha parameters)"],
  ["scale_out", "scale out (add capacity)"],
  ["rate_limit", "tighten rate limits"],
  ["no_action", "reject: no action"],
];

const $ = (id) => document.getElementById(id);
const state = { samples: [], timer: null, tiers: [], tiersDrawn: null, polling: false };

class ApiError extends Error {
  constructor(status, body) {
    const code = body && body.error ? body.error : "HTTP " + status;
    super(code + ": " + (body && body.message ? body.message : "request failed"));
    this.status = status;
    this.body = body;
  }
}

async function api(method, path, { body, params } = {}) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  let url = path;
  if (params) url += "?" + new URLSearchParams(params).toString();
  const init = { method, headers: { Authorization: "Bearer " + token }, cache: "no-store" };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const resp = await fetch(url, init);
  const text = await resp.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch (e) { data = { message: text }; }
  if (!resp.ok) throw new ApiError(resp.status, data);
  return data;
}

// -- small DOM helpers -------------------------------------------------------------

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null && v !== false) e.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) e.append(c instanceof Node ? c : document.createTextNode(c == null ? "" : String(c)));
  return e;
}

function svg(tag, attrs = {}, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function fill(tbody, rows) {
  tbody.replaceChildren(...rows.map((cells) => el("tr", {}, cells.map((c) => (c instanceof Node && c.tagName === "TD" ? c : el("td", {}, c))))));
}

const num = (x, d = 1) => (x === null || x === undefined ? "-" : Number(x).toLocaleString("en", { maximumFractionDigits: d }));
const when = (t) => (t ? new Date(t * 1000).toISOString().replace("T", " ").slice(0, 19) + " UTC" : "-");
const short = (id) => String(id).slice(0, 8);

function showError(target, err) {
  target.textContent = err instanceof ApiError ? err.message : String(err);
}

// -- login -----------------------------------------------------------------------------

async function login(token) {
  sessionStorage.setItem(TOKEN_KEY, token);
  try {
    await api("GET", "/v1/admin/tiers");
  } catch (err) {
    sessionStorage.removeItem(TOKEN_KEY);
    showError($("login-error"), err);
    return;
  }
  $("login-error").textContent = "";
  $("token").value = "";
  $("login").hidden = true;
  $("app").hidden = false;
  $("logout").hidden = false;
  $("who").textContent = describeToken(token);
  start();
}

function describeToken(token) {
  try {
    const claims = JSON.parse(atob(token.split(".")[1].replace(/-/g, "+").replace(/_/g, "/")));
    return `tenant ${claims.tenant}, ${claims.role} ${claims.sub}`;
  } catch (e) {
    return "";
  }
}

function logout() {
  sessionStorage.removeItem(TOKEN_KEY);
  clearInterval(state.timer);
  state.timer = null;
  $("app").hidden = true;
  $("login").hidden = false;
  $("logout").hidden = true;
  $("who").textContent = "";
}

function start() {
  poll();
  loadAlpha();
  loadTierHistory();
  if (state.timer === null) state.timer = setInterval(poll, POLL_MS);
}

async function poll() {
  if (state.polling) return;
  state.polling = true;
  try {
    const [cap, proj, reviews, tiers, rereview] = await Promise.all([
      api("GET", "/v1/admin/capacity"),
      api("GET", "/v1/admin/projections"),
      api("GET", "/v1/admin/reviews"),
      api("GET", "/v1/admin/tiers"),
      api("GET", "/v1/admin/rereview"),
    ]);
    renderCapacity(cap);
    renderProjections(proj);
    renderReviews(reviews.reviews);
    renderTiers(tiers.tiers);
    renderRereview(rereview);
    $("error").textContent = "";
  } catch (err) {
    if (err instanceof ApiError && (err.status === 401 || err.status === 403)) {
      logout();
      showError($("login-error"), err);
    } else {
      showError($("error"), err);
    }
  } finally {
    state.polling = false;
  }
}

// -- capacity ----------------------------------------------------------------------------

function renderCapacity(cap) {
  const t1 = cap.triggers.T1.threshold_ratio * cap.platform_fanout_budget;
  const t2 = cap.triggers.T2.threshold_ratio * cap.mailbox_write_budget;
  state.samples.push({ at: Date.now() / 1000, all: cap.fanout_entries_per_sec, large: cap.large_group_entries_per_sec });
  if (state.samples.length > HISTORY) state.samples.shift();
  $("capacity-updated").textContent = "updated " + new Date().toISOString().slice(11, 19) + " UTC";
  const flag = (t) => el("span", { class: cap.triggers[t].firing ? "red" : "green", id: "trigger-" + t }, cap.triggers[t].firing ? "FIRING" : "ok");
  fill($("capacity-numbers").tBodies[0], [
    ["entries/s (window " + num(cap.window_s) + " s)", num(cap.fanout_entries_per_sec)],
    ["large-group entries/s", num(cap.large_group_entries_per_sec)],
    ["T1 line (" + cap.triggers.T1.threshold_ratio + " x platform budget)", num(t1)],
    ["T2 line (" + cap.triggers.T2.threshold_ratio + " x mailbox write budget)", num(t2)],
    ["T1", flag("T1")],
    ["T2", flag("T2")],
  ]);
  fill($("scopes").tBodies[0], cap.scopes.map((s) => [s.tenant === null ? "(other tenants)" : s.tenant, s.size_bucket || "-", num(s.entries_per_sec), num(100 * s.share) + " %"]));
  drawCapacity(t1, t2);
}

function drawCapacity(t1, t2) {
  // log scale (as `fanout analyze capacity --png`): T1 and T2 are far apart, the load near one of them
  const chart = $("capacity-chart");
  const W = 640, H = 240, L = 60, R = 10, T = 10, B = 30;
  const positive = [t1, t2, ...state.samples.flatMap((s) => [s.all, s.large])].filter((v) => v > 0);
  const lo = Math.log10(Math.min(...positive) / 3), hi = Math.log10(Math.max(...positive) * 3);
  const x = (i) => L + (i / Math.max(1, HISTORY - 1)) * (W - L - R);
  const y = (v) => T + (1 - (Math.log10(Math.max(v, 10 ** lo)) - lo) / (hi - lo)) * (H - T - B);
  const kids = [svg("rect", { x: L, y: T, width: W - L - R, height: H - T - B, class: "plot" })];
  for (let e = Math.ceil(lo); e <= Math.floor(hi); e++) {
    kids.push(svg("line", { x1: L, x2: W - R, y1: y(10 ** e), y2: y(10 ** e), class: "grid" }));
    kids.push(svg("text", { x: L - 4, y: y(10 ** e) + 4, class: "axis end" }, num(10 ** e, 0)));
  }
  const line = (v, cls, label) => {
    kids.push(svg("line", { x1: L, x2: W - R, y1: y(v), y2: y(v), class: cls }));
    kids.push(svg("text", { x: W - R - 4, y: y(v) - 4, class: "axis end " + cls }, label + " " + num(v, 0)));
  };
  line(t1, "t1", "T1");
  line(t2, "t2", "T2");
  const path = (key, cls) => {
    if (!state.samples.length) return;
    const off = HISTORY - state.samples.length;
    const d = state.samples.map((s, i) => (i ? "L" : "M") + x(i + off).toFixed(1) + " " + y(s[key]).toFixed(1)).join(" ");
    kids.push(svg("path", { d, class: cls }));
  };
  path("all", "series-all");
  path("large", "series-large");
  kids.push(svg("text", { x: L, y: H - 8, class: "axis" }, "last " + HISTORY + " polls (log scale): entries/s (blue), large-group entries/s (purple)"));
  chart.replaceChildren(...kids);
}

function renderProjections(p) {
  fill($("projections").tBodies[0], p.projections.map((r) => [r.name, r.partition, r.position, el("td", { class: r.lag > 0 ? "amber" : "" }, r.lag), r.last_error || ""]));
}

// -- reviews -------------------------------------------------------------------------------

function renderReviews(reviews) {
  const open = reviews.filter((r) => r.status === "open");
  const decided = reviews.filter((r) => r.status !== "open").sort((a, b) => (b.decided_at || 0) - (a.decided_at || 0));
  fill($("decided-reviews").tBodies[0], decided.map((r) => [short(r.review_id), r.size_bucket, r.trigger, r.decision, Object.entries(r.decision_params || {}).map(([k, v]) => k + "=" + v).join(", "), r.decided_by, when(r.decided_at)]));
  // A card already shown stays where it is, untouched (what the reviewer typed, the preview, the
  // focus, a click in progress); new ones are added, decided ones removed.
  const shown = new Map([...$("open-reviews").querySelectorAll("form.review")].map((f) => [f.dataset.reviewId, f]));
  const byAge = (a, b) => a.opened_at - b.opened_at || (a.review_id < b.review_id ? -1 : a.review_id > b.review_id ? 1 : 0);
  const cards = open.sort(byAge).map((r) => shown.get(r.review_id) || reviewCard(r));
  place($("open-reviews"), cards.length ? cards : [$("no-open-reviews") || el("p", { class: "note", id: "no-open-reviews" }, "No open review.")]);
}

// Makes `nodes` the children of `parent` without taking out a node that is already in place: a
// node taken out of the page and put back (replaceChildren) loses the focus, so the keystrokes
// after it go nowhere, and a click whose button was down then is not delivered to it.
function place(parent, nodes) {
  const keep = new Set(nodes);
  for (const c of [...parent.children]) if (!keep.has(c)) c.remove();
  nodes.forEach((n, i) => { if (parent.children[i] !== n) parent.insertBefore(n, parent.children[i] || null); });
}

function evidence(r) {
  const d = r.details || {};
  const rows = [["trigger", r.trigger], ["scope", r.tenant + " x " + r.size_bucket], ["opened", when(r.opened_at) + " by " + r.opened_by]];
  if (d.rate !== undefined) rows.push(["rate at the time", num(d.rate) + " entries/s (limit " + num(d.limit) + ")"]);
  if (d.window_s !== undefined) rows.push(["window", num(d.window_s) + " s"]);
  if (d.title) rows.push(["condition", d.condition + ": " + d.title + " (measured " + num(d.value, 3) + ", limit " + num(d.limit, 3) + ")"]);
  for (const [k, v] of Object.entries(d)) {
    if (!["rate", "limit", "window_s", "at", "title", "condition", "value", "details", "state"].includes(k)) rows.push([k, typeof v === "object" ? JSON.stringify(v) : String(v)]);
  }
  const t = el("table", { class: "evidence" }, el("tbody"));
  fill(t.tBodies[0], rows);
  return t;
}

function reviewCard(r) {
  const id = short(r.review_id);
  const decision = el("select", { name: "decision", class: "decision" }, DECISIONS.map(([v, label]) => el("option", { value: v }, label)));
  const minSaving = el("input", { name: "read_diffusion_min_saving", class: "min-saving", size: 8, placeholder: "e.g. 20000" });
  const maxRatio = el("input", { name: "read_diffusion_max_active_ratio", class: "max-ratio", size: 6, placeholder: "e.g. 0.05" });
  const note = el("input", { name: "note", class: "note-input", size: 30 });
  const out = el("div", { class: "preview" });
  const err = el("p", { class: "error form-error", role: "alert" });
  const params = () => ({ read_diffusion_min_saving: minSaving.value.trim(), read_diffusion_max_active_ratio: maxRatio.value.trim() });
  const preview = async () => {
    err.textContent = "";
    try {
      renderPreview(out, await api("GET", `/v1/admin/reviews/${r.review_id}/preview`, { params: params() }));
    } catch (e) { out.replaceChildren(); showError(err, e); }
  };
  const submit = async (ev) => {
    ev.preventDefault();
    err.textContent = "";
    const body = { decision: decision.value, note: note.value };
    if (decision.value === "enable_mention_only") {
      // sent as typed: the API, not the page, says what is wrong with a value
      for (const [k, v] of Object.entries(params())) body[k] = v === "" ? null : Number.isFinite(Number(v)) ? Number(v) : v;
    }
    try {
      await api("POST", `/v1/admin/reviews/${r.review_id}/decision`, { body });
      await poll();
      loadAlpha();
      loadTierHistory();
    } catch (e) { showError(err, e); }
  };
  return el("form", { class: "review", id: "review-" + id, "data-review-id": r.review_id, onsubmit: submit },
    el("h4", {}, "Review " + id + " (" + r.trigger + ", " + r.size_bucket + ")"),
    evidence(r),
    el("p", {}, el("label", {}, "decision ", decision), " ", el("label", {}, "read_diffusion_min_saving ", minSaving), " ",
      el("label", {}, "read_diffusion_max_active_ratio ", maxRatio), " ", el("label", {}, "note ", note)),
    el("p", {}, el("button", { type: "button", class: "preview-button", onclick: preview }, "Preview (computed by the server)"), " ",
      el("button", { type: "submit", class: "decide-button" }, "Decide")),
    err, out);
}

function renderPreview(out, p) {
  const t = el("table", { class: "preview-table" }, el("thead", {}, el("tr", {}, ["conversation", "N", "alpha", "policy", "N_eq", "saving/msg", "switches now", "estimated unread"].map((h) => el("th", {}, h)))), el("tbody"));
  fill(t.tBodies[0], p.conversations.map((c) => [c.conversation_id, c.members, num(c.alpha, 3), c.write_policy, num(c.n_eq), num(c.saving_per_message), el("td", { class: c.switches ? "switches" : "" }, c.switches ? "yes" : c.reason || "no"), c.switches ? c.members_estimated : 0]));
  out.replaceChildren(
    el("p", { class: "preview-summary" }, `${p.switching.length} of ${p.conversations.length} conversations would switch now: ${p.switching.join(", ") || "none"}. ` +
      `Saving ${num(p.saving_per_message)} entries per message, about ${num(p.entries_per_sec_saved)} entries/s of the scope's ${num(p.scope_entries_per_sec)}; ` +
      `${p.members_estimated_unread} members would get an estimated unread.`),
    t, el("p", { class: "note" }, p.basis));
}

// -- tiers and rollback -------------------------------------------------------------------

function renderTiers(tiers) {
  state.tiers = tiers;
  // Redrawn only when a tier changed: a redraw replaces the Roll back... buttons, and a click
  // whose button was down then would be lost.
  const drawn = JSON.stringify(tiers);
  if (drawn === state.tiersDrawn) return;
  state.tiersDrawn = drawn;
  fill($("tiers").tBodies[0], tiers.map((t) => [
    t.size_bucket,
    el("td", { class: t.state === "enabled" ? "amber tier-state" : "tier-state", id: "tier-" + t.size_bucket }, t.state),
    t.review_id ? short(t.review_id) : "-", num(t.read_diffusion_min_saving), num(t.read_diffusion_max_active_ratio, 3), when(t.changed_at),
    el("td", { class: "tier-conversations" }, t.conversations.join(", ")),
    t.state === "enabled" ? el("button", { type: "button", class: "rollback", onclick: () => askRollback(t) }, "Roll back...") : "",
  ]));
}

function askRollback(t) {
  $("rollback-text").textContent = `Roll back the mention_only tier of ${t.tenant} x ${t.size_bucket}? ` +
    `Its ${t.conversations.length} conversation(s) (${t.conversations.join(", ") || "none"}) return to always at once: ` +
    "new messages are written to every member's mailbox again. Existing mailboxes are NOT backfilled: " +
    "what was sent while in mention_only stays out of silent members' mailboxes, and their unread stays an " +
    "estimate until their next MARK_READ or REBUILD. Re-entering waits the minimum switch interval.";
  $("rollback-confirm").hidden = false;
  $("rollback-confirm").dataset.bucket = t.size_bucket;
}

async function rollback() {
  const bucket = $("rollback-confirm").dataset.bucket;
  try {
    const r = await api("POST", `/v1/admin/tiers/${bucket}/rollback`, { body: { reason: $("rollback-reason").value } });
    $("tiers-message").textContent = `Rolled back ${bucket}: returned to always: ${r.returned_to_always.join(", ") || "none"}`;
    $("rollback-confirm").hidden = true;
    await poll();
    loadAlpha();
    loadTierHistory();
  } catch (e) { showError($("tiers-message"), e); }
}

async function loadTierHistory() {
  try {
    const h = await api("GET", "/v1/admin/tiers/history");
    const what = { Created: "created", Enabled: "enabled", RolledBack: "rolled back", ConversationEntered: "entered mention_only", ConversationExited: "returned to always" };
    fill($("tier-history").tBodies[0], h.history.slice().reverse().map((e) => [when(e.at), e.size_bucket, what[e.event] || e.event,
      e.event === "Enabled" ? `review ${short(e.review_id)}, min_saving ${e.read_diffusion_min_saving}, max_active_ratio ${e.read_diffusion_max_active_ratio}`
        : e.event === "RolledBack" ? `by ${e.by}: ${e.reason}` : e.conversation_id || ""]));
  } catch (e) { showError($("error"), e); }
}

// -- alpha scatter -----------------------------------------------------------------------

async function loadAlpha() {
  try {
    const report = await api("GET", "/v1/admin/alpha");
    $("alpha-charts").replaceChildren(...report.buckets.map(alphaChart));
  } catch (e) { showError($("error"), e); }
}

function alphaChart(b) {
  const W = 360, H = 260, L = 50, R = 10, T = 24, B = 34;
  const points = b.per_conversation.filter((c) => c.members > 0);
  const positive = points.map((c) => c.alpha).filter((a) => a > 0);
  const ratio = b.max_active_ratio, ms = b.min_saving;
  const floor = Math.min(...positive, ratio || 1, 1) / 4;
  const yLo = Math.log10(floor / 2), yHi = Math.log10(1.5);
  const ns = points.map((c) => c.members);
  const xLo = Math.log10(Math.max(0.8, Math.min(...ns, ms || 10) / 2.5));
  const xHi = Math.log10(Math.max(...ns, ms ? ms / (1 - Math.min(ratio, 0.99)) : 10, 10) * 4);
  const x = (n) => L + ((Math.log10(n) - xLo) / (xHi - xLo)) * (W - L - R);
  const y = (a) => T + (1 - (Math.log10(Math.max(a, floor)) - yLo) / (yHi - yLo)) * (H - T - B);
  const s = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "alpha-chart", id: "alpha-" + b.size_bucket });
  s.append(svg("rect", { x: L, y: T, width: W - L - R, height: H - T - B, class: "plot" }));
  if (ms && ratio) { // the region meeting the criterion: alpha < ratio and N > ms / (1 - alpha)
    const pts = [];
    const aTop = Math.min(ratio, 0.999);
    for (let k = 0; k <= 40; k++) {
      const a = Math.pow(10, yLo + (k / 40) * (Math.log10(aTop) - yLo));
      pts.push([Math.min(x(ms / (1 - a)), W - R), y(a)]);
    }
    const poly = [...pts, [W - R, y(aTop)], [W - R, y(Math.pow(10, yLo))]];
    s.append(svg("polygon", { points: poly.map((p) => p.map((v) => v.toFixed(1)).join(",")).join(" "), class: "region" }));
    s.append(svg("line", { x1: L, x2: W - R, y1: y(ratio), y2: y(ratio), class: "t1" }));
    s.append(svg("polyline", { points: pts.map((p) => p.map((v) => v.toFixed(1)).join(",")).join(" "), class: "criterion" }));
  }
  for (let e = Math.ceil(xLo); e <= Math.floor(xHi); e++) s.append(svg("text", { x: x(10 ** e), y: H - B + 14, class: "axis mid" }, num(10 ** e, 0)));
  for (let e = Math.ceil(yLo); e <= 0; e++) s.append(svg("text", { x: L - 4, y: y(10 ** e) + 4, class: "axis end" }, String(10 ** e)));
  s.append(svg("text", { x: L, y: 14, class: "title" }, `${b.size_bucket}: ${points.length} conv., mean alpha ${num(b.alpha_mean, 3)}`));
  s.append(svg("text", { x: W - R, y: H - 4, class: "axis end" }, "N (log)"));
  s.append(svg("text", { x: 4, y: T + 10, class: "axis" }, "alpha"));
  for (const c of points) {
    const dot = svg("circle", { cx: x(c.members).toFixed(1), cy: y(c.alpha).toFixed(1), r: c.meets ? 6 : 4, class: "point " + c.write_policy + (c.meets ? " meets" : ""), tabindex: 0, "data-cid": c.conversation_id });
    dot.append(svg("title", {}, `${c.conversation_id}: N ${c.members}, alpha ${num(c.alpha, 3)}, ${c.write_policy}`));
    const show = () => {
      $("alpha-point").textContent = `${c.conversation_id} (${b.size_bucket}): N ${c.members}, alpha ${num(c.alpha, 4)}, ` +
        `write_policy ${c.write_policy}, last switch ${when(c.last_switch_at)}` + (c.meets === undefined ? "" : `, meets the criterion: ${c.meets ? "yes" : "no"}`);
    };
    dot.addEventListener("click", show);
    dot.addEventListener("mouseenter", show);
    s.append(dot);
  }
  return s;
}

// -- a message's cost -------------------------------------------------------------------

async function lookupCost(ev) {
  ev.preventDefault();
  $("cost-error").textContent = "";
  const cid = encodeURIComponent($("cost-cid").value.trim());
  const seq = encodeURIComponent($("cost-seq").value.trim());
  try {
    const r = await api("GET", `/v1/conversations/${cid}/messages/${seq}/delivery`);
    fill($("cost").tBodies[0], [
      ["state", r.state], ["message_id", r.message_id], ["write_policy", r.write_policy], ["member_count", r.member_count],
      ["body writes, O(1)", r.body_writes], ["head writes, O(1)", r.head_writes], ["shards touched, O(S)", r.shards],
      ["mailbox entries, O(N)", r.mailbox_entries], ["online pushes, O(O)", r.online_pushes], ["materialized_at", when(r.materialized_at)],
    ]);
  } catch (e) { $("cost").tBodies[0].replaceChildren(); showError($("cost-error"), e); }
}

// -- re-review conditions ------------------------------------------------------------------

function renderRereview(r) {
  const data = (c) => {
    const d = c.details;
    if (c.condition === 1) return "T1/T2 firing: " + JSON.stringify(d.firing) + "; held " + JSON.stringify(Object.fromEntries(Object.entries(d.held_s).map(([k, v]) => [k, Math.round(v) + " s"])));
    if (c.condition === 4) return d.measured_here ? `${num(d.entries_measured, 0)} entries timed (judged from ${d.min_entries}); estimate ${d.estimate_us} us x ${d.factor}` : "not measured by this process";
    return `${d.conversations} large conversation(s)`;
  };
  const unit = { 1: " s", 4: " us/entry", 7: "" };
  const show = (c, v) => (v === null || v === undefined ? "-" : num(v, 3) + unit[c.condition]);
  fill($("rereview").tBodies[0], r.conditions.map((c) => [c.condition, c.title,
    el("td", { class: c.state, id: "condition-" + c.condition }, c.state), show(c, c.value), show(c, c.limit), data(c)]));
  $("checklist").replaceChildren(...r.checklist.map((c) => el("li", {}, el("input", { type: "checkbox", disabled: true }), ` (${c.condition}) ${c.text}: decided in ${c.where}`)));
}

// -- wiring -------------------------------------------------------------------------------

document.addEventListener("DOMContentLoaded", () => {
  $("token-form").addEventListener("submit", (ev) => { ev.preventDefault(); login($("token").value.trim()); });
  $("logout").addEventListener("click", logout);
  $("alpha-refresh").addEventListener("click", loadAlpha);
  $("rollback-yes").addEventListener("click", rollback);
  $("rollback-no").addEventListener("click", () => { $("rollback-confirm").hidden = true; });
  $("cost-form").addEventListener("submit", lookupCost);
  const saved = sessionStorage.getItem(TOKEN_KEY);
  if (saved) login(saved);
});
