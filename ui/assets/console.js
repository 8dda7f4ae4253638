// The operator console. One page for every /ui/... address: the path picks the view and
// links are ordinary links (full page loads keep back, reload and "open in new tab"
// working). Signing in trades the operator's token for a browser session (POST
// /v1/sessions); only that session stays in this tab's sessionStorage, never the token.
import {
  h,
  put,
  takeCredential,
  fragmentHasCredential,
  openSession,
  client,
  errorBox,
  rawMember,
  prettyJson,
  fmtTime,
  badge,
  localToIso,
  isoToLocal,
  field,
  table,
  liveLine,
  pollUntil,
  attemptItem,
  rateChart,
  rate,
} from "./common.js";

const TOKEN_KEY = "hookd.console.token";
let token = null;
const api = client(() => token);
const main = document.getElementById("main");
const PAGE = 50;

// What the token may do (GET /v1/whoami). The API enforces scopes itself; this only keeps
// the console from offering buttons that can only answer 403.
let who = { tenant: null, consumer: null, scopes: [] };
const can = (scope) => who.scopes.includes(scope);

const enc = encodeURIComponent;

function show(...children) {
  put(main, ...children);
}

/** Trades a token (typed, or from an older `#token=` link) for a session. A credential
 *  that cannot make one (a ServiceAccount token, or any text while authentication is off)
 *  is kept as it is: a ServiceAccount token is short-lived already. */
async function signInWith(credential) {
  try {
    token = await openSession(TOKEN_KEY, credential);
  } catch (e) {
    if (e.status !== 422 || !credential.token) throw e;
    token = credential.token;
    sessionStorage.setItem(TOKEN_KEY, token);
  }
}

/** Signs in with what the address brought, else with this tab's session; then the page. */
async function boot() {
  const credential = takeCredential();
  if (credential) {
    try {
      await signInWith(credential);
    } catch (e) {
      token = null;
      return signIn(
        e.status === 401
          ? credential.code
            ? "That sign-in link was used already or has expired (401)."
            : "That token was refused (401): it is unknown, revoked or expired."
          : `Could not sign in: ${e.message}`,
      );
    }
  } else {
    token = sessionStorage.getItem(TOKEN_KEY);
  }
  await start();
}

async function start() {
  if (!token) return signIn();
  try {
    who = await api("GET", "/v1/whoami");
  } catch (e) {
    if (e.status === 401) return signIn("That token was refused (401): it is unknown, revoked or expired.");
    return show(errorBox(e, "Could not read what this token may do"));
  }
  chrome();
  try {
    await route();
  } catch (e) {
    show(h("h1", {}, "Something went wrong"), errorBox(e));
  }
}

function signIn(message) {
  const { input, el } = field("token", "API token", {
    type: "password",
    autocomplete: "off",
    spellcheck: "false",
    required: true,
  });
  const form = h(
    "form",
    {
      class: "card narrow",
      on: {
        submit: async (ev) => {
          ev.preventDefault();
          // the typed token is sent once and never kept: the tab holds a session
          const typed = input.value.trim();
          input.value = "";
          try {
            await signInWith({ token: typed });
          } catch (e) {
            token = null;
            return signIn(
              e.status === 401
                ? "That token was refused (401): it is unknown, revoked or expired."
                : `Could not sign in: ${e.message}`,
            );
          }
          start();
        },
      },
    },
    h("h1", {}, "Sign in to the hookd console"),
    message ? h("p", { class: "error", role: "alert" }, message) : null,
    el,
    h(
      "p",
      { class: "muted" },
      "A hookd_… token from `hookd token create`, with scope read (operate to replay, manage to change endpoints). It is sent once and not kept: this tab keeps a session that ends within 12 hours, or when the token is revoked.",
    ),
    h("button", { type: "submit" }, "Sign in"),
  );
  put(document.getElementById("nav"));
  put(document.getElementById("who"));
  show(form);
  input.focus();
}

function chrome() {
  const here = location.pathname.replace(/\/+$/, "");
  const link = (href, text) => {
    const current = href === "/ui" ? here === "/ui" || here.startsWith("/ui/messages") : here.startsWith(href);
    return h("a", { href, "aria-current": current ? "page" : null }, text);
  };
  put(
    document.getElementById("nav"),
    link("/ui", "Messages"),
    link("/ui/dead-letters", "Dead letters"),
    link("/ui/endpoints", "Endpoints"),
    who.consumer ? null : link("/ui/consumers", "Consumers"),
    who.consumer || !can("manage") ? null : link("/ui/sources", "Sources"),
    can("read") ? link("/ui/event-types", "Event types") : null,
  );
  put(
    document.getElementById("who"),
    h(
      "span",
      { class: "muted", id: "whoami" },
      who.tenant ? `tenant ${who.tenant}` : "all tenants",
      who.consumer ? ` · consumer ${who.consumer}` : "",
      ` · ${who.scopes.join(", ") || "no scopes"}`,
    ),
    " ",
    h(
      "button",
      {
        type: "button",
        class: "link",
        on: {
          click: async () => {
            // the session ends on the server too: a copy the browser left on disk is dead
            try {
              await api("DELETE", "/v1/sessions");
            } catch {
              // not a session (a ServiceAccount token), or hookd is unreachable: sign out here anyway
            }
            sessionStorage.removeItem(TOKEN_KEY);
            location.assign("/ui");
          },
        },
      },
      "Sign out",
    ),
  );
}

