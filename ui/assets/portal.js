// The customer portal: one consumer's endpoints, test events and deliveries. Opened as
// /portal#code=… (a link from POST /v1/consumers/{uid}/portal): the one-time code is
// traded for a browser session of the consumer's token, and only that session is kept.
// It confines every call to the consumer, so the page needs no checks of its own about
// whose data it shows: the API answers 404 for anything else.
import {
  h,
  put,
  takeCredential,
  fragmentHasCredential,
  openSession,
  client,
  errorBox,
  fmtTime,
  badge,
  field,
  table,
  liveLine,
  pollUntil,
  attemptItem,
} from "./common.js";

const TOKEN_KEY = "hookd.portal.token";
let token = null;
const api = client(() => token);
const app = document.getElementById("app");
const enc = encodeURIComponent;
let who = { consumer: null, scopes: [] };
const can = (scope) => who.scopes.includes(scope);

/** Signs in with what the address brought (a code, or a token from an older link), else
 *  with this tab's session, then shows the page. */
async function boot() {
  const credential = takeCredential();
  if (credential) {
    try {
      token = await openSession(TOKEN_KEY, credential);
    } catch (e) {
      token = null;
      if (e.status === 401) return linkDead(credential.code !== undefined);
      return put(app, errorBox(e, "Could not sign in"));
    }
  } else {
    token = sessionStorage.getItem(TOKEN_KEY);
  }
  await start();
}

/** A link that cannot sign in any more: what happened and what to do, in words. */
function linkDead(wasCode) {
  put(document.getElementById("who"));
  put(
    app,
    h(
      "div",
      { class: "card narrow", id: "link-dead" },
      h("h1", {}, "This link has expired"),
      h(
        "p",
        { role: "alert" },
        wasCode
          ? "A sign-in link works once, within a few minutes of being made, and this one was used already or is too old. Open the page again from where you found the link to get a fresh one."
          : "The access token in this link is unknown, expired or revoked. Open the page again from where you found the link to get a fresh one.",
      ),
    ),
  );
}

async function start() {
  if (!token) return signIn("Open this page from the link you were given; it signs you in.");
  try {
    who = await api("GET", "/v1/whoami");
  } catch (e) {
    if (e.status === 401) return signIn("This link has expired or was revoked. Ask for a new one.");
    return put(app, errorBox(e));
  }
  put(document.getElementById("who"), h("span", { class: "muted", id: "whoami" }, who.consumer ? `Signed in as ${who.consumer}` : "Signed in"));
  put(
    app,
    h("h1", {}, "Your webhook endpoints"),
    h("p", { class: "muted" }, "Register the URLs that should receive events, test them, and see what was delivered."),
    can("manage") ? addForm() : null,
    h("div", { id: "secret-once" }),
    h("div", { id: "endpoints" }, h("p", { class: "muted" }, "Loading…")),
  );
  await loadEndpoints();
}

function signIn(message) {
  const { input, el } = field("token", "Access token", { type: "password", autocomplete: "off", required: true });
  put(
    app,
    h(
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
              token = await openSession(TOKEN_KEY, { token: typed });
            } catch (e) {
              token = null;
              return signIn(e.status === 401 ? "That token was refused: it is unknown, expired or revoked." : e.message);
            }
            start();
          },
        },
      },
      h("h1", {}, "Sign in"),
      h("p", { role: "alert" }, message),
      el,
      h("button", { type: "submit" }, "Sign in"),
    ),
  );
}

/** Comma-separated event types (one per line works too); empty means every type. Not
 *  split on spaces: "order paid" is a mistake the API names (422), where splitting it would
 *  silently subscribe to two other types, "order" and "paid". */
function parseTypes(text) {
  return text
    .split(/[,\n]+/)
    .map((t) => t.trim())
    .filter(Boolean);
}

/** A secret is shown once, right after it was made; it is in no later answer of the API,
 *  so this box is the only place it ever appears. */
function showSecret(secret, what) {
  const box = document.getElementById("secret-once");
  const done = h("button", { type: "button", on: { click: () => put(box) } }, "I have saved it");
  put(
    box,
    h(
      "div",
      { class: "card secret", role: "alert" },
      h("h2", {}, "Signing secret for ", what),
      h("p", {}, "Copy it now: it is shown only this once. Your server verifies each webhook with it."),
      h("pre", { id: "secret-value", class: "mono", tabindex: "0" }, secret),
      done,
    ),
  );
  done.focus();
}

