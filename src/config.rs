//! Typed configuration: one struct per component, from flags with `HOOKD_*` (and
//! `DATABASE_URL`) environment equivalents. `--help` shows every doc comment here. Plain
//! values only: this module depends on no component (the command line that assembles
//! them is `cli`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::db::PoolSettings;
use crate::domain::{AuthMode, NamespaceTenants, Scope};

/// A settings type as its flags' defaults make it, whatever the environment holds: the
/// one place defaults are written is the `#[arg(default_value…)]` of each field, and
/// tests, `hookd dev` and the bench start from this instead of restating them.
fn clap_defaults<T: Args + clap::FromArgMatches>() -> T {
    // without their environment variables, so a HOOKD_* set in the caller's shell never
    // changes what "the default" means
    let cmd = T::augment_args(clap::Command::new("defaults")).mut_args(|a| a.env(None));
    let matches = cmd
        .try_get_matches_from(["defaults"])
        .expect("every setting of a component has a default");
    T::from_arg_matches(&matches).expect("defaults parse into their settings type")
}

macro_rules! settings_defaults {
    ($($t:ty),*) => {$(
        impl $t {
            /// The settings with every flag at its default (environment ignored).
            pub fn defaults() -> Self {
                clap_defaults()
            }
        }
    )*};
}

settings_defaults!(
    ApiSettings,
    DispatchSettings,
    RetentionSettings,
    ControllerSettings
);

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Args)]
pub struct DbArgs {
    /// Postgres connection URL, e.g. postgres://hookd@db:5432/hookd
    // hide_env_values: `--help` would print the URL, password included
    #[arg(long = "database-url", env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: String,
    /// Most connections this process opens
    #[arg(long, env = "HOOKD_DB_MAX_CONNECTIONS", default_value_t = 16)]
    pub db_max_connections: u32,
    /// How long a request waits for a free connection before it is answered 503
    #[arg(long, env = "HOOKD_DB_ACQUIRE_TIMEOUT_MS", default_value_t = 5000)]
    pub db_acquire_timeout_ms: u64,
    /// What DATABASE_URL reaches: `none` (Postgres itself, or a pooler in session mode) or `transaction` (a pooler in transaction mode, e.g. PgBouncer `pool_mode = transaction`: no named prepared statements, every statement in a transaction; `hookd migrate` and LISTEN need a direct connection, see docs/poolers.md)
    #[arg(
        long,
        env = "HOOKD_DATABASE_POOLER",
        value_enum,
        default_value = "none"
    )]
    pub database_pooler: crate::db::Pooler,
}

impl DbArgs {
    pub fn pool_settings(&self) -> PoolSettings {
        PoolSettings {
            url: self.database_url.clone(),
            max_connections: self.db_max_connections,
            acquire_timeout: Duration::from_millis(self.db_acquire_timeout_ms),
        }
    }
}

#[derive(Debug, Clone, Args)]
pub struct ApiArgs {
    #[command(flatten)]
    pub db: DbArgs,
    #[command(flatten)]
    pub api: ApiSettings,
    #[command(flatten)]
    pub manage: ManageSettings,
    /// The key that seals signing secrets the endpoints API generates or receives (the same key the dispatchers decrypt with)
    #[command(flatten)]
    pub keys: KeyArgs,
}

/// What the endpoints and consumers API needs beyond the database.
#[derive(Debug, Clone, Args)]
pub struct ManageSettings {
    /// Destinations admitted despite being private/loopback/link-local (comma-separated CIDRs); endpoint URLs are checked against it at create time. Give the API the dispatchers' value
    #[arg(long, env = "HOOKD_ALLOWED_DESTINATIONS", default_value = "")]
    pub allowed_destinations: String,
    /// Public base URL of this API (e.g. https://hooks.example.com), for portal links; default: links relative to the API
    #[arg(long, env = "HOOKD_PUBLIC_URL")]
    pub public_url: Option<String>,
}