async function route() {
  const path = location.pathname.replace(/\/+$/, "");
  let m;
  if (path === "/ui") return messagesPage();
  if ((m = path.match(/^\/ui\/messages\/([^/]+)$/))) return messagePage(decodeURIComponent(m[1]));
  if (path === "/ui/dead-letters") return deadLettersPage();
  if (path === "/ui/endpoints") return endpointsPage();
  if ((m = path.match(/^\/ui\/endpoints\/([^/]+)$/))) return endpointPage(decodeURIComponent(m[1]));
  if (path === "/ui/consumers") return consumersPage();
  if (path === "/ui/sources") return sourcesPage();
  if (path === "/ui/event-types") return eventTypesPage();
  if ((m = path.match(/^\/ui\/sources\/([^/]+)$/))) return sourcePage(decodeURIComponent(m[1]));
  show(h("h1", {}, "Not found"), h("p", {}, "There is no console page at this address."), h("a", { href: "/ui" }, "Messages"));
}

/** The page's query with `changes` applied (null removes), as a link target. */
function withQuery(changes) {
  const q = new URLSearchParams(location.search);
  for (const [k, v] of Object.entries(changes)) {
    if (v === null || v === "") q.delete(k);
    else q.set(k, v);
  }
  const s = q.toString();
  return location.pathname + (s ? "?" + s : "");
}

/** "Next page" (keyset: the API's opaque cursor) and "first page" links. */
function pager(nextCursor) {
  const q = new URLSearchParams(location.search);
  return h(
    "nav",
    { class: "pager", "aria-label": "Pages" },
    q.get("cursor") ? h("a", { href: withQuery({ cursor: null }) }, "← First page") : null,
    nextCursor ? h("a", { href: withQuery({ cursor: nextCursor }), rel: "next" }, "Next page →") : null,
  );
}

/** A filter form whose fields mirror the page's query; submitting loads the page again
 *  with the new query (form-action 'none' forbids a native submit, by design). */
function filterForm(fields, label) {
  const q = new URLSearchParams(location.search);
  const made = fields.map((f) => {
    const made = field(`f-${f.name}`, f.label, f.attrs || {});
    if (f.options) {
      for (const [value, text] of f.options) made.input.appendChild(h("option", { value }, text));
    }
    made.input.value = q.get(f.name) || "";
    return { ...f, ...made };
  });
  return h(
    "form",
    {
      class: "filters",
      role: "search",
      "aria-label": label,
      on: {
        submit: (ev) => {
          ev.preventDefault();
          const next = {};
          for (const f of made) next[f.name] = f.input.value.trim() || null;
          next.cursor = null;
          location.assign(withQuery(next));
        },
      },
    },
    made.map((f) => f.el),
    h("button", { type: "submit" }, "Apply"),
  );
}

// ---- messages ----

