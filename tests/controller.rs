//! The controllers against a scripted Kubernetes API (kube's `tower_test` mock-service
//! pattern, as kube-rs/controller-rs tests it) and a real Postgres: the exact sequence of
//! API calls each reconcile makes — finalizer, Secret read, status patch, Events,
//! Deployment apply, cleanup — and what it leaves in the database.
//!
//! The API server is the one part that cannot run here, so it is scripted; every request
//! the reconcilers make is also checked against `hookd::k8s::REQUIRED_ACCESS`, the list
//! the RBAC manifests are built from.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use hookd::k8s::crd::{WebhookDispatcher, WebhookEndpoint, WebhookSource};
use hookd::k8s::{
    Context, REQUIRED_ACCESS, Settings, dispatcher_controller, endpoint_controller,
    source_controller,
};
use http::{Request, Response};
use kube::client::Body;
use kube::runtime::controller::Action;
use serde_json::{Value, json};
use sqlx::PgPool;
use uuid::Uuid;

/// Signing secrets of the fixtures: generated, not the published test vectors (which the
/// controller warns about with an Event, see `published_test_secret_is_warned_about`).
const SECRET_A: &str = "whsec_lqXZgHVWuKr3RFBqm5Ls8VXsx0znleJz";
const SECRET_B: &str = "whsec_ZtlEx88nJEUInbSXVR2losYZJkSiqIxq";

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

/// One request the controller made.
#[derive(Debug, Clone)]
struct Call {
    method: String,
    path: String,
    query: String,
    body: Value,
}

/// The scripted API server: each `expect` answers the next request, after checking it is
/// the one the script expects.
struct ApiServer {
    handle: Handle,
    calls: Vec<Call>,
}

impl ApiServer {
    async fn expect(
        &mut self,
        method: &str,
        path: &str,
        reply: impl FnOnce(&Call) -> (u16, Value),
    ) -> Call {
        let (req, send) = tokio::time::timeout(Duration::from_secs(10), self.handle.next_request())
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {method} {path}"))
            .expect("the client is alive");
        let method_got = req.method().to_string();
        let path_got = req.uri().path().to_string();
        let query = req.uri().query().unwrap_or_default().to_string();
        let bytes = req.into_body().collect_bytes().await.unwrap();
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap_or(Value::Null)
        };
        let call = Call {
            method: method_got,
            path: path_got,
            query,
            body,
        };
        assert_eq!(
            (call.method.as_str(), call.path.as_str()),
            (method, path),
            "unexpected call: {call:#?}"
        );
        let (code, body) = reply(&call);
        send.send_response(
            Response::builder()
                .status(code)
                .header("content-type", "application/json")
                .body(Body::from(serde_json::to_vec(&body).unwrap()))
                .unwrap(),
        );
        self.calls.push(call.clone());
        call
    }

    /// No request beyond the script.
    async fn expect_no_more(&mut self) {
        if let Ok(Some((req, _))) =
            tokio::time::timeout(Duration::from_millis(200), self.handle.next_request()).await
        {
            panic!("unexpected extra call: {} {}", req.method(), req.uri());
        }
        assert_rbac_covers(&self.calls);
    }
}

fn context(pool: &PgPool) -> (Arc<Context>, ApiServer) {
    common::init();
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    let ctx = Context::new(
        client,
        pool.clone(),
        common::keyring(common::TEST_ENCRYPTION_KEY, ""),
        hookd::metrics::Metrics::new(),
        Settings {
            status_interval: Duration::from_secs(10),
            image: "hookd:test".into(),
            concurrency: 4,
            namespace_tenants: "mapped-ns=shared-tenant".parse().unwrap(),
            resync: Duration::from_secs(600),
            dispatcher_images: vec!["registry.example/hookd:1.2".into()],
            dispatcher_service_accounts: vec![],
        },
        Some("test-replica".into()),
    );
    (
        Arc::new(ctx),
        ApiServer {
            handle,
            calls: Vec::new(),
        },
    )
}

/// Maps a request to (group, resource, verb) and checks REQUIRED_ACCESS grants it.
fn assert_rbac_covers(calls: &[Call]) {
    for c in calls {
        let parts: Vec<&str> = c.path.trim_start_matches('/').split('/').collect();
        // /api/v1/namespaces/NS/RES/NAME[/SUB] or /apis/G/V/namespaces/NS/RES/NAME[/SUB]
        let (group, rest) = match parts[0] {
            "api" => ("", &parts[2..]),
            _ => (parts[1], &parts[3..]),
        };
        assert_eq!(rest[0], "namespaces", "{c:?}");
        let resource = match rest.get(4) {
            Some(sub) => format!("{}/{}", rest[2], sub),
            None => rest[2].to_string(),
        };
        let verb = match (c.method.as_str(), rest.len()) {
            ("GET", 3) => "list",
            ("GET", _) => "get",
            ("POST", _) => "create",
            ("PATCH", _) => "patch",
            ("PUT", _) => "update",
            ("DELETE", _) => "delete",
            (m, _) => panic!("unexpected method {m}"),
        };
        assert!(
            REQUIRED_ACCESS
                .iter()
                .any(|a| a.group == group && a.resource == resource && a.verbs.contains(&verb)),
            "{} {} needs {verb} on {group}/{resource}, which REQUIRED_ACCESS (and so the RBAC manifests) does not grant",
            c.method,
            c.path
        );
    }
}

// ---- fixtures ----

const NS: &str = "team-a";

fn endpoint_object(name: &str, finalizer: bool, extra_spec: Value) -> WebhookEndpoint {
    let mut spec = json!({
        "url": "https://receiver.example.com/hook",
        "eventTypes": ["invoice.*"],
        "secretRef": {"name": format!("{name}-secret"), "key": "secret"},
    });
    for (k, v) in extra_spec.as_object().unwrap() {
        spec[k] = v.clone();
    }
    let mut metadata = json!({
        "name": name, "namespace": NS, "uid": Uuid::now_v7().to_string(),
        "generation": 1, "resourceVersion": "1",
    });
    if finalizer {
        metadata["finalizers"] = json!([endpoint_controller::FINALIZER]);
    }
    serde_json::from_value(json!({
        "apiVersion": "hookd.dev/v1alpha1", "kind": "WebhookEndpoint",
        "metadata": metadata, "spec": spec,
    }))
    .unwrap()
}

fn secret_object(name: &str, value: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "namespace": NS, "resourceVersion": "7"},
        "type": "Opaque",
        "data": {"secret": base64::engine::general_purpose::STANDARD.encode(value)},
    })
}

fn status_error(code: u16, reason: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
           "message": format!("{reason} (scripted)"), "reason": reason, "code": code})
}

fn ep_path(name: &str) -> String {
    format!("/apis/hookd.dev/v1alpha1/namespaces/{NS}/webhookendpoints/{name}")
}

fn secret_path(name: &str) -> String {
    format!("/api/v1/namespaces/{NS}/secrets/{name}-secret")
}

const EVENTS_PATH: &str = "/apis/events.k8s.io/v1/namespaces/team-a/events";

/// Answers a status patch with the object carrying that status.
fn with_status(ep: &WebhookEndpoint) -> impl FnOnce(&Call) -> (u16, Value) + '_ {
    move |c: &Call| {
        let mut obj = serde_json::to_value(ep).unwrap();
        obj["status"] = c.body["status"].clone();
        (200, obj)
    }
}

fn echo(code: u16) -> impl FnOnce(&Call) -> (u16, Value) {
    move |c: &Call| (code, c.body.clone())
}

fn condition<'a>(status: &'a Value, type_: &str) -> &'a Value {
    status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == type_)
        .unwrap_or_else(|| panic!("no {type_} condition in {status}"))
}

/// Drives one reconcile of `ep` (finalizer already on) whose Secret `<name>-secret` holds
/// `secret`, answering the calls a sync with one transition makes: the Secret GET, the
/// status patch and one Event. Returns the status the controller wrote.
async fn sync_once(
    ctx: &Arc<Context>,
    api: &mut ApiServer,
    ep: &WebhookEndpoint,
    secret: &'static str,
) -> Value {
    let name = ep.metadata.name.clone().unwrap();
    let run = tokio::spawn(endpoint_controller::reconcile(
        Arc::new(ep.clone()),
        ctx.clone(),
    ));
    let secret_name = format!("{name}-secret");
    api.expect("GET", &secret_path(&name), move |_| {
        (200, secret_object(&secret_name, secret))
    })
    .await;
    let patch = api
        .expect(
            "PATCH",
            &format!("{}/status", ep_path(&name)),
            with_status(ep),
        )
        .await;
    api.expect("POST", EVENTS_PATH, echo(201)).await;
    run.await.unwrap().unwrap();
    patch.body["status"].clone()
}

async fn endpoint_row(pool: &PgPool, name: &str) -> Option<(Uuid, String, Option<String>)> {
    sqlx::query_as("SELECT id, state, state_reason FROM hookd.endpoints WHERE k8s_namespace = $1 AND k8s_name = $2")
        .bind(NS)
        .bind(name)
        .fetch_optional(pool)
        .await
        .unwrap()
}

async fn live_secrets(pool: &PgPool, id: Uuid) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM hookd.endpoint_secrets WHERE endpoint_id = $1 AND (not_after IS NULL OR not_after > now())")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn enqueue(pool: &PgPool, tenant: &str) -> Uuid {
    sqlx::query_scalar("SELECT hookd.enqueue($1, 'invoice.paid', '{\"n\":1}')")
        .bind(tenant)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn delivery_statuses(pool: &PgPool, endpoint: Uuid) -> Vec<String> {
    sqlx::query_scalar("SELECT status FROM hookd.deliveries WHERE endpoint_id = $1 ORDER BY id")
        .bind(endpoint)
        .fetch_all(pool)
        .await
        .unwrap()
}

// ---- WebhookEndpoint ----