#[derive(Debug, Clone, Args)]
pub struct ApiSettings {
    /// Address the API listens on
    #[arg(long, env = "HOOKD_LISTEN", default_value = "0.0.0.0:8080")]
    pub listen: SocketAddr,
    /// Largest accepted payload, in bytes (413 above it)
    #[arg(long, env = "HOOKD_MAX_PAYLOAD_BYTES", default_value_t = 256 * 1024)]
    pub max_payload_bytes: usize,
    /// Most messages in one POST /v1/messages/batch
    #[arg(long, env = "HOOKD_MAX_BATCH", default_value_t = 100)]
    pub max_batch: usize,
    /// Ingest committer tasks; concurrent requests share their transactions (group commit)
    #[arg(long, env = "HOOKD_INGEST_COMMITTERS", default_value_t = 4)]
    pub ingest_committers: usize,
    /// Most messages one shared ingest transaction carries
    #[arg(long, env = "HOOKD_INGEST_MAX_GROUP", default_value_t = 256)]
    pub ingest_max_group: usize,
    /// How long a request waits (ms) for another holder of its idempotency key or its
    /// orderingKey's line (a request still committing, or a producer's open transaction
    /// through hookd.enqueue) before it is answered 409 idempotency_key_in_use (or
    /// ordering_key_in_use). Only that request waits.
    #[arg(long, env = "HOOKD_IDEMPOTENCY_WAIT_MS", default_value_t = 5000)]
    pub idempotency_wait_ms: u64,
    /// Send a coalesced NOTIFY after each commit, naming the new deliveries, so a waiting dispatcher leases them at once
    #[arg(long, env = "HOOKD_NOTIFY", default_value_t = true, action = clap::ArgAction::Set)]
    pub notify: bool,
    /// Postgres URL for LISTEN, straight to Postgres, for when DATABASE_URL goes through a pooler in transaction mode: the API listens for changes to inbound sources, and keeps them between requests only while it does (without it such an API reads a source from the database on every inbound request)
    // hide_env_values: `--help` would print the URL, password included
    #[arg(long, env = "HOOKD_NOTIFY_DATABASE_URL", hide_env_values = true)]
    pub notify_database_url: Option<String>,
    /// `on`: every /v1 request needs a Bearer credential and the tenant comes from it;
    /// `none`: no authentication, the tenant comes from the request body (local runs only)
    #[arg(long, env = "HOOKD_AUTH", default_value = "on")]
    pub auth: AuthMode,
    /// Scopes every Kubernetes ServiceAccount caller gets (comma-separated)
    #[arg(
        long,
        env = "HOOKD_AUTH_SA_SCOPES",
        default_value = "produce,read",
        value_delimiter = ','
    )]
    pub auth_sa_scopes: Vec<Scope>,
    /// ServiceAccount tenant overrides, `namespace=tenant,…` (default: a ServiceAccount's tenant is its namespace)
    #[arg(long, env = "HOOKD_AUTH_NAMESPACE_TENANTS", default_value = "")]
    pub auth_namespace_tenants: NamespaceTenants,
    /// Per-tenant ingest limit in events per second, per API replica (default: no limit); over it, 429 with Retry-After
    #[arg(long, env = "HOOKD_TENANT_RATE_LIMIT", value_parser = parse_rate)]
    pub tenant_rate_limit: Option<f64>,
    /// Longest a request may take, body upload included, in seconds (408 after it)
    #[arg(long, env = "HOOKD_API_REQUEST_TIMEOUT_SECS", default_value_t = 30)]
    pub api_request_timeout_secs: u64,
    /// Time a client has to send a complete request head, counted from when the
    /// connection opens or last went idle: it also closes idle keep-alive connections
    #[arg(long, env = "HOOKD_API_HEADER_TIMEOUT_SECS", default_value_t = 20)]
    pub api_header_timeout_secs: u64,
    /// Most open client connections; further clients wait in the listen backlog
    #[arg(long, env = "HOOKD_API_MAX_CONNECTIONS", default_value_t = 4096)]
    pub api_max_connections: usize,
    /// Largest total size of a request's headers, in bytes (431 above it)
    #[arg(long, env = "HOOKD_API_MAX_HEADER_BYTES", default_value_t = 16 * 1024)]
    pub api_max_header_bytes: usize,
    /// Longest request target (path and query), in bytes (414 above it)
    #[arg(long, env = "HOOKD_API_MAX_URL_BYTES", default_value_t = 4096)]
    pub api_max_url_bytes: usize,
    /// Most ingest request-body bytes one API replica holds at once (being read, parsed or
    /// waiting for their commit), reserved from each request's Content-Length before its
    /// body is read; over it, 503 `ingest_busy`
    #[arg(long, env = "HOOKD_API_MAX_INFLIGHT_BYTES", default_value_t = 128 << 20)]
    pub api_max_inflight_bytes: usize,
    /// One tenant's share of those bytes (default: a quarter of them, and never less than
    /// one largest batch); over it, 429 `tenant_ingest_busy`. A body larger than the share
    /// is refused with 413
    #[arg(long, env = "HOOKD_API_TENANT_INFLIGHT_BYTES")]
    pub api_tenant_inflight_bytes: Option<usize>,
    /// Origins allowed to embed the customer portal (/portal) in an iframe: the CSP
    /// frame-ancestors sources, space-separated (`https://app.example.com`), or `'none'`
    #[arg(long, env = "HOOKD_PORTAL_FRAME_ANCESTORS", default_value = "'none'")]
    pub portal_frame_ancestors: crate::domain::FrameAncestors,
    /// Most live endpoints one consumer may have (Stripe allows 16 per account); over it,
    /// 422 `consumer_endpoint_limit`
    #[arg(long, env = "HOOKD_CONSUMER_MAX_ENDPOINTS", default_value_t = 16)]
    pub consumer_max_endpoints: i64,
    /// Most live endpoints made through the API one tenant may have, consumers' included;
    /// over it, 422 `tenant_endpoint_limit`
    #[arg(long, env = "HOOKD_TENANT_MAX_ENDPOINTS", default_value_t = 300_000)]
    pub tenant_max_endpoints: i64,
    /// Requests per second one consumer token's consumer may make that cost work (test
    /// events, replayed deliveries, endpoint changes), per API replica; over it, 429
    /// `consumer_rate_limited`. Never taken from the tenant's HOOKD_TENANT_RATE_LIMIT
    #[arg(long, env = "HOOKD_CONSUMER_RATE_LIMIT", default_value = "10", value_parser = parse_rate)]
    pub consumer_rate_limit: f64,
    /// Reads (GET) per second one consumer token's consumer may make, per API replica; over
    /// it, 429 `consumer_read_rate_limited`. A portal page makes a handful; a consumer
    /// polling its history in a loop spends this, not the API's CPU the producer's ingest
    /// shares. Apart from HOOKD_CONSUMER_RATE_LIMIT
    #[arg(long, env = "HOOKD_CONSUMER_READ_RATE_LIMIT", default_value = "20", value_parser = parse_rate)]
    pub consumer_read_rate_limit: f64,
    /// One consumer's share of the request-body bytes in flight (HOOKD_API_MAX_INFLIGHT_BYTES),
    /// apart from its tenant's share; over it, 429 `consumer_requests_busy`
    #[arg(long, env = "HOOKD_CONSUMER_INFLIGHT_BYTES", default_value_t = 1 << 20)]
    pub consumer_inflight_bytes: usize,
    /// Rows one batch of a consumer deletion disables or cancels, each batch one short
    /// transaction
    #[arg(long, env = "HOOKD_CONSUMER_DELETE_BATCH", default_value_t = 1000)]
    pub consumer_delete_batch: i64,
}