async function messagesPage() {
  const q = new URLSearchParams(location.search);
  const filters = filterForm(
    [
      { name: "eventType", label: "Event type", attrs: { placeholder: "invoice.paid" } },
      { name: "consumer", label: "Consumer", attrs: { placeholder: "cust_42" } },
      {
        name: "status",
        label: "Delivery status",
        attrs: { tag: "select" },
        options: [["", "any"], ["pending", "pending"], ["failed", "failed (retrying)"], ["dead", "dead"], ["succeeded", "succeeded"], ["cancelled", "cancelled"]],
      },
      { name: "since", label: "Since", attrs: { type: "datetime-local" } },
      { name: "until", label: "Until", attrs: { type: "datetime-local" } },
    ],
    "Filter messages",
  );
  const open = field("open-id", "Open an event by id", { placeholder: "eventId", autocomplete: "off", required: true });
  const openForm = h(
    "form",
    {
      class: "filters",
      on: {
        submit: (ev) => {
          ev.preventDefault();
          location.assign("/ui/messages/" + enc(open.input.value.trim()));
        },
      },
    },
    open.el,
    h("button", { type: "submit" }, "Open"),
  );
  const list = h("div", {}, h("p", { class: "muted" }, "Loading…"));
  show(h("h1", {}, "Messages"), filters, openForm, list);

  const params = new URLSearchParams({ limit: String(PAGE) });
  for (const k of ["eventType", "consumer", "status", "source", "cursor"]) if (q.get(k)) params.set(k, q.get(k));
  for (const k of ["since", "until"]) if (localToIso(q.get(k))) params.set(k, localToIso(q.get(k)));
  let page;
  try {
    page = await api("GET", "/v1/messages?" + params);
  } catch (e) {
    return put(list, errorBox(e, "Could not list messages"));
  }
  if (!page.items.length) return put(list, h("p", { class: "muted" }, "No messages match."), pager(null));
  const rows = page.items.map((m) =>
    h(
      "tr",
      {},
      h("td", {}, h("time", { datetime: m.createdAt }, fmtTime(m.createdAt))),
      h("td", {}, h("a", { href: "/ui/messages/" + enc(m.id), class: "event-link" }, m.eventType)),
      h("td", {}, m.consumer ?? "—"),
      h("td", {}, deliveryCounts(m.deliveries)),
      h("td", { class: "mono" }, m.id),
    ),
  );
  put(list, table(["Created", "Event type", "Consumer", "Deliveries", "Event id"], rows, "Recent messages, newest first"), pager(page.nextCursor));
}

function deliveryCounts(d) {
  if (!d || !d.total) return h("span", { class: "muted" }, "none");
  const parts = ["succeeded", "pending", "failed", "dead", "cancelled"]
    .filter((k) => d[k])
    .map((k) => h("span", { class: "count" }, badge(k), " ", String(d[k])));
  return h("span", { class: "counts" }, parts);
}

async function messagePage(id) {
  let res;
  try {
    res = await api("GET", "/v1/messages/" + enc(id), undefined, { raw: true });
  } catch (e) {
    return show(h("h1", {}, "Message"), errorBox(e, `Could not open event ${id}`));
  }
  const m = res.json;
  // The exact bytes: the payload's text as the API embedded it, not JSON.parse's view.
  const raw = rawMember(res.text, "payload") ?? JSON.stringify(m.payload);
  const bytes = new TextEncoder().encode(raw).length;
  const deliveries = h("div", { id: "deliveries" });
  show(
    h("p", {}, h("a", { href: "/ui" }, "← Messages")),
    h("h1", {}, h("span", { class: "muted" }, "Event "), h("span", { id: "event-type" }, m.eventType)),
    h(
      "dl",
      { class: "facts" },
      fact("Event id", h("span", { class: "mono" }, m.eventId)),
      fact("Tenant", m.tenant),
      m.consumer !== undefined ? fact("Consumer", m.consumer ?? "— (tenant-wide)") : null,
      fact("Created", fmtTime(m.createdAt)),
      fact("Idempotency key", m.idempotencyKey ?? "—"),
      m.source ? fact("Source", h("a", { href: "/ui/sources/" + enc(m.source) }, m.source)) : null,
      m.sourceEventId ? fact("Provider's event id", h("span", { class: "mono" }, m.sourceEventId)) : null,
    ),
    h(
      "section",
      { "aria-labelledby": "payload-title" },
      h("h2", { id: "payload-title" }, "Payload"),
      h(
        "div",
        { class: "panes" },
        h("figure", {}, h("figcaption", {}, `Exact bytes (${bytes} bytes, as sent and signed)`), h("pre", { id: "payload-raw", class: "payload", tabindex: "0" }, raw)),
        h("figure", {}, h("figcaption", {}, "Pretty-printed"), h("pre", { id: "payload-pretty", class: "payload", tabindex: "0" }, prettyJson(raw))),
      ),
    ),
    h("section", { "aria-labelledby": "deliveries-title" }, h("h2", { id: "deliveries-title" }, `Deliveries (${m.deliveries.length})`), deliveries),
  );
  if (!m.deliveries.length) put(deliveries, h("p", { class: "muted" }, "No endpoint subscribed to this event when it was sent."));
  for (const d of m.deliveries) deliveries.appendChild(deliveryCard(d.deliveryId));
}

function fact(term, value) {
  return [h("dt", {}, term), h("dd", {}, value)];
}

/** One delivery with its attempt timeline and a replay button that waits for the new
 *  attempt and shows it. */