/// First pass over a new object: only the finalizer is added (a JSON patch that tests the
/// finalizer list first), nothing is written to Postgres yet.
#[sqlx::test]
async fn new_endpoint_gets_the_finalizer_first(pool: PgPool) {
    let (ctx, mut api) = context(&pool);
    let ep = endpoint_object("ep1", false, json!({}));
    let run = tokio::spawn(endpoint_controller::reconcile(Arc::new(ep.clone()), ctx));
    let call = api
        .expect("PATCH", &ep_path("ep1"), |c| {
            let mut obj = serde_json::to_value(&ep).unwrap();
            obj["metadata"]["finalizers"] = json!(["hookd.dev/endpoint"]);
            let _ = c;
            (200, obj)
        })
        .await;
    assert_eq!(
        call.body,
        json!([
            {"op": "test", "path": "/metadata/finalizers", "value": null},
            {"op": "add", "path": "/metadata/finalizers", "value": ["hookd.dev/endpoint"]}
        ])
    );
    assert_eq!(run.await.unwrap().unwrap(), Action::await_change());
    api.expect_no_more().await;
    assert!(endpoint_row(&pool, "ep1").await.is_none());
}

/// With the finalizer in place: GET the Secret, write the row, server-side-apply the
/// status, publish `Created`. A second pass over the object as the API server now holds it
/// writes nothing: no status patch, no Event (the loop a real API server would expose).
/// An endpoint signing with a published Standard Webhooks test-vector secret is synced,
/// with a Warning Event that names no secret.
#[sqlx::test]
async fn published_test_secret_is_warned_about(pool: PgPool) {
    let (ctx, mut api) = context(&pool);
    let ep = endpoint_object("pub", true, json!({}));
    let run = tokio::spawn(endpoint_controller::reconcile(
        Arc::new(ep.clone()),
        ctx.clone(),
    ));
    api.expect("GET", &secret_path("pub"), |_| {
        (200, secret_object("pub-secret", common::SECRET_A))
    })
    .await;
    api.expect(
        "PATCH",
        &format!("{}/status", ep_path("pub")),
        with_status(&ep),
    )
    .await;
    let created = api.expect("POST", EVENTS_PATH, echo(201)).await;
    assert_eq!(created.body["reason"], "Created");
    let warning = api.expect("POST", EVENTS_PATH, echo(201)).await;
    assert_eq!(warning.body["reason"], "PublishedSigningSecret");
    assert_eq!(warning.body["type"], "Warning");
    assert!(!warning.body.to_string().contains(common::SECRET_A));
    run.await.unwrap().unwrap();
    api.expect_no_more().await;
    assert!(
        endpoint_row(&pool, "pub").await.is_some(),
        "synced all the same"
    );
}

#[sqlx::test]
async fn endpoint_is_synced_and_status_applied_once(pool: PgPool) {
    let (ctx, mut api) = context(&pool);
    let ep = endpoint_object("ep1", true, json!({}));
    let run = tokio::spawn(endpoint_controller::reconcile(
        Arc::new(ep.clone()),
        ctx.clone(),
    ));
    api.expect("GET", &secret_path("ep1"), |_| {
        (200, secret_object("ep1-secret", SECRET_A))
    })
    .await;
    let patch = api
        .expect(
            "PATCH",
            &format!("{}/status", ep_path("ep1")),
            with_status(&ep),
        )
        .await;
    assert!(
        patch.query.contains("fieldManager=hookd-controller"),
        "{}",
        patch.query
    );
    assert!(patch.query.contains("force=true"), "{}", patch.query);
    assert_eq!(patch.body["apiVersion"], "hookd.dev/v1alpha1");
    assert_eq!(patch.body["kind"], "WebhookEndpoint");
    let status = &patch.body["status"];
    let (id, state, _) = endpoint_row(&pool, "ep1").await.expect("row written");
    assert_eq!(state, "active");
    assert_eq!(status["endpointId"], id.to_string());
    assert_eq!(status["observedGeneration"], 1);
    assert_eq!(status["activeSecrets"], 1);
    assert_eq!(status["circuit"], "closed");
    assert_eq!(status["backlog"], 0);
    let ready = condition(status, "Ready");
    assert_eq!(
        (ready["status"].as_str(), ready["reason"].as_str()),
        (Some("True"), Some("Active"))
    );
    for c in status["conditions"].as_array().unwrap() {
        for field in ["type", "status", "reason", "message", "lastTransitionTime"] {
            assert!(c[field].is_string(), "condition lacks {field}: {c}");
        }
    }
    assert!(
        !status.to_string().contains("null"),
        "Option fields are skipped: {status}"
    );
    let event = api.expect("POST", EVENTS_PATH, echo(201)).await;
    assert_eq!(event.body["reason"], "Created");
    assert_eq!(event.body["regarding"]["name"], "ep1");
    assert_eq!(event.body["reportingController"], "hookd-controller");
    assert_eq!(
        run.await.unwrap().unwrap(),
        Action::requeue(Duration::from_secs(10))
    );
    api.expect_no_more().await;
    assert_eq!(live_secrets(&pool, id).await, 1);

    // the object as the API server returns it now
    let mut stored = ep.clone();
    stored.status = Some(serde_json::from_value(status.clone()).unwrap());
    let run = tokio::spawn(endpoint_controller::reconcile(Arc::new(stored), ctx));
    api.expect("GET", &secret_path("ep1"), |_| {
        (200, secret_object("ep1-secret", SECRET_A))
    })
    .await;
    run.await.unwrap().unwrap();
    api.expect_no_more().await;
}

/// A changed Secret becomes the current secret and the old one keeps signing for the
/// grace period: both live in Postgres, status says 2, and a `SecretRotated` Event.
#[sqlx::test]
async fn rotated_secret_keeps_the_old_one_for_the_grace_period(pool: PgPool) {
    let (ctx, mut api) = context(&pool);
    let ep = endpoint_object("rot", true, json!({"secretRotationGraceSeconds": 3600}));
    let first = sync_once(&ctx, &mut api, &ep, SECRET_A).await;

    let mut stored = ep.clone();
    stored.status = Some(serde_json::from_value(first.clone()).unwrap());
    let run = tokio::spawn(endpoint_controller::reconcile(Arc::new(stored), ctx));
    api.expect("GET", &secret_path("rot"), |_| {
        (200, secret_object("rot-secret", SECRET_B))
    })
    .await;
    let patch = api
        .expect(
            "PATCH",
            &format!("{}/status", ep_path("rot")),
            with_status(&ep),
        )
        .await;
    assert_eq!(patch.body["status"]["activeSecrets"], 2);
    let event = api.expect("POST", EVENTS_PATH, echo(201)).await;
    assert_eq!(event.body["reason"], "SecretRotated");
    assert_eq!(event.body["type"], "Normal");
    run.await.unwrap().unwrap();
    api.expect_no_more().await;

    let (id, _, _) = endpoint_row(&pool, "rot").await.unwrap();
    let stored: Vec<Option<Vec<u8>>> =
        sqlx::query_scalar("SELECT ciphertext FROM hookd.endpoint_secrets WHERE endpoint_id = $1")
            .bind(id)
            .fetch_all(&pool)
            .await
            .unwrap();
    assert!(
        stored.iter().all(|c| c
            .as_ref()
            .is_some_and(|c| !c.windows(SECRET_B.len()).any(|w| w == SECRET_B.as_bytes()))),
        "the controller stores secrets encrypted"
    );
    let grace: Vec<Option<f64>> = sqlx::query_scalar(
        "SELECT extract(epoch FROM not_after - now())::float8 FROM hookd.endpoint_secrets WHERE endpoint_id = $1 ORDER BY id",
    )
    .bind(id)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(grace.len(), 2);
    let old = grace[0].expect("the old secret has a deadline");
    assert!(
        (3500.0..=3600.0).contains(&old),
        "old secret valid ~1h more, got {old}"
    );
    assert_eq!(grace[1], None, "the new secret is current");
}

/// A missing Secret: Ready=False/SecretNotFound with a Warning Event, and the row is
/// paused, so deliveries are created and held (never sent, never dropped). When the
/// Secret appears, the same deliveries become claimable.
#[sqlx::test]
async fn missing_secret_holds_deliveries_until_it_appears(pool: PgPool) {
    let (ctx, mut api) = context(&pool);
    let ep = endpoint_object("nosecret", true, json!({}));
    let run = tokio::spawn(endpoint_controller::reconcile(
        Arc::new(ep.clone()),
        ctx.clone(),
    ));
    api.expect("GET", &secret_path("nosecret"), |_| {
        (404, status_error(404, "NotFound"))
    })
    .await;
    let patch = api
        .expect(
            "PATCH",
            &format!("{}/status", ep_path("nosecret")),
            with_status(&ep),
        )
        .await;
    let status = &patch.body["status"];
    let ready = condition(status, "Ready");
    assert_eq!(
        (ready["status"].as_str(), ready["reason"].as_str()),
        (Some("False"), Some("SecretNotFound"))
    );
    assert!(
        ready["message"]
            .as_str()
            .unwrap()
            .contains("team-a/nosecret-secret")
    );
    assert_eq!(condition(status, "SecretResolved")["status"], "False");
    let created = api.expect("POST", EVENTS_PATH, echo(201)).await;
    assert_eq!(created.body["reason"], "Created");
    let warning = api.expect("POST", EVENTS_PATH, echo(201)).await;
    assert_eq!(
        (
            warning.body["reason"].as_str(),
            warning.body["type"].as_str()
        ),
        (Some("SecretNotFound"), Some("Warning"))
    );
    run.await.unwrap().unwrap();
    api.expect_no_more().await;

    let (id, state, reason) = endpoint_row(&pool, "nosecret").await.unwrap();
    assert_eq!(state, "paused");
    assert!(reason.unwrap().contains("not found"));
    enqueue(&pool, NS).await;
    assert_eq!(
        delivery_statuses(&pool, id).await,
        vec!["pending"],
        "created and held"
    );
    let claim = hookd::db::deliveries::ClaimRequest {
        worker_id: Uuid::now_v7(),
        limit: 10,
        lease_secs: 30.0,
        per_endpoint_cap: 10,
        busy: vec![],
        now: None,
        default_max_attempts: 8,
    };
    assert!(
        hookd::db::deliveries::claim(&pool, &claim)
            .await
            .unwrap()
            .is_empty(),
        "held, not sent"
    );

    // the Secret is created: the endpoint becomes active and the delivery claimable
    let mut stored = ep.clone();
    stored.status = Some(serde_json::from_value(status.clone()).unwrap());
    let run = tokio::spawn(endpoint_controller::reconcile(Arc::new(stored), ctx));
    api.expect("GET", &secret_path("nosecret"), |_| {
        (200, secret_object("nosecret-secret", SECRET_A))
    })
    .await;
    let patch = api
        .expect(
            "PATCH",
            &format!("{}/status", ep_path("nosecret")),
            with_status(&ep),
        )
        .await;
    assert_eq!(condition(&patch.body["status"], "Ready")["status"], "True");
    assert_eq!(
        api.expect("POST", EVENTS_PATH, echo(201)).await.body["reason"],
        "SecretResolved"
    );
    run.await.unwrap().unwrap();
    api.expect_no_more().await;
    assert_eq!(endpoint_row(&pool, "nosecret").await.unwrap().1, "active");
    assert_eq!(
        hookd::db::deliveries::claim(&pool, &claim)
            .await
            .unwrap()
            .len(),
        1
    );
}