fn parse_rate(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(r) if r.is_finite() && r > 0.0 => Ok(r),
        _ => Err(format!(
            "{s:?} is not a positive number of events per second"
        )),
    }
}

#[derive(Debug, Clone, Args)]
pub struct DispatchArgs {
    #[command(flatten)]
    pub db: DbArgs,
    #[command(flatten)]
    pub dispatch: DispatchSettings,
    #[command(flatten)]
    pub keys: KeyArgs,
    #[command(flatten)]
    pub retention: RetentionSettings,
}

/// Defaults of `hookd dispatch` that the controller also writes into a WebhookDispatcher's
/// pods (its Deployment's probes and grace period follow the request timeout).
pub const DISPATCH_LEASE_SECS: u64 = 5;
pub const DISPATCH_REQUEST_TIMEOUT_SECS: u64 = 15;
pub const DISPATCH_CONCURRENCY: usize = 256;

#[derive(Debug, Clone, Args)]
pub struct DispatchSettings {
    /// Address for /healthz, /readyz and /metrics
    #[arg(long, env = "HOOKD_LISTEN", default_value = "0.0.0.0:8081")]
    pub listen: SocketAddr,
    /// Lease on a claimed delivery, in seconds (at least 2). Renewed every quarter lease
    /// while its request runs, so it bounds how soon another dispatcher takes over the
    /// deliveries of one that died, not how long a request may take
    #[arg(long, env = "HOOKD_LEASE_SECS", default_value_t = DISPATCH_LEASE_SECS)]
    pub lease_secs: u64,
    /// Timeout of one delivery request, in seconds (an endpoint's own timeout may be lower)
    #[arg(long, env = "HOOKD_REQUEST_TIMEOUT_SECS", default_value_t = DISPATCH_REQUEST_TIMEOUT_SECS)]
    pub request_timeout_secs: u64,
    /// Deliveries in flight at once in this process
    #[arg(long, env = "HOOKD_CONCURRENCY", default_value_t = DISPATCH_CONCURRENCY)]
    pub concurrency: usize,
    /// Deliveries in flight at once per endpoint in this process (an endpoint's maxInFlight may be lower)
    #[arg(long, env = "HOOKD_ENDPOINT_CONCURRENCY", default_value_t = 32)]
    pub endpoint_concurrency: usize,
    /// Destinations admitted despite being private/loopback/link-local (comma-separated CIDRs)
    #[arg(long, env = "HOOKD_ALLOWED_DESTINATIONS", default_value = "")]
    pub allowed_destinations: String,
    /// Delays before each retry, in seconds (comma-separated); the default is the common webhook schedule
    #[arg(
        long,
        env = "HOOKD_RETRY_SCHEDULE",
        default_value = "5,300,1800,7200,18000,36000,36000"
    )]
    pub retry_schedule: String,
    /// Attempts before a delivery is dead (default: one more than the retry schedule's length)
    #[arg(long, env = "HOOKD_MAX_ATTEMPTS")]
    pub max_attempts: Option<u32>,
    /// Jitter applied to each retry delay, as a fraction (0.2 = ±20%)
    #[arg(long, env = "HOOKD_RETRY_JITTER", default_value_t = 0.2)]
    pub retry_jitter: f64,
    /// Longest Retry-After honoured, in seconds (longer values are capped)
    #[arg(long, env = "HOOKD_MAX_RETRY_AFTER_SECS", default_value_t = 3600)]
    pub max_retry_after_secs: u64,
    /// Consecutive failures that open an endpoint's circuit
    #[arg(long, env = "HOOKD_CIRCUIT_FAILURES", default_value_t = 5)]
    pub circuit_failures: u32,
    /// How long an open circuit waits before one probe, in seconds
    #[arg(long, env = "HOOKD_CIRCUIT_COOLDOWN_SECS", default_value_t = 30)]
    pub circuit_cooldown_secs: u64,
    /// Seconds an endpoint's circuit may stay open before hookd emits hookd.endpoint.circuit_open to the tenant's endpoints that subscribe to it (once per opening; 0: never)
    #[arg(long, env = "HOOKD_CIRCUIT_ALERT_SECS", default_value_t = 3600)]
    pub circuit_alert_secs: u64,
    /// Fallback poll interval, in milliseconds: the most time between two scans of the queue, whatever NOTIFYs arrive
    #[arg(long, env = "HOOKD_POLL_MS", default_value_t = 1000)]
    pub poll_ms: u64,
    /// LISTEN for the API's NOTIFY, which names new deliveries to lease at once (scans and polling still run)
    #[arg(long, env = "HOOKD_NOTIFY", default_value_t = true, action = clap::ArgAction::Set)]
    pub notify: bool,
    /// Postgres URL for LISTEN, straight to Postgres, for when DATABASE_URL goes through a pooler in transaction mode (a LISTEN is session state the pooler cannot keep); without it such a dispatcher only polls (HOOKD_POLL_MS)
    // hide_env_values: `--help` would print the URL, password included
    #[arg(long, env = "HOOKD_NOTIFY_DATABASE_URL", hide_env_values = true)]
    pub notify_database_url: Option<String>,
    /// On SIGTERM, how long in-flight deliveries may take to finish, in seconds
    #[arg(long, env = "HOOKD_SHUTDOWN_GRACE_SECS", default_value_t = 20)]
    pub shutdown_grace_secs: u64,
    /// Bytes of each response body kept in the attempt log
    #[arg(long, env = "HOOKD_RESPONSE_SNIPPET_BYTES", default_value_t = 1024)]
    pub response_snippet_bytes: usize,
}

