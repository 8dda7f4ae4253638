//! Shared test kit: fixtures that go through the real code paths (sync core, API router,
//! dispatcher), a real HTTP receiver that verifies every delivery with the official
//! Standard Webhooks verifier, and condition waits (no fixed sleeps).

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use hookd::auth::{AuthMode, Scope};
use hookd::config::{ApiSettings, DispatchSettings};
use hookd::k8s::crd::{SecretKeyRef, WebhookEndpoint, WebhookEndpointSpec};
use hookd::k8s::sync;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

pub mod browser;
mod factory;
mod process;
pub use factory::*;
pub use process::*;

/// Vector A's secret from the Standard Webhooks test vectors.
pub const SECRET_A: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
/// Vector B's secret.
pub const SECRET_B: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";

/// The encryption key of the test kit (HOOKD_ENCRYPTION_KEY format). Child processes get
/// it through the environment ([`TEST_KEY_ENV`]), so they read what in-process fixtures
/// wrote.
pub const TEST_ENCRYPTION_KEY: &str = "test-k1:q7ZJ4bLhxU0FPnS3cT2wdm8vR1yN6gKeA9oXiCjBfMs=";
pub const TEST_KEY_ENV: &str = "HOOKD_ENCRYPTION_KEY";

/// The keyring the kit's fixtures and in-process dispatchers use.
pub fn test_keyring() -> Arc<hookd::crypto::Keyring> {
    Arc::new(keyring(TEST_ENCRYPTION_KEY, ""))
}

/// A keyring from HOOKD_ENCRYPTION_KEY / HOOKD_ENCRYPTION_OLD_KEYS style text.
pub fn keyring(active: &str, older: &str) -> hookd::crypto::Keyring {
    hookd::crypto::Keyring::from_config("active", active, "older", older).unwrap()
}

pub fn init() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_test_writer()
        .try_init();
}

/// A `postgres://` URL for the database behind `pool` (for child processes).
pub fn database_url(pool: &PgPool) -> String {
    let o = pool.connect_options();
    format!(
        "postgres://{}@{}:{}/{}",
        o.get_username(),
        o.get_host(),
        o.get_port(),
        o.get_database().unwrap_or("postgres")
    )
}

pub fn hookd_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_hookd"))
}

/// Waits until `check` returns true, polling every 20 ms; false on timeout.
pub async fn wait_until<F, Fut>(timeout: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if check().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A free TCP port on 127.0.0.1 (for child processes that bind it themselves).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Serves `app` on an ephemeral 127.0.0.1 port until the returned token is cancelled.
pub async fn serve_local(app: axum::Router) -> (SocketAddr, CancellationToken) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    let s = stop.clone();
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(s.cancelled_owned())
            .await
            .ok();
    });
    (addr, stop)
}

// ---- endpoints through the real sync core ----

#[derive(Debug, Clone)]
pub struct EndpointOpts {
    pub namespace: String,
    pub name: String,
    pub tenant: Option<String>,
    pub consumer: Option<String>,
    pub url: String,
    pub event_types: Vec<String>,
    pub secret: String,
    pub paused: bool,
    pub max_attempts: Option<u32>,
    pub retry_schedule: Option<Vec<u32>>,
    pub max_in_flight: Option<u32>,
    pub rate_limit: Option<hookd::endpoints::RateLimit>,
    pub ordering: Option<hookd::endpoints::DeliveryOrder>,
    pub on_dead_letter: Option<hookd::endpoints::OnDeadLetter>,
    pub timeout_seconds: Option<u32>,
    pub grace_seconds: Option<u32>,
}

impl Default for EndpointOpts {
    fn default() -> Self {
        EndpointOpts {
            namespace: "team-a".into(),
            name: format!("ep-{}", Uuid::now_v7().simple()),
            tenant: None,
            consumer: None,
            url: "http://127.0.0.1:9/unused".into(),
            event_types: vec![],
            secret: SECRET_A.into(),
            paused: false,
            max_attempts: None,
            retry_schedule: None,
            max_in_flight: None,
            rate_limit: None,
            ordering: None,
            on_dead_letter: None,
            timeout_seconds: None,
            grace_seconds: None,
        }
    }
}