function deliveryCard(id) {
  const body = h("div", {}, h("p", { class: "muted" }, "Loading…"));
  const status = liveLine();
  const card = h("article", { class: "card delivery", id: "delivery-" + id, "aria-label": "Delivery " + id }, body, status);
  let last = null;
  const logLength = (d) => d.attempts.length + (d.attemptsOmitted || 0);

  async function load() {
    try {
      last = await api("GET", "/v1/deliveries/" + enc(id));
    } catch (e) {
      put(body, errorBox(e, `Delivery ${id}`));
      return null;
    }
    render(last);
    return last;
  }

  async function replay(button) {
    button.disabled = true;
    const before = last ? logLength(last) : 0;
    put(status, "Replaying…");
    try {
      await api("POST", `/v1/deliveries/${enc(id)}/replay`);
    } catch (e) {
      put(status, errorBox(e, "Replay refused"));
      button.disabled = false;
      return;
    }
    put(status, "Replay queued; waiting for the new attempt…");
    const done = await pollUntil(async () => {
      const d = await load();
      return d && logLength(d) > before && d.status !== "pending" && d.status !== "in_progress";
    });
    const a = last?.attempts?.[last.attempts.length - 1];
    if (done && a) {
      put(status, `New attempt #${a.attempt}: ${a.statusCode != null ? "HTTP " + a.statusCode : a.errorClass || "no response"} in ${a.durationMs} ms; delivery ${last.status}.`);
    } else {
      put(status, "The replay is queued; no new attempt yet (is a dispatcher running?).");
    }
  }

  function render(d) {
    const ep = d.endpoint;
    const why = [];
    if (ep && ep.state !== "active") why.push(`endpoint ${ep.state}${ep.stateReason ? ": " + ep.stateReason : ""}`);
    if (ep && ep.circuitState && ep.circuitState !== "closed")
      why.push(`circuit ${ep.circuitState.replace("_", " ")}${ep.circuitOpenUntil ? " until " + fmtTime(ep.circuitOpenUntil) : ""}`);
    put(
      body,
      h(
        "header",
        { class: "delivery-head" },
        h("h3", {}, badge(d.status), " ", h("span", { class: "mono" }, d.deliveryId)),
        h(
          "p",
          { class: "muted" },
          "to endpoint ",
          h("a", { href: "/ui/endpoints/" + enc(d.endpointId) }, d.endpointId),
          ` · ${d.attemptCount} attempt(s) since enqueue or replay`,
          d.nextAttemptAt ? ` · next attempt ${fmtTime(d.nextAttemptAt)}` : "",
        ),
        why.length ? h("p", { class: "warn" }, why.join(" · ")) : null,
        can("operate")
          ? h("button", { type: "button", class: "replay", on: { click: (ev) => replay(ev.currentTarget) } }, "Replay")
          : null,
      ),
      d.attemptsOmitted ? h("p", { class: "muted" }, `${d.attemptsOmitted} older attempt(s) not shown`) : null,
      d.attempts.length
        ? h("ol", { class: "timeline", "aria-label": "Attempts, oldest first" }, d.attempts.map(attemptItem))
        : h("p", { class: "muted" }, "No attempt yet."),
    );
  }

  load();
  return card;
}

// ---- dead letters ----

async function deadLettersPage() {
  const q = new URLSearchParams(location.search);
  const list = h("div", {}, h("p", { class: "muted" }, "Loading…"));
  show(
    h("h1", {}, "Dead letters"),
    h("p", { class: "muted" }, "Deliveries that used up their attempts, oldest first. Replaying one sends it again now, with the same webhook-id."),
    filterForm([{ name: "endpointId", label: "Endpoint id", attrs: { autocomplete: "off" } }], "Filter dead letters"),
    list,
  );
  const params = new URLSearchParams({ limit: String(PAGE) });
  for (const k of ["endpointId", "cursor"]) if (q.get(k)) params.set(k, q.get(k));
  let page;
  try {
    page = await api("GET", "/v1/dead-letters?" + params);
  } catch (e) {
    return put(list, errorBox(e, "Could not list dead letters"));
  }
  if (!page.items.length) return put(list, h("p", { class: "muted" }, "No dead letters."), pager(null));
  const rows = page.items.map((d) => {
    const cell = h("td", {});
    if (can("operate")) {
      cell.appendChild(
        h(
          "button",
          {
            type: "button",
            on: {
              click: async (ev) => {
                ev.currentTarget.disabled = true;
                try {
                  await api("POST", `/v1/deliveries/${enc(d.deliveryId)}/replay`);
                  put(cell, "replayed");
                } catch (e) {
                  put(cell, errorBox(e));
                }
              },
            },
          },
          "Replay",
        ),
      );
    }
    return h(
      "tr",
      {},
      h("td", {}, fmtTime(d.deadAt)),
      h("td", {}, h("a", { href: "/ui/messages/" + enc(d.eventId), class: "mono" }, d.eventId)),
      h("td", {}, h("a", { href: "/ui/endpoints/" + enc(d.endpointId), class: "mono" }, d.endpointId)),
      h("td", {}, d.reason),
      h("td", {}, String(d.attempts)),
      cell,
    );
  });
  put(list, table(["Dead since", "Event", "Endpoint", "Reason", "Attempts", ""], rows, "Dead letters"), pager(page.nextCursor));
}