/// A Secret the controller may not read (403) and a malformed one are problems of the
/// object, reported in its status, not controller errors.
#[sqlx::test]
async fn unreadable_and_malformed_secrets_are_reported(pool: PgPool) {
    let (ctx, mut api) = context(&pool);
    for (name, reply, reason) in [
        (
            "forbidden",
            (403, status_error(403, "Forbidden")),
            "SecretUnreadable",
        ),
        (
            "malformed",
            (200, secret_object("malformed-secret", "not-a-whsec")),
            "SecretMalformed",
        ),
    ] {
        let ep = endpoint_object(name, true, json!({}));
        let run = tokio::spawn(endpoint_controller::reconcile(
            Arc::new(ep.clone()),
            ctx.clone(),
        ));
        api.expect("GET", &secret_path(name), move |_| reply).await;
        let patch = api
            .expect(
                "PATCH",
                &format!("{}/status", ep_path(name)),
                with_status(&ep),
            )
            .await;
        assert_eq!(condition(&patch.body["status"], "Ready")["reason"], reason);
        api.expect("POST", EVENTS_PATH, echo(201)).await; // Created
        assert_eq!(
            api.expect("POST", EVENTS_PATH, echo(201)).await.body["reason"],
            reason
        );
        run.await.unwrap().unwrap();
        assert_eq!(endpoint_row(&pool, name).await.unwrap().1, "paused");
    }
    api.expect_no_more().await;
}

/// `paused: true` holds deliveries; unpausing releases them.
#[sqlx::test]
async fn paused_endpoint_holds_deliveries(pool: PgPool) {
    let (ctx, mut api) = context(&pool);
    let ep = endpoint_object("p", true, json!({"paused": true}));
    let run = tokio::spawn(endpoint_controller::reconcile(
        Arc::new(ep.clone()),
        ctx.clone(),
    ));
    api.expect("GET", &secret_path("p"), |_| {
        (200, secret_object("p-secret", SECRET_A))
    })
    .await;
    let patch = api
        .expect(
            "PATCH",
            &format!("{}/status", ep_path("p")),
            with_status(&ep),
        )
        .await;
    assert_eq!(
        condition(&patch.body["status"], "Ready")["reason"],
        "Paused"
    );
    api.expect("POST", EVENTS_PATH, echo(201)).await;
    run.await.unwrap().unwrap();
    let (id, state, _) = endpoint_row(&pool, "p").await.unwrap();
    assert_eq!(state, "paused");
    enqueue(&pool, NS).await;
    assert_eq!(delivery_statuses(&pool, id).await, vec!["pending"]);

    let mut unpaused = endpoint_object("p", true, json!({}));
    unpaused.metadata.uid = ep.metadata.uid.clone();
    unpaused.metadata.generation = Some(2);
    let run = tokio::spawn(endpoint_controller::reconcile(
        Arc::new(unpaused.clone()),
        ctx,
    ));
    api.expect("GET", &secret_path("p"), |_| {
        (200, secret_object("p-secret", SECRET_A))
    })
    .await;
    let patch = api
        .expect(
            "PATCH",
            &format!("{}/status", ep_path("p")),
            with_status(&unpaused),
        )
        .await;
    assert_eq!(patch.body["status"]["observedGeneration"], 2);
    assert_eq!(condition(&patch.body["status"], "Ready")["status"], "True");
    assert_eq!(patch.body["status"]["backlog"], 1);
    run.await.unwrap().unwrap();
    api.expect_no_more().await;
    assert_eq!(endpoint_row(&pool, "p").await.unwrap().1, "active");
}

/// Deletion: the row is disabled, unfinished deliveries end `cancelled` (visible, not
/// dropped), finished ones keep their state, an Event is attempted — and when the
/// namespace is terminating and refuses it (403), the finalizer still comes off.
#[sqlx::test]
async fn deleting_cancels_pending_deliveries_and_removes_the_finalizer(pool: PgPool) {
    let (ctx, mut api) = context(&pool);
    let ep = endpoint_object("gone", true, json!({}));
    sync_once(&ctx, &mut api, &ep, SECRET_A).await;
    let (id, _, _) = endpoint_row(&pool, "gone").await.unwrap();
    for _ in 0..3 {
        enqueue(&pool, NS).await;
    }
    sqlx::query("UPDATE hookd.deliveries SET status = 'succeeded', completed_at = now() WHERE id = (SELECT id FROM hookd.deliveries WHERE endpoint_id = $1 ORDER BY id LIMIT 1)")
        .bind(id)
        .execute(&pool)
        .await
        .unwrap();

    let mut deleting = ep.clone();
    deleting.metadata.deletion_timestamp =
        Some(hookd::k8s::conditions::to_time(chrono::Utc::now()));
    deleting.metadata.generation = Some(2);
    let run = tokio::spawn(endpoint_controller::reconcile(Arc::new(deleting), ctx));
    let event = api
        .expect("POST", EVENTS_PATH, |_| {
            (403, status_error(403, "Forbidden"))
        })
        .await;
    assert_eq!(event.body["reason"], "Deleted");
    assert!(
        event.body["note"]
            .as_str()
            .unwrap()
            .contains("2 unfinished deliveries cancelled")
    );
    let unfinalize = api
        .expect("PATCH", &ep_path("gone"), |_| {
            let mut obj = serde_json::to_value(&ep).unwrap();
            obj["metadata"]["finalizers"] = json!([]);
            (200, obj)
        })
        .await;
    assert_eq!(
        unfinalize.body,
        json!([
            {"op": "test", "path": "/metadata/finalizers/0", "value": "hookd.dev/endpoint"},
            {"op": "remove", "path": "/metadata/finalizers/0"}
        ])
    );
    assert_eq!(run.await.unwrap().unwrap(), Action::await_change());
    api.expect_no_more().await;
    let (_, state, reason) = endpoint_row(&pool, "gone").await.unwrap();
    assert_eq!(state, "disabled");
    assert_eq!(reason.as_deref(), Some("WebhookEndpoint deleted"));
    let mut statuses = delivery_statuses(&pool, id).await;
    statuses.sort();
    assert_eq!(statuses, vec!["cancelled", "cancelled", "succeeded"]);
    // no new deliveries for a deleted endpoint
    enqueue(&pool, NS).await;
    assert_eq!(delivery_statuses(&pool, id).await.len(), 3);
}

/// An API server error while reading the Secret fails the reconcile before anything is
/// written; error_policy retries soon.
#[sqlx::test]
async fn api_server_error_writes_nothing_and_retries(pool: PgPool) {
    let (ctx, mut api) = context(&pool);
    let ep = Arc::new(endpoint_object("err", true, json!({})));
    let run = tokio::spawn(endpoint_controller::reconcile(ep.clone(), ctx.clone()));
    api.expect("GET", &secret_path("err"), |_| {
        (500, status_error(500, "InternalError"))
    })
    .await;
    let err = run.await.unwrap().expect_err("a 500 fails the reconcile");
    api.expect_no_more().await;
    assert!(endpoint_row(&pool, "err").await.is_none());
    // a transient error: exponential backoff from 1 s, with jitter, growing per failure
    assert!(!err.is_permanent());
    let delays: Vec<Duration> = (0..4)
        .map(
            |_| match endpoint_controller::error_policy(ep.clone(), &err, ctx.clone()) {
                a if a == Action::await_change() => panic!("must retry"),
                a => requeue_of(&a),
            },
        )
        .collect();
    assert!(
        delays[0] >= Duration::from_millis(500) && delays[0] <= Duration::from_secs(1),
        "{delays:?}"
    );
    assert!(
        delays[3] >= Duration::from_secs(4) && delays[3] <= Duration::from_secs(8),
        "{delays:?}"
    );
}

/// The delay of a requeue Action (kube's Action has no accessor; its Debug shows it).
fn requeue_of(a: &Action) -> Duration {
    let dbg = format!("{a:?}");
    let inner = dbg
        .split("requeue_after: Some(")
        .nth(1)
        .unwrap_or_else(|| panic!("not a requeue: {dbg}"));
    let inner = &inner[..inner.find(')').unwrap()];
    parse_debug_duration(inner)
}

fn parse_debug_duration(s: &str) -> Duration {
    let (num, unit) = s.split_at(s.find(|c: char| c.is_alphabetic() || c == 'µ').unwrap());
    let n: f64 = num.parse().unwrap();
    match unit {
        "s" => Duration::from_secs_f64(n),
        "ms" => Duration::from_secs_f64(n / 1e3),
        "µs" => Duration::from_secs_f64(n / 1e6),
        "ns" => Duration::from_secs_f64(n / 1e9),
        u => panic!("unit {u}"),
    }
}

