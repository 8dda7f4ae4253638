//! `hookd controller` as a real process, against an in-test stand-in for the Kubernetes
//! API server (the one part that cannot run here) and a real Postgres.
//!
//! The stand-in serves list/watch for the watched kinds, GET of Secrets, the Lease with
//! server-side-apply conflict semantics (what kube-lease-manager's locking relies on), and
//! records every write. That is enough to prove the wiring the unit-level controller tests
//! cannot: kubeconfig discovery, leader election, watches and readiness, a reconcile
//! through kube's Controller machinery into Postgres and back as a status patch, SIGTERM
//! releasing the Lease, and a standby replica taking over when the leader is SIGKILLed.

use crate::common;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use serde_json::{Value, json};
use sqlx::PgPool;

use common::*;

const LEASE_PATH: &str =
    "/apis/coordination.k8s.io/v1/namespaces/hookd-system/leases/hookd-controller";

#[derive(Default)]
struct Fake {
    lease: Option<Value>,
    /// the field manager owning `spec.holderIdentity` (server-side apply conflicts)
    holder_manager: Option<String>,
    endpoints: Vec<Value>,
    dispatchers: Vec<Value>,
    secrets: BTreeMap<String, Value>,
    endpoint_status: Vec<Value>,
    dispatcher_status: Vec<Value>,
    deployments: Vec<Value>,
    events: Vec<Value>,
    unexpected: Vec<String>,
    rv: u64,
    /// answer every Lease write with 500 (renewals fail)
    fail_lease_writes: bool,
    /// when the last Lease write was answered with success
    last_lease_write_ok: Option<std::time::Instant>,
    /// the WebhookDispatcher CRD is gone: its list and watch answer 404, and open watches
    /// of it end (what the API server does when a CRD is deleted)
    dispatcher_crd_gone: Arc<std::sync::atomic::AtomicBool>,
}

type Shared = Arc<Mutex<Fake>>;

fn json_response(code: u16, v: Value) -> Response {
    (
        StatusCode::from_u16(code).unwrap(),
        [("content-type", "application/json")],
        v.to_string(),
    )
        .into_response()
}

fn status(code: u16, reason: &str) -> Response {
    json_response(
        code,
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason,
               "message": reason, "code": code}),
    )
}

fn list(kind: &str, api_version: &str, items: Vec<Value>, rv: u64) -> Response {
    json_response(
        200,
        json!({"apiVersion": api_version, "kind": kind,
               "metadata": {"resourceVersion": rv.to_string()}, "items": items}),
    )
}