// ---- endpoints ----

async function endpointsPage() {
  const q = new URLSearchParams(location.search);
  const list = h("div", {}, h("p", { class: "muted" }, "Loading…"));
  show(h("h1", {}, "Endpoints"), who.consumer ? null : filterForm([{ name: "consumer", label: "Consumer", attrs: { placeholder: "cust_42" } }], "Filter endpoints"), list);
  const params = new URLSearchParams({ limit: String(PAGE) });
  for (const k of ["consumer", "cursor"]) if (q.get(k)) params.set(k, q.get(k));
  let page;
  try {
    page = await api("GET", "/v1/endpoints?" + params);
  } catch (e) {
    return put(list, errorBox(e, "Could not list endpoints"));
  }
  if (!page.items.length) return put(list, h("p", { class: "muted" }, "No endpoints."), pager(null));
  const rows = page.items.map((e) =>
    h(
      "tr",
      {},
      h("td", {}, h("a", { href: "/ui/endpoints/" + enc(e.id), class: "url" }, e.url)),
      h("td", {}, e.consumer ?? "—"),
      h("td", {}, e.eventTypes.length ? e.eventTypes.join(", ") : "all"),
      h("td", {}, badge(e.state)),
      h("td", {}, badge(e.circuit?.state)),
      h("td", {}, e.managedBy),
    ),
  );
  put(list, table(["URL", "Consumer", "Event types", "State", "Circuit", "Managed by"], rows, "Endpoints"), pager(page.nextCursor));
}

async function endpointPage(id) {
  const top = h("div", {}, h("p", { class: "muted" }, "Loading…"));
  const deliveries = h("div", {});
  show(h("p", {}, h("a", { href: "/ui/endpoints" }, "← Endpoints")), top, deliveries);
  let ep, stats;
  try {
    [ep, stats] = await Promise.all([api("GET", "/v1/endpoints/" + enc(id)), api("GET", `/v1/endpoints/${enc(id)}/stats`)]);
  } catch (e) {
    return put(top, h("h1", {}, "Endpoint"), errorBox(e, `Could not open endpoint ${id}`));
  }
  const status = liveLine();
  const action = (path, label) =>
    h(
      "button",
      {
        type: "button",
        on: {
          click: async (ev) => {
            ev.currentTarget.disabled = true;
            try {
              await api("POST", `/v1/endpoints/${enc(id)}/${path}`);
              location.reload();
            } catch (e) {
              put(status, errorBox(e, label + " refused"));
              ev.target.disabled = false;
            }
          },
        },
      },
      label,
    );
  const actions = [];
  if (can("manage") && ep.managedBy !== "kubernetes") {
    if (ep.state === "active") actions.push(action("pause", "Pause"));
    if (ep.state === "paused") actions.push(action("resume", "Resume"));
    if (ep.state === "disabled") actions.push(action("enable", "Re-enable"));
  }
  put(
    top,
    h("h1", { class: "url" }, ep.url),
    h(
      "dl",
      { class: "facts" },
      fact("Endpoint id", h("span", { class: "mono" }, ep.id)),
      fact("Consumer", ep.consumer ?? "— (tenant-wide)"),
      fact("Event types", ep.eventTypes.length ? ep.eventTypes.join(", ") : "all"),
      ep.description ? fact("Description", ep.description) : null,
      fact("State", [badge(stats.state ?? ep.state), ep.disabledReason ? " " + ep.disabledReason : ""]),
      fact("Circuit", [badge(stats.circuit?.state), stats.circuit?.openUntil ? " until " + fmtTime(stats.circuit.openUntil) : ""]),
      fact("Rate limit", ep.rateLimit ? `at most ${ep.rateLimit.perSecond}/s, bursts of ${ep.rateLimit.burst} (across every dispatcher)` : "none"),
      fact("Ordering", ep.ordering === "perKey"
        ? `one at a time per orderingKey; after a dead letter: ${ep.onDeadLetter === "hold" ? "hold the key" : "continue"}`
        : "none"),
      fact("Backlog", String(stats.backlog)),
      fact("Last success", stats.lastSuccess ? `${fmtTime(stats.lastSuccess.at)} (HTTP ${stats.lastSuccess.statusCode})` : "—"),
      fact(
        "Last failure",
        stats.lastFailure
          ? `${fmtTime(stats.lastFailure.at)} (${stats.lastFailure.statusCode != null ? "HTTP " + stats.lastFailure.statusCode : stats.lastFailure.error || "error"})`
          : "—",
      ),
      fact("Managed by", ep.managedBy === "kubernetes" ? "Kubernetes (change the WebhookEndpoint object)" : "the API"),
      stats.secretUnreadable
        ? fact("Held", `since ${fmtTime(stats.secretUnreadable.since)}: a dispatcher cannot decrypt the signing secret (${stats.secretUnreadable.error}); deliveries wait, uncounted`)
        : null,
    ),
    actions.length ? h("div", { class: "actions" }, actions) : null,
    status,
    h(
      "section",
      { "aria-labelledby": "rate-title" },
      h("h2", { id: "rate-title" }, "Success rate"),
      h("p", { id: "rate-hour" }, "Last hour: ", rate(stats.lastHour)),
      h("p", { id: "rate-day" }, "Last day: ", rate(stats.lastDay)),
      rateChart(stats.hourly || [], "Deliveries per hour over the last day, failed on top of succeeded"),
      h("p", { class: "muted legend" }, h("span", { class: "key ok" }), " succeeded ", h("span", { class: "key bad" }), " failed, per hour, oldest on the left"),
    ),
    can("operate") ? replayForm(id) : null,
  );
  await endpointDeliveries(id, deliveries);
}

