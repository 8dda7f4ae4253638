//! Kubernetes: the custom resource types, the endpoint sync core shared by `hookd apply`
//! and the controller, and `hookd controller` itself (both controllers behind a leader
//! Lease, with health and metrics).
//!
//! `run` is the one entry point. Reconcilers live in `endpoint_controller` and
//! `dispatcher_controller`, each with `reconcile` + `error_policy` and pure functions for
//! the desired state that tests call without a cluster.

pub mod client;
pub mod conditions;
pub mod crd;
pub mod dispatcher_controller;
pub mod endpoint_controller;
mod leader;
pub mod sync;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::StatusCode;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use kube::api::PartialObjectMeta;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{Controller, Predicate, WatchStreamExt, predicates, watcher};
use kube::{Api, Client, Resource};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::config::ControllerSettings;
use crate::crypto::Keyring;
use crate::db::DbError;
use crate::domain::NamespaceTenants;
use crate::metrics::{ControllerLabel, Metrics, ReconcileResult};
use client::with_user_agent;

pub use crd::{
    WebhookDispatcher, WebhookDispatcherSpec, WebhookDispatcherStatus, WebhookEndpoint,
    WebhookEndpointSpec, WebhookEndpointStatus,
};

/// Every CRD hookd defines, as one multi-document YAML stream (`hookd crd`, `crds/`).
pub fn crds_yaml() -> String {
    crd::crds()
        .iter()
        .map(|c| serde_yaml::to_string(c).expect("CRDs serialize to YAML"))
        .collect::<Vec<_>>()
        .join("---\n")
}

/// Server-side apply field manager of every object and status the controller writes.
pub const FIELD_MANAGER: &str = "hookd-controller";

/// One Kubernetes API permission the controller needs, for the RBAC manifests and the
/// tests that check both the code's calls and the manifests against this list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Access {
    pub group: &'static str,
    pub resource: &'static str,
    pub verbs: &'static [&'static str],
    /// false: only in the controller's own (install) namespace
    pub cluster_wide: bool,
}

/// What `hookd controller` calls, and where. Keep in step with the code: the controller
/// tests record every request the reconcilers make and check it against this list.
pub const REQUIRED_ACCESS: &[Access] = &[
    // the WebhookEndpoint watch (list+watch), the finalizer (patch), status (SSA patch)
    Access {
        group: "hookd.dev",
        resource: "webhookendpoints",
        verbs: &["list", "watch", "patch"],
        cluster_wide: true,
    },
    Access {
        group: "hookd.dev",
        resource: "webhookendpoints/status",
        verbs: &["patch"],
        cluster_wide: true,
    },
    // metadata-only watch of Secrets, and a GET of each referenced one
    Access {
        group: "",
        resource: "secrets",
        verbs: &["get", "list", "watch"],
        cluster_wide: true,
    },
    Access {
        group: "events.k8s.io",
        resource: "events",
        verbs: &["create", "patch"],
        cluster_wide: true,
    },
    Access {
        group: "hookd.dev",
        resource: "webhookdispatchers",
        verbs: &["list", "watch"],
        cluster_wide: false,
    },
    Access {
        group: "hookd.dev",
        resource: "webhookdispatchers/status",
        verbs: &["patch"],
        cluster_wide: false,
    },
    // owner references with blockOwnerDeletion need this where the
    // OwnerReferencesPermissionEnforcement admission plugin runs (e.g. OpenShift)
    Access {
        group: "hookd.dev",
        resource: "webhookdispatchers/finalizers",
        verbs: &["update"],
        cluster_wide: false,
    },
    // metadata-only watch of owned Deployments; server-side apply creates or patches them
    Access {
        group: "apps",
        resource: "deployments",
        verbs: &["list", "watch", "create", "patch"],
        cluster_wide: false,
    },
    // why dispatcher pods are not ready (container waiting reasons, scheduling), read
    // only while some are not
    Access {
        group: "",
        resource: "pods",
        verbs: &["list"],
        cluster_wide: false,
    },
    Access {
        group: "coordination.k8s.io",
        resource: "leases",
        verbs: &["get", "create", "patch"],
        cluster_wide: false,
    },
];