/// The database is down: the object says `Ready=Unknown/DatabaseUnavailable` instead of
/// a stale `True`, and the reconcile fails so it is retried.
#[sqlx::test]
async fn database_outage_is_reported_on_the_object(pool: PgPool) {
    let (ctx, mut api) = context(&pool);
    let ep = endpoint_object("db", true, json!({}));
    let first = sync_once(&ctx, &mut api, &ep, SECRET_A).await;

    // the same controller against a database that refuses connections
    let dead = hookd::db::connect_lazy(&hookd::db::PoolSettings {
        url: format!(
            "postgres://postgres@127.0.0.1:{}/postgres",
            common::free_port()
        ),
        max_connections: 1,
        acquire_timeout: Duration::from_millis(500),
    })
    .unwrap();
    let down = Arc::new(Context::new(
        ctx.client.clone(),
        dead,
        common::keyring(common::TEST_ENCRYPTION_KEY, ""),
        hookd::metrics::Metrics::new(),
        Settings {
            status_interval: Duration::from_secs(10),
            image: "hookd:test".into(),
            concurrency: 4,
            namespace_tenants: "mapped-ns=shared-tenant".parse().unwrap(),
            resync: Duration::from_secs(600),
            dispatcher_images: vec!["registry.example/hookd:1.2".into()],
            dispatcher_service_accounts: vec![],
        },
        None,
    ));
    let mut stored = ep.clone();
    stored.status = Some(serde_json::from_value(first.clone()).unwrap());
    let run = tokio::spawn(endpoint_controller::reconcile(Arc::new(stored), down));
    api.expect("GET", &secret_path("db"), |_| {
        (200, secret_object("db-secret", SECRET_A))
    })
    .await;
    let patch = api
        .expect(
            "PATCH",
            &format!("{}/status", ep_path("db")),
            with_status(&ep),
        )
        .await;
    let ready = condition(&patch.body["status"], "Ready");
    assert_eq!(
        (ready["status"].as_str(), ready["reason"].as_str()),
        (Some("Unknown"), Some("DatabaseUnavailable"))
    );
    let err = run
        .await
        .unwrap()
        .expect_err("the reconcile fails and is retried");
    assert!(!err.is_permanent(), "an outage is retried soon");
    api.expect_no_more().await;
}

/// A receiver's 410 disables the row; the next reconcile says so and raises a Warning.
#[sqlx::test]
async fn endpoint_disabled_by_410_is_reported(pool: PgPool) {
    let (ctx, mut api) = context(&pool);
    let ep = endpoint_object("g410", true, json!({}));
    let first = sync_once(&ctx, &mut api, &ep, SECRET_A).await;
    let (id, _, _) = endpoint_row(&pool, "g410").await.unwrap();
    let mut conn = pool.acquire().await.unwrap();
    hookd::db::endpoints::disable(&mut conn, &[(id, 1)], "receiver answered 410 Gone")
        .await
        .unwrap();
    drop(conn);

    let mut stored = ep.clone();
    stored.status = Some(serde_json::from_value(first.clone()).unwrap());
    let run = tokio::spawn(endpoint_controller::reconcile(Arc::new(stored), ctx));
    api.expect("GET", &secret_path("g410"), |_| {
        (200, secret_object("g410-secret", SECRET_A))
    })
    .await;
    let patch = api
        .expect(
            "PATCH",
            &format!("{}/status", ep_path("g410")),
            with_status(&ep),
        )
        .await;
    let ready = condition(&patch.body["status"], "Ready");
    assert_eq!(ready["reason"], "EndpointDisabled");
    assert!(ready["message"].as_str().unwrap().contains("410"));
    let event = api.expect("POST", EVENTS_PATH, echo(201)).await;
    assert_eq!(
        (event.body["reason"].as_str(), event.body["type"].as_str()),
        (Some("EndpointDisabled"), Some("Warning"))
    );
    run.await.unwrap().unwrap();
    api.expect_no_more().await;
    assert_eq!(
        endpoint_row(&pool, "g410").await.unwrap().1,
        "disabled",
        "a resync does not re-enable it"
    );
}

/// The Secret watch is mapped back to the endpoints that reference that Secret through an
/// index kept from the WebhookEndpoint watch (a lookup, not a scan of every endpoint):
/// same namespace and name only, following spec changes, deletions and re-lists.
#[test]
fn secret_changes_map_to_the_endpoints_that_use_them() {
    use kube::runtime::reflector::ObjectRef;
    use kube::runtime::watcher::Event;
    let index = endpoint_controller::SecretIndex::default();
    let mk = |ns: &str, name: &str, secret: &str| {
        let mut ep = endpoint_object(name, true, json!({"secretRef": {"name": secret}}));
        ep.metadata.namespace = Some(ns.into());
        ep
    };
    index.apply(&Event::Init);
    for ep in [
        mk("team-a", "one", "shared"),
        mk("team-a", "two", "shared"),
        mk("team-a", "three", "other"),
        mk("team-b", "four", "shared"),
    ] {
        index.apply(&Event::InitApply(ep));
    }
    index.apply(&Event::InitDone);
    let secret = |ns: &str,
                  name: &str|
     -> kube::api::PartialObjectMeta<k8s_openapi::api::core::v1::Secret> {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": name, "namespace": ns}
        }))
        .unwrap()
    };
    let sorted = |mut v: Vec<ObjectRef<WebhookEndpoint>>| {
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    };
    assert_eq!(
        sorted(index.endpoints_for(&secret("team-a", "shared"))),
        vec![
            ObjectRef::new("one").within("team-a"),
            ObjectRef::new("two").within("team-a"),
        ]
    );
    // "two" moves to another Secret, "one" is deleted
    index.apply(&Event::Apply(mk("team-a", "two", "other")));
    index.apply(&Event::Delete(mk("team-a", "one", "shared")));
    assert!(index.endpoints_for(&secret("team-a", "shared")).is_empty());
    assert_eq!(
        sorted(index.endpoints_for(&secret("team-a", "other"))),
        vec![
            ObjectRef::new("three").within("team-a"),
            ObjectRef::new("two").within("team-a"),
        ]
    );
    // a re-list replaces the index with what the list returned
    index.apply(&Event::Init);
    index.apply(&Event::InitApply(mk("team-b", "four", "shared")));
    index.apply(&Event::InitDone);
    assert!(index.endpoints_for(&secret("team-a", "other")).is_empty());
    assert_eq!(
        index.endpoints_for(&secret("team-b", "shared")),
        vec![ObjectRef::new("four").within("team-b")]
    );
}

// ---- WebhookDispatcher ----

fn dispatcher_object(spec: Value) -> WebhookDispatcher {
    serde_json::from_value(json!({
        "apiVersion": "hookd.dev/v1alpha1", "kind": "WebhookDispatcher",
        "metadata": {"name": "default", "namespace": "hookd-system", "uid": "d-uid", "generation": 1},
        "spec": spec,
    }))
    .unwrap()
}

const DEPLOY_PATH: &str =
    "/apis/apps/v1/namespaces/hookd-system/deployments/hookd-dispatcher-default";
const DISPATCHER_STATUS_PATH: &str =
    "/apis/hookd.dev/v1alpha1/namespaces/hookd-system/webhookdispatchers/default/status";

fn applied_deployment(ready: i32) -> impl FnOnce(&Call) -> (u16, Value) {
    move |c: &Call| {
        let mut obj = c.body.clone();
        obj["status"] = json!({"readyReplicas": ready, "replicas": obj["spec"]["replicas"]});
        (200, obj)
    }
}

fn dispatcher_with_status(d: &WebhookDispatcher) -> impl FnOnce(&Call) -> (u16, Value) + '_ {
    move |c: &Call| {
        let mut obj = serde_json::to_value(d).unwrap();
        obj["status"] = c.body["status"].clone();
        (200, obj)
    }
}

/// The Deployment is server-side applied exactly as `desired_deployment` builds it, owned
/// by the WebhookDispatcher; the status reports replicas, readiness and the backlog.
#[sqlx::test]
async fn dispatcher_applies_its_deployment_and_reports_status(pool: PgPool) {
    let (ctx, mut api) = context(&pool);
    let d =
        dispatcher_object(json!({"replicas": 2, "databaseSecretRef": {"name": "hookd-database"}}));
    let run = tokio::spawn(dispatcher_controller::reconcile(
        Arc::new(d.clone()),
        ctx.clone(),
    ));
    let apply = api
        .expect("PATCH", DEPLOY_PATH, applied_deployment(1))
        .await;
    assert!(
        apply.query.contains("fieldManager=hookd-controller") && apply.query.contains("force=true")
    );
    assert_eq!(
        apply.body,
        serde_json::to_value(dispatcher_controller::desired_deployment(
            &d,
            "hookd:test",
            2
        ))
        .unwrap()
    );
    assert_eq!(apply.body["metadata"]["ownerReferences"][0]["uid"], "d-uid");
    // one pod missing: its pods are read for a reason (none found: still starting)
    let pods = api
        .expect("GET", PODS_PATH, |_| (200, pod_list(json!([]))))
        .await;
    for part in [
        "labelSelector=app.kubernetes.io%2Fcomponent%3Ddispatcher%2Capp.kubernetes.io%2Finstance%3Ddefault%2Capp.kubernetes.io%2Fname%3Dhookd",
        "limit=20",
    ] {
        assert!(pods.query.contains(part), "{}", pods.query);
    }
    let status = api
        .expect("PATCH", DISPATCHER_STATUS_PATH, dispatcher_with_status(&d))
        .await;
    let s = &status.body["status"];
    assert_eq!(s["replicas"], 2);
    assert_eq!(s["readyReplicas"], 1);
    assert_eq!(s["backlog"], 0);
    assert_eq!(s["deployment"], "hookd-dispatcher-default");
    assert_eq!(condition(s, "Ready")["status"], "False");
    assert_eq!(condition(s, "Ready")["reason"], "Progressing");
    assert_eq!(
        run.await.unwrap().unwrap(),
        Action::requeue(Duration::from_secs(10)),
        "pods not ready: looked at again soon (their changes bring no watch event)"
    );
    api.expect_no_more().await;

    // all ready: no pod is read, and only the rare resync (the Deployment watch brings
    // changes)
    let (ctx, mut api) = context(&pool);
    let run = tokio::spawn(dispatcher_controller::reconcile(
        Arc::new(d.clone()),
        ctx.clone(),
    ));
    api.expect("PATCH", DEPLOY_PATH, applied_deployment(2))
        .await;
    let status = api
        .expect("PATCH", DISPATCHER_STATUS_PATH, dispatcher_with_status(&d))
        .await;
    assert_eq!(condition(&status.body["status"], "Ready")["status"], "True");
    assert_eq!(
        run.await.unwrap().unwrap(),
        Action::requeue(Duration::from_secs(600))
    );
    api.expect_no_more().await;
}

const PODS_PATH: &str = "/api/v1/namespaces/hookd-system/pods";

fn pod_list(items: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items})
}