function addForm() {
  const url = field("new-url", "Endpoint URL", { type: "url", required: true, placeholder: "https://example.com/webhooks", autocomplete: "url" });
  const types = field("new-types", "Event types (comma-separated; empty for all)", { placeholder: "invoice.paid, invoice.*" });
  const desc = field("new-description", "Description (optional)", { maxlength: "200" });
  const status = liveLine();
  return h(
    "form",
    {
      class: "card",
      id: "add-endpoint",
      on: {
        submit: async (ev) => {
          ev.preventDefault();
          const body = { url: url.input.value.trim(), eventTypes: parseTypes(types.input.value) };
          if (desc.input.value.trim()) body.description = desc.input.value.trim();
          put(status, "Adding…");
          try {
            const ep = await api("POST", "/v1/endpoints", body);
            put(status, "Endpoint added.");
            ev.target.reset();
            showSecret(ep.secret, ep.url);
            await loadEndpoints();
          } catch (e) {
            put(status, errorBox(e, "Not added"));
          }
        },
      },
    },
    h("h2", {}, "Add an endpoint"),
    url.el,
    types.el,
    catalogPicker(types.input, "new"),
    desc.el,
    h("button", { type: "submit" }, "Add endpoint"),
    status,
  );
}

async function loadEndpoints() {
  const el = document.getElementById("endpoints");
  let page;
  try {
    page = await api("GET", "/v1/endpoints?limit=100");
  } catch (e) {
    return put(el, errorBox(e, "Could not list your endpoints"));
  }
  if (!page.items.length) return put(el, h("p", { class: "muted" }, "No endpoints yet."));
  put(el, page.items.map(endpointCard));
}

function endpointCard(ep) {
  const status = liveLine();
  const deliveries = h("div", { class: "deliveries" });
  const card = h("article", { class: "card endpoint", id: "endpoint-" + ep.id, "aria-label": "Endpoint " + ep.url });
  const act = (label, fn, cls) =>
    h(
      "button",
      {
        type: "button",
        class: cls,
        on: {
          click: async (ev) => {
            const b = ev.currentTarget;
            b.disabled = true;
            try {
              await fn(b);
            } catch (e) {
              put(status, errorBox(e, label + " failed"));
            }
            b.disabled = false;
          },
        },
      },
      label,
    );

  const actions = [];
  if (can("manage") && ep.managedBy !== "kubernetes") {
    actions.push(
      act("Send test event", async () => {
        const r = await api("POST", `/v1/endpoints/${enc(ep.id)}/test`, {});
        put(status, "Test event sent; waiting for your endpoint to answer…");
        let d = null;
        await pollUntil(async () => {
          d = await api("GET", "/v1/deliveries/" + enc(r.deliveryId));
          return d.attempts.length > 0 && d.status !== "pending" && d.status !== "in_progress";
        });
        const a = d?.attempts?.[d.attempts.length - 1];
        if (d && d.status === "succeeded") put(status, `Test event delivered: HTTP ${a.statusCode} in ${a.durationMs} ms.`);
        else if (a) put(status, `Test event not delivered yet: ${a.statusCode != null ? "HTTP " + a.statusCode : a.errorClass || "no response"}${a.error ? " (" + a.error + ")" : ""}; it will be retried.`);
        else put(status, "Test event queued; no attempt yet.");
        await loadDeliveries(ep.id, deliveries);
      }, "test-event"),
      ep.state === "paused"
        ? act("Resume", async () => {
            await api("POST", `/v1/endpoints/${enc(ep.id)}/resume`);
            await loadEndpoints();
          }, "resume")
        : ep.state === "active"
          ? act("Pause", async () => {
              await api("POST", `/v1/endpoints/${enc(ep.id)}/pause`);
              await loadEndpoints();
            }, "pause")
          : act("Re-enable", async () => {
              await api("POST", `/v1/endpoints/${enc(ep.id)}/enable`);
              await loadEndpoints();
            }, "enable"),
      act("Edit event types", async () => editTypes(ep, card), "edit-types"),
      act("Rate limit", async () => editRate(ep, card), "edit-rate"),
      // one at a time per orderingKey, in the order the producer's events committed
      act(ep.ordering === "perKey" ? "Stop ordering by key" : "Order by key", async () => {
        await api("PATCH", `/v1/endpoints/${enc(ep.id)}`, { ordering: ep.ordering === "perKey" ? "none" : "perKey" });
        await loadEndpoints();
      }, "ordering"),
      act("Rotate secret", async () => {
        const r = await api("POST", `/v1/endpoints/${enc(ep.id)}/secret/rotate`, {});
        showSecret(r.secret, ep.url);
        put(status, `Secret rotated; the previous one keeps signing until ${fmtTime(r.previousValidUntil)} so you can switch over.`);
      }, "rotate"),
      act(
        "Delete",
        async (b) => {
          // two steps instead of window.confirm(): a modal dialog would trap keyboard
          // users in some embeddings and cannot be styled
          put(
            status,
            "Delete this endpoint? Its pending deliveries are cancelled. ",
            h(
              "button",
              {
                type: "button",
                class: "danger",
                on: {
                  click: async () => {
                    try {
                      await api("DELETE", "/v1/endpoints/" + enc(ep.id));
                      await loadEndpoints();
                    } catch (e) {
                      put(status, errorBox(e, "Not deleted"));
                    }
                  },
                },
              },
              "Yes, delete",
            ),
          );
          b.blur();
        },
        "danger delete",
      ),
    );
  }

  put(
    card,
    h("h3", { class: "url" }, ep.url),
    h(
      "p",
      { class: "muted" },
      badge(ep.state),
      ep.disabledReason ? " " + ep.disabledReason : "",
      " · events: ",
      h("span", { class: "types" }, ep.eventTypes.length ? ep.eventTypes.join(", ") : "all"),
      ep.description ? " · " + ep.description : "",
      " · ",
      h("span", { class: "rate" }, rateText(ep.rateLimit)),
    ),
    h("div", { class: "actions" }, actions),
    h("div", { class: "edit" }),
    status,
    deliveries,
  );
  loadDeliveries(ep.id, deliveries);
  return card;
}