/// Errors of a reconcile. Each is retried by `error_policy`; none crashes the controller.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[source] kube::Error),
    #[error(transparent)]
    Db(#[from] DbError),
    #[error("{0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
    #[error("object {0} has no namespace")]
    NoNamespace(String),
}

impl Error {
    /// Whether retrying the same request can succeed by itself. The API server refusing
    /// a request (400 Bad Request, 403 Forbidden, 404 of a path that must exist, 422
    /// Invalid) or the database refusing a write stays refused until someone changes RBAC,
    /// an admission policy or the object; outages (5xx, 429, timeouts, connections) end.
    pub fn is_permanent(&self) -> bool {
        use kube::runtime::finalizer::Error as F;
        let kube_permanent = |e: &kube::Error| matches!(e, kube::Error::Api(s) if matches!(s.code, 400 | 403 | 405 | 422));
        match self {
            Error::Kube(e) => kube_permanent(e),
            Error::Db(e) => !e.is_unavailable(),
            Error::NoNamespace(_) => true,
            Error::Finalizer(f) => match f.as_ref() {
                F::ApplyFailed(e) | F::CleanupFailed(e) => e.is_permanent(),
                F::AddFinalizer(e) | F::RemoveFinalizer(e) => kube_permanent(e),
                _ => true,
            },
        }
    }
}

/// Per-object exponential backoff with jitter for failed reconciles: a fixed delay
/// retries thousands of objects in lockstep against an API server or database that is
/// already struggling, and retries a permanent refusal every few seconds forever.
#[derive(Default)]
pub struct Backoff {
    failures: std::sync::Mutex<std::collections::HashMap<String, u32>>,
}

/// First retry of a transient error, and the most any retry waits.
pub const BACKOFF_TRANSIENT: (Duration, Duration) =
    (Duration::from_secs(1), Duration::from_secs(300));
/// The same for permanent errors (refused by the API server or the database).
pub const BACKOFF_PERMANENT: (Duration, Duration) =
    (Duration::from_secs(30), Duration::from_secs(1800));

impl Backoff {
    /// The delay before the next attempt at `key`, counting this failure.
    pub fn next(&self, key: &str, permanent: bool) -> Duration {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        let n = failures.entry(key.to_string()).or_insert(0);
        *n = n.saturating_add(1);
        let (base, cap) = if permanent {
            BACKOFF_PERMANENT
        } else {
            BACKOFF_TRANSIENT
        };
        backoff_delay(*n, base, cap, rand::random::<f64>())
    }

    /// A successful reconcile starts the next failure from the base delay again.
    pub fn reset(&self, key: &str) {
        self.failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
    }
}

/// Pure: `base x 2^(failures-1)` capped at `cap`, with "equal jitter": half fixed, half
/// spread by `unit` (0..1), so retries of many objects spread out but never come sooner
/// than half the nominal delay.
pub fn backoff_delay(failures: u32, base: Duration, cap: Duration, unit: f64) -> Duration {
    let exp = failures.saturating_sub(1).min(30);
    let nominal = base.saturating_mul(1u32 << exp).min(cap);
    let half = nominal / 2;
    half + half.mul_f64(unit.clamp(0.0, 1.0))
}

/// Controller settings after defaults are resolved.
#[derive(Debug, Clone)]
pub struct Settings {
    /// how often status figures from Postgres are refreshed (and autoscaling sampled)
    pub status_interval: Duration,
    /// dispatcher image when a WebhookDispatcher names none
    pub image: String,
    /// the tenant each namespace's WebhookEndpoints may subscribe to
    pub namespace_tenants: NamespaceTenants,
    /// reconciles at once per controller; bounded so a resync of thousands of endpoints
    /// queues instead of starving the connection pool into timeouts
    pub concurrency: u16,
    /// how often an unchanged object is reconciled anyway (watch events drive everything
    /// else); rare, since each full pass of an endpoint GETs its Secret
    pub resync: Duration,
    /// images a WebhookDispatcher may name besides `image`
    pub dispatcher_images: Vec<String>,
    /// service accounts a WebhookDispatcher may name besides `hookd-dispatcher`
    pub dispatcher_service_accounts: Vec<String>,
}