#[derive(Debug, Clone, Args)]
pub struct ControllerArgs {
    #[command(flatten)]
    pub db: DbArgs,
    #[command(flatten)]
    pub keys: KeyArgs,
    #[command(flatten)]
    pub controller: ControllerSettings,
}

#[derive(Debug, Clone, Args)]
pub struct ControllerSettings {
    /// Address for /healthz, /readyz and /metrics
    #[arg(long, env = "HOOKD_LISTEN", default_value = "0.0.0.0:8082")]
    pub listen: SocketAddr,
    /// Watch WebhookEndpoints (and their Secrets) in this namespace only; unset = all namespaces
    #[arg(long, env = "HOOKD_WATCH_NAMESPACE")]
    pub watch_namespace: Option<String>,
    /// Reconcile only while holding the leader Lease (turn off for a single local replica)
    #[arg(long, env = "HOOKD_LEADER_ELECTION", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_election: bool,
    /// Name of the leader Lease
    #[arg(long, env = "HOOKD_LEASE_NAME", default_value = "hookd-controller")]
    pub lease_name: String,
    /// Seconds the leader Lease stays valid without renewal: how long work pauses when a leader dies
    #[arg(long, env = "HOOKD_LEASE_DURATION_SECS", default_value_t = 15)]
    pub lease_duration_secs: u64,
    /// Namespace of the leader Lease and of WebhookDispatchers (default: POD_NAMESPACE, else the service account's namespace, else hookd-system)
    #[arg(long, env = "HOOKD_LEASE_NAMESPACE")]
    pub lease_namespace: Option<String>,
    /// This replica's identity for the Lease (set from the downward API; default: the host name)
    #[arg(long, env = "POD_NAME")]
    pub pod_name: Option<String>,
    /// This replica's namespace (downward API)
    #[arg(long, env = "POD_NAMESPACE")]
    pub pod_namespace: Option<String>,
    /// Image of dispatcher Deployments when a WebhookDispatcher names none (set it to the controller's own image)
    #[arg(long, env = "HOOKD_IMAGE", default_value = concat!("hookd:", env!("CARGO_PKG_VERSION")))]
    pub image: String,
    /// Tenant of each namespace's WebhookEndpoints, `namespace=tenant,…` (default: the namespace; the API's mapping of ServiceAccounts, so share the value)
    #[arg(long, env = "HOOKD_AUTH_NAMESPACE_TENANTS", default_value = "")]
    pub namespace_tenants: NamespaceTenants,
    /// Reconciles running at once per controller (each holds a database connection while it syncs)
    #[arg(long, env = "HOOKD_RECONCILE_CONCURRENCY", default_value_t = 8)]
    pub reconcile_concurrency: u16,
    /// How often status figures are refreshed from Postgres and autoscaling is sampled, in seconds
    #[arg(long, env = "HOOKD_STATUS_INTERVAL_SECS", default_value_t = 10)]
    pub status_interval_secs: u64,
    /// Seconds between full reconciles of an unchanged object (watch events bring every change; each full pass of an endpoint GETs its Secret)
    #[arg(long, env = "HOOKD_RESYNC_SECS", default_value_t = 600)]
    pub resync_secs: u64,
    /// Images a WebhookDispatcher may name besides HOOKD_IMAGE, comma-separated (default: none, only the controller's own image)
    #[arg(
        long,
        env = "HOOKD_DISPATCHER_IMAGES",
        value_delimiter = ',',
        default_value = ""
    )]
    pub dispatcher_images: Vec<String>,
    /// Service accounts a WebhookDispatcher may name besides hookd-dispatcher, comma-separated (default: none)
    #[arg(
        long,
        env = "HOOKD_DISPATCHER_SERVICE_ACCOUNTS",
        value_delimiter = ',',
        default_value = ""
    )]
    pub dispatcher_service_accounts: Vec<String>,
}