pub fn webhook_endpoint(o: &EndpointOpts) -> WebhookEndpoint {
    let mut ep = WebhookEndpoint::new(
        &o.name,
        WebhookEndpointSpec {
            url: o.url.clone(),
            event_types: o.event_types.clone(),
            secret_ref: SecretKeyRef {
                name: format!("{}-secret", o.name),
                key: "secret".into(),
            },
            tenant: o.tenant.clone(),
            consumer: o.consumer.clone(),
            paused: o.paused,
            timeout_seconds: o.timeout_seconds,
            max_attempts: o.max_attempts,
            retry_schedule: o.retry_schedule.clone(),
            max_in_flight: o.max_in_flight,
            rate_limit: o.rate_limit,
            ordering: o.ordering,
            on_dead_letter: o.on_dead_letter,
            headers: BTreeMap::new(),
            secret_rotation_grace_seconds: o.grace_seconds,
        },
    );
    ep.metadata.namespace = Some(o.namespace.clone());
    ep
}

/// A v1 Secret holding `value` under key `secret`.
pub fn secret(namespace: &str, name: &str, value: &str) -> k8s_openapi::api::core::v1::Secret {
    let mut s = k8s_openapi::api::core::v1::Secret::default();
    s.metadata.name = Some(name.into());
    s.metadata.namespace = Some(namespace.into());
    s.string_data = Some(BTreeMap::from([("secret".to_string(), value.to_string())]));
    s
}

/// Declares an endpoint through the sync core (as `hookd apply` would), its secret
/// encrypted under the test key; returns its id.
pub async fn endpoint(pool: &PgPool, o: EndpointOpts) -> Uuid {
    endpoint_with_keyring(pool, o, &test_keyring()).await
}

/// [`endpoint`] with the secret encrypted under `keyring`.
pub async fn endpoint_with_keyring(
    pool: &PgPool,
    o: EndpointOpts,
    keyring: &hookd::crypto::Keyring,
) -> Uuid {
    let ep = webhook_endpoint(&o);
    let s = secret(&o.namespace, &format!("{}-secret", o.name), &o.secret);
    let resolved = sync::resolve_secret(
        &o.namespace,
        &format!("{}-secret", o.name),
        "secret",
        Some(&s),
    );
    let desired = sync::desired_endpoint(&ep, resolved);
    let mut conn = pool.acquire().await.unwrap();
    sync::apply_endpoint(&mut conn, &desired, keyring)
        .await
        .unwrap()
        .endpoint_id
}

// ---- the API, in process, on an ephemeral port ----

/// The defaults of `hookd api`, on an ephemeral loopback port.
pub fn api_settings() -> ApiSettings {
    ApiSettings {
        listen: "127.0.0.1:0".parse().unwrap(),
        ..ApiSettings::defaults()
    }
}

/// The tenant whose token `TestApi::get` and `post` use when the request names none.
pub const DEFAULT_TENANT: &str = "team-a";

/// A static API token with `scopes`, straight through the code `hookd token create` runs.
pub async fn mint_token(pool: &PgPool, tenant: &str, scopes: &[Scope]) -> String {
    hookd::auth::tokens::create(
        pool,
        &hookd::auth::tokens::TokenRequest {
            consumer: None,
            tenant: tenant.into(),
            scopes: scopes.to_vec(),
            name: Some("test".into()),
            expires_at: None,
        },
    )
    .await
    .unwrap()
    .token
}

/// The API with real authentication: requests carry real static tokens, minted on first
/// use per tenant (every scope) unless the test passes its own.
pub struct TestApi {
    pub base: String,
    pub client: reqwest::Client,
    pool: PgPool,
    auth: bool,
    tokens: Mutex<HashMap<String, String>>,
    shutdown: CancellationToken,
}

impl Drop for TestApi {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl TestApi {
    pub async fn start(pool: &PgPool) -> TestApi {
        Self::start_with(pool, api_settings()).await
    }

    pub async fn start_with(pool: &PgPool, settings: ApiSettings) -> TestApi {
        Self::start_with_kube(pool, settings, None).await
    }