/** Replay an endpoint's failures since a time (the recover flow after an outage). */
function replayForm(id) {
  const since = field("replay-since", "Created since", { type: "datetime-local", required: true });
  since.input.value = isoToLocal(new Date(Date.now() - 3600e3));
  const dead = h("input", { type: "checkbox", id: "replay-dead", checked: true });
  const failed = h("input", { type: "checkbox", id: "replay-failed", checked: true });
  const status = liveLine();
  return h(
    "section",
    { "aria-labelledby": "replay-title" },
    h("h2", { id: "replay-title" }, "Replay failures"),
    h(
      "form",
      {
        class: "filters",
        on: {
          submit: async (ev) => {
            ev.preventDefault();
            const statuses = [dead.checked && "dead", failed.checked && "failed"].filter(Boolean);
            if (!statuses.length) return put(status, "Choose dead, failed or both.");
            try {
              const r = await api("POST", `/v1/endpoints/${enc(id)}/replay`, { since: localToIso(since.input.value), statuses });
              put(status, `Replayed ${r.replayed} deliveries${r.skippedLeased ? ` (${r.skippedLeased} skipped: being sent right now)` : ""}.`);
            } catch (e) {
              put(status, errorBox(e, "Replay refused"));
            }
          },
        },
      },
      since.el,
      h("div", { class: "field checks" }, h("label", {}, dead, " dead"), h("label", {}, failed, " failed (waiting to retry)")),
      h("button", { type: "submit" }, "Replay"),
    ),
    status,
  );
}

async function endpointDeliveries(id, el) {
  put(el, h("h2", {}, "Recent deliveries"), h("p", { class: "muted" }, "Loading…"));
  let page;
  try {
    page = await api("GET", `/v1/endpoints/${enc(id)}/deliveries?limit=20`);
  } catch (e) {
    return put(el, h("h2", {}, "Recent deliveries"), errorBox(e, "Could not list deliveries"));
  }
  const rows = page.items.map((d) =>
    h(
      "tr",
      {},
      h("td", {}, fmtTime(d.createdAt)),
      h("td", {}, h("a", { href: "/ui/messages/" + enc(d.eventId) }, d.eventType)),
      h("td", {}, badge(d.status)),
      h("td", {}, String(d.attempts)),
      h("td", {}, d.lastStatusCode != null ? String(d.lastStatusCode) : "—"),
      h("td", {}, d.lastError ?? ""),
    ),
  );
  put(
    el,
    h("h2", {}, "Recent deliveries"),
    rows.length ? table(["Created", "Event", "Status", "Attempts", "Last code", "Last error"], rows, "Recent deliveries of this endpoint") : h("p", { class: "muted" }, "None yet."),
  );
}

// ---- consumers ----