/// What every reconcile gets.
pub struct Context {
    pub client: Client,
    pub pool: PgPool,
    /// seals signing secrets before they are stored
    pub keys: Keyring,
    pub recorder: Recorder,
    pub metrics: Metrics,
    pub settings: Settings,
    pub backoff: Backoff,
    /// Secret versions and each endpoint's last full sync
    pub secrets: endpoint_controller::SecretCache,
}

/// A Kubernetes Event to publish about an object (kube's `Event` has no Debug/PartialEq,
/// and tests compare these).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectEvent {
    pub warning: bool,
    pub reason: &'static str,
    pub note: String,
}

impl ObjectEvent {
    pub fn normal(reason: &'static str, note: String) -> Self {
        ObjectEvent {
            warning: false,
            reason,
            note,
        }
    }
    pub fn warning(reason: &'static str, note: String) -> Self {
        ObjectEvent {
            warning: true,
            reason,
            note,
        }
    }
}

/// Records a reconcile's duration when dropped.
pub struct ReconcileTimer<'a> {
    metrics: &'a Metrics,
    controller: &'static str,
    started: Instant,
}

impl Drop for ReconcileTimer<'_> {
    fn drop(&mut self) {
        self.metrics
            .reconcile_seconds
            .get_or_create(&ControllerLabel {
                controller: self.controller,
            })
            .observe(self.started.elapsed().as_secs_f64());
    }
}

impl Context {
    pub fn new(
        client: Client,
        pool: PgPool,
        keys: Keyring,
        metrics: Metrics,
        settings: Settings,
        instance: Option<String>,
    ) -> Self {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: FIELD_MANAGER.into(),
                instance,
            },
        );
        Context {
            client,
            pool,
            keys,
            recorder,
            metrics,
            settings,
            backoff: Backoff::default(),
            secrets: Default::default(),
        }
    }

    pub fn reconcile_timer(&self, controller: &'static str) -> ReconcileTimer<'_> {
        ReconcileTimer {
            metrics: &self.metrics,
            controller,
            started: Instant::now(),
        }
    }

    pub fn count_reconcile(&self, controller: &'static str, ok: bool) {
        self.metrics
            .reconciles
            .get_or_create(&ReconcileResult {
                controller,
                result: if ok { "ok" } else { "error" },
            })
            .inc();
    }

    /// Publishes an Event, best effort: Events are for people, and a namespace being
    /// deleted refuses them, which must not block a finalizer.
    pub async fn publish<K: Resource<DynamicType = ()>>(&self, obj: &K, ev: ObjectEvent) {
        let event = Event {
            type_: if ev.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: ev.reason.into(),
            note: Some(ev.note),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &obj.object_ref(&())).await {
            tracing::debug!(error = %e, reason = ev.reason, "could not publish an Event");
        }
    }
}

/// Liveness and readiness of this replica.
#[derive(Default)]
struct Health {
    leading: AtomicBool,
    synced: AtomicBool,
}

