// Shared by the console and the portal.
//
// Every piece of data reaches the page through text nodes (h() below turns strings into
// text nodes, never markup): payloads, URLs, error messages and receivers' response
// snippets are written by other people, and the CSP is the second line, not the first.

/** An element with attributes, event listeners (`on: {click: fn}`) and children (strings
 *  become text nodes; null, undefined and false are skipped; arrays are flattened). */
export function h(tag, props, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "on") {
      for (const [event, fn] of Object.entries(v)) el.addEventListener(event, fn);
    } else if (k === "class") {
      el.className = v;
    } else {
      el.setAttribute(k, v === true ? "" : String(v));
    }
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else if (c instanceof Node) el.appendChild(c);
    else el.appendChild(document.createTextNode(String(c)));
  }
}

/** Replaces the children of `el`. */
export function put(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

/** What a link brought in its fragment: `#code=` (a portal link's one-time code) or, from
 *  older links, `#token=`. The fragment is removed from the address bar at once, before
 *  anything else happens (a fragment never reaches a server log, but it does reach the
 *  browser's history: that is why links carry a short-lived, single-use code). */
export function takeCredential() {
  const m = location.hash.match(/^#(code|token)=([^&]+)/);
  if (!m) return null;
  history.replaceState(null, "", location.pathname + location.search);
  return { [m[1]]: decodeURIComponent(m[2]) };
}

/** Whether the fragment carries a credential (see takeCredential). */
export function fragmentHasCredential() {
  return /^#(code|token)=/.test(location.hash);
}

/** Trades a credential for a browser session and keeps only the session, in this tab's
 *  sessionStorage (a tab's life, and never the token or the code itself): a code with
 *  POST /v1/sessions/from-code, a token with POST /v1/sessions. Resolves to the session
 *  token; rejects with an ApiError (401 `sign_in_code_invalid` for a used or expired code). */
export async function openSession(key, credential) {
  sessionStorage.removeItem(key);
  const api = client(() => credential.token);
  const s = credential.code
    ? await api("POST", "/v1/sessions/from-code", { code: credential.code }, { anonymous: true })
    : await api("POST", "/v1/sessions", {});
  sessionStorage.setItem(key, s.token);
  return s.token;
}

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

/** A caller of the public API with the tab's token. Resolves to the parsed JSON (or, with
 *  `{raw: true}`, `{json, text}`), rejects with an ApiError carrying the API's code. */
export function client(getToken) {
  return async function api(method, path, body, opts = {}) {
    const headers = opts.anonymous ? {} : { authorization: "Bearer " + getToken() };
    const init = { method, headers, cache: "no-store", credentials: "omit" };
    if (body !== undefined) {
      headers["content-type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    let r;
    try {
      r = await fetch(path, init);
    } catch (e) {
      throw new ApiError(0, "network", "hookd did not answer (" + e.message + ")");
    }
    const text = await r.text();
    let json = null;
    try {
      json = text ? JSON.parse(text) : null;
    } catch {
      json = null;
    }
    if (!r.ok) {
      const e = (json && json.error) || {};
      throw new ApiError(r.status, e.code || "http_" + r.status, e.message || r.statusText);
    }
    return opts.raw ? { json, text } : json;
  };
}

/** An error box for a failed call (its text from the API, as text). */
export function errorBox(e, what) {
  const detail = e instanceof ApiError ? `${e.message} (${e.status} ${e.code})` : String(e);
  return h("p", { class: "error", role: "alert" }, what ? `${what}: ${detail}` : detail);
}

// ---- JSON text, byte for byte ----

const WS = " \t\n\r";

function skipWs(t, i) {
  while (i < t.length && WS.includes(t[i])) i++;
  return i;
}

/** Index just after the string starting at t[i] (a `"`). */
function scanString(t, i) {
  i++;
  while (i < t.length) {
    if (t[i] === "\\") i += 2;
    else if (t[i] === '"') return i + 1;
    else i++;
  }
  return t.length;
}

/** Index just after the JSON value starting at t[i]. */
function scanValue(t, i) {
  const c = t[i];
  if (c === '"') return scanString(t, i);
  if (c === "{" || c === "[") {
    let depth = 0;
    while (i < t.length) {
      const d = t[i];
      if (d === '"') {
        i = scanString(t, i);
        continue;
      }
      if (d === "{" || d === "[") depth++;
      else if ((d === "}" || d === "]") && --depth === 0) return i + 1;
      i++;
    }
    return t.length;
  }
  while (i < t.length && !(",}]" + WS).includes(t[i])) i++;
  return i;
}

/** The exact text of a top-level member's value in a JSON object text, or null. The API
 *  embeds a payload verbatim, so this is what the producer sent: key order, spacing and
 *  integers beyond 2^53 that JSON.parse would change. */
export function rawMember(text, name) {
  let i = skipWs(text, 0);
  if (text[i] !== "{") return null;
  i++;
  while (i < text.length) {
    i = skipWs(text, i);
    if (text[i] !== '"') return null;
    const keyEnd = scanString(text, i);
    const key = JSON.parse(text.slice(i, keyEnd));
    i = skipWs(text, skipWs(text, keyEnd) + 1);
    const end = scanValue(text, i);
    if (key === name) return text.slice(i, end);
    i = skipWs(text, end);
    if (text[i] !== ",") return null;
    i++;
  }
  return null;
}

/** JSON text re-indented without parsing it, so every literal stays as sent. */
export function prettyJson(raw) {
  let out = "";
  let depth = 0;
  const newline = () => "\n" + "  ".repeat(depth);
  for (let i = 0; i < raw.length; ) {
    const c = raw[i];
    if (c === '"') {
      const end = scanString(raw, i);
      out += raw.slice(i, end);
      i = end;
    } else if (WS.includes(c)) {
      i++;
    } else if (c === "{" || c === "[") {
      const j = skipWs(raw, i + 1);
      if (raw[j] === (c === "{" ? "}" : "]")) {
        out += c + raw[j];
        i = j + 1;
      } else {
        depth++;
        out += c + newline();
        i++;
      }
    } else if (c === "}" || c === "]") {
      depth--;
      out += newline() + c;
      i++;
    } else if (c === ",") {
      out += "," + newline();
      i++;
    } else if (c === ":") {
      out += ": ";
      i++;
    } else {
      out += c;
      i++;
    }
  }
  return out;
}

// ---- small views ----

/** `2026-12-04 00:31:02 UTC`: one unambiguous clock for operators in several zones. */
export function fmtTime(iso) {
  if (!iso) return "—";
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return String(iso);
  return d.toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
}

/** A status word as a badge; the class is derived from a fixed alphabet only. */
export function badge(word) {
  const w = String(word ?? "unknown");
  return h("span", { class: "badge b-" + w.replace(/[^a-z_]/g, "") }, w.replace("_", " "));
}

/** `YYYY-MM-DDTHH:MM` of a datetime-local input, as an ISO instant for the API. */
export function localToIso(v) {
  if (!v) return null;
  const d = new Date(v);
  return Number.isNaN(d.getTime()) ? null : d.toISOString();
}

/** An instant as the value of a datetime-local input (local time, minutes). */
export function isoToLocal(d) {
  const pad = (n) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T${pad(d.getHours())}:${pad(d.getMinutes())}`;
}

/** A labelled input (the label is a real <label for>, for screen readers and for a click
 *  target on a phone). */
export function field(id, label, attrs = {}) {
  const input = h(attrs.tag || "input", { id, name: id, ...attrs, tag: null });
  return { input, el: h("div", { class: "field" }, h("label", { for: id }, label), input) };
}

/** A <table> in a horizontally scrolling box, so wide rows never widen a phone's page. */
export function table(headings, rows, caption) {
  return h(
    "div",
    { class: "scroll", tabindex: "0", role: "region", "aria-label": caption },
    h(
      "table",
      {},
      h("caption", { class: "sr-only" }, caption),
      h("thead", {}, h("tr", {}, headings.map((t) => h("th", { scope: "col" }, t)))),
      h("tbody", {}, rows),
    ),
  );
}

/** A polite live region: status lines after a button press are read out. */
export function liveLine(cls = "status") {
  return h("p", { class: cls, role: "status", "aria-live": "polite" });
}

/** Calls `check` every `ms` until it returns true or `timeoutMs` passes. */
export async function pollUntil(check, timeoutMs = 30000, ms = 500) {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (await check()) return true;
    await new Promise((r) => setTimeout(r, ms));
  }
  return false;
}

/** One attempt of the log as a timeline entry: when, outcome, how long, why. */
export function attemptItem(a) {
  const outcome = a.statusCode != null ? `HTTP ${a.statusCode}` : a.errorClass || "no response";
  const ok = a.statusCode != null && a.statusCode >= 200 && a.statusCode < 300;
  return h(
    "li",
    { class: ok ? "attempt ok" : "attempt bad" },
    h(
      "div",
      { class: "attempt-head" },
      h("strong", {}, `#${a.attempt}`),
      " ",
      h("span", { class: "outcome" }, outcome),
      " · ",
      `${a.durationMs} ms`,
      " · ",
      h("time", { datetime: a.startedAt }, fmtTime(a.startedAt)),
    ),
    a.errorClass && a.statusCode != null ? h("div", {}, "error class: ", a.errorClass) : null,
    a.error ? h("div", { class: "attempt-error" }, a.error) : null,
    a.responseSnippet
      ? h("pre", { class: "snippet", "aria-label": "response snippet" }, a.responseSnippet)
      : null,
  );
}

/** A chart of hourly outcomes (oldest first): bars scaled to the busiest hour, the
 *  failed part on top; each bar's numbers in a <title> and the whole in aria-label. */
export function rateChart(hourly, label) {
  const NS = "http://www.w3.org/2000/svg";
  const barW = 10;
  const height = 60;
  const max = Math.max(1, ...hourly.map((b) => b.succeeded + b.failed));
  const svg = document.createElementNS(NS, "svg");
  svg.setAttribute("viewBox", `0 0 ${hourly.length * barW} ${height}`);
  svg.setAttribute("class", "chart");
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", label);
  svg.setAttribute("preserveAspectRatio", "none");
  const rect = (x, y, h, cls, title) => {
    const r = document.createElementNS(NS, "rect");
    r.setAttribute("x", x + 1);
    r.setAttribute("y", y);
    r.setAttribute("width", barW - 2);
    r.setAttribute("height", Math.max(h, 0));
    r.setAttribute("class", cls);
    const t = document.createElementNS(NS, "title");
    t.textContent = title;
    r.appendChild(t);
    svg.appendChild(r);
  };
  hourly.forEach((b, i) => {
    const total = b.succeeded + b.failed;
    const title = `${fmtTime(b.hour)}: ${b.succeeded} succeeded, ${b.failed} failed`;
    if (total === 0) {
      rect(i * barW, height - 1, 1, "none", title);
      return;
    }
    const okH = (height * b.succeeded) / max;
    const badH = (height * b.failed) / max;
    rect(i * barW, height - okH, okH, "ok", title);
    rect(i * barW, height - okH - badH, badH, "bad", title);
  });
  return svg;
}

/** "97.5 % (39 of 40)" or "no deliveries". */
export function rate(w) {
  const total = (w?.succeeded || 0) + (w?.failed || 0);
  if (!total) return "no deliveries";
  const pct = Math.round((1000 * w.succeeded) / total) / 10;
  return `${pct} % (${w.succeeded} of ${total} succeeded)`;
}