async function consumersPage() {
  const list = h("div", {}, h("p", { class: "muted" }, "Loading…"));
  show(h("h1", {}, "Consumers"), h("p", { class: "muted" }, "The parties your webhooks are for. A portal link lets one of them manage their own endpoints."), list);
  const q = new URLSearchParams(location.search);
  const params = new URLSearchParams({ limit: String(PAGE) });
  if (q.get("cursor")) params.set("cursor", q.get("cursor"));
  let page;
  try {
    page = await api("GET", "/v1/consumers?" + params);
  } catch (e) {
    return put(list, errorBox(e, "Could not list consumers"));
  }
  if (!page.items.length) return put(list, h("p", { class: "muted" }, "No consumers yet (PUT /v1/consumers/{uid})."), pager(null));
  const rows = page.items.map((c) => {
    const portal = h("td", {});
    if (can("manage")) portal.appendChild(portalButton(c.uid, portal));
    return h(
      "tr",
      {},
      h("td", { class: "mono" }, c.uid),
      h("td", {}, c.name ?? ""),
      h("td", {}, h("a", { href: "/ui/endpoints?consumer=" + enc(c.uid) }, String(c.endpointCount))),
      h("td", {}, h("a", { href: "/ui?consumer=" + enc(c.uid) }, "messages")),
      portal,
    );
  });
  put(list, table(["Uid", "Name", "Endpoints", "Messages", "Portal"], rows, "Consumers"), pager(page.nextCursor));
}