/// Where an in-cluster process finds its own namespace.
const SERVICE_ACCOUNT_NAMESPACE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

impl ControllerSettings {
    /// Namespace of the Lease and of the WebhookDispatchers this controller manages.
    pub fn install_namespace(&self) -> String {
        self.lease_namespace
            .clone()
            .or_else(|| self.pod_namespace.clone())
            .or_else(|| {
                std::fs::read_to_string(SERVICE_ACCOUNT_NAMESPACE)
                    .ok()
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty())
            })
            .unwrap_or_else(|| "hookd-system".into())
    }

    /// A unique identity per replica for the Lease: the pod name, else the host name.
    pub fn identity(&self) -> String {
        self.pod_name
            .clone()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| format!("hookd-controller-{}", uuid::Uuid::now_v7().simple()))
    }
}

#[derive(Debug, Clone, Args)]
pub struct ApplyArgs {
    #[command(flatten)]
    pub db: DbArgs,
    #[command(flatten)]
    pub keys: KeyArgs,
    /// YAML files with WebhookEndpoint, WebhookSource and Secret documents; `-` reads standard input, a
    /// directory applies every *.yaml in it
    #[arg(short = 'f', long = "filename", required = true, num_args = 1..)]
    pub files: Vec<PathBuf>,
}