/// `hookd controller`: wait for the leader Lease (unless leader election is off), then run
/// both controllers until shutdown. Losing the Lease ends the process, so that a fresh
/// replica stands by instead of one that may still hold stale work in memory.
pub async fn run(
    pool: PgPool,
    keys: Keyring,
    settings: ControllerSettings,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let config = kube::Config::infer().await.map_err(|e| {
        anyhow::anyhow!(
            "cannot reach a Kubernetes cluster (in-cluster service account, KUBECONFIG or ~/.kube/config): {e}"
        )
    })?;
    let client = Client::try_from(with_user_agent(config.clone()))?;
    let metrics = Metrics::new();
    let health = Arc::new(Health::default());
    let listener = tokio::net::TcpListener::bind(settings.listen).await?;
    tracing::info!(listen = %settings.listen, "controller health and metrics listening");
    let server = tokio::spawn(crate::ops::serve_on(
        listener,
        health_router(health.clone(), metrics.clone()),
        shutdown.clone(),
    ));
    let install_ns = settings.install_namespace();
    let identity = settings.identity();
    let ctx = Arc::new(Context::new(
        client.clone(),
        pool,
        keys,
        metrics.clone(),
        Settings {
            status_interval: Duration::from_secs(settings.status_interval_secs.max(1)),
            image: settings.image.clone(),
            concurrency: settings.reconcile_concurrency.max(1),
            namespace_tenants: settings.namespace_tenants.clone(),
            resync: Duration::from_secs(settings.resync_secs.max(1)),
            dispatcher_images: non_empty(&settings.dispatcher_images),
            dispatcher_service_accounts: non_empty(&settings.dispatcher_service_accounts),
        },
        Some(identity.clone()),
    ));
    let result = if settings.leader_election {
        let lease = leader::LeaseConfig {
            name: settings.lease_name.clone(),
            namespace: install_ns.clone(),
            identity,
            duration_secs: settings.lease_duration_secs,
        };
        // The lease manager talks through its own client, whose successful Lease writes
        // tell the watchdog how long leadership is certainly valid.
        let (observer, renewed) = leader::RenewalObserver::new(&lease);
        let lease_client = kube::client::ClientBuilder::try_from(with_user_agent(config))?
            .with_layer(&observer)
            .build();
        leader::run_as_leader(
            lease_client,
            &lease,
            renewed,
            &metrics,
            shutdown.clone(),
            |token| {
                health.leading.store(true, Ordering::SeqCst);
                run_controllers(
                    ctx,
                    settings.watch_namespace.clone(),
                    install_ns.clone(),
                    health.clone(),
                    token,
                )
            },
        )
        .await
    } else {
        health.leading.store(true, Ordering::SeqCst);
        metrics.leader.set(1);
        run_controllers(
            ctx,
            settings.watch_namespace.clone(),
            install_ns,
            health.clone(),
            shutdown.clone(),
        )
        .await;
        Ok(())
    };
    shutdown.cancel();
    server.await??;
    result
}

