//! The console (/ui) and the portal (/portal) in a real headless Chromium, against a real
//! `hookd dev` process on the test's database and real receivers on 127.0.0.1.
//!
//! Needs Debian's `chromium` and `chromium-driver` (.ci/run installs them); fails saying
//! so when they are missing, unless HOOKD_SKIP_BROWSER=1. HOOKD_UPDATE_SCREENSHOTS=1
//! refreshes docs/screenshots/ from the run.

use crate::common;
use crate::common::browser as kit;

use std::time::Duration;

use hookd::auth::Scope;
use kit::{Browser, Hookd, RecordingReceiver};
use reqwest::Method;
use sqlx::PgPool;

use common::{EndpointOpts, delivery_status, endpoint, mint_token, wait_until};

const CSP_HEAD: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors ";

/// The event the operator is looking for, among others, byte for byte (key order, a space,
/// an integer beyond 2^53).
const FAILED_PAYLOAD: &str = r#"{"order":"ord_17", "total":4200,"ledger":12345678901234567890}"#;

/// An operator signs in with `#token=`, finds an event by its type, opens it, sees the
/// failed attempt and replays it, and sees the new attempt that succeeded.
#[sqlx::test]
async fn operator_finds_an_event_by_type_and_replays_its_failed_delivery(pool: PgPool) {
    let Some(b) = Browser::start().await else {
        return;
    };
    let rx = RecordingReceiver::start(500).await;
    let endpoint_id = endpoint(
        &pool,
        EndpointOpts {
            url: rx.url("/orders"),
            max_attempts: Some(1),
            ..Default::default()
        },
    )
    .await;
    let hookd = Hookd::start(&pool, &[]).await;
    let producer = mint_token(&pool, "team-a", &[Scope::Produce]).await;
    let operator = mint_token(&pool, "team-a", &[Scope::Read, Scope::Operate]).await;

    let noise = hookd.send(&producer, "invoice.created", r#"{"n":1}"#).await;
    let event = hookd.send(&producer, "order.failed", FAILED_PAYLOAD).await;
    hookd.send(&producer, "invoice.created", r#"{"n":2}"#).await;
    let (_, m) = hookd
        .call(
            &operator,
            Method::GET,
            &format!("/v1/messages/{event}"),
            None,
        )
        .await;
    let delivery: uuid::Uuid = m["deliveries"][0]["deliveryId"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    // one attempt allowed, and the receiver answers 500: the delivery is dead
    assert!(
        wait_until(Duration::from_secs(20), || async {
            delivery_status(&pool, delivery).await.0 == "dead"
        })
        .await,
        "the delivery did not die; hookd log:\n{}",
        hookd.log()
    );

    // sign in through the fragment of an older link; the page removes it from the address
    // bar and trades the token for a session
    b.goto(&format!("{}/ui#token={operator}", hookd.base)).await;
    b.wait_for("a.event-link").await;
    let url = b.client.current_url().await.unwrap();
    assert_eq!(
        url.fragment(),
        None,
        "the token stays in the address bar: {url}"
    );
    assert_eq!(url.path(), "/ui");
    let kept = b
        .js("return sessionStorage.getItem('hookd.console.token')")
        .await;
    let kept = kept.as_str().unwrap();
    assert!(
        kept.starts_with("hookd_") && kept != operator,
        "the tab keeps the token itself, not a session"
    );
    let whoami = b.wait_for_text("#whoami", "team-a").await;
    assert!(
        whoami.contains("read") && whoami.contains("operate"),
        "{whoami}"
    );
    let listed = b.text("main table").await.unwrap();
    assert!(
        listed.contains("order.failed") && listed.contains("invoice.created"),
        "{listed}"
    );
    b.screenshot("console-messages").await;

    // the dead letter is listed, with a replay offered to this operate token
    b.click("#nav a[href='/ui/dead-letters']").await;
    let dead = b.wait_for_text("main table", &event).await;
    assert!(dead.contains(&endpoint_id.to_string()), "{dead}");
    // all three events died (one attempt, a failing receiver): three rows, each with Replay
    assert_eq!(
        b.js("return [...document.querySelectorAll('main tbody tr')].map(r => r.querySelectorAll('button').length)")
            .await,
        serde_json::json!([1, 1, 1])
    );
    b.click("#nav a[href='/ui']").await;
    b.wait_for("a.event-link").await;

    // find it by type
    b.type_into("#f-eventType", "order.failed").await;
    b.click("form.filters button[type=submit]").await;
    b.wait_for_text("main table", "order.failed").await;
    let links = b
        .js("return [...document.querySelectorAll('a.event-link')].map(a => a.textContent)")
        .await;
    assert_eq!(links, serde_json::json!(["order.failed"]), "the filter");
    assert!(
        !b.text("main table").await.unwrap().contains(&noise),
        "another type listed"
    );

    // open it: exact bytes, a pretty view, the failed attempt with the receiver's snippet
    b.click("a.event-link").await;
    b.wait_for_text("#event-type", "order.failed").await;
    assert_eq!(
        b.client.current_url().await.unwrap().path(),
        format!("/ui/messages/{event}")
    );
    assert_eq!(b.text("#payload-raw").await.unwrap(), FAILED_PAYLOAD);
    let pretty = b.text("#payload-pretty").await.unwrap();
    assert!(
        pretty.contains("\n  \"ledger\": 12345678901234567890\n"),
        "{pretty}"
    );
    let card = format!("#delivery-{delivery}");
    let timeline = b
        .wait_for_text(&format!("{card} .timeline"), "HTTP 500")
        .await;
    assert!(timeline.contains("#1"), "{timeline}");
    assert!(
        timeline.contains("<script>alert('snippet')</script>"),
        "the response snippet, as text: {timeline}"
    );
    assert!(
        b.text(&format!("{card} .badge"))
            .await
            .unwrap()
            .contains("dead")
    );

    // replay: the receiver is fixed now; the page shows the new attempt
    rx.set_status(200);
    let before = rx.seen().len();
    // from the keyboard: the replay is a real button that Enter activates
    b.wait_for(&format!("{card} button.replay"))
        .await
        .send_keys("\u{E007}")
        .await
        .unwrap();
    let line = b
        .wait_for_text(&format!("{card} [role=status]"), "New attempt #2")
        .await;
    assert!(line.contains("HTTP 200"), "{line}");
    let timeline = b
        .wait_for_text(&format!("{card} .timeline"), "HTTP 200")
        .await;
    assert_eq!(
        b.js(&format!(
            "return document.querySelectorAll('{card} .timeline li').length"
        ))
        .await,
        2,
        "{timeline}"
    );
    assert_eq!(
        rx.seen().len(),
        before + 1,
        "one new request reached the receiver"
    );
    assert_eq!(delivery_status(&pool, delivery).await.0, "succeeded");
    b.assert_no_dialog().await;
    b.screenshot("console-message").await;

    // the endpoint's page: state, circuit, backlog and the hourly chart from /stats
    b.goto(&format!("{}/ui/endpoints/{endpoint_id}", hookd.base))
        .await;
    b.wait_for_text("#rate-day", "succeeded").await;
    assert_eq!(
        b.js("return [...document.querySelectorAll('dl.facts dt')].find(d => d.textContent === 'Rate limit')?.nextElementSibling?.textContent")
            .await,
        "none",
        "the facts show the endpoint's rate limit"
    );
    assert_eq!(
        b.js("return [...document.querySelectorAll('dl.facts dt')].find(d => d.textContent === 'Ordering')?.nextElementSibling?.textContent")
            .await,
        "none",
        "the facts show the endpoint's ordering"
    );
    assert_eq!(
        b.js("return document.querySelectorAll('svg.chart rect').length > 0")
            .await,
        true
    );
    b.screenshot("console-endpoint").await;

    // recover after the outage: the two invoice.created deliveries are still dead
    b.click("#replay-title + form button[type=submit]").await;
    b.wait_for_text("#replay-title ~ [role=status]", "Replayed 2 deliveries")
        .await;
    assert!(
        wait_until(Duration::from_secs(20), || async {
            rx.seen().len() == before + 3
        })
        .await,
        "the replayed deliveries did not arrive"
    );
}

/// A payload with markup is shown as text, nothing in it runs; every response carries the
/// strict policy and the browser enforces it; the page loads nothing from another origin;
/// a deep link signs in; the message page fits a 375 px wide phone.
#[sqlx::test]
async fn payloads_render_as_text_under_a_strict_csp(pool: PgPool) {
    let Some(b) = Browser::start().await else {
        return;
    };
    let rx = RecordingReceiver::start(200).await;
    endpoint(
        &pool,
        EndpointOpts {
            url: rx.url("/x"),
            ..Default::default()
        },
    )
    .await;
    let hookd = Hookd::start(
        &pool,
        &[(
            "HOOKD_PORTAL_FRAME_ANCESTORS",
            "https://shop.example https://*.shop.example",
        )],
    )
    .await;
    let producer = mint_token(&pool, "team-a", &[Scope::Produce]).await;
    let reader = mint_token(&pool, "team-a", &[Scope::Read]).await;
    let hostile = r#"{"name":"<script>alert(1)</script><img src=x onerror=alert(2)>","url":"javascript:alert(3)"}"#;
    let event = hookd.send(&producer, "customer.renamed", hostile).await;

    // the headers, on pages and assets alike
    let http = reqwest::Client::new();
    for (path, ancestors, ty) in [
        ("/ui", "'none'", "text/html"),
        ("/ui/messages/whatever", "'none'", "text/html"),
        ("/ui/assets/console.js", "'none'", "text/javascript"),
        ("/ui/assets/app.css", "'none'", "text/css"),
        (
            "/portal",
            "https://shop.example https://*.shop.example",
            "text/html",
        ),
    ] {
        let r = http
            .get(format!("{}{path}", hookd.base))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{path}");
        let h = |n: &str| {
            r.headers()
                .get(n)
                .map(|v| v.to_str().unwrap().to_string())
                .unwrap_or_default()
        };
        assert_eq!(
            h("content-security-policy"),
            format!("{CSP_HEAD}{ancestors}"),
            "{path}"
        );
        assert_eq!(h("x-content-type-options"), "nosniff", "{path}");
        assert_eq!(h("referrer-policy"), "no-referrer", "{path}");
        assert!(
            h("content-type").starts_with(ty),
            "{path}: {}",
            h("content-type")
        );
    }

    // the page shows the attempts there are when it opens (it does not poll): the
    // delivery first, or a loaded machine opens it on "No attempt yet."
    let delivered = wait_until(Duration::from_secs(30), || async {
        sqlx::query_scalar::<_, bool>(
            "SELECT EXISTS (SELECT 1 FROM hookd.deliveries WHERE event_id = $1::uuid AND status = 'succeeded')",
        )
        .bind(event.to_string())
        .fetch_one(&pool)
        .await
        .unwrap()
    })
    .await;
    assert!(delivered, "the event was not delivered within 30 s");

    // a deep link with the token in the fragment
    b.goto(&format!(
        "{}/ui/messages/{event}#token={reader}",
        hookd.base
    ))
    .await;
    b.wait_for_text("#event-type", "customer.renamed").await;
    let url = b.client.current_url().await.unwrap();
    assert_eq!(url.fragment(), None, "{url}");
    assert_eq!(url.path(), format!("/ui/messages/{event}"));
    b.wait_for_text(".timeline", "HTTP 200").await;

    // the markup is text on the page, and no element came out of it
    assert_eq!(b.text("#payload-raw").await.unwrap(), hostile);
    assert!(
        b.text("#payload-pretty")
            .await
            .unwrap()
            .contains("\"<script>alert(1)</script><img src=x onerror=alert(2)>\"")
    );
    assert_eq!(
        b.js("return document.querySelectorAll('main script, main img, main iframe').length")
            .await,
        0
    );
    assert_eq!(
        b.js("return document.querySelectorAll('a[href^=\"javascript\"]').length")
            .await,
        0
    );
    b.assert_no_dialog().await;
    // a scope the token lacks is not offered
    assert_eq!(
        b.js("return document.querySelectorAll('button.replay').length")
            .await,
        0,
        "a read-only token is offered Replay"
    );

    // the browser enforces the policy: no inline script, no connection to another origin
    let inline = b
        .js_async(
            "const s = document.createElement('script'); s.textContent = 'window.__ran = 1';
             document.body.append(s); setTimeout(() => done(window.__ran === 1), 100);",
        )
        .await;
    assert_eq!(inline, false, "an inline script ran");
    let other_origin = b
        .js_async(&format!(
            "const seen = [];
             document.addEventListener('securitypolicyviolation', e => seen.push(e.violatedDirective));
             fetch('{}').then(() => done('fetched'), () => setTimeout(() => done(seen), 50));",
            rx.url("/exfiltrate")
        ))
        .await;
    assert_eq!(other_origin, serde_json::json!(["connect-src"]));
    assert!(
        rx.seen().iter().all(|s| s.path != "/exfiltrate"),
        "the request left"
    );

    // everything the page loaded came from its own origin
    let loaded = b
        .js("return performance.getEntriesByType('resource').map(e => e.name)")
        .await;
    let loaded: Vec<String> = serde_json::from_value(loaded).unwrap();
    assert!(
        loaded.iter().any(|u| u.ends_with("/ui/assets/common.js")),
        "{loaded:?}"
    );
    for u in &loaded {
        assert!(
            u.starts_with(&hookd.base),
            "loaded from another origin: {u}"
        );
    }

    // readable at 375 px: nothing makes the page itself scroll sideways
    b.client.set_window_size(375, 800).await.unwrap();
    b.client.refresh().await.unwrap();
    b.wait_for_text(".timeline", "HTTP 200").await;
    let fits = b
        .js("return [window.innerWidth, document.documentElement.scrollWidth]")
        .await;
    let (inner, scroll) = (fits[0].as_i64().unwrap(), fits[1].as_i64().unwrap());
    assert!(inner <= 400, "the window is not phone-sized: {inner}");
    assert!(
        scroll <= inner,
        "the page is {scroll} px wide in a {inner} px window"
    );
    b.screenshot("console-message-375").await;

    // a token that is not valid gets the sign-in form, with a reason
    b.goto(&format!("{}/ui#token=hookd_not-a-token", hookd.base))
        .await;
    b.wait_for_text("[role=alert]", "refused").await;
    b.wait_for("input#token[type=password]").await;
}

/// A customer opens the portal link an operator minted, adds an endpoint, sees its secret
/// once, sends a test event and sees it delivered (signed with that secret), and reaches
/// nothing of another customer.
#[sqlx::test]
async fn customer_adds_an_endpoint_and_tests_it_in_the_portal(pool: PgPool) {
    let Some(b) = Browser::start().await else {
        return;
    };
    let rx = RecordingReceiver::start(200).await;
    let hookd = Hookd::start(&pool, &[]).await;
    let admin = mint_token(&pool, "team-a", &[Scope::Read, Scope::Manage]).await;
    let other_url = rx.url("/cust_7");
    let (status, other) = hookd
        .call(
            &admin,
            Method::POST,
            "/v1/endpoints",
            Some(serde_json::json!({"url": other_url, "consumer": "cust_7"})),
        )
        .await;
    assert_eq!(status, 201, "{other}");
    let other_id = other["id"].as_str().unwrap().to_string();
    let (status, portal) = hookd
        .call(
            &admin,
            Method::POST,
            "/v1/consumers/cust_42/portal",
            Some(serde_json::json!({})),
        )
        .await;
    assert_eq!(status, 201, "{portal}");
    let link = portal["url"].as_str().unwrap();
    // absolute when the API knows its public address (hookd dev does), else relative
    let link = if link.starts_with('/') {
        format!("{}{link}", hookd.base)
    } else {
        link.to_string()
    };
    // a one-time code, not the token, is all the link carries
    assert!(
        link.starts_with(&format!("{}/portal#code=", hookd.base)),
        "{link}"
    );
    assert!(!link.contains(portal["token"].as_str().unwrap()), "{link}");

    b.goto(&link).await;
    b.wait_for_text("#whoami", "cust_42").await;
    let url = b.client.current_url().await.unwrap();
    assert_eq!(url.fragment(), None, "{url}");
    b.wait_for_text("#endpoints", "No endpoints yet").await;

    // add an endpoint: its secret is shown, once
    let mine = rx.url("/cust_42");
    b.type_into("#new-url", &mine).await;
    b.type_into("#new-types", "order.paid, order.refunded")
        .await;
    b.click("#add-endpoint button[type=submit]").await;
    let secret = b.wait_for_text("#secret-value", "whsec_").await;
    b.wait_for_text("#endpoints .endpoint .url", &mine).await;
    assert_eq!(
        b.text("#endpoints .types").await.unwrap(),
        "order.paid, order.refunded"
    );
    b.click("#secret-once button").await;
    assert_eq!(b.text("#secret-value").await, None, "the secret stays");
    b.client.refresh().await.unwrap();
    b.wait_for_text("#endpoints .endpoint .url", &mine).await;
    let page = b.js("return document.documentElement.outerHTML").await;
    assert!(
        !page.as_str().unwrap().contains(&secret),
        "the secret is shown again"
    );

    // a test event reaches the receiver, signed with the secret the page showed
    b.click("#endpoints .endpoint button.test-event").await;
    let line = b
        .wait_for_text("#endpoints .endpoint [role=status]", "Test event delivered")
        .await;
    assert!(line.contains("HTTP 200"), "{line}");
    let seen: Vec<_> = rx
        .seen()
        .into_iter()
        .filter(|s| s.path == "/cust_42")
        .collect();
    assert_eq!(seen.len(), 1);
    standardwebhooks::Webhook::new(&secret)
        .unwrap()
        .verify(&seen[0].body, &seen[0].headers)
        .expect("signed with the secret the portal showed");
    b.wait_for_text("#endpoints .endpoint table", "succeeded")
        .await;
    b.click("#endpoints .endpoint button.attempts-toggle").await;
    b.wait_for_text("#endpoints tr.detail .timeline", "HTTP 200")
        .await;
    b.screenshot("portal").await;

    // rotating shows the new secret, once
    b.click("#endpoints .endpoint button.rotate").await;
    let rotated = b.wait_for_text("#secret-value", "whsec_").await;
    assert_ne!(rotated, secret);

    // edit the event types, pause and resume, then delete
    b.click("#endpoints .endpoint button.edit-types").await;
    b.type_into("#endpoints .endpoint .edit input", "order.*")
        .await;
    b.click("#endpoints .endpoint .edit button[type=submit]")
        .await;
    b.wait_for_text("#endpoints .types", "order.*").await;
    // a rate limit the customer sets for its own server
    assert_eq!(b.text("#endpoints .rate").await.unwrap(), "no rate limit");
    b.click("#endpoints .endpoint button.edit-rate").await;
    b.type_into("#endpoints .endpoint .edit input", "2.5").await;
    b.click("#endpoints .endpoint .edit button[type=submit]")
        .await;
    b.wait_for_text("#endpoints .rate", "at most 2.5/s (bursts of 3)")
        .await;
    // ordered delivery per key, for a customer whose events must arrive in order
    b.click("#endpoints .endpoint button.ordering").await;
    b.wait_for_text(
        "#endpoints .endpoint button.ordering",
        "Stop ordering by key",
    )
    .await;
    b.click("#endpoints .endpoint button.pause").await;
    b.wait_for_text("#endpoints .endpoint .badge", "paused")
        .await;
    b.click("#endpoints .endpoint button.resume").await;
    b.wait_for_text("#endpoints .endpoint .badge", "active")
        .await;

    // nothing of cust_7: not listed, and its id answers like an unknown one
    let text = b.js("return document.body.textContent").await;
    assert!(!text.as_str().unwrap().contains(&other_url), "{text}");
    let probe = b
        .js_async(&format!(
            "const t = sessionStorage.getItem('hookd.portal.token');
             const get = p => fetch(p, {{headers: {{authorization: 'Bearer ' + t}}}});
             Promise.all([get('/v1/endpoints/{other_id}'), get('/v1/endpoints/{other_id}/deliveries'),
                          get('/v1/endpoints').then(r => r.json())])
               .then(([one, deliveries, list]) =>
                 done([one.status, deliveries.status, list.items.map(e => e.consumer)]));"
        ))
        .await;
    assert_eq!(probe, serde_json::json!([404, 404, ["cust_42"]]));
    b.assert_no_dialog().await;

    b.click("#endpoints .endpoint button.delete").await;
    b.click("#endpoints .endpoint button.danger:not(.delete)")
        .await;
    b.wait_for_text("#endpoints", "No endpoints yet").await;
}

/// The portal can be framed by the origins HOOKD_PORTAL_FRAME_ANCESTORS names and by no
/// other; the console by none.
#[sqlx::test]
async fn portal_is_framable_only_by_the_allowed_origins(pool: PgPool) {
    let Some(b) = Browser::start().await else {
        return;
    };
    // two embedding sites, different origins (ports) on loopback; only the first is allowed
    let embedder = || {
        axum::Router::new().route(
            "/",
            axum::routing::get(
                |axum::extract::Query(q): axum::extract::Query<
                    std::collections::HashMap<String, String>,
                >| async move {
                    axum::response::Html(format!(
                        r#"<!doctype html><title>shop</title><iframe src="{}" onload="this.dataset.done = 1"></iframe>"#,
                        q["src"]
                    ))
                },
            ),
        )
    };
    let (allowed, _stop_a) = common::serve_local(embedder()).await;
    let (other, _stop_o) = common::serve_local(embedder()).await;
    let hookd = Hookd::start(
        &pool,
        &[("HOOKD_PORTAL_FRAME_ANCESTORS", &format!("http://{allowed}"))],
    )
    .await;

    // what the frame shows: the page's own marker, or nothing (the browser's error page)
    let framed = |site: std::net::SocketAddr, path: &'static str| {
        let b = &b;
        let src = format!("{}{path}", hookd.base);
        async move {
            b.goto(&format!("http://{site}/?src={src}")).await;
            b.wait_for("iframe").await;
            // the frame has loaded (or been refused) once its load event fired
            let _ = b
                .js_async(
                    "const f = document.querySelector('iframe');
                     if (f.dataset.done) { done(1); } else { f.addEventListener('load', () => done(1)); setTimeout(() => done(0), 5000); }",
                )
                .await;
            b.client.enter_frame(0).await.unwrap();
            let marker = b
                .js("return document.querySelector('#main') !== null && location.origin")
                .await;
            b.client.enter_parent_frame().await.unwrap();
            marker
        }
    };
    assert_eq!(
        framed(allowed, "/portal").await,
        serde_json::Value::String(hookd.base.clone()),
        "the allowed origin cannot frame the portal"
    );
    assert_eq!(
        framed(other, "/portal").await,
        false,
        "another origin frames the portal"
    );
    assert_eq!(
        framed(allowed, "/ui").await,
        false,
        "the console can be framed"
    );
}

/// `POST /v1/consumers/{uid}/portal` as an operator's server calls it: (absolute link,
/// the consumer token the link's code stands for).
async fn portal_link(hookd: &Hookd, admin: &str, uid: &str) -> (String, String) {
    let (status, portal) = hookd
        .call(
            admin,
            Method::POST,
            &format!("/v1/consumers/{uid}/portal"),
            Some(serde_json::json!({})),
        )
        .await;
    assert_eq!(status, 201, "{portal}");
    let link = portal["url"].as_str().unwrap();
    let link = if link.starts_with('/') {
        format!("{}{link}", hookd.base)
    } else {
        link.to_string()
    };
    (link, portal["token"].as_str().unwrap().to_string())
}

/// Every file under `dir` (recursively) whose bytes contain `needle`, as ASCII/UTF-8 or as
/// UTF-16LE (how Chromium keeps some strings, sessionStorage values among them).
fn files_containing(dir: &std::path::Path, needle: &str) -> Vec<String> {
    let ascii = needle.as_bytes().to_vec();
    let utf16: Vec<u8> = needle.encode_utf16().flat_map(u16::to_le_bytes).collect();
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            let Ok(meta) = std::fs::symlink_metadata(&p) else {
                continue;
            };
            if meta.is_dir() {
                stack.push(p);
            } else if meta.is_file()
                && let Ok(bytes) = std::fs::read(&p)
                && [&ascii, &utf16]
                    .iter()
                    .any(|n| bytes.windows(n.len()).any(|w| w == n.as_slice()))
            {
                found.push(p.display().to_string());
            }
        }
    }
    found
}