#[derive(Debug, Clone, Args)]
pub struct DeleteArgs {
    #[command(flatten)]
    pub db: DbArgs,
    /// YAML files whose WebhookEndpoints are removed (the files given to `hookd apply`;
    /// their Secrets are ignored); `-` reads standard input, a directory means every *.yaml in it
    #[arg(short = 'f', long = "filename", required = true, num_args = 1..)]
    pub files: Vec<PathBuf>,
    /// Exit 0 even when an endpoint was never applied or is already deleted
    #[arg(long)]
    pub ignore_not_found: bool,
}

#[derive(Debug, Clone, Args)]
pub struct DevArgs {
    /// Postgres URL; when unset, a throwaway cluster is started and removed on exit
    // hide_env_values: `--help` would print the URL, password included
    #[arg(long = "database-url", env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// Address of the API
    #[arg(long, env = "HOOKD_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Address of the built-in example receiver
    #[arg(
        long,
        env = "HOOKD_DEV_RECEIVER_LISTEN",
        default_value = "127.0.0.1:9000"
    )]
    pub receiver_listen: SocketAddr,
    /// Address of the dispatcher's /healthz, /readyz and /metrics
    #[arg(
        long,
        env = "HOOKD_DEV_DISPATCH_LISTEN",
        default_value = "127.0.0.1:8081"
    )]
    pub dispatch_listen: SocketAddr,
    /// Folder of WebhookEndpoint YAML to apply at start (default: the examples built into
    /// this binary, `examples/*.yaml` of its source, aimed at the example receiver)
    #[arg(long, env = "HOOKD_DEV_EXAMPLES")]
    pub examples: Option<PathBuf>,
    #[command(flatten)]
    pub keys: KeyArgs,
}

/// Key material read from the environment or a flag. Its `Debug` is redacted, so
/// printing the parsed command line never shows a key.
#[derive(Clone)]
pub struct KeyMaterial(String);

impl std::fmt::Debug for KeyMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyMaterial(..)")
    }
}

// Infallible on purpose: validating here would let clap echo the rejected value, key
// included, in its error message. `KeyArgs::keyring` validates instead.
impl From<String> for KeyMaterial {
    fn from(s: String) -> Self {
        KeyMaterial(s)
    }
}

impl KeyMaterial {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

/// The encryption keys of signing secrets. Every component that reads or writes signing
/// secrets (dispatch, apply, dev, rekey, controller) flattens this struct. Prefer the
/// environment to the flags: command lines are visible to every user in `ps`.
#[derive(Debug, Clone, Default, Args)]
pub struct KeyArgs {
    /// Active key for signing secrets at rest, `<key-id>:<base64 of 32 bytes>` (in Kubernetes: Secret hookd-encryption, key `key`). Unset: the local key file (not for production)
    #[arg(
        long = "encryption-key",
        env = "HOOKD_ENCRYPTION_KEY",
        hide_env_values = true,
        value_name = "KEY_ID:BASE64"
    )]
    pub encryption_key: Option<KeyMaterial>,
    /// Older keys still accepted for decryption during a rotation, comma-separated, same format; drop them once `hookd rekey` has run
    #[arg(
        long = "encryption-old-keys",
        env = "HOOKD_ENCRYPTION_OLD_KEYS",
        hide_env_values = true,
        value_name = "KEY_ID:BASE64,..."
    )]
    pub encryption_old_keys: Option<KeyMaterial>,
    /// Key file used when HOOKD_ENCRYPTION_KEY is unset; created (mode 0600) on first use. Default: $XDG_DATA_HOME/hookd/encryption-key, else ~/.local/share/hookd/encryption-key
    #[arg(long = "encryption-key-file", env = "HOOKD_ENCRYPTION_KEY_FILE")]
    pub encryption_key_file: Option<PathBuf>,
}