function portalButton(uid, cell) {
  return h(
    "button",
    {
      type: "button",
      on: {
        click: async () => {
          try {
            const r = await api("POST", `/v1/consumers/${enc(uid)}/portal`, {});
            // Only a link to a portal page is made clickable; anything else stays text.
            const safe = /^(\/portal|https?:\/\/[^\s]+\/portal)[#?]/.test(r.url);
            put(
              cell,
              safe ? h("a", { href: r.url, target: "_blank", rel: "noreferrer noopener" }, "Open portal") : null,
              h("div", { class: "muted" }, `link valid until ${fmtTime(r.expiresAt)}; give it only to ${uid}`),
            );
          } catch (e) {
            put(cell, errorBox(e, "No portal link"));
          }
        },
      },
    },
    "Portal link",
  );
}

// ---- inbound sources ----

async function sourcesPage() {
  const q = new URLSearchParams(location.search);
  const list = h("div", {}, h("p", { class: "muted" }, "Loading…"));
  show(
    h("h1", {}, "Sources"),
    h("p", { class: "muted" }, "Providers' webhooks (Stripe, GitHub, …) taken at POST /in/{name}, verified, and sent on to your endpoints like any event."),
    list,
  );
  const params = new URLSearchParams({ limit: String(PAGE) });
  if (q.get("cursor")) params.set("cursor", q.get("cursor"));
  let page;
  try {
    page = await api("GET", "/v1/sources?" + params);
  } catch (e) {
    return put(list, errorBox(e, "Could not list sources"));
  }
  if (!page.items.length) return put(list, h("p", { class: "muted" }, "No sources yet (POST /v1/sources, or a WebhookSource object)."), pager(null));
  const rows = page.items.map((s) =>
    h(
      "tr",
      {},
      h("td", {}, h("a", { href: "/ui/sources/" + enc(s.name), class: "source-link" }, s.name)),
      h("td", {}, s.provider),
      h("td", { class: "mono" }, s.url),
      h("td", {}, s.consumer ?? "—"),
      h("td", {}, s.managedBy),
    ),
  );
  put(list, table(["Name", "Provider", "URL", "Consumer", "Managed by"], rows, "Sources"), pager(page.nextCursor));
}

/** The tenant's event-type catalog, read-only: each type with its description, deprecation,
 *  owner, and its example and schema behind a disclosure. Changes go through the API or a
 *  WebhookEventType object. */
async function eventTypesPage() {
  const q = new URLSearchParams(location.search);
  const list = h("div", {}, h("p", { class: "muted" }, "Loading…"));
  show(
    h("h1", {}, "Event types"),
    h(
      "p",
      { class: "muted" },
      "The catalog customers pick from in the portal, and that a message sent with \"validate\": true is checked against. Declared with POST /v1/event-types or a WebhookEventType object.",
    ),
    list,
  );
  const params = new URLSearchParams({ limit: String(PAGE), includeDeprecated: "true" });
  if (q.get("cursor")) params.set("cursor", q.get("cursor"));
  let page;
  try {
    page = await api("GET", "/v1/event-types?" + params);
  } catch (e) {
    return put(list, errorBox(e, "Could not list event types"));
  }
  if (!page.items.length) return put(list, h("p", { class: "muted" }, "No event types yet."), pager(null));
  const rows = page.items.map((t) =>
    h(
      "tr",
      { class: "event-type", "data-type": t.name },
      h("td", { class: "mono" }, t.name, t.deprecated ? [" ", badge("deprecated")] : null),
      h(
        "td",
        {},
        t.description ?? "—",
        t.deprecated && t.deprecationNote ? h("p", { class: "muted" }, t.deprecationNote) : null,
        t.example != null || t.schema != null
          ? h(
              "details",
              {},
              h("summary", {}, "Example and schema"),
              t.example != null ? h("pre", { class: "mono example" }, JSON.stringify(t.example, null, 2)) : null,
              t.schema != null ? h("pre", { class: "mono schema" }, JSON.stringify(t.schema, null, 2)) : null,
            )
          : null,
      ),
      h("td", {}, t.schema != null ? "yes" : "no"),
      h("td", {}, t.managedBy),
    ),
  );
  put(list, table(["Name", "Description", "Schema", "Managed by"], rows, "Event types"), pager(page.nextCursor));
}

const OUTCOME_TEXT = {
  accepted: "accepted",
  duplicate: "duplicate (taken before; nothing written)",
  url_verification: "Slack's URL check, answered",
  missing_signature: "refused: no signature",
  malformed_signature: "refused: malformed signature",
  bad_signature: "refused: signature does not match",
  stale_timestamp: "refused: signed too long ago (replay or clock skew)",
  not_json: "refused: body is not JSON",
  not_admitted: "held back before verification (size, bytes in flight or rate)",
  not_taken: "verified, not committed (rate or outage; the provider retries)",
};

async function sourcePage(name) {
  const top = h("div", {}, h("p", { class: "muted" }, "Loading…"));
  const requests = h("section", { "aria-labelledby": "requests-title" });
  const events = h("section", { "aria-labelledby": "events-title" });
  show(h("p", {}, h("a", { href: "/ui/sources" }, "← Sources")), top, requests, events);
  let s, stats;
  try {
    [s, stats] = await Promise.all([api("GET", "/v1/sources/" + enc(name)), api("GET", `/v1/sources/${enc(name)}/stats`)]);
  } catch (e) {
    return put(top, h("h1", {}, "Source"), errorBox(e, `Could not open source ${name}`));
  }
  put(
    top,
    h("h1", {}, h("span", { class: "muted" }, "Source "), h("span", { id: "source-name" }, s.name)),
    h(
      "dl",
      { class: "facts" },
      fact("Provider", s.provider),
      fact("URL for the provider", h("span", { class: "mono" }, s.url)),
      fact("Tenant", s.tenant),
      fact("Consumer", s.consumer ?? "— (tenant-wide)"),
      fact("Event types", `${s.eventTypePrefix}.{provider's type}`),
      fact("Largest body", `${s.maxBodyBytes} bytes`),
      fact("Managed by", s.managedBy),
      s.description ? fact("Description", s.description) : null,
    ),
  );
  const rows = stats.outcomes.map((o) =>
    h(
      "tr",
      { class: o.taken ? "" : "refused", "data-outcome": o.outcome },
      h("td", {}, badge(o.taken ? "taken" : "refused"), " ", OUTCOME_TEXT[o.outcome] ?? o.outcome),
      h("td", { class: "num" }, String(o.count)),
      h("td", {}, fmtTime(o.lastAt)),
    ),
  );
  put(
    requests,
    h("h2", { id: "requests-title" }, "Requests since " + fmtTime(stats.since)),
    rows.length
      ? table(["Outcome", "Requests", "Last"], rows, "Requests to this source by outcome")
      : h("p", { class: "muted" }, "No requests yet. Counts show a few seconds after a request; a request to an unknown name is counted in the metrics only."),
  );
  put(events, h("h2", { id: "events-title" }, "Accepted requests"), h("p", { class: "muted" }, "Loading…"));
  let page;
  try {
    page = await api("GET", "/v1/messages?" + new URLSearchParams({ source: s.name, limit: "20" }));
  } catch (e) {
    return put(events, h("h2", { id: "events-title" }, "Accepted requests"), errorBox(e, "Could not list its events"));
  }
  const eventRows = page.items.map((m) =>
    h(
      "tr",
      {},
      h("td", {}, h("time", { datetime: m.createdAt }, fmtTime(m.createdAt))),
      h("td", {}, h("a", { href: "/ui/messages/" + enc(m.id), class: "event-link" }, m.eventType)),
      h("td", { class: "mono" }, m.sourceEventId ?? "—"),
      h("td", {}, deliveryCounts(m.deliveries)),
    ),
  );
  put(
    events,
    h("h2", { id: "events-title" }, "Accepted requests"),
    eventRows.length
      ? table(["Received", "Event type", "Provider's event id", "Deliveries"], eventRows, "Events this source took, newest first")
      : h("p", { class: "muted" }, "None yet."),
    page.nextCursor ? h("p", {}, h("a", { href: "/ui?" + new URLSearchParams({ source: s.name }) }, "All its events →")) : null,
  );
}

// A link with a fresh `#code=` or `#token=` opened in this tab, or an embedding page that changes
// only the fragment, brings a new token without a reload: take it and start over.
window.addEventListener("hashchange", () => {
  if (fragmentHasCredential()) boot();
});

boot();