/// Issue 29 item 5: neither the portal link nor the console's sign-in puts a token in
/// the browser. A fresh profile opens a portal link and uses the portal, signs in to the
/// console with the operator's token and moves between its pages; after Chromium quits
/// (its History and session files written), no file of the profile holds either token.
#[sqlx::test]
async fn no_token_is_left_in_the_browser_profile(pool: PgPool) {
    let Some(b) = Browser::start().await else {
        return;
    };
    let rx = RecordingReceiver::start(200).await;
    let hookd = Hookd::start(&pool, &[]).await;
    let admin = mint_token(&pool, "team-a", &[Scope::Read, Scope::Manage]).await;
    let operator = mint_token(&pool, "team-a", &[Scope::Read, Scope::Operate]).await;
    let producer = mint_token(&pool, "team-a", &[Scope::Produce]).await;
    let (link, consumer_token) = portal_link(&hookd, &admin, "cust_9").await;

    // the portal, from its link: add an endpoint, then reload (the tab's session survives)
    b.goto(&link).await;
    b.wait_for_text("#whoami", "cust_9").await;
    b.type_into("#new-url", &rx.url("/cust_9")).await;
    b.click("#add-endpoint button[type=submit]").await;
    b.wait_for_text("#secret-value", "whsec_").await;
    b.client.refresh().await.unwrap();
    b.wait_for_text("#endpoints .endpoint .url", &rx.url("/cust_9"))
        .await;

    // the console, signed in through its form, then a few full page loads
    hookd.send(&producer, "order.paid", r#"{"n":1}"#).await;
    b.goto(&format!("{}/ui", hookd.base)).await;
    b.type_into("input#token", &operator).await;
    b.click("main form button[type=submit]").await;
    b.wait_for_text("#whoami", "team-a").await;
    b.wait_for("a.event-link").await;
    let event_page = b
        .js("return document.querySelector('a.event-link').href")
        .await;
    b.goto(&format!("{}/ui/dead-letters", hookd.base)).await;
    b.wait_for_text("#whoami", "team-a").await;
    b.goto(event_page.as_str().unwrap()).await;
    b.wait_for_text("#event-type", "order.paid").await;
    let url = b.client.current_url().await.unwrap();
    assert!(!url.as_str().contains(&operator), "{url}");

    let profile = b.profile().to_path_buf();
    b.quit().await;
    // the check means something only if the browser wrote its history: the pages are in it
    assert!(
        !files_containing(&profile, "/ui/messages/").is_empty(),
        "Chromium wrote no history to {}; the check below would prove nothing",
        profile.display()
    );
    assert!(!files_containing(&profile, "/portal").is_empty());
    for (what, token) in [
        ("the consumer token", &consumer_token),
        ("the operator's token", &operator),
    ] {
        let found = files_containing(&profile, token);
        assert!(found.is_empty(), "{what} is in the profile: {found:#?}");
    }
}

/// Issue 31 item 5: a fresh link opened in the same tab (only the fragment changes, so the
/// page is not reloaded) signs in with the new credential; a used code gets a page that
/// says so. The console does the same with an older `#token=` link.
#[sqlx::test]
async fn a_fresh_link_in_the_same_tab_signs_in_again(pool: PgPool) {
    let Some(b) = Browser::start().await else {
        return;
    };
    let hookd = Hookd::start(&pool, &[]).await;
    let admin = mint_token(&pool, "team-a", &[Scope::Read, Scope::Manage]).await;
    let (first, _) = portal_link(&hookd, &admin, "cust_a").await;
    let (second, _) = portal_link(&hookd, &admin, "cust_b").await;

    b.goto(&first).await;
    b.wait_for_text("#whoami", "cust_a").await;
    b.js("window.__samePage = 1; return null").await;
    b.goto(&second).await;
    b.wait_for_text("#whoami", "cust_b").await;
    assert_eq!(
        b.js("return window.__samePage === 1").await,
        true,
        "the page was reloaded: this is not the hashchange path"
    );
    assert_eq!(b.client.current_url().await.unwrap().fragment(), None);

    // the first link again: its code was used
    b.goto(&first).await;
    let dead = b.wait_for_text("#link-dead", "used already").await;
    assert!(dead.contains("expired"), "{dead}");
    assert_eq!(b.js("return window.__samePage === 1").await, true);
    assert_eq!(
        b.js("return sessionStorage.getItem('hookd.portal.token')")
            .await,
        serde_json::Value::Null,
        "a dead link signs the tab out"
    );

    // the console: one tenant's token, then another's, in the same tab
    let team_a = mint_token(&pool, "team-a", &[Scope::Read]).await;
    let team_b = mint_token(&pool, "team-b", &[Scope::Read]).await;
    b.goto(&format!("{}/ui#token={team_a}", hookd.base)).await;
    b.wait_for_text("#whoami", "tenant team-a").await;
    b.js("window.__samePage = 2; return null").await;
    b.goto(&format!("{}/ui#token={team_b}", hookd.base)).await;
    b.wait_for_text("#whoami", "tenant team-b").await;
    assert_eq!(b.js("return window.__samePage === 2").await, true);
    assert_eq!(b.client.current_url().await.unwrap().fragment(), None);
}

/// An operator opens an inbound source's page: its requests by outcome (accepted,
/// duplicate, refused with the reason), the events it took with their deliveries, and
/// from one of them the delivery that failed, replayed.
#[sqlx::test]
async fn operator_sees_a_sources_requests_and_replays_what_it_took(pool: PgPool) {
    const SECRET: &str = "whsec_console_4f8a1c2e9b7d3a6f";
    let Some(b) = Browser::start().await else {
        return;
    };
    let rx = RecordingReceiver::start(500).await;
    endpoint(
        &pool,
        EndpointOpts {
            url: rx.url("/payments"),
            event_types: vec!["stripe.*".into()],
            max_attempts: Some(1),
            ..Default::default()
        },
    )
    .await;
    let hookd = Hookd::start(&pool, &[]).await;
    let admin = mint_token(
        &pool,
        "team-a",
        &[Scope::Read, Scope::Operate, Scope::Manage],
    )
    .await;
    let (status, v) = hookd
        .call(
            &admin,
            Method::POST,
            "/v1/sources",
            Some(serde_json::json!({"name": "stripe", "provider": "stripe", "secret": SECRET})),
        )
        .await;
    assert_eq!(status, 201, "{v}");
    let http = reqwest::Client::new();
    let post = |body: &str, signature: String| {
        http.post(format!("{}/in/stripe", hookd.base))
            .header("content-type", "application/json")
            .header("stripe-signature", signature)
            .body(body.to_string())
            .send()
    };
    let now = chrono::Utc::now().timestamp();
    let paid = r#"{"id":"evt_console_1","type":"invoice.paid","data":{"object":{"id":"in_1"}}}"#;
    let r = post(paid, common::stripe_signature(SECRET, now, paid))
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    let taken: serde_json::Value = r.json().await.unwrap();
    let delivery: uuid::Uuid = taken["deliveryIds"][0].as_str().unwrap().parse().unwrap();
    // the provider's retry, a forged request and a replayed old one
    let r = post(paid, common::stripe_signature(SECRET, now, paid))
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    let r = post(
        paid,
        common::stripe_signature("whsec_not_the_secret", now, paid),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 401);
    let r = post(paid, common::stripe_signature(SECRET, now - 3600, paid))
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    // counts are written every few seconds; the delivery dies (one attempt, a 500)
    assert!(
        wait_until(Duration::from_secs(20), || async {
            let (_, s) = hookd
                .call(&admin, Method::GET, "/v1/sources/stripe/stats", None)
                .await;
            s["outcomes"].as_array().is_some_and(|o| o.len() == 4)
                && delivery_status(&pool, delivery).await.0 == "dead"
        })
        .await,
        "hookd log:\n{}",
        hookd.log()
    );

    b.goto(&format!("{}/ui/sources#token={admin}", hookd.base))
        .await;
    b.wait_for("a.source-link").await;
    b.click("#nav a[href='/ui/sources']").await;
    b.click("a.source-link").await;
    b.wait_for_text("#source-name", "stripe").await;
    let outcomes = b
        .js("return [...document.querySelectorAll('tr[data-outcome]')].map(r => [r.dataset.outcome, r.querySelector('td.num').textContent, r.classList.contains('refused')])")
        .await;
    let mut outcomes: Vec<(String, String, bool)> = serde_json::from_value(outcomes).unwrap();
    outcomes.sort();
    assert_eq!(
        outcomes,
        [
            ("accepted".into(), "1".into(), false),
            ("bad_signature".into(), "1".into(), true),
            ("duplicate".into(), "1".into(), false),
            ("stale_timestamp".into(), "1".into(), true),
        ]
    );
    let requests = b.text("#requests-title ~ .scroll table").await.unwrap();
    assert!(
        requests.contains("refused: signature does not match"),
        "{requests}"
    );
    let events = b
        .wait_for_text("#events-title ~ .scroll table", "evt_console_1")
        .await;
    assert!(events.contains("stripe.invoice.paid"), "{events}");
    b.screenshot("console-source").await;

    // the accepted request's event: where it came from, and its delivery, replayed
    b.click("#events-title ~ .scroll a.event-link").await;
    b.wait_for_text("#event-type", "stripe.invoice.paid").await;
    let facts = b.text("dl.facts").await.unwrap();
    assert!(
        facts.contains("stripe") && facts.contains("evt_console_1"),
        "{facts}"
    );
    assert_eq!(b.text("#payload-raw").await.unwrap(), paid, "byte for byte");
    rx.set_status(200);
    let card = format!("#delivery-{delivery}");
    b.wait_for(&format!("{card} button.replay")).await;
    b.click(&format!("{card} button.replay")).await;
    let line = b
        .wait_for_text(&format!("{card} [role=status]"), "New attempt #2")
        .await;
    assert!(line.contains("HTTP 200"), "{line}");
    let seen = rx.seen();
    let last = seen.last().unwrap();
    assert_eq!(last.body, paid.as_bytes(), "forwarded byte for byte");
    assert_eq!(last.headers["hookd-source"], "stripe");
    assert_eq!(last.headers["hookd-source-event-id"], "evt_console_1");
    b.assert_no_dialog().await;
}