/// A comma-separated list's entries, without the empty one an unset variable gives.
fn non_empty(list: &[String]) -> Vec<String> {
    list.iter()
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

/// Both controllers until `token` is cancelled.
async fn run_controllers(
    ctx: Arc<Context>,
    watch_namespace: Option<String>,
    install_namespace: String,
    health: Arc<Health>,
    token: CancellationToken,
) {
    let client = ctx.client.clone();
    let (endpoints, endpoint_store) = endpoint_controller_stream(
        client.clone(),
        watch_namespace.as_deref(),
        ctx.clone(),
        token.clone(),
    );
    let (dispatchers, dispatcher_store) =
        dispatcher_controller_stream(client, &install_namespace, ctx, token.clone());
    // Polled, not awaited: a store's readiness signal wakes only one waiter, and the
    // Controller's own runner is already waiting on it.
    let ready_token = token.clone();
    tokio::spawn(async move {
        use futures::FutureExt;
        loop {
            let synced = endpoint_store.wait_until_ready().now_or_never().is_some()
                && dispatcher_store.wait_until_ready().now_or_never().is_some();
            if synced {
                tracing::info!("watches synced");
                health.synced.store(true, Ordering::SeqCst);
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                _ = ready_token.cancelled() => return,
            }
        }
    });
    tracing::info!(
        namespaces = watch_namespace.as_deref().unwrap_or("(all)"),
        dispatcher_namespace = %install_namespace,
        "controllers running"
    );
    tokio::join!(endpoints, dispatchers);
}

/// The predicate on each controller's own objects: spec changes (generation), finalizer
/// changes and the start of a deletion pass; status writes — including the controller's
/// own — do not, or every status patch would trigger the next reconcile.
fn spec_or_finalizers<K: Resource>(obj: &K) -> Option<u64> {
    predicates::generation
        .combine(predicates::finalizers)
        .hash_property(obj)
}

fn endpoint_controller_stream(
    client: Client,
    namespace: Option<&str>,
    ctx: Arc<Context>,
    token: CancellationToken,
) -> (
    impl std::future::Future<Output = ()>,
    Store<WebhookEndpoint>,
) {
    // Secrets are watched metadata-only: the controller never holds every Secret of the
    // cluster in memory, only their names and versions; it GETs the ones it needs.
    let (endpoints, secrets): (Api<WebhookEndpoint>, Api<PartialObjectMeta<Secret>>) =
        match namespace {
            Some(ns) => (
                Api::namespaced(client.clone(), ns),
                Api::namespaced(client, ns),
            ),
            None => (Api::all(client.clone()), Api::all(client)),
        };
    let (reader, writer) = reflector::store();
    let index = endpoint_controller::SecretIndex::default();
    let index_writer = index.clone();
    let objects = watcher(endpoints, watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .inspect_ok(move |event| index_writer.apply(event))
        .applied_objects()
        .predicate_filter(spec_or_finalizers, Default::default());
    // Only names and resourceVersions are kept: enough to tell whether a Secret changed
    // since an endpoint last read it.
    let (secret_reader, secret_writer) = reflector::store();
    ctx.secrets.set_store(secret_reader);
    let secret_changes = watcher(secrets, watcher::Config::default())
        .default_backoff()
        .reflect(secret_writer)
        .touched_objects()
        .predicate_filter(predicates::resource_version, Default::default());
    let config = kube::runtime::controller::Config::default().concurrency(ctx.settings.concurrency);
    let fut = Controller::for_stream(objects, reader.clone())
        .with_config(config)
        .watches_stream(secret_changes, move |s| index.endpoints_for(&s))
        .graceful_shutdown_on(token.cancelled_owned())
        .run(
            endpoint_controller::reconcile,
            endpoint_controller::error_policy,
            ctx,
        )
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "webhookendpoint controller");
            }
        });
    (fut, reader)
}

fn dispatcher_controller_stream(
    client: Client,
    namespace: &str,
    ctx: Arc<Context>,
    token: CancellationToken,
) -> (
    impl std::future::Future<Output = ()>,
    Store<WebhookDispatcher>,
) {
    let dispatchers: Api<WebhookDispatcher> = Api::namespaced(client.clone(), namespace);
    let deployments: Api<PartialObjectMeta<Deployment>> = Api::namespaced(client, namespace);
    let (reader, writer) = reflector::store();
    let objects = watcher(dispatchers, watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .applied_objects()
        .predicate_filter(spec_or_finalizers, Default::default());
    let (k, v) = dispatcher_controller::MANAGED_BY;
    let owned = watcher(
        deployments,
        watcher::Config::default().labels(&format!("{k}={v}")),
    )
    .default_backoff()
    .touched_objects()
    .predicate_filter(predicates::resource_version, Default::default());
    let config = kube::runtime::controller::Config::default().concurrency(ctx.settings.concurrency);
    let fut = Controller::for_stream(objects, reader.clone())
        .with_config(config)
        .owns_stream(owned)
        .graceful_shutdown_on(token.cancelled_owned())
        .run(
            dispatcher_controller::reconcile,
            dispatcher_controller::error_policy,
            ctx,
        )
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "webhookdispatcher controller");
            }
        });
    (fut, reader)
}

/// `/healthz` (the process is up), `/readyz` (the leader's watches have synced; a standby
/// replica is ready to take over, so it answers ready too) and `/metrics`.
fn health_router(health: Arc<Health>, metrics: Metrics) -> Router {
    crate::ops::router_with_readiness(
        move || {
            if !health.leading.load(Ordering::SeqCst) {
                (StatusCode::OK, "standby")
            } else if health.synced.load(Ordering::SeqCst) {
                (StatusCode::OK, "ready")
            } else {
                (StatusCode::SERVICE_UNAVAILABLE, "watches not synced yet")
            }
        },
        metrics,
    )
}