/// Why pods do not start reaches the WebhookDispatcher's status: the Deployment's
/// ReplicaFailure (Pod Security refused the pods) without reading pods, and a pod's
/// container that cannot start (its Secret is missing) from the pods; a refused pod list
/// still leaves the count.
#[sqlx::test]
async fn dispatcher_status_says_why_pods_do_not_start(pool: PgPool) {
    let d =
        dispatcher_object(json!({"replicas": 2, "databaseSecretRef": {"name": "hookd-database"}}));
    let with_deployment_status = |status: Value| {
        move |c: &Call| {
            let mut obj = c.body.clone();
            obj["status"] = status;
            (200, obj)
        }
    };
    let refused = "pods \"hookd-dispatcher-default-5f7c9d-x\" is forbidden: violates PodSecurity \"restricted:latest\": runAsNonRoot != true";
    // 1. Pod Security admission refused every pod
    let (ctx, mut api) = context(&pool);
    let run = tokio::spawn(dispatcher_controller::reconcile(
        Arc::new(d.clone()),
        ctx.clone(),
    ));
    api.expect(
        "PATCH",
        DEPLOY_PATH,
        with_deployment_status(json!({"replicas": 0, "conditions": [
            {"type": "Available", "status": "False", "reason": "MinimumReplicasUnavailable", "message": "Deployment does not have minimum availability."},
            {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate", "message": refused},
        ]})),
    )
    .await;
    api.expect("GET", PODS_PATH, |_| (200, pod_list(json!([]))))
        .await;
    let status = api
        .expect("PATCH", DISPATCHER_STATUS_PATH, dispatcher_with_status(&d))
        .await;
    let ready = condition(&status.body["status"], "Ready");
    assert_eq!(
        (ready["status"].as_str(), ready["reason"].as_str()),
        (Some("False"), Some("FailedCreate"))
    );
    assert_eq!(
        ready["message"],
        format!("0/2 dispatcher pods ready: {refused}")
    );
    assert_eq!(
        run.await.unwrap().unwrap(),
        Action::requeue(Duration::from_secs(10))
    );
    api.expect_no_more().await;

    // 2. the pods exist but their database Secret does not
    let (ctx, mut api) = context(&pool);
    let run = tokio::spawn(dispatcher_controller::reconcile(
        Arc::new(d.clone()),
        ctx.clone(),
    ));
    api.expect(
        "PATCH",
        DEPLOY_PATH,
        with_deployment_status(json!({"replicas": 2, "unavailableReplicas": 2})),
    )
    .await;
    api.expect("GET", PODS_PATH, |_| {
        (
            200,
            pod_list(json!([{
                "metadata": {"name": "hookd-dispatcher-default-5f7c9d-abcde", "namespace": "hookd-system"},
                "status": {"phase": "Pending", "containerStatuses": [{
                    "name": "dispatcher", "image": "hookd:test", "imageID": "", "ready": false,
                    "restartCount": 0,
                    "state": {"waiting": {"reason": "CreateContainerConfigError",
                                          "message": "secret \"hookd-database\" not found"}}}]}
            }])),
        )
    })
    .await;
    let status = api
        .expect("PATCH", DISPATCHER_STATUS_PATH, dispatcher_with_status(&d))
        .await;
    let ready = condition(&status.body["status"], "Ready");
    assert_eq!(ready["reason"], "CreateContainerConfigError");
    assert!(
        ready["message"]
            .as_str()
            .unwrap()
            .ends_with("container dispatcher: secret \"hookd-database\" not found"),
        "{ready}"
    );
    run.await.unwrap().unwrap();
    api.expect_no_more().await;

    // 3. the pod list is refused (RBAC of an older install): the count, no reason
    let (ctx, mut api) = context(&pool);
    let run = tokio::spawn(dispatcher_controller::reconcile(
        Arc::new(d.clone()),
        ctx.clone(),
    ));
    api.expect("PATCH", DEPLOY_PATH, applied_deployment(0))
        .await;
    api.expect("GET", PODS_PATH, |_| (403, status_error(403, "Forbidden")))
        .await;
    let status = api
        .expect("PATCH", DISPATCHER_STATUS_PATH, dispatcher_with_status(&d))
        .await;
    let ready = condition(&status.body["status"], "Ready");
    assert_eq!(
        (ready["reason"].as_str(), ready["message"].as_str()),
        (Some("Progressing"), Some("0/2 dispatcher pods ready"))
    );
    run.await.unwrap().unwrap();
    api.expect_no_more().await;
}

/// Autoscaling reads the backlog from Postgres: 2 500 due deliveries at 1 000 per replica
/// ask for 3 pods, with a `ScaledUp` Event.
#[sqlx::test]
async fn autoscaling_sets_replicas_from_the_backlog(pool: PgPool) {
    let (ctx, mut api) = context(&pool);
    common::endpoint(
        &pool,
        common::EndpointOpts {
            namespace: NS.into(),
            ..Default::default()
        },
    )
    .await;
    sqlx::query("SELECT hookd.enqueue($1, 'invoice.paid', '{}') FROM generate_series(1, 2500)")
        .bind(NS)
        .execute(&pool)
        .await
        .unwrap();
    let mut d = dispatcher_object(json!({
        "autoscaling": {"minReplicas": 1, "maxReplicas": 10, "targetBacklogPerReplica": 1000},
        "databaseSecretRef": {"name": "hookd-database"}
    }));
    d.status = Some(serde_json::from_value(json!({"replicas": 1})).unwrap());
    let run = tokio::spawn(dispatcher_controller::reconcile(Arc::new(d.clone()), ctx));
    let apply = api
        .expect("PATCH", DEPLOY_PATH, applied_deployment(1))
        .await;
    assert_eq!(apply.body["spec"]["replicas"], 3);
    api.expect("GET", PODS_PATH, |_| (200, pod_list(json!([]))))
        .await;
    let status = api
        .expect("PATCH", DISPATCHER_STATUS_PATH, dispatcher_with_status(&d))
        .await;
    assert_eq!(status.body["status"]["backlog"], 2500);
    assert_eq!(status.body["status"]["replicas"], 3);
    assert!(status.body["status"]["lastScaleTime"].is_string());
    let event = api
        .expect(
            "POST",
            "/apis/events.k8s.io/v1/namespaces/hookd-system/events",
            echo(201),
        )
        .await;
    assert_eq!(event.body["reason"], "ScaledUp");
    assert_eq!(
        run.await.unwrap().unwrap(),
        Action::requeue(Duration::from_secs(10))
    );
    api.expect_no_more().await;
}

/// A failed Deployment apply fails the reconcile and writes no status.
#[sqlx::test]
async fn dispatcher_apply_error_is_retried(pool: PgPool) {
    let (ctx, mut api) = context(&pool);
    let d = Arc::new(dispatcher_object(
        json!({"databaseSecretRef": {"name": "db"}}),
    ));
    let run = tokio::spawn(dispatcher_controller::reconcile(d.clone(), ctx.clone()));
    api.expect("PATCH", DEPLOY_PATH, |_| {
        (422, status_error(422, "Invalid"))
    })
    .await;
    // a refusal is permanent: said on the object, then retried with a long backoff
    let status = api
        .expect("PATCH", DISPATCHER_STATUS_PATH, dispatcher_with_status(&d))
        .await;
    let ready = condition(&status.body["status"], "Ready");
    assert_eq!(
        (ready["status"].as_str(), ready["reason"].as_str()),
        (Some("False"), Some("ApplyRejected"))
    );
    assert!(ready["message"].as_str().unwrap().contains("Invalid"));
    let err = run.await.unwrap().expect_err("apply failed");
    api.expect_no_more().await;
    assert!(err.is_permanent());
    let first = requeue_of(&dispatcher_controller::error_policy(
        d.clone(),
        &err,
        ctx.clone(),
    ));
    let second = requeue_of(&dispatcher_controller::error_policy(
        d.clone(),
        &err,
        ctx.clone(),
    ));
    assert!(
        first >= Duration::from_secs(15) && first <= Duration::from_secs(30),
        "{first:?}"
    );
    assert!(
        second >= Duration::from_secs(30) && second <= Duration::from_secs(60),
        "{second:?}"
    );
}

/// Foreground deletion: while the garbage collector deletes the owned Deployment, the
/// controller must not apply it again — no API call at all.
#[sqlx::test]
async fn dispatcher_being_deleted_is_left_alone(pool: PgPool) {
    let (ctx, mut api) = context(&pool);
    let mut d = dispatcher_object(json!({"databaseSecretRef": {"name": "db"}}));
    d.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::from_second(1_700_000_000).unwrap(),
    ));
    d.metadata.finalizers = Some(vec!["foregroundDeletion".into()]);
    let action = dispatcher_controller::reconcile(Arc::new(d), ctx)
        .await
        .unwrap();
    assert_eq!(action, Action::await_change());
    api.expect_no_more().await;
}

/// The privilege boundary: an image off the allow-list, another service account or env
/// beyond the tuning settings is refused — no Deployment apply, `Ready=False/NotAllowed`
/// and one Warning; an allow-listed image is applied.
#[sqlx::test]
async fn dispatcher_outside_the_privilege_boundary_is_refused(pool: PgPool) {
    for (spec, what) in [
        (json!({"image": "evil.example/miner:latest"}), "image"),
        (
            json!({"serviceAccountName": "cluster-admin-sa"}),
            "serviceAccountName",
        ),
        (
            json!({"env": [{"name": "HOOKD_ENCRYPTION_KEY_FILE", "value": "/etc/shadow"}]}),
            "HOOKD_ENCRYPTION_KEY_FILE",
        ),
        (
            json!({"env": [{"name": "HOOKD_CONCURRENCY", "valueFrom": {"secretKeyRef": {"name": "other", "key": "k"}}}]}),
            "valueFrom",
        ),
    ] {
        // a fresh recorder each time (it would patch, not create, a repeated Event)
        let (ctx, mut api) = context(&pool);
        let mut spec = spec;
        spec["databaseSecretRef"] = json!({"name": "db"});
        let d = dispatcher_object(spec.clone());
        let run = tokio::spawn(dispatcher_controller::reconcile(
            Arc::new(d.clone()),
            ctx.clone(),
        ));
        let status = api
            .expect("PATCH", DISPATCHER_STATUS_PATH, dispatcher_with_status(&d))
            .await;
        let ready = condition(&status.body["status"], "Ready");
        assert_eq!(ready["reason"], "NotAllowed", "{spec}");
        assert!(ready["message"].as_str().unwrap().contains(what), "{ready}");
        let event = api
            .expect(
                "POST",
                "/apis/events.k8s.io/v1/namespaces/hookd-system/events",
                echo(201),
            )
            .await;
        assert_eq!(
            (event.body["reason"].as_str(), event.body["type"].as_str()),
            (Some("NotAllowed"), Some("Warning"))
        );
        assert_eq!(run.await.unwrap().unwrap(), Action::await_change());
        api.expect_no_more().await;
        // the admission rule refuses the env cases too
        if what != "image" && what != "serviceAccountName" {
            assert!(d.validate_cel().is_err(), "{spec}");
        }
    }
    let (ctx, mut api) = context(&pool);
    let d = dispatcher_object(json!({"databaseSecretRef": {"name": "db"},
        "image": "registry.example/hookd:1.2",
        "env": [{"name": "HOOKD_RETRY_SCHEDULE", "value": "1,2"}]}));
    assert!(d.validate_cel().is_ok());
    let run = tokio::spawn(dispatcher_controller::reconcile(Arc::new(d.clone()), ctx));
    let apply = api
        .expect("PATCH", DEPLOY_PATH, applied_deployment(1))
        .await;
    assert_eq!(
        apply.body["spec"]["template"]["spec"]["containers"][0]["image"],
        "registry.example/hookd:1.2"
    );
    api.expect("PATCH", DISPATCHER_STATUS_PATH, dispatcher_with_status(&d))
        .await;
    run.await.unwrap().unwrap();
    api.expect_no_more().await;
}