    /// With a Kubernetes client for TokenReviews (a tower_test mock in the tests).
    pub async fn start_with_kube(
        pool: &PgPool,
        settings: ApiSettings,
        kube: Option<kube::Client>,
    ) -> TestApi {
        init();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        // the endpoints API seals secrets with the key the tests' dispatchers use, and
        // admits loopback receivers as the tests' dispatchers do
        let manage = hookd::api::ManageDeps {
            keyring: Ok(keyring(TEST_ENCRYPTION_KEY, "")),
            allow: hookd::outbound::AllowList::parse("127.0.0.0/8,::1/128").unwrap(),
            public_url: None,
        };
        let state = hookd::api::AppState::start(pool.clone(), &settings, kube, shutdown.clone())
            .with_manage(manage);
        tokio::spawn(hookd::api::server::serve_api_on(
            listener,
            hookd::api::app(state),
            settings.listener_limits(),
            shutdown.clone(),
        ));
        TestApi {
            base: format!("http://{addr}"),
            client: reqwest::Client::new(),
            pool: pool.clone(),
            auth: settings.auth == AuthMode::On,
            tokens: Mutex::new(HashMap::new()),
            shutdown,
        }
    }

    /// The every-scope token of `tenant` (minted once per tenant).
    pub async fn token_for(&self, tenant: &str) -> String {
        if let Some(t) = self.tokens.lock().unwrap().get(tenant) {
            return t.clone();
        }
        let t = mint_token(&self.pool, tenant, &Scope::ALL).await;
        self.tokens
            .lock()
            .unwrap()
            .entry(tenant.to_string())
            .or_insert(t)
            .clone()
    }

    /// A request to `path` authenticated as `tenant` (nothing added when auth is off).
    pub async fn request_as(
        &self,
        tenant: &str,
        method: reqwest::Method,
        path: &str,
    ) -> reqwest::RequestBuilder {
        let req = self.client.request(method, format!("{}{path}", self.base));
        if self.auth {
            req.bearer_auth(self.token_for(tenant).await)
        } else {
            req
        }
    }

    /// POST JSON text (sent byte for byte) as the tenant the body names (the first
    /// message's, for a batch; `DEFAULT_TENANT` if none), and return (status, parsed body).
    pub async fn post(&self, path: &str, body: &str) -> (StatusCode, serde_json::Value) {
        let tenant = body_tenant(body).unwrap_or_else(|| DEFAULT_TENANT.to_string());
        self.post_as(&tenant, path, body).await
    }

    pub async fn post_as(
        &self,
        tenant: &str,
        path: &str,
        body: &str,
    ) -> (StatusCode, serde_json::Value) {
        let r = self
            .request_as(tenant, reqwest::Method::POST, path)
            .await
            .header("content-type", "application/json")
            .body(body.to_string());
        send(r).await
    }

    /// GET as `DEFAULT_TENANT`.
    pub async fn get(&self, path: &str) -> (StatusCode, serde_json::Value) {
        self.get_as(DEFAULT_TENANT, path).await
    }

    pub async fn get_as(&self, tenant: &str, path: &str) -> (StatusCode, serde_json::Value) {
        send(self.request_as(tenant, reqwest::Method::GET, path).await).await
    }

    /// Enqueues one message and returns (eventId, deliveryIds); panics unless 201.
    pub async fn enqueue(
        &self,
        tenant: &str,
        event_type: &str,
        payload: &str,
    ) -> (Uuid, Vec<Uuid>) {
        let body =
            format!(r#"{{"tenant":"{tenant}","eventType":"{event_type}","payload":{payload}}}"#);
        let (status, v) = self.post("/v1/messages", &body).await;
        assert_eq!(status, StatusCode::CREATED, "{v}");
        ids(&v)
    }
}

/// The tenant a message or batch body names, if it is JSON and names one.
fn body_tenant(body: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(body).ok()?;
    let t = v
        .get("tenant")
        .or_else(|| v.get("messages")?.get(0)?.get("tenant"))?;
    t.as_str().map(str::to_owned)
}

/// A request to `api` with an explicit bearer token and an optional JSON body.
pub async fn call(
    api: &TestApi,
    token: &str,
    method: reqwest::Method,
    path: &str,
    body: Option<serde_json::Value>,
) -> (StatusCode, serde_json::Value) {
    let mut r = api
        .client
        .request(method, format!("{}{path}", api.base))
        .bearer_auth(token);
    if let Some(b) = body {
        r = r.json(&b);
    }
    send(r).await
}

/// Sends and returns (status, body parsed as JSON, or as a JSON string if it is not JSON).
pub async fn send(req: reqwest::RequestBuilder) -> (StatusCode, serde_json::Value) {
    let r = req.send().await.unwrap();
    let status = StatusCode::from_u16(r.status().as_u16()).unwrap();
    let text = r.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)),
    )
}