function editTypes(ep, card) {
  const slot = card.querySelector(".edit");
  const types = field("types-" + ep.id, "Event types (comma-separated; empty for all)");
  types.input.value = ep.eventTypes.join(", ");
  put(
    slot,
    h(
      "form",
      {
        class: "filters",
        on: {
          submit: async (ev) => {
            ev.preventDefault();
            try {
              await api("PATCH", "/v1/endpoints/" + enc(ep.id), { eventTypes: parseTypes(types.input.value) });
              await loadEndpoints();
            } catch (e) {
              slot.appendChild(errorBox(e, "Not saved"));
            }
          },
        },
      },
      types.el,
      catalogPicker(types.input, ep.id),
      h("button", { type: "submit" }, "Save"),
      h("button", { type: "button", class: "link", on: { click: () => put(slot) } }, "Cancel"),
    ),
  );
  types.input.focus();
}

function rateText(r) {
  return r ? `at most ${r.perSecond}/s (bursts of ${r.burst})` : "no rate limit";
}

/** The most deliveries a second your server is sent (across every hookd dispatcher), and
 *  how many may come at once after a quiet spell; both empty removes the limit. */
function editRate(ep, card) {
  const slot = card.querySelector(".edit");
  const rate = field("rate-" + ep.id, "Most deliveries a second (empty: no limit)", { type: "number", min: "0.01", max: "100000", step: "any", inputmode: "decimal" });
  const burst = field("burst-" + ep.id, "Burst (optional; default: the rate rounded up)", { type: "number", min: "1", max: "100000", step: "1", inputmode: "numeric" });
  if (ep.rateLimit) {
    rate.input.value = String(ep.rateLimit.perSecond);
    burst.input.value = String(ep.rateLimit.burst);
  }
  put(
    slot,
    h(
      "form",
      {
        class: "filters",
        on: {
          submit: async (ev) => {
            ev.preventDefault();
            const perSecond = rate.input.value.trim();
            const b = burst.input.value.trim();
            const rateLimit = perSecond === "" ? null : { perSecond: Number(perSecond), ...(b === "" ? {} : { burst: Number(b) }) };
            try {
              await api("PATCH", "/v1/endpoints/" + enc(ep.id), { rateLimit });
              await loadEndpoints();
            } catch (e) {
              slot.appendChild(errorBox(e, "Not saved"));
            }
          },
        },
      },
      rate.el,
      burst.el,
      h("button", { type: "submit" }, "Save"),
      h("button", { type: "button", class: "link", on: { click: () => put(slot) } }, "Cancel"),
    ),
  );
  rate.input.focus();
}

async function loadDeliveries(endpointId, el) {
  let page;
  try {
    page = await api("GET", `/v1/endpoints/${enc(endpointId)}/deliveries?limit=10`);
  } catch (e) {
    return put(el, errorBox(e, "Could not list deliveries"));
  }
  if (!page.items.length) return put(el, h("p", { class: "muted" }, "No deliveries yet."));
  const rows = page.items.map((d) => {
    const detail = h("tr", { class: "detail", hidden: true }, h("td", { colspan: "5" }));
    const toggle = h(
      "button",
      {
        type: "button",
        class: "link attempts-toggle",
        "aria-expanded": "false",
        on: {
          click: async () => {
            const open = toggle.getAttribute("aria-expanded") === "true";
            toggle.setAttribute("aria-expanded", String(!open));
            detail.hidden = open;
            if (!open) await deliveryDetail(d.deliveryId, detail.firstChild, () => loadDeliveries(endpointId, el));
          },
        },
      },
      "Attempts",
    );
    return [
      h(
        "tr",
        { class: "delivery-row", "data-status": d.status },
        h("td", {}, fmtTime(d.createdAt)),
        h("td", {}, d.eventType),
        h("td", {}, badge(d.status)),
        h("td", {}, d.lastStatusCode != null ? `HTTP ${d.lastStatusCode}` : d.lastError ?? "—"),
        h("td", {}, toggle),
      ),
      detail,
    ];
  });
  put(el, h("h4", {}, "Recent deliveries"), table(["Created", "Event type", "Status", "Last answer", ""], rows, "Recent deliveries"));
}