/// The CRDs' own validation: the dispatcher's cross-field rules.
#[test]
fn dispatcher_cel_rules() {
    let check = |spec: Value| dispatcher_object(spec).validate_cel();
    assert!(check(json!({"databaseSecretRef": {"name": "db"}})).is_ok());
    assert!(check(json!({"databaseSecretRef": {"name": "db"}, "leaseSeconds": 30, "requestTimeoutSeconds": 25})).is_ok());
    // leases are renewed while a request runs (issue 13): a lease shorter than the
    // request timeout is fine
    assert!(
        check(json!({"databaseSecretRef": {"name": "db"}, "leaseSeconds": 5, "requestTimeoutSeconds": 60})).is_ok()
    );
    assert!(
        check(json!({"databaseSecretRef": {"name": "db"},
        "autoscaling": {"minReplicas": 5, "maxReplicas": 2, "targetBacklogPerReplica": 10}}))
        .is_err()
    );
    assert!(
        check(json!({"databaseSecretRef": {"name": "db"}, "imagePullPolicy": "Sometimes"}))
            .is_err()
    );
    assert!(
        check(json!({"databaseSecretRef": {"name": "db"}, "allowedDestinations": ["not a cidr"]}))
            .is_err()
    );
}

// ---- tenancy ----

/// A namespace cannot subscribe to another tenant's events: a foreign `spec.tenant` is
/// refused before anything is read or written (no Secret GET, no row), with
/// `Ready=False/TenantNotAllowed` and a Warning.
#[sqlx::test]
async fn foreign_tenant_is_refused_and_nothing_subscribes(pool: PgPool) {
    let (ctx, mut api) = context(&pool);
    let ep = endpoint_object("spy", true, json!({"tenant": "billing"}));
    let run = tokio::spawn(endpoint_controller::reconcile(Arc::new(ep.clone()), ctx));
    let patch = api
        .expect(
            "PATCH",
            &format!("{}/status", ep_path("spy")),
            with_status(&ep),
        )
        .await;
    let ready = condition(&patch.body["status"], "Ready");
    assert_eq!(
        (ready["status"].as_str(), ready["reason"].as_str()),
        (Some("False"), Some("TenantNotAllowed"))
    );
    assert!(ready["message"].as_str().unwrap().contains("\"billing\""));
    assert!(patch.body["status"].get("endpointId").is_none());
    let event = api.expect("POST", EVENTS_PATH, echo(201)).await;
    assert_eq!(
        (event.body["reason"].as_str(), event.body["type"].as_str()),
        (Some("TenantNotAllowed"), Some("Warning"))
    );
    run.await.unwrap().unwrap();
    api.expect_no_more().await;
    assert!(endpoint_row(&pool, "spy").await.is_none());
    enqueue(&pool, "billing").await;
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM hookd.deliveries")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(n, 0, "billing's event reached no endpoint of team-a");
}

/// One header rule for every door (issue 30): `Content-Encoding: gzip` on an endpoint
/// would make every delivery unreadable to a standard receiver. The API, `hookd apply` and
/// the CRD's CEL rule refuse it with one message; before, the API refused it and the CRD
/// and `hookd apply` (7 reserved names against 15) stored it.
#[sqlx::test]
async fn content_encoding_is_refused_by_every_door_with_one_message(pool: PgPool) {
    let rule = hookd::endpoints::HEADER_NAME_RULE;
    // the API
    let api = common::TestApi::start(&pool).await;
    let (status, body) = common::send(
        api.request_as(
            common::DEFAULT_TENANT,
            reqwest::Method::POST,
            "/v1/endpoints",
        )
        .await
        .json(&json!({"url": "https://example.com/hook", "headers": {"Content-Encoding": "gzip"}})),
    )
    .await;
    assert_eq!(status, 422, "{body}");
    assert!(
        body["error"]["message"].as_str().unwrap().contains(rule),
        "{body}"
    );
    // `hookd apply`
    let yaml = r#"
apiVersion: hookd.dev/v1alpha1
kind: WebhookEndpoint
metadata: {name: gz, namespace: team-a}
spec:
  url: https://example.com/hook
  eventTypes: ["*"]
  secretRef: {name: s}
  headers: {Content-Encoding: gzip}
"#;
    let Err(err) = hookd::apply::parse_documents(std::path::Path::new("gz.yaml"), yaml) else {
        panic!("hookd apply refuses it");
    };
    let err = err.to_string();
    assert!(err.contains(rule), "{err}");
    // the CRD's CEL rule, evaluated as the API server would
    let ep = endpoint_object("gz", true, json!({"headers": {"Content-Encoding": "gzip"}}));
    let err = ep
        .validate_cel()
        .expect_err("the CRD refuses it")
        .to_string();
    assert!(err.contains(rule), "{err}");
}

/// An object stored before its CRD refused a header (an older hookd's CRD; the API server
/// does not check stored objects again) is held: `Ready=False/InvalidSpec`, nothing synced.
#[sqlx::test]
async fn a_stored_spec_the_rules_refuse_is_held(pool: PgPool) {
    let (ctx, mut api) = context(&pool);
    let ep = endpoint_object("gz", true, json!({"headers": {"Content-Encoding": "gzip"}}));
    let run = tokio::spawn(endpoint_controller::reconcile(Arc::new(ep.clone()), ctx));
    let patch = api
        .expect(
            "PATCH",
            &format!("{}/status", ep_path("gz")),
            with_status(&ep),
        )
        .await;
    let ready = condition(&patch.body["status"], "Ready");
    assert_eq!(
        (ready["status"].as_str(), ready["reason"].as_str()),
        (Some("False"), Some("InvalidSpec"))
    );
    assert!(
        ready["message"]
            .as_str()
            .unwrap()
            .contains(hookd::endpoints::HEADER_NAME_RULE)
    );
    let event = api.expect("POST", EVENTS_PATH, echo(201)).await;
    assert_eq!(event.body["reason"].as_str(), Some("InvalidSpec"));
    run.await.unwrap().unwrap();
    api.expect_no_more().await;
    assert!(endpoint_row(&pool, "gz").await.is_none());
}

/// An endpoint that was accepted and then asks for a foreign tenant keeps its last
/// accepted row (its own tenant) but is held: its deliveries wait, nothing of the other
/// tenant reaches it.
#[sqlx::test]
async fn switching_to_a_foreign_tenant_holds_the_endpoint(pool: PgPool) {
    let (ctx, mut api) = context(&pool);
    let ep = endpoint_object("sw", true, json!({}));
    let first = sync_once(&ctx, &mut api, &ep, SECRET_A).await;
    let (id, _, _) = endpoint_row(&pool, "sw").await.unwrap();

    let mut foreign = endpoint_object("sw", true, json!({"tenant": "billing"}));
    foreign.metadata.uid = ep.metadata.uid.clone();
    foreign.metadata.generation = Some(2);
    foreign.status = Some(serde_json::from_value(first.clone()).unwrap());
    let run = tokio::spawn(endpoint_controller::reconcile(
        Arc::new(foreign.clone()),
        ctx,
    ));
    let patch = api
        .expect(
            "PATCH",
            &format!("{}/status", ep_path("sw")),
            with_status(&foreign),
        )
        .await;
    let status = &patch.body["status"];
    assert_eq!(condition(status, "Ready")["reason"], "TenantNotAllowed");
    assert_eq!(status["endpointId"], id.to_string());
    assert_eq!(status["activeSecrets"], 0);
    assert_eq!(
        condition(status, "SecretResolved")["status"],
        "True",
        "kept from before"
    );
    api.expect("POST", EVENTS_PATH, echo(201)).await;
    run.await.unwrap().unwrap();
    api.expect_no_more().await;
    let row: (String, String) =
        sqlx::query_as("SELECT state, tenant FROM hookd.endpoints WHERE id = $1")
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(
        row,
        ("paused".to_string(), NS.to_string()),
        "held under its old tenant"
    );
    enqueue(&pool, "billing").await;
    enqueue(&pool, NS).await;
    assert_eq!(
        delivery_statuses(&pool, id).await,
        vec!["pending"],
        "only its own tenant's event, held"
    );
}