impl KeyArgs {
    /// The keyring: HOOKD_ENCRYPTION_KEY when set, else the local key file (created on
    /// first use, with a warning that production must set HOOKD_ENCRYPTION_KEY).
    pub fn keyring(&self) -> Result<crate::crypto::Keyring, crate::crypto::KeyConfigError> {
        let env = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
        crate::crypto::load_keyring(crate::crypto::KeySources {
            key: self.encryption_key.as_ref().map(KeyMaterial::expose),
            old_keys: self
                .encryption_old_keys
                .as_ref()
                .map(KeyMaterial::expose)
                .unwrap_or(""),
            key_file: self.encryption_key_file.clone(),
            xdg_data_home: env("XDG_DATA_HOME").map(PathBuf::from),
            home: env("HOME").map(PathBuf::from),
            in_cluster: env("KUBERNETES_SERVICE_HOST").is_some(),
        })
    }
}

/// How long terminal rows are kept. Read by `hookd dispatch` (which prunes on an
/// interval) and `hookd prune`; give every process the same values.
#[derive(Debug, Clone, Args)]
pub struct RetentionSettings {
    /// Days a terminal delivery (succeeded, dead, cancelled), its attempts and dead letter, and then its event are kept; 0 keeps them forever
    #[arg(long, env = "HOOKD_RETENTION_DAYS", default_value_t = 30)]
    pub retention_days: u32,
    /// Per-tenant overrides, `tenant=days,...` (0 = forever), e.g. `billing=90,scratch=1`
    #[arg(long, env = "HOOKD_TENANT_RETENTION", default_value = "")]
    pub tenant_retention: String,
    /// Seconds between prune passes in each dispatcher (one replica prunes at a time); 0 turns dispatcher pruning off
    #[arg(long, env = "HOOKD_PRUNE_INTERVAL_SECS", default_value_t = 600)]
    pub prune_interval_secs: u64,
    /// Rows deleted per statement; each batch is its own short transaction
    #[arg(long, env = "HOOKD_PRUNE_BATCH", default_value_t = 500)]
    pub prune_batch: u32,
}

#[derive(Debug, Clone, Args)]
pub struct RekeyArgs {
    #[command(flatten)]
    pub db: DbArgs,
    #[command(flatten)]
    pub keys: KeyArgs,
    /// Secrets re-encrypted per transaction
    #[arg(long, env = "HOOKD_REKEY_BATCH", default_value_t = 100)]
    pub batch: u32,
}

#[derive(Debug, Clone, Args)]
pub struct PruneArgs {
    #[command(flatten)]
    pub db: DbArgs,
    #[command(flatten)]
    pub retention: RetentionSettings,
}

#[derive(Debug, Clone, Args)]
pub struct ReceiverArgs {
    /// Address the receiver listens on
    #[arg(long, env = "HOOKD_LISTEN", default_value = "0.0.0.0:9000")]
    pub listen: SocketAddr,
    /// Signing secrets (`whsec_…`) deliveries are verified with (repeatable; comma-separated in the environment)
    #[arg(
        long = "secret",
        env = "HOOKD_RECEIVER_SECRETS",
        value_delimiter = ',',
        hide_env_values = true
    )]
    pub secrets: Vec<String>,
    /// Files holding signing secrets (whitespace-separated), re-read on every delivery so a rotated,
    /// mounted Secret takes effect without a restart (repeatable; comma-separated in the environment)
    #[arg(
        long = "secret-file",
        env = "HOOKD_RECEIVER_SECRET_FILES",
        value_delimiter = ','
    )]
    pub secret_files: Vec<PathBuf>,
    /// Wait this long before answering each delivery, in milliseconds (PUT /control changes it)
    #[arg(long, env = "HOOKD_RECEIVER_DELAY_MS", default_value_t = 0)]
    pub delay_ms: u64,
    /// Status answered to verified deliveries, e.g. 503 to make hookd retry (PUT /control changes it)
    #[arg(long, env = "HOOKD_RECEIVER_STATUS", default_value_t = 200)]
    pub status: u16,
    /// Name secrets in GET /received by the first 12 hex digits of their SHA-256 instead of by
    /// where they came from (`secret #1`, `FILE #1`). The page is unauthenticated: only for
    /// receivers no one else can reach
    #[arg(long, env = "HOOKD_RECEIVER_SHOW_FINGERPRINTS", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub show_fingerprints: bool,
}