async function deliveryDetail(id, cell, refresh) {
  put(cell, h("p", { class: "muted" }, "Loading…"));
  let d;
  try {
    d = await api("GET", "/v1/deliveries/" + enc(id));
  } catch (e) {
    return put(cell, errorBox(e));
  }
  const status = liveLine();
  put(
    cell,
    h("p", { class: "mono" }, "webhook-id ", d.deliveryId),
    d.attempts.length ? h("ol", { class: "timeline" }, d.attempts.map(attemptItem)) : h("p", { class: "muted" }, "No attempt yet."),
    can("operate")
      ? h(
          "button",
          {
            type: "button",
            on: {
              click: async (ev) => {
                ev.currentTarget.disabled = true;
                try {
                  await api("POST", `/v1/deliveries/${enc(id)}/replay`);
                  put(status, "Sent again.");
                  setTimeout(refresh, 1500);
                } catch (e) {
                  put(status, errorBox(e, "Replay refused"));
                }
              },
            },
          },
          "Replay",
        )
      : null,
    status,
  );
}

// ---- the event-type catalog ----

let catalog = null;

/** The tenant's event types (GET /v1/event-types, deprecated ones too), read once per page:
 *  what the pickers offer. An API without a catalog, or an empty one, offers nothing. */
async function loadCatalog() {
  if (!catalog) {
    catalog = api("GET", "/v1/event-types?limit=1000&includeDeprecated=true")
      .then((page) => page.items)
      .catch(() => []);
  }
  return catalog;
}

/** Checkboxes for the catalog's types beside a free-text event-types input, kept in step
 *  with it both ways: checking one adds its name to the text, typing a name checks it.
 *  Patterns (`invoice.*`) and types not in the catalog stay typed text. Each type shows its
 *  description, and its example and schema behind a disclosure. */
function catalogPicker(input, key) {
  const box = h("fieldset", { class: "catalog", id: "catalog-" + key, hidden: true });
  const boxes = [];
  const sync = () => {
    const typed = new Set(parseTypes(input.value));
    for (const cb of boxes) cb.checked = typed.has(cb.value);
  };
  input.addEventListener("input", sync);
  loadCatalog().then((types) => {
    if (!types.length) return;
    const items = types.map((t, i) => {
      const id = `catalog-${key}-${i}`;
      const cb = h("input", {
        type: "checkbox",
        id,
        value: t.name,
        on: {
          change: () => {
            const typed = parseTypes(input.value).filter((n) => n !== t.name);
            if (cb.checked) typed.push(t.name);
            input.value = typed.join(", ");
          },
        },
      });
      boxes.push(cb);
      const details =
        t.example != null || t.schema != null
          ? h(
              "details",
              {},
              h("summary", {}, "Example and schema"),
              t.example != null ? [h("h5", {}, "Example"), h("pre", { class: "mono example" }, JSON.stringify(t.example, null, 2))] : null,
              t.schema != null ? [h("h5", {}, "Schema"), h("pre", { class: "mono schema" }, JSON.stringify(t.schema, null, 2))] : null,
            )
          : null;
      return h(
        "div",
        { class: "catalog-type", "data-type": t.name },
        cb,
        " ",
        h("label", { for: id, class: "mono" }, t.name),
        t.deprecated ? [" ", badge("deprecated")] : null,
        t.description ? h("p", { class: "muted" }, t.description) : null,
        t.deprecated && t.deprecationNote ? h("p", { class: "muted deprecation" }, t.deprecationNote) : null,
        details,
      );
    });
    put(box, h("legend", {}, "Pick from the event types on offer"), items);
    box.hidden = false;
    sync();
  });
  return box;
}

// A link with a fresh `#code=` (or `#token=`) opened in this tab, or an embedding page that changes
// only the fragment, brings a new token without a reload: take it and start over.
window.addEventListener("hashchange", () => {
  if (fragmentHasCredential()) boot();
});

boot();