/// With `HOOKD_AUTH_NAMESPACE_TENANTS` mapping a namespace to a tenant, its endpoints
/// default to that tenant (as its ServiceAccounts produce for it) and may not claim the
/// namespace's own name as a tenant.
#[sqlx::test]
async fn mapped_namespaces_subscribe_to_their_mapped_tenant(pool: PgPool) {
    let (ctx, mut api) = context(&pool);
    let mut ep = endpoint_object("m", true, json!({}));
    ep.metadata.namespace = Some("mapped-ns".into());
    let path = "/apis/hookd.dev/v1alpha1/namespaces/mapped-ns/webhookendpoints/m";
    let run = tokio::spawn(endpoint_controller::reconcile(
        Arc::new(ep.clone()),
        ctx.clone(),
    ));
    api.expect(
        "GET",
        "/api/v1/namespaces/mapped-ns/secrets/m-secret",
        |_| {
            let mut s = secret_object("m-secret", SECRET_A);
            s["metadata"]["namespace"] = json!("mapped-ns");
            (200, s)
        },
    )
    .await;
    api.expect("PATCH", &format!("{path}/status"), with_status(&ep))
        .await;
    api.expect(
        "POST",
        "/apis/events.k8s.io/v1/namespaces/mapped-ns/events",
        echo(201),
    )
    .await;
    run.await.unwrap().unwrap();
    let tenant: String =
        sqlx::query_scalar("SELECT tenant FROM hookd.endpoints WHERE k8s_namespace = 'mapped-ns'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(tenant, "shared-tenant");

    let mut own_name = endpoint_object("m2", true, json!({"tenant": "mapped-ns"}));
    own_name.metadata.namespace = Some("mapped-ns".into());
    let run = tokio::spawn(endpoint_controller::reconcile(
        Arc::new(own_name.clone()),
        ctx,
    ));
    let patch = api
        .expect(
            "PATCH",
            "/apis/hookd.dev/v1alpha1/namespaces/mapped-ns/webhookendpoints/m2/status",
            with_status(&own_name),
        )
        .await;
    assert_eq!(
        condition(&patch.body["status"], "Ready")["reason"],
        "TenantNotAllowed"
    );
    api.expect(
        "POST",
        "/apis/events.k8s.io/v1/namespaces/mapped-ns/events",
        echo(201),
    )
    .await;
    run.await.unwrap().unwrap();
    api.expect_no_more().await;
}

// ---- load ----

/// 5,000 endpoints, synced once, then idle for a minute: the periodic passes a
/// `HOOKD_STATUS_INTERVAL_SECS=10` controller makes in that minute (6 per endpoint) read
/// their figures from Postgres and send the API server nothing — no Secret GET (its
/// resourceVersion from the metadata watch is unchanged), no status patch (unchanged),
/// no Event. Before, each pass GETs the Secret: 30,000 requests a minute here. A Secret
/// that does change costs one GET for the one endpoint that uses it.
#[sqlx::test]
async fn idle_endpoints_cost_the_api_server_nothing(pool: PgPool) {
    use kube::runtime::reflector;
    use kube::runtime::watcher::Event;
    use std::collections::HashMap;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    const N: usize = 5000;
    const PASSES_PER_MINUTE: usize = 6;
    let (ctx, api) = context(&pool);
    let mut handle = api.handle;
    let names: Vec<String> = (0..N).map(|i| format!("ep{i}")).collect();
    let objects: HashMap<String, WebhookEndpoint> = names
        .iter()
        .map(|n| (n.clone(), endpoint_object(n, true, json!({}))))
        .collect();

    // the Secret metadata watch, as its reflector would fill the store
    let (secret_reader, mut secret_writer) =
        reflector::store::<kube::api::PartialObjectMeta<k8s_openapi::api::core::v1::Secret>>();
    let secret_meta = |name: &str, rv: &str| {
        serde_json::from_value(json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": format!("{name}-secret"), "namespace": NS, "resourceVersion": rv}}))
        .unwrap()
    };
    for n in &names {
        secret_writer.apply_watcher_event(&Event::Apply(secret_meta(n, "7")));
    }
    ctx.secrets.set_store(secret_reader);

    // the API server: answers everything, counts every request
    let requests = Arc::new(AtomicUsize::new(0));
    let statuses: Arc<Mutex<HashMap<String, Value>>> = Default::default();
    let server = {
        let (requests, statuses, objects) = (requests.clone(), statuses.clone(), objects.clone());
        tokio::spawn(async move {
            while let Some((req, send)) = handle.next_request().await {
                requests.fetch_add(1, Ordering::SeqCst);
                let (method, path) = (req.method().to_string(), req.uri().path().to_string());
                let bytes = req.into_body().collect_bytes().await.unwrap();
                let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                let last = path.rsplit('/').next().unwrap().to_string();
                let (code, reply) = match method.as_str() {
                    "GET" => (200, secret_object(&last, SECRET_A)),
                    "PATCH" => {
                        let name = path.rsplit('/').nth(1).unwrap().to_string();
                        let mut obj = serde_json::to_value(&objects[&name]).unwrap();
                        obj["status"] = body["status"].clone();
                        statuses
                            .lock()
                            .unwrap()
                            .insert(name, body["status"].clone());
                        (200, obj)
                    }
                    _ => (201, body),
                };
                send.send_response(
                    Response::builder()
                        .status(code)
                        .header("content-type", "application/json")
                        .body(Body::from(serde_json::to_vec(&reply).unwrap()))
                        .unwrap(),
                );
            }
        })
    };

    let run_all = |eps: Vec<WebhookEndpoint>| {
        let ctx = ctx.clone();
        async move {
            futures::stream::iter(eps)
                .for_each_concurrent(16, |ep| {
                    let ctx = ctx.clone();
                    async move {
                        let action = endpoint_controller::reconcile(Arc::new(ep), ctx)
                            .await
                            .expect("reconcile");
                        assert_eq!(action, Action::requeue(Duration::from_secs(10)));
                    }
                })
                .await
        }
    };
    use futures::StreamExt;

    // startup: one full sync per endpoint (Secret GET, status patch, `Created` Event)
    run_all(objects.values().cloned().collect()).await;
    let startup = requests.swap(0, Ordering::SeqCst);
    assert_eq!(startup, 3 * N, "startup: GET + status patch + Event each");

    // the objects as the API server now holds them (with the status just written)
    let synced: Vec<WebhookEndpoint> = {
        let st = statuses.lock().unwrap();
        names
            .iter()
            .map(|n| {
                let mut ep = objects[n].clone();
                ep.status = Some(serde_json::from_value(st[n].clone()).unwrap());
                ep
            })
            .collect()
    };
    let started = std::time::Instant::now();
    for _ in 0..PASSES_PER_MINUTE {
        run_all(synced.clone()).await;
    }
    let idle = requests.swap(0, Ordering::SeqCst);
    println!(
        "{N} endpoints: {startup} API requests at startup, {idle} in an idle minute ({} periodic passes, {:.1} s of database reads)",
        N * PASSES_PER_MINUTE,
        started.elapsed().as_secs_f64()
    );
    assert!(idle <= 5, "an idle minute made {idle} API requests");

    // one Secret changes: its endpoint alone reads it again (same bytes: no rotation, so
    // no status patch either)
    secret_writer.apply_watcher_event(&Event::Apply(secret_meta("ep42", "8")));
    run_all(synced.clone()).await;
    assert_eq!(requests.swap(0, Ordering::SeqCst), 1, "one Secret GET");
    server.abort();
}

// ---- WebhookSource ----

const STRIPE_A: &str = "whsec_live_4Hq9ZtPm2Lx7Vb3Nc8Rw1Ks6Yd0Fg5Ju";
const STRIPE_B: &str = "whsec_live_9Tn2Wq7Ev4Mz1Xc6Bp3Ly8Hd5Ks0Ga7Rf";

fn source_object(ns: &str, name: &str, extra_spec: Value) -> WebhookSource {
    let mut spec = json!({
        "provider": "stripe",
        "secretRef": {"name": format!("{name}-secret"), "key": "secret"},
    });
    for (k, v) in extra_spec.as_object().unwrap() {
        spec[k] = v.clone();
    }
    serde_json::from_value(json!({
        "apiVersion": "hookd.dev/v1alpha1", "kind": "WebhookSource",
        "metadata": {
            "name": name, "namespace": ns, "uid": Uuid::now_v7().to_string(),
            "generation": 1, "resourceVersion": "1",
            "finalizers": [source_controller::FINALIZER],
        },
        "spec": spec,
    }))
    .unwrap()
}

fn source_path(ns: &str, name: &str) -> String {
    format!("/apis/hookd.dev/v1alpha1/namespaces/{ns}/webhooksources/{name}")
}

/// One reconcile of a source whose Secret holds `secret`: the Secret GET, then a status
/// patch when the status changes and an Event when one is due. Returns the object as the
/// API server would now hold it, and the Event's reason.
async fn reconcile_source(
    ctx: &Arc<Context>,
    api: &mut ApiServer,
    src: &WebhookSource,
    secret: &'static str,
    patch: bool,
    event: Option<&str>,
) -> WebhookSource {
    let ns = src.metadata.namespace.clone().unwrap();
    let name = src.metadata.name.clone().unwrap();
    let run = tokio::spawn(source_controller::reconcile(
        Arc::new(src.clone()),
        ctx.clone(),
    ));
    let secret_name = format!("{name}-secret");
    let secret_ns = ns.clone();
    api.expect(
        "GET",
        &format!("/api/v1/namespaces/{ns}/secrets/{name}-secret"),
        move |_| {
            let mut s = secret_object(&secret_name, secret);
            s["metadata"]["namespace"] = json!(secret_ns);
            (200, s)
        },
    )
    .await;
    let mut now = src.clone();
    if patch {
        let call = api
            .expect(
                "PATCH",
                &format!("{}/status", source_path(&ns, &name)),
                |c: &Call| {
                    let mut obj = serde_json::to_value(src).unwrap();
                    obj["status"] = c.body["status"].clone();
                    (200, obj)
                },
            )
            .await;
        assert_eq!(call.body["kind"], "WebhookSource");
        now.status = Some(serde_json::from_value(call.body["status"].clone()).unwrap());
    }
    if let Some(reason) = event {
        let e = api
            .expect(
                "POST",
                &format!("/apis/events.k8s.io/v1/namespaces/{ns}/events"),
                echo(201),
            )
            .await;
        assert_eq!(e.body["reason"], reason, "{:#?}", e.body);
    }
    // no figures to refresh: the next full pass at resync (the Secret watch brings changes)
    assert_eq!(
        run.await.unwrap().unwrap(),
        Action::requeue(Duration::from_secs(600))
    );
    api.expect_no_more().await;
    now
}

async fn source_secrets(pool: &PgPool, name: &str) -> (i64, i64) {
    sqlx::query_as(
        "SELECT count(*) FILTER (WHERE k.not_after IS NULL),
                count(*) FILTER (WHERE k.not_after > now())
         FROM hookd.source_secrets k JOIN hookd.sources s ON s.id = k.source_id WHERE s.name = $1",
    )
    .bind(name)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// A WebhookSource and its Secret become a source: created once, a new Secret value made
/// current with the old one verifying for the grace, read-only to the API, refused to a
/// second namespace, and deleted with its object.
#[sqlx::test]
async fn a_webhook_source_is_reconciled_rotated_guarded_and_deleted(pool: PgPool) {
    let (ctx, mut api) = context(&pool);
    let src = source_object(
        NS,
        "stripe-live",
        json!({"secretRotationGraceSeconds": 3600}),
    );
    let src = reconcile_source(&ctx, &mut api, &src, STRIPE_A, true, Some("Created")).await;
    let status = serde_json::to_value(src.status.as_ref().unwrap()).unwrap();
    let ready = condition(&status, "Ready");
    assert_eq!(
        (&ready["status"], &ready["reason"]),
        (&json!("True"), &json!("Ready"))
    );
    assert_eq!(status["path"], "/in/stripe-live");
    let row = hookd::db::sources::get(&pool, "stripe-live", Some(NS))
        .await
        .unwrap()
        .expect("the source is written");
    assert_eq!(status["sourceId"], row.id.to_string());
    assert_eq!(row.managed_by, hookd::domain::ManagedBy::Kubernetes);
    assert_eq!(
        (row.provider.as_str(), row.event_type_prefix.as_str()),
        ("stripe", "stripe-live")
    );
    assert_eq!(source_secrets(&pool, "stripe-live").await, (1, 0));

    // unchanged: no write at all
    let src = reconcile_source(&ctx, &mut api, &src, STRIPE_A, false, None).await;
    assert_eq!(source_secrets(&pool, "stripe-live").await, (1, 0));
    // a new value in the Secret: current, the old one in its grace
    let src = reconcile_source(&ctx, &mut api, &src, STRIPE_B, false, Some("SecretRotated")).await;
    assert_eq!(source_secrets(&pool, "stripe-live").await, (1, 1));

    // the API reads it and refuses to change it
    let refused = hookd::inbound::sources::delete(&pool, Some(NS), "stripe-live").await;
    assert!(
        matches!(
            refused,
            Err(hookd::inbound::sources::SourceError::ManagedByKubernetes(_))
        ),
        "{refused:?}"
    );

    // another namespace declaring the same route is told, and takes nothing
    let other = source_object("team-b", "stripe-live", json!({}));
    let other = reconcile_source(&ctx, &mut api, &other, STRIPE_A, true, Some("NameTaken")).await;
    let status = serde_json::to_value(other.status.as_ref().unwrap()).unwrap();
    assert_eq!(condition(&status, "Ready")["reason"], "NameTaken");
    assert!(status.get("sourceId").is_none(), "{status}");
    // a name that is an object name but not a route
    let dotted = source_object(NS, "a.b", json!({}));
    let dotted =
        reconcile_source(&ctx, &mut api, &dotted, STRIPE_A, true, Some("InvalidSpec")).await;
    let status = serde_json::to_value(dotted.status.as_ref().unwrap()).unwrap();
    assert!(
        condition(&status, "Ready")["message"]
            .as_str()
            .unwrap()
            .contains("lower-case letters, digits or '-'"),
        "{status}"
    );
    // a secret a provider's signatures could never match is refused, the last one kept
    let short =
        reconcile_source(&ctx, &mut api, &src, "too-short", true, Some("InvalidSpec")).await;
    let status = serde_json::to_value(short.status.as_ref().unwrap()).unwrap();
    assert_eq!(condition(&status, "Ready")["reason"], "InvalidSpec");
    assert_eq!(source_secrets(&pool, "stripe-live").await, (1, 1));

    // deleted with its object
    let mut deleting = src.clone();
    deleting.metadata.deletion_timestamp =
        Some(hookd::k8s::conditions::to_time(chrono::Utc::now()));
    let run = tokio::spawn(source_controller::reconcile(Arc::new(deleting), ctx));
    let event = api.expect("POST", EVENTS_PATH, echo(201)).await;
    assert_eq!(event.body["reason"], "Deleted");
    api.expect("PATCH", &source_path(NS, "stripe-live"), |_| {
        let mut obj = serde_json::to_value(&src).unwrap();
        obj["metadata"]["finalizers"] = json!([]);
        (200, obj)
    })
    .await;
    assert_eq!(run.await.unwrap().unwrap(), Action::await_change());
    api.expect_no_more().await;
    assert!(
        hookd::db::sources::get(&pool, "stripe-live", None)
            .await
            .unwrap()
            .is_none()
    );
}

// ---- WebhookEventType ----

fn event_type_object(name: &str, spec: Value) -> hookd::k8s::WebhookEventType {
    serde_json::from_value(json!({
        "apiVersion": "hookd.dev/v1alpha1", "kind": "WebhookEventType",
        "metadata": {
            "name": name, "namespace": NS, "uid": Uuid::now_v7().to_string(),
            "generation": 1, "resourceVersion": "1",
            "finalizers": [hookd::k8s::event_type_controller::FINALIZER],
        },
        "spec": spec,
    }))
    .unwrap()
}

/// One reconcile of a WebhookEventType: a status patch when the status changes and an
/// Event when one is due. Returns the object as the API server would now hold it.
async fn reconcile_event_type(
    ctx: &Arc<Context>,
    api: &mut ApiServer,
    et: &hookd::k8s::WebhookEventType,
    patch: bool,
    event: Option<&str>,
) -> hookd::k8s::WebhookEventType {
    let name = et.metadata.name.clone().unwrap();
    let run = tokio::spawn(hookd::k8s::event_type_controller::reconcile(
        Arc::new(et.clone()),
        ctx.clone(),
    ));
    let mut now = et.clone();
    if patch {
        let call = api
            .expect(
                "PATCH",
                &format!(
                    "/apis/hookd.dev/v1alpha1/namespaces/{NS}/webhookeventtypes/{name}/status"
                ),
                |c: &Call| {
                    let mut obj = serde_json::to_value(et).unwrap();
                    obj["status"] = c.body["status"].clone();
                    (200, obj)
                },
            )
            .await;
        assert_eq!(call.body["kind"], "WebhookEventType");
        now.status = Some(serde_json::from_value(call.body["status"].clone()).unwrap());
    }
    if let Some(reason) = event {
        let e = api.expect("POST", EVENTS_PATH, echo(201)).await;
        assert_eq!(e.body["reason"], reason, "{:#?}", e.body);
    }
    assert_eq!(
        run.await.unwrap().unwrap(),
        Action::requeue(Duration::from_secs(600))
    );
    api.expect_no_more().await;
    now
}

/// A WebhookEventType becomes an entry of its namespace's tenant's catalog: written once
/// (a resync writes nothing), a schema that does not compile refused with the last entry
/// kept, read-only to the API, and removed with its object.
#[sqlx::test]
async fn a_webhook_event_type_is_reconciled_into_the_catalog_and_removed(pool: PgPool) {
    let (ctx, mut api) = context(&pool);
    let spec = json!({
        "name": "invoice.paid",
        "description": "An invoice was paid.",
        "schema": {"type": "object", "required": ["amount"], "properties": {"amount": {"type": "integer"}}},
        "example": {"amount": 4200},
    });
    let et = event_type_object("invoice-paid", spec.clone());
    let et = reconcile_event_type(&ctx, &mut api, &et, true, Some("Created")).await;
    let status = serde_json::to_value(et.status.as_ref().unwrap()).unwrap();
    assert_eq!(condition(&status, "Ready")["status"], "True");
    assert_eq!(status["eventType"], "invoice.paid");
    let row = hookd::db::event_types::get(&pool, NS, "invoice.paid")
        .await
        .unwrap()
        .expect("the entry is written");
    assert_eq!(row.managed_by, hookd::domain::ManagedBy::Kubernetes);
    assert_eq!(row.example.as_deref(), Some(r#"{"amount":4200}"#));
    let version = row.version;

    // a resync: no status write, no new version (the API processes keep their compiled schema)
    let et = reconcile_event_type(&ctx, &mut api, &et, false, None).await;
    let row = hookd::db::event_types::get(&pool, NS, "invoice.paid")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.version, version);

    // the API reads it and refuses to change it
    let refused = hookd::catalog::delete(&pool, NS, "invoice.paid").await;
    assert!(
        matches!(
            refused,
            Err(hookd::catalog::CatalogError::ManagedByKubernetes(_))
        ),
        "{refused:?}"
    );

    // a schema that does not compile: Ready=False with what is wrong, the entry as it was
    let mut broken = et.clone();
    broken.spec.schema = Some(json!({"type": "nonsense"}));
    broken.metadata.generation = Some(2);
    let broken = reconcile_event_type(&ctx, &mut api, &broken, true, Some("InvalidSchema")).await;
    let status = serde_json::to_value(broken.status.as_ref().unwrap()).unwrap();
    let ready = condition(&status, "Ready");
    assert_eq!(
        (&ready["status"], &ready["reason"]),
        (&json!("False"), &json!("InvalidSchema"))
    );
    assert!(
        ready["message"].as_str().unwrap().contains("nonsense"),
        "{ready}"
    );
    let row = hookd::db::event_types::get(&pool, NS, "invoice.paid")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.version, version, "the last accepted entry stays");

    // deleted with its object
    let mut deleting = et.clone();
    deleting.metadata.deletion_timestamp =
        Some(hookd::k8s::conditions::to_time(chrono::Utc::now()));
    let run = tokio::spawn(hookd::k8s::event_type_controller::reconcile(
        Arc::new(deleting),
        ctx,
    ));
    let event = api.expect("POST", EVENTS_PATH, echo(201)).await;
    assert_eq!(event.body["reason"], "Deleted");
    api.expect(
        "PATCH",
        &format!("/apis/hookd.dev/v1alpha1/namespaces/{NS}/webhookeventtypes/invoice-paid"),
        |_| {
            let mut obj = serde_json::to_value(&et).unwrap();
            obj["metadata"]["finalizers"] = json!([]);
            (200, obj)
        },
    )
    .await;
    assert_eq!(run.await.unwrap().unwrap(), Action::await_change());
    api.expect_no_more().await;
    assert!(
        hookd::db::event_types::get(&pool, NS, "invoice.paid")
            .await
            .unwrap()
            .is_none()
    );
}