pub fn ids(v: &serde_json::Value) -> (Uuid, Vec<Uuid>) {
    let event = v["eventId"].as_str().unwrap().parse().unwrap();
    let deliveries = v["deliveryIds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap().parse().unwrap())
        .collect();
    (event, deliveries)
}

// ---- a real receiver ----

/// One delivery as received, after verification.
#[derive(Debug, Clone)]
pub struct Received {
    pub webhook_id: String,
    pub idempotency_key: Option<String>,
    pub signature: String,
    pub event_type: Option<String>,
    pub body: Bytes,
    /// verified with the official `standardwebhooks` crate under each configured secret
    pub verified_by: Vec<bool>,
    pub at: std::time::Instant,
    /// every header as sent
    pub headers: HeaderMap,
}

/// How the receiver answers.
#[derive(Debug, Clone)]
pub struct Behavior {
    pub status: u16,
    pub delay: Duration,
    pub retry_after: Option<String>,
}

impl Default for Behavior {
    fn default() -> Self {
        Behavior {
            status: 200,
            delay: Duration::ZERO,
            retry_after: None,
        }
    }
}

#[derive(Clone)]
struct ReceiverState {
    secrets: Vec<String>,
    received: Arc<Mutex<Vec<Received>>>,
    behavior: Arc<Mutex<Behavior>>,
}

pub struct Receiver {
    pub addr: SocketAddr,
    pub received: Arc<Mutex<Vec<Received>>>,
    pub behavior: Arc<Mutex<Behavior>>,
    shutdown: CancellationToken,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl Receiver {
    /// A receiver on 127.0.0.1 that verifies each delivery against each of `secrets`.
    pub async fn start(secrets: &[&str]) -> Receiver {
        let received = Arc::new(Mutex::new(Vec::new()));
        let behavior = Arc::new(Mutex::new(Behavior::default()));
        let state = ReceiverState {
            secrets: secrets.iter().map(|s| s.to_string()).collect(),
            received: received.clone(),
            behavior: behavior.clone(),
        };
        let app = axum::Router::new()
            .fallback(axum::routing::post(receive))
            .with_state(state);
        let (addr, shutdown) = serve_local(app).await;
        Receiver {
            addr,
            received,
            behavior,
            shutdown,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn set(&self, b: Behavior) {
        *self.behavior.lock().unwrap() = b;
    }

    pub fn count(&self) -> usize {
        self.received.lock().unwrap().len()
    }

    pub fn all(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }

    pub fn ids(&self) -> Vec<String> {
        self.received
            .lock()
            .unwrap()
            .iter()
            .map(|r| r.webhook_id.clone())
            .collect()
    }
}

async fn receive(State(st): State<ReceiverState>, headers: HeaderMap, body: Bytes) -> Response {
    let behavior = st.behavior.lock().unwrap().clone();
    let h = |n: &str| {
        headers
            .get(n)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let verified_by = st
        .secrets
        .iter()
        .map(|s| {
            standardwebhooks::Webhook::new(s)
                .map(|w| w.verify(&body, &headers).is_ok())
                .unwrap_or(false)
        })
        .collect();
    if !behavior.delay.is_zero() {
        tokio::time::sleep(behavior.delay).await;
    }
    st.received.lock().unwrap().push(Received {
        webhook_id: h("webhook-id").unwrap_or_default(),
        idempotency_key: h("idempotency-key"),
        signature: h("webhook-signature").unwrap_or_default(),
        event_type: h("hookd-event-type"),
        body,
        verified_by,
        at: std::time::Instant::now(),
        headers,
    });
    let mut resp = (StatusCode::from_u16(behavior.status).unwrap(), "ok").into_response();
    if let Some(ra) = behavior.retry_after {
        resp.headers_mut()
            .insert("retry-after", ra.parse().unwrap());
    }
    resp
}

// ---- the dispatcher, in process ----

/// Fast settings for tests: loopback admitted, short schedule, quick polling.
pub fn dispatch_settings() -> DispatchSettings {
    DispatchSettings {
        listen: "127.0.0.1:0".parse().unwrap(),
        lease_secs: 30,
        request_timeout_secs: 10,
        concurrency: 64,
        endpoint_concurrency: 16,
        allowed_destinations: "127.0.0.0/8".into(),
        retry_schedule: "1,1,1".into(),
        retry_jitter: 0.0,
        poll_ms: 50,
        shutdown_grace_secs: 5,
        response_snippet_bytes: 256,
        ..DispatchSettings::defaults()
    }
}

pub struct TestDispatcher {
    shutdown: CancellationToken,
    handle: Option<tokio::task::JoinHandle<()>>,
    pub worker_id: Uuid,
    pub metrics: hookd::metrics::Metrics,
}

impl TestDispatcher {
    /// An in-process dispatcher with the test key.
    pub async fn start(pool: &PgPool, settings: DispatchSettings) -> TestDispatcher {
        let cfg = hookd::dispatch::DispatchConfig::from_settings(&settings).unwrap();
        Self::start_with(pool, cfg, test_keyring()).await
    }

    /// An in-process dispatcher with its own configuration (e.g. a scripted resolver)
    /// and keyring.
    pub async fn start_with(
        pool: &PgPool,
        cfg: hookd::dispatch::DispatchConfig,
        keyring: Arc<hookd::crypto::Keyring>,
    ) -> TestDispatcher {
        init();
        let worker_id = cfg.worker_id;
        let shutdown = CancellationToken::new();
        let metrics = hookd::metrics::Metrics::new();
        let handle = tokio::spawn(hookd::dispatch::run_dispatcher(
            pool.clone(),
            cfg,
            keyring,
            metrics.clone(),
            shutdown.clone(),
        ));
        TestDispatcher {
            shutdown,
            handle: Some(handle),
            worker_id,
            metrics,
        }
    }

    /// Graceful stop (as on SIGTERM), waiting for it to finish.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        if let Some(h) = self.handle.take() {
            h.await.unwrap();
        }
    }
}

impl Drop for TestDispatcher {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Status of one delivery straight from the table.
pub async fn delivery_status(pool: &PgPool, id: Uuid) -> (String, i32) {
    sqlx::query_as("SELECT status, attempts FROM hookd.deliveries WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Hex HMAC-SHA256, as GitHub and Stripe sign.
pub fn hmac_hex(key: &[u8], content: &[u8]) -> String {
    use hmac::Mac as _;
    let mut m = hmac::Hmac::<sha2::Sha256>::new_from_slice(key).unwrap();
    m.update(content);
    m.finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Stripe's scheme: `t={unix}`, `v1=` hex HMAC-SHA256 of `{t}.{body}` keyed with the
/// secret as shown (`whsec_…` included).
pub fn stripe_signature(secret: &str, t: i64, body: &str) -> String {
    format!(
        "t={t},v1={}",
        hmac_hex(secret.as_bytes(), format!("{t}.{body}").as_bytes())
    )
}

/// A claim of up to `limit` rows by `worker_id` at `now` (None: the database's clock), with
/// a 30 s lease and no per-endpoint cap that matters (1000).
pub fn claim_req(
    worker_id: Uuid,
    limit: i64,
    now: Option<chrono::DateTime<chrono::Utc>>,
) -> hookd::db::deliveries::ClaimRequest {
    hookd::db::deliveries::ClaimRequest {
        worker_id,
        limit,
        lease_secs: 30.0,
        per_endpoint_cap: 1000,
        busy: Vec::new(),
        now,
        default_max_attempts: 8,
    }
}

/// Runs the README's `sh` block marked `<!-- tested: {tested_by} runs this block as
/// written -->` with `bash -e`, as the guide sets its variables (`API`, `TOKEN`, and
/// `ENDPOINT` when given), and returns its standard output; panics unless it succeeds.
pub async fn run_readme_block(
    tested_by: &str,
    api: &TestApi,
    token: &str,
    endpoint: Option<&str>,
) -> String {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let marker = format!("<!-- tested: {tested_by} runs this block as written -->\n```sh\n");
    let start = readme.find(&marker).expect("the README has the block") + marker.len();
    let block = &readme[start..start + readme[start..].find("```").unwrap()];
    let mut cmd = tokio::process::Command::new("bash");
    cmd.args(["-e", "-c", block])
        .env("API", &api.base)
        .env("TOKEN", token);
    if let Some(id) = endpoint {
        cmd.env("ENDPOINT", id);
    }
    let out = cmd.output().await.unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}