/// A watch that stays open and quiet until `gone` is set, then ends.
fn watch_until(gone: Arc<std::sync::atomic::AtomicBool>) -> Response {
    let ended = futures::stream::unfold(gone, |gone| async move {
        while !gone.load(std::sync::atomic::Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        None::<(Result<Bytes, Infallible>, _)>
    });
    Response::builder()
        .header("content-type", "application/json")
        .body(Body::from_stream(ended))
        .unwrap()
}

/// A watch that stays open and quiet: the stand-in's objects never change by themselves.
fn quiet_watch() -> Response {
    Response::builder()
        .header("content-type", "application/json")
        .body(Body::from_stream(futures::stream::pending::<
            Result<Bytes, Infallible>,
        >()))
        .unwrap()
}

fn metadata_only(v: &Value) -> Value {
    json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": v["metadata"]})
}

fn merge_spec(lease: &mut Value, patch: &Value) {
    let spec = lease["spec"].as_object_mut().unwrap();
    for (k, v) in patch["spec"].as_object().unwrap() {
        if v.is_null() {
            spec.remove(k);
        } else {
            spec.insert(k.clone(), v.clone());
        }
    }
}

async fn handle(
    State(fake): State<Shared>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_string();
    let query: BTreeMap<String, String> = uri
        .query()
        .unwrap_or_default()
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let watch = query.get("watch").is_some_and(|w| w == "true" || w == "1");
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let mut f = fake.lock().unwrap();
    f.rv += 1;
    let rv = f.rv;
    match (method.as_str(), path.as_str()) {
        // ---- the Lease, with server-side-apply conflicts on holderIdentity ----
        ("GET", LEASE_PATH) => match &f.lease {
            Some(l) => json_response(200, l.clone()),
            None => status(404, "NotFound"),
        },
        ("POST", "/apis/coordination.k8s.io/v1/namespaces/hookd-system/leases") => {
            if f.lease.is_some() {
                return status(409, "AlreadyExists");
            }
            let mut lease = body.clone();
            lease["metadata"]["namespace"] = json!("hookd-system");
            lease["metadata"]["resourceVersion"] = json!(rv.to_string());
            lease["spec"] = json!({});
            f.lease = Some(lease.clone());
            json_response(201, lease)
        }
        ("PATCH", LEASE_PATH) if f.fail_lease_writes => status(500, "InternalError"),
        ("PATCH", LEASE_PATH) => {
            f.last_lease_write_ok = Some(std::time::Instant::now());
            let manager = query.get("fieldManager").cloned().unwrap_or_default();
            let ct = headers
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            let Some(mut lease) = f.lease.clone() else {
                return status(404, "NotFound");
            };
            let new_holder = body["spec"].get("holderIdentity").cloned();
            if ct.starts_with("application/apply-patch")
                && let Some(Value::String(h)) = &new_holder
                && let Some(cur) = lease["spec"]["holderIdentity"].as_str()
                && cur != h
                && f.holder_manager.as_deref() != Some(manager.as_str())
            {
                return status(409, "Conflict");
            }
            merge_spec(&mut lease, &body);
            match new_holder {
                Some(Value::Null) => f.holder_manager = None,
                Some(_) => f.holder_manager = Some(manager),
                None => {}
            }
            lease["metadata"]["resourceVersion"] = json!(rv.to_string());
            f.lease = Some(lease.clone());
            json_response(200, lease)
        }
        // ---- watched collections ----
        ("GET", "/apis/hookd.dev/v1alpha1/webhookendpoints") if watch => quiet_watch(),
        ("GET", "/apis/hookd.dev/v1alpha1/webhookendpoints") => {
            let items = f.endpoints.clone();
            list("WebhookEndpointList", "hookd.dev/v1alpha1", items, rv)
        }
        ("GET", "/apis/hookd.dev/v1alpha1/webhooksources") if watch => quiet_watch(),
        ("GET", "/apis/hookd.dev/v1alpha1/webhooksources") => {
            list("WebhookSourceList", "hookd.dev/v1alpha1", vec![], rv)
        }
        ("GET", "/apis/hookd.dev/v1alpha1/webhookeventtypes") if watch => quiet_watch(),
        ("GET", "/apis/hookd.dev/v1alpha1/webhookeventtypes") => {
            list("WebhookEventTypeList", "hookd.dev/v1alpha1", vec![], rv)
        }
        ("GET", "/api/v1/secrets") if watch => quiet_watch(),
        ("GET", "/api/v1/secrets") => {
            let items = f.secrets.values().map(metadata_only).collect();
            list("PartialObjectMetadataList", "meta.k8s.io/v1", items, rv)
        }
        ("GET", "/apis/hookd.dev/v1alpha1/namespaces/hookd-system/webhookdispatchers")
            if f.dispatcher_crd_gone
                .load(std::sync::atomic::Ordering::SeqCst) =>
        {
            status(404, "NotFound")
        }
        ("GET", "/apis/hookd.dev/v1alpha1/namespaces/hookd-system/webhookdispatchers") if watch => {
            watch_until(f.dispatcher_crd_gone.clone())
        }
        ("GET", "/apis/hookd.dev/v1alpha1/namespaces/hookd-system/webhookdispatchers") => {
            let items = f.dispatchers.clone();
            list("WebhookDispatcherList", "hookd.dev/v1alpha1", items, rv)
        }
        ("GET", "/apis/apps/v1/namespaces/hookd-system/deployments") if watch => quiet_watch(),
        ("GET", "/apis/apps/v1/namespaces/hookd-system/deployments") => {
            list("PartialObjectMetadataList", "meta.k8s.io/v1", vec![], rv)
        }
        // ---- reads and writes of single objects ----
        ("GET", p) if p.starts_with("/api/v1/namespaces/") && p.contains("/secrets/") => {
            match f.secrets.get(p) {
                Some(s) => json_response(200, s.clone()),
                None => status(404, "NotFound"),
            }
        }
        ("PATCH", p)
            if p.starts_with("/apis/hookd.dev/v1alpha1/namespaces/")
                && p.contains("/webhookendpoints/")
                && p.ends_with("/status") =>
        {
            f.endpoint_status.push(body.clone());
            let mut obj = f.endpoints[0].clone();
            obj["status"] = body["status"].clone();
            json_response(200, obj)
        }
        ("PATCH", p) if p.contains("/webhookdispatchers/") && p.ends_with("/status") => {
            f.dispatcher_status.push(body.clone());
            let mut obj = f.dispatchers[0].clone();
            obj["status"] = body["status"].clone();
            json_response(200, obj)
        }
        ("PATCH", p) if p.starts_with("/apis/apps/v1/namespaces/hookd-system/deployments/") => {
            f.deployments.push(body.clone());
            let mut obj = body.clone();
            obj["status"] = json!({"readyReplicas": body["spec"]["replicas"]});
            json_response(200, obj)
        }
        ("POST", p) if p.ends_with("/events") => {
            f.events.push(body.clone());
            json_response(201, body)
        }
        (m, p) => {
            f.unexpected
                .push(format!("{m} {p}?{}", uri.query().unwrap_or_default()));
            status(404, "NotFound")
        }
    }
}

struct ApiServer {
    fake: Shared,
    kubeconfig: PathBuf,
    _dir: TempDir,
    _stop: tokio_util::sync::CancellationToken,
}

/// A temp dir removed on drop.
struct TempDir(PathBuf);
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn api_server(fake: Fake) -> ApiServer {
    api_server_on(fake, "127.0.0.1:0").await
}

/// The stand-in on `addr` (a fixed port: a kubeconfig written before it listened).
async fn api_server_on(fake: Fake, addr: &str) -> ApiServer {
    let fake = Arc::new(Mutex::new(fake));
    let app = axum::Router::new()
        .fallback(handle)
        .with_state(fake.clone());
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let s = stop.clone();
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(s.cancelled_owned())
            .await
            .ok();
    });
    let dir = std::env::temp_dir().join(format!("hookd-kubeconfig-{}", uuid::Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("config");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster: {{server: \"http://{addr}\"}}\nusers:\n- name: fake\n  user: {{token: test}}\ncontexts:\n- name: fake\n  context: {{cluster: fake, user: fake, namespace: default}}\ncurrent-context: fake\n"
        ),
    )
    .unwrap();
    ApiServer {
        fake,
        kubeconfig,
        _dir: TempDir(dir),
        _stop: stop,
    }
}

fn world() -> Fake {
    let secret_value = base64::engine::general_purpose::STANDARD.encode(SECRET_A);
    let mut f = Fake::default();
    f.endpoints.push(json!({
        "apiVersion": "hookd.dev/v1alpha1", "kind": "WebhookEndpoint",
        "metadata": {"name": "orders", "namespace": "shop", "uid": "ep-uid", "generation": 1,
                     "resourceVersion": "5", "finalizers": ["hookd.dev/endpoint"]},
        "spec": {"url": "https://receiver.example.com/hook", "secretRef": {"name": "orders-signing"}}
    }));
    f.secrets.insert(
        "/api/v1/namespaces/shop/secrets/orders-signing".into(),
        json!({"apiVersion": "v1", "kind": "Secret",
               "metadata": {"name": "orders-signing", "namespace": "shop", "resourceVersion": "3"},
               "data": {"secret": secret_value}}),
    );
    f.dispatchers.push(json!({
        "apiVersion": "hookd.dev/v1alpha1", "kind": "WebhookDispatcher",
        "metadata": {"name": "default", "namespace": "hookd-system", "uid": "d-uid", "generation": 1,
                     "resourceVersion": "6"},
        "spec": {"replicas": 2, "databaseSecretRef": {"name": "hookd-database"}}
    }));
    f
}

struct Replica {
    child: HookdProcess,
    listen: String,
}

fn start_replica(pool: &PgPool, api: &ApiServer, name: &str) -> Replica {
    start_replica_with_lease(pool, api, name, 4)
}

fn start_replica_with_lease(
    pool: &PgPool,
    api: &ApiServer,
    name: &str,
    lease_secs: u64,
) -> Replica {
    start_replica_with_kubeconfig(pool, &api.kubeconfig, name, lease_secs)
}

fn start_replica_with_kubeconfig(
    pool: &PgPool,
    kubeconfig: &std::path::Path,
    name: &str,
    lease_secs: u64,
) -> Replica {
    let listen = format!("127.0.0.1:{}", free_port());
    let child = HookdCommand::new(["controller"])
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("KUBECONFIG", kubeconfig)
        .database(pool)
        .env("HOOKD_LISTEN", &listen)
        .env("POD_NAME", name)
        .env("POD_NAMESPACE", "hookd-system")
        .env("HOOKD_LEASE_DURATION_SECS", lease_secs.to_string())
        .env("HOOKD_IMAGE", "registry.example/hookd:9.9")
        .test_key()
        .env("HOOKD_LOG", "info")
        .spawn();
    Replica { child, listen }
}

async fn get_text(url: &str) -> Option<(u16, String)> {
    let r = reqwest::get(url).await.ok()?;
    Some((r.status().as_u16(), r.text().await.ok()?))
}

fn holder(api: &ApiServer) -> Option<String> {
    api.fake.lock().unwrap().lease.as_ref()?["spec"]["holderIdentity"]
        .as_str()
        .map(str::to_owned)
}

/// One replica end to end: it takes the Lease, syncs its watches (readyz), reconciles the
/// WebhookEndpoint into Postgres and writes its status, applies the dispatcher Deployment
/// with HOOKD_IMAGE, serves metrics, and on SIGTERM releases the Lease and exits 0.
#[sqlx::test]
async fn controller_process_reconciles_and_releases_the_lease(pool: PgPool) {
    init();
    let api = api_server(world()).await;
    let mut replica = start_replica(&pool, &api, "replica-a");
    let health = format!("http://{}", replica.listen);

    assert!(
        wait_until(Duration::from_secs(30), || async {
            sqlx::query_scalar::<_, String>(
                "SELECT state FROM hookd.endpoints WHERE k8s_namespace = 'shop' AND k8s_name = 'orders'",
            )
            .fetch_optional(&pool)
            .await
            .unwrap()
                == Some("active".into())
        })
        .await,
        "the endpoint row was never written; unexpected calls: {:?}",
        api.fake.lock().unwrap().unexpected
    );
    assert!(
        wait_until(Duration::from_secs(10), || async {
            let f = api.fake.lock().unwrap();
            // the Event is published after the status write, best-effort: wait for it too
            !f.endpoint_status.is_empty()
                && !f.deployments.is_empty()
                && !f.dispatcher_status.is_empty()
                && f.events.iter().any(|e| e["reason"] == "Created")
        })
        .await,
        "writes: {} endpoint status, {} deployments, {} dispatcher status; unexpected: {:?}",
        api.fake.lock().unwrap().endpoint_status.len(),
        api.fake.lock().unwrap().deployments.len(),
        api.fake.lock().unwrap().dispatcher_status.len(),
        api.fake.lock().unwrap().unexpected
    );
    assert_eq!(holder(&api).as_deref(), Some("replica-a"));
    {
        let f = api.fake.lock().unwrap();
        let status = &f.endpoint_status[0]["status"];
        let ready = status["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "Ready")
            .unwrap();
        assert_eq!(ready["status"], "True", "{status}");
        let deployment = &f.deployments[0];
        assert_eq!(deployment["spec"]["replicas"], 2);
        assert_eq!(
            deployment["spec"]["template"]["spec"]["containers"][0]["image"],
            "registry.example/hookd:9.9"
        );
        assert!(f.events.iter().any(|e| e["reason"] == "Created"));
        assert!(
            f.unexpected.is_empty(),
            "unexpected calls: {:?}",
            f.unexpected
        );
    }
    assert!(
        wait_until(Duration::from_secs(10), || async {
            get_text(&format!("{health}/readyz")).await == Some((200, "ready".into()))
        })
        .await,
        "readyz: {:?}",
        get_text(&format!("{health}/readyz")).await
    );
    let (_, metrics) = get_text(&format!("{health}/metrics")).await.unwrap();
    assert!(metrics.contains("hookd_leader 1"), "{metrics}");
    assert!(
        metrics.contains(r#"hookd_reconciles_total{controller="webhookendpoint",result="ok"}"#),
        "{metrics}"
    );

    // SIGTERM: the controllers stop, the Lease is released for a standby, exit 0
    replica.child.signal("TERM");
    let exit = replica
        .child
        .wait_timeout(Duration::from_secs(15))
        .await
        .expect("exits after SIGTERM");
    assert!(exit.success(), "{exit:?}");
    assert_eq!(holder(&api), None, "the Lease was released on shutdown");
}

/// Two replicas: one leads, the other stands by (ready, not reconciling). SIGKILL the
/// leader — no chance to release — and the standby takes over once the Lease expires.
#[sqlx::test]
async fn standby_replica_takes_over_when_the_leader_is_killed(pool: PgPool) {
    init();
    let api = api_server(world()).await;
    let mut a = start_replica(&pool, &api, "replica-a");
    assert!(
        wait_until(Duration::from_secs(30), || async {
            holder(&api).as_deref() == Some("replica-a")
        })
        .await,
        "replica-a never took the Lease; unexpected calls: {:?}",
        api.fake.lock().unwrap().unexpected
    );
    let b = start_replica(&pool, &api, "replica-b");
    let b_health = format!("http://{}", b.listen);
    assert!(
        wait_until(Duration::from_secs(20), || async {
            get_text(&format!("{b_health}/readyz")).await == Some((200, "standby".into()))
        })
        .await
    );
    // b stays standby while a renews (several lease durations)
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(holder(&api).as_deref(), Some("replica-a"));
    let (_, metrics) = get_text(&format!("{b_health}/metrics")).await.unwrap();
    assert!(metrics.contains("hookd_leader 0"), "{metrics}");

    a.child.kill(); // SIGKILL: the Lease is left held
    // from here on every write comes from replica-b
    let (deployments_before, statuses_before) = {
        let f = api.fake.lock().unwrap();
        (f.deployments.len(), f.endpoint_status.len())
    };
    assert_eq!(holder(&api).as_deref(), Some("replica-a"));
    assert!(
        wait_until(Duration::from_secs(30), || async {
            holder(&api).as_deref() == Some("replica-b")
        })
        .await,
        "replica-b did not take over"
    );
    assert!(
        wait_until(Duration::from_secs(20), || async {
            get_text(&format!("{b_health}/readyz")).await == Some((200, "ready".into()))
        })
        .await
    );
    let (_, metrics) = get_text(&format!("{b_health}/metrics")).await.unwrap();
    assert!(metrics.contains("hookd_leader 1"), "{metrics}");
    // the new leader reconciles everything it lists: the Deployment is applied again and
    // the endpoint's status written (the stand-in serves the object without a status)
    assert!(
        wait_until(Duration::from_secs(20), || async {
            let f = api.fake.lock().unwrap();
            f.deployments.len() > deployments_before && f.endpoint_status.len() > statuses_before
        })
        .await,
        "replica-b did not reconcile after taking over"
    );
    assert!(api.fake.lock().unwrap().unexpected.is_empty());
}

/// Renewals start failing (the API server answers the Lease writes with 500): the leader
/// stops reconciling before its Lease could expire and another replica take it over —
/// and stays up, campaigning again (e2e/run.sh --control-plane local shows it leading
/// again after a real API outage). Before, it exited 1: an API stall of ~2.5 s over a renewal (a control-plane
/// upgrade) ended every leader, and the Deployment went into CrashLoopBackOff.
#[sqlx::test]
async fn leader_stops_before_its_lease_can_be_taken_over_and_stays_up(pool: PgPool) {
    init();
    let api = api_server(world()).await;
    // 9 s: renewals start 3 s before expiry and the leader gives them 1.5 s, leaving the
    // process 1.5 s to stop, however loaded the machine running this test is
    let mut replica = start_replica_with_lease(&pool, &api, "replica-a", 9);
    let health = format!("http://{}", replica.listen);
    assert!(
        wait_until(Duration::from_secs(30), || async {
            holder(&api).as_deref() == Some("replica-a")
                && get_text(&format!("{health}/readyz")).await == Some((200, "ready".into()))
        })
        .await,
        "replica-a never led"
    );
    let last_ok = {
        let mut f = api.fake.lock().unwrap();
        f.fail_lease_writes = true;
        f.last_lease_write_ok.expect("the Lease was written")
    };
    // standing by again: the controllers were stopped
    assert!(
        wait_until(Duration::from_secs(20), || async {
            get_text(&format!("{health}/readyz")).await == Some((200, "standby".into()))
        })
        .await,
        "the leader did not stop when it could not renew; alive: {}; output:\n{}",
        replica.child.is_running(),
        replica.child.output()
    );
    let stopped = last_ok.elapsed();
    println!(
        "renewals failing: the leader stopped {stopped:?} after its last successful Lease write (Lease duration 9 s)"
    );
    // HOOKD_LEASE_DURATION_SECS=9: a standby may take over 9 s after the last renewal
    assert!(
        stopped < Duration::from_secs(9),
        "stopped {stopped:?} after the last renewal, when the Lease may already be another's"
    );
    // the gauge is cleared just after the controllers stop
    assert!(
        wait_until(Duration::from_secs(10), || async {
            get_text(&format!("{health}/metrics"))
                .await
                .is_some_and(|(_, m)| m.contains("hookd_leader 0"))
        })
        .await
    );
    assert!(
        replica.child.is_running(),
        "losing leadership must not end the process:\n{}",
        replica.child.output()
    );
}

/// The API server cannot be reached when the controller starts (a control-plane upgrade,
/// a node whose network is not up yet): it keeps retrying instead of exiting, and leads
/// once the API server answers. Before, the Lease builder's first error ended the process
/// with exit 1 within half a second.
#[sqlx::test]
async fn controller_waits_for_an_api_server_that_cannot_be_reached_at_start(pool: PgPool) {
    init();
    let addr = format!("127.0.0.1:{}", free_port());
    let dir = std::env::temp_dir().join(format!("hookd-kubeconfig-{}", uuid::Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    let _dir = TempDir(dir.clone());
    let kubeconfig = dir.join("config");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster: {{server: \"http://{addr}\"}}\nusers:\n- name: fake\n  user: {{token: test}}\ncontexts:\n- name: fake\n  context: {{cluster: fake, user: fake, namespace: default}}\ncurrent-context: fake\n"
        ),
    )
    .unwrap();
    let mut replica = start_replica_with_kubeconfig(&pool, &kubeconfig, "replica-a", 9);
    let health = format!("http://{}", replica.listen);
    // two failed attempts at least (retried with a backoff), and still running
    assert!(
        wait_until(Duration::from_secs(30), || async {
            replica
                .child
                .output()
                .matches("cannot read or create the leader Lease; retrying")
                .count()
                >= 2
        })
        .await,
        "no retries of the unreachable API server; alive: {}; output:\n{}",
        replica.child.is_running(),
        replica.child.output()
    );
    assert!(
        replica.child.is_running(),
        "exited while the API server could not be reached:\n{}",
        replica.child.output()
    );
    assert_eq!(
        get_text(&format!("{health}/healthz")).await.map(|(c, _)| c),
        Some(200)
    );

    let api = api_server_on(world(), &addr).await;
    assert!(
        wait_until(Duration::from_secs(60), || async {
            holder(&api).as_deref() == Some("replica-a")
                && get_text(&format!("{health}/readyz")).await == Some((200, "ready".into()))
        })
        .await,
        "did not lead once the API server answered; output:\n{}",
        replica.child.output()
    );
}

/// A CRD deleted while the controller runs: the API server ends the watches of it and
/// answers 404 from then on. `/readyz` turns 503 and says which watch fails and why, and
/// the log says so at warn; when the CRD is back, ready again. Before, `/readyz` stayed 200
/// and the 404s were logged at debug only.
#[sqlx::test]
async fn readyz_turns_false_and_says_why_when_a_crd_is_deleted(pool: PgPool) {
    init();
    let api = api_server(world()).await;
    let replica = start_replica(&pool, &api, "replica-a");
    let health = format!("http://{}", replica.listen);
    assert!(
        wait_until(Duration::from_secs(30), || async {
            get_text(&format!("{health}/readyz")).await == Some((200, "ready".into()))
        })
        .await,
        "never ready: {:?}",
        get_text(&format!("{health}/readyz")).await
    );
    let gone = api.fake.lock().unwrap().dispatcher_crd_gone.clone();
    gone.store(true, std::sync::atomic::Ordering::SeqCst);
    assert!(
        wait_until(Duration::from_secs(30), || async {
            matches!(get_text(&format!("{health}/readyz")).await,
                Some((503, body)) if body.contains("webhookdispatchers.hookd.dev") && body.contains("404"))
        })
        .await,
        "readyz after the CRD went: {:?}",
        get_text(&format!("{health}/readyz")).await
    );
    // the warning is written as readiness turns; the reader of the child's output may be
    // a moment behind
    let warned = || {
        replica.child.output().lines().any(|l| {
            l.contains("WARN")
                && l.contains("watch failing")
                && l.contains("webhookdispatchers.hookd.dev")
        })
    };
    assert!(
        wait_until(Duration::from_secs(20), || async { warned() }).await,
        "no warning naming the failing watch:\n{}",
        replica.child.output()
    );
    gone.store(false, std::sync::atomic::Ordering::SeqCst);
    assert!(
        wait_until(Duration::from_secs(60), || async {
            get_text(&format!("{health}/readyz")).await == Some((200, "ready".into()))
        })
        .await,
        "not ready again after the CRD came back: {:?}",
        get_text(&format!("{health}/readyz")).await
    );
}
