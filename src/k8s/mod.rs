//! Kubernetes: the custom resource types, the endpoint sync core shared by `hookd apply`
//! and the controller, and `hookd controller` itself (its controllers behind a leader
//! Lease, with health and metrics).
//!
//! `run` is the one entry point. Reconcilers live in `endpoint_controller`,
//! `dispatcher_controller`, `source_controller` and `event_type_controller`, each with `reconcile` + `error_policy`
//! and pure functions for the desired state that tests call without a cluster.

pub mod client;
pub mod conditions;
pub mod crd;
pub mod dispatcher_controller;
pub mod endpoint_controller;
pub mod event_type_controller;
mod leader;
pub mod source_controller;
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
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector;
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
    WebhookEndpointSpec, WebhookEndpointStatus, WebhookEventType, WebhookEventTypeSpec,
    WebhookEventTypeStatus, WebhookSource, WebhookSourceSpec, WebhookSourceStatus,
};

/// Every CRD hookd defines, as one multi-document YAML stream (`hookd crd`, `crds/`).
/// Long strings (CEL rules, their messages) stay on one line, as `kubectl get -o yaml`
/// prints them, rather than folded at 80 columns.
pub fn crds_yaml() -> String {
    let options = serde_saphyr::ser_options! {
        folded_wrap_chars: usize::MAX,
    };
    serde_saphyr::to_string_multiple_with_options(&crd::crds(), options)
        .expect("CRDs serialize to YAML")
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
    // the WebhookSource watch, its finalizer and status, like WebhookEndpoint's (its
    // Secrets through the Secret access above)
    Access {
        group: "hookd.dev",
        resource: "webhooksources",
        verbs: &["list", "watch", "patch"],
        cluster_wide: true,
    },
    Access {
        group: "hookd.dev",
        resource: "webhooksources/status",
        verbs: &["patch"],
        cluster_wide: true,
    },
    // the WebhookEventType watch, its finalizer and status, like WebhookSource's
    Access {
        group: "hookd.dev",
        resource: "webhookeventtypes",
        verbs: &["list", "watch", "patch"],
        cluster_wide: true,
    },
    Access {
        group: "hookd.dev",
        resource: "webhookeventtypes/status",
        verbs: &["patch"],
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

fn backoff_key(controller: &str, ns: &str, name: &str) -> String {
    format!("{controller}/{ns}/{name}")
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
    /// Server-side applies `status` to `obj`'s status subresource as the controller's field
    /// manager (forced: the controller owns status).
    pub async fn apply_status<K>(
        &self,
        obj: &K,
        status: &impl serde::Serialize,
    ) -> Result<(), Error>
    where
        K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        let api: Api<K> = Api::namespaced(
            self.client.clone(),
            &obj.meta().namespace.clone().unwrap_or_default(),
        );
        let patch = serde_json::json!({
            "apiVersion": K::api_version(&()),
            "kind": K::kind(&()),
            "status": status,
        });
        api.patch_status(
            obj.meta().name.as_deref().unwrap_or_default(),
            &kube::api::PatchParams::apply(FIELD_MANAGER).force(),
            &kube::api::Patch::Apply(&patch),
        )
        .await
        .map_err(Error::Kube)?;
        Ok(())
    }

    /// GETs a Secret an object references. One the controller may not read is the
    /// object's problem (its status says so), not the controller's error.
    pub async fn get_secret(
        &self,
        ns: &str,
        name: &str,
    ) -> Result<Result<Option<Secret>, sync::SecretProblem>, Error> {
        match Api::<Secret>::namespaced(self.client.clone(), ns)
            .get_opt(name)
            .await
        {
            Ok(s) => Ok(Ok(s)),
            Err(kube::Error::Api(status)) if status.code == 403 => {
                Ok(Err(sync::SecretProblem::Unreadable {
                    namespace: ns.into(),
                    name: name.into(),
                    reason: "the controller's service account is not allowed to get it".into(),
                }))
            }
            Err(e) => Err(Error::Kube(e)),
        }
    }

    /// The error policy of every controller: per-object backoff (see [`Backoff`]), logged
    /// with the object and the delay.
    pub fn retry_after(
        &self,
        controller: &'static str,
        ns: &str,
        name: &str,
        err: &Error,
    ) -> Action {
        let delay = self
            .backoff
            .next(&backoff_key(controller, ns, name), err.is_permanent());
        tracing::warn!(
            controller,
            object = %format!("{ns}/{name}"),
            error = %err,
            permanent = err.is_permanent(),
            retry_in_secs = delay.as_secs_f64(),
            "reconcile failed; will retry"
        );
        Action::requeue(delay)
    }

    /// A reconcile that succeeded ends its object's backoff.
    pub fn reset_backoff(&self, controller: &'static str, ns: &str, name: &str) {
        self.backoff.reset(&backoff_key(controller, ns, name));
    }

    /// The reconcile of a namespaced kind kept with a finalizer (WebhookEndpoint,
    /// WebhookSource): the finalizer first, then `apply` or, once the object is deleted,
    /// `cleanup`; timed and counted, and a success ends the object's backoff.
    pub async fn reconcile_finalized<K, A, AF, C, CF>(
        self: &Arc<Self>,
        controller: &'static str,
        finalizer_name: &str,
        obj: Arc<K>,
        apply: A,
        cleanup: C,
    ) -> Result<Action, Error>
    where
        K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + std::fmt::Debug
            + serde::de::DeserializeOwned
            + serde::Serialize,
        A: FnOnce(Arc<K>) -> AF,
        AF: std::future::Future<Output = Result<Action, Error>>,
        C: FnOnce(Arc<K>) -> CF,
        CF: std::future::Future<Output = Result<Action, Error>>,
    {
        use kube::ResourceExt as _;
        use kube::runtime::finalizer::{Event as Finalizer, finalizer};
        let _timer = self.reconcile_timer(controller);
        let ns = obj
            .namespace()
            .ok_or_else(|| Error::NoNamespace(obj.name_any()))?;
        let name = obj.name_any();
        let api: Api<K> = Api::namespaced(self.client.clone(), &ns);
        let result = finalizer(&api, finalizer_name, obj, |event| async move {
            match event {
                Finalizer::Apply(o) => apply(o).await,
                Finalizer::Cleanup(o) => cleanup(o).await,
            }
        })
        .await
        .map_err(|e| Error::Finalizer(Box::new(e)));
        self.count_reconcile(controller, result.is_ok());
        if result.is_ok() {
            self.reset_backoff(controller, &ns, &name);
        }
        result
    }

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

/// Where one of the leader's watches stands.
#[derive(Debug, Clone, PartialEq, Eq)]
enum WatchState {
    /// listing (at start, or relisting after an error or a 410)
    Syncing,
    Synced,
    /// the last list or watch request failed; retried with a backoff
    Failing(String),
}

/// The watches of a leadership term, by the resource they watch.
const WATCHES: [&str; 7] = [
    "webhookendpoints.hookd.dev",
    "secrets",
    "webhookdispatchers.hookd.dev",
    "deployments.apps",
    "webhooksources.hookd.dev",
    // the source controller's own metadata watch of Secrets
    "secrets (for webhooksources)",
    "webhookeventtypes.hookd.dev",
];

/// Liveness and readiness of this replica: ready while standing by, or while leading with
/// every watch synced. A watch that fails (its CRD deleted, RBAC withdrawn, the API server
/// gone) turns readiness false until it has listed again, and says so in `/readyz` and the
/// log: the watches retry forever, so without this a controller whose CRD is gone would
/// look healthy while reconciling nothing.
#[derive(Default)]
struct Health {
    leading: AtomicBool,
    watches: std::sync::Mutex<std::collections::BTreeMap<&'static str, WatchState>>,
}

impl Health {
    fn watches(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::BTreeMap<&'static str, WatchState>> {
        self.watches.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A leadership term starts: every watch lists first.
    fn start_term(&self) {
        let mut w = self.watches();
        w.clear();
        for name in WATCHES {
            w.insert(name, WatchState::Syncing);
        }
        self.leading.store(true, Ordering::SeqCst);
    }

    fn end_term(&self) {
        self.leading.store(false, Ordering::SeqCst);
        self.watches().clear();
    }

    /// Updates `watch`'s state from one item of its watcher stream, logging changes: a
    /// failure at warn (once per distinct error, not per retry), the recovery at info.
    fn observe<K>(&self, watch: &'static str, item: &Result<watcher::Event<K>, watcher::Error>) {
        let next = match item {
            Ok(watcher::Event::Init) => WatchState::Syncing,
            Ok(watcher::Event::InitDone) => WatchState::Synced,
            Ok(_) => return,
            Err(e) => WatchState::Failing(watch_error(e)),
        };
        let mut w = self.watches();
        let prev = w.insert(watch, next.clone());
        if prev.as_ref() == Some(&next) {
            return;
        }
        match (&prev, &next) {
            (_, WatchState::Failing(reason)) if is_expired(item) => {
                tracing::info!(watch, reason = %reason, "watch expired (410): relisting");
            }
            (_, WatchState::Failing(reason)) => {
                tracing::warn!(watch, reason = %reason, "watch failing: not ready until it lists again");
            }
            (Some(WatchState::Failing(_)), WatchState::Synced) => {
                tracing::info!(watch, "watch recovered: listed again");
            }
            _ => {}
        }
        if next == WatchState::Synced && w.values().all(|s| *s == WatchState::Synced) {
            tracing::info!("watches synced");
        }
    }

    /// The API server accepted a watch of `watch`: one that was failing works again (a
    /// watch starts only from a resourceVersion its store has listed).
    fn watch_started(&self, watch: &'static str) {
        let mut w = self.watches();
        if let Some(state @ WatchState::Failing(_)) = w.get_mut(watch) {
            *state = WatchState::Synced;
            tracing::info!(watch, "watch recovered: watching again");
            if w.values().all(|s| *s == WatchState::Synced) {
                tracing::info!("watches synced");
            }
        }
    }

    /// `/readyz`: the status and why.
    fn readiness(&self) -> (StatusCode, String) {
        if !self.leading.load(Ordering::SeqCst) {
            return (StatusCode::OK, "standby".into());
        }
        let w = self.watches();
        let failing: Vec<String> = w
            .iter()
            .filter_map(|(name, s)| match s {
                WatchState::Failing(reason) => Some(format!("watch of {name} failing: {reason}")),
                _ => None,
            })
            .collect();
        if !failing.is_empty() {
            return (StatusCode::SERVICE_UNAVAILABLE, failing.join("; "));
        }
        let syncing: Vec<&str> = w
            .iter()
            .filter(|(_, s)| **s == WatchState::Syncing)
            .map(|(name, _)| *name)
            .collect();
        if w.is_empty() || !syncing.is_empty() {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("watches not synced yet: {}", syncing.join(", ")),
            );
        }
        (StatusCode::OK, "ready".into())
    }
}

/// Tells `Health` about every watch request the API server accepted (2xx): the watcher
/// resumes a failed watch from its resourceVersion without listing again, so no stream
/// event would say it works again.
#[derive(Clone)]
struct WatchObserver {
    health: Arc<Health>,
}

impl<S> tower::Layer<S> for WatchObserver {
    type Service = WatchObserved<S>;
    fn layer(&self, inner: S) -> WatchObserved<S> {
        WatchObserved {
            inner,
            health: self.health.clone(),
        }
    }
}

#[derive(Clone)]
struct WatchObserved<S> {
    inner: S,
    health: Arc<Health>,
}

impl<S, B, RB> tower::Service<http::Request<B>> for WatchObserved<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
    S::Error: 'static,
    RB: 'static,
{
    type Response = http::Response<RB>;
    type Error = S::Error;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<http::Response<RB>, S::Error>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let is_watch = req
            .uri()
            .query()
            .is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"));
        let watch = is_watch.then(|| watch_of_path(req.uri().path())).flatten();
        let fut = self.inner.call(req);
        let health = self.health.clone();
        Box::pin(async move {
            let res = fut.await;
            if let (Some(watch), Ok(r)) = (watch, &res)
                && r.status().is_success()
            {
                health.watch_started(watch);
            }
            res
        })
    }
}

/// Which of `WATCHES` a collection path belongs to.
fn watch_of_path(path: &str) -> Option<&'static str> {
    let last = path.rsplit('/').next()?;
    match last {
        "webhookendpoints" => Some(WATCHES[0]),
        "secrets" => Some(WATCHES[1]),
        "webhookdispatchers" => Some(WATCHES[2]),
        "deployments" => Some(WATCHES[3]),
        _ => None,
    }
}

/// A 410 Gone: the resourceVersion a watch resumed from was compacted away; the watcher
/// relists, which is routine (etcd compacts every few minutes), not a failure to warn about.
fn is_expired<K>(item: &Result<watcher::Event<K>, watcher::Error>) -> bool {
    match item {
        Err(watcher::Error::WatchError(s)) => s.code == 410,
        Err(watcher::Error::WatchStartFailed(kube::Error::Api(s))) => s.code == 410,
        _ => false,
    }
}

/// A watch error in one line, with what to do about the common ones.
fn watch_error(e: &watcher::Error) -> String {
    let status = match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s)) => Some(s.code),
        watcher::Error::WatchError(s) => Some(s.code),
        _ => None,
    };
    let hint = match status {
        Some(404) => " (is the CRD installed? `kubectl apply -k crds/`)",
        Some(401) => " (the controller's credentials were refused)",
        Some(403) => " (RBAC: the controller's ServiceAccount lacks this permission)",
        _ => "",
    };
    format!("{e}{hint}")
}

/// `hookd controller`: wait for the leader Lease (unless leader election is off), then run
/// both controllers until shutdown. Losing the Lease (an API server that cannot be reached
/// for longer than the renewal window) stops both controllers and campaigns again, with
/// a fresh context when it leads again; the process never exits for an API outage, which
/// during a control-plane upgrade would turn into CrashLoopBackOff.
pub async fn run(
    pool: PgPool,
    keys: Keyring,
    settings: ControllerSettings,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let metrics = Metrics::new();
    let health = Arc::new(Health::default());
    let config = kube::Config::infer().await.map_err(|e| {
        anyhow::anyhow!(
            "cannot reach a Kubernetes cluster (in-cluster service account, KUBECONFIG or ~/.kube/config): {e}"
        )
    })?;
    // Watch requests that start are how a watch that failed is seen to work again: resumed
    // from its resourceVersion it lists nothing, and a quiet resource sends no event.
    let client = kube::client::ClientBuilder::try_from(with_user_agent(config.clone()))?
        .with_layer(&WatchObserver {
            health: health.clone(),
        })
        .build();
    let listener = tokio::net::TcpListener::bind(settings.listen).await?;
    tracing::info!(listen = %settings.listen, "controller health and metrics listening");
    let server = tokio::spawn(crate::ops::serve_on(
        listener,
        health_router(health.clone(), metrics.clone()),
        shutdown.clone(),
    ));
    let install_ns = settings.install_namespace();
    let identity = settings.identity();
    let reconcile_settings = Settings {
        status_interval: Duration::from_secs(settings.status_interval_secs.max(1)),
        image: settings.image.clone(),
        concurrency: settings.reconcile_concurrency.max(1),
        namespace_tenants: settings.namespace_tenants.clone(),
        resync: Duration::from_secs(settings.resync_secs.max(1)),
        dispatcher_images: non_empty(&settings.dispatcher_images),
        dispatcher_service_accounts: non_empty(&settings.dispatcher_service_accounts),
    };
    // Each leadership term starts from a fresh context (caches, backoffs, stores): what a
    // replica held in memory before it lost the Lease may be stale by the time it leads again.
    let new_context = {
        let (client, metrics, identity) = (client.clone(), metrics.clone(), identity.clone());
        move || {
            Arc::new(Context::new(
                client.clone(),
                pool.clone(),
                keys.clone(),
                metrics.clone(),
                reconcile_settings.clone(),
                Some(identity.clone()),
            ))
        }
    };
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
                run_controllers(
                    new_context(),
                    settings.watch_namespace.clone(),
                    install_ns.clone(),
                    health.clone(),
                    token,
                )
            },
        )
        .await
    } else {
        metrics.leader.set(1);
        run_controllers(
            new_context(),
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
    health.start_term();
    let endpoints = endpoint_controller_stream(
        client.clone(),
        watch_namespace.as_deref(),
        ctx.clone(),
        health.clone(),
        token.clone(),
    );
    let sources = source_controller_stream(
        client.clone(),
        watch_namespace.as_deref(),
        ctx.clone(),
        health.clone(),
        token.clone(),
    );
    let event_types = event_type_controller_stream(
        client.clone(),
        watch_namespace.as_deref(),
        ctx.clone(),
        health.clone(),
        token.clone(),
    );
    let dispatchers =
        dispatcher_controller_stream(client, &install_namespace, ctx, health.clone(), token);
    tracing::info!(
        namespaces = watch_namespace.as_deref().unwrap_or("(all)"),
        dispatcher_namespace = %install_namespace,
        "controllers running"
    );
    tokio::join!(endpoints, dispatchers, sources, event_types);
    health.end_term();
}

/// The predicate on each controller's own objects: spec changes (generation), finalizer
/// changes and the start of a deletion pass; status writes — including the controller's
/// own — do not, or every status patch would trigger the next reconcile.
fn spec_or_finalizers<K: Resource>(obj: &K) -> Option<u64> {
    predicates::generation
        .combine(predicates::finalizers)
        .hash_property(obj)
}

/// The objects a controller watches: in `namespace` (`HOOKD_WATCH_NAMESPACE`), or in all.
fn watched<K>(client: Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match namespace {
        Some(ns) => Api::namespaced(client, ns),
        None => Api::all(client),
    }
}

fn endpoint_controller_stream(
    client: Client,
    namespace: Option<&str>,
    ctx: Arc<Context>,
    health: Arc<Health>,
    token: CancellationToken,
) -> impl std::future::Future<Output = ()> {
    // Secrets are watched metadata-only: the controller never holds every Secret of the
    // cluster in memory, only their names and versions; it GETs the ones it needs.
    let endpoints: Api<WebhookEndpoint> = watched(client.clone(), namespace);
    let secrets: Api<PartialObjectMeta<Secret>> = watched(client, namespace);
    let (reader, writer) = reflector::store();
    let index = endpoint_controller::SecretIndex::default();
    let index_writer = index.clone();
    let endpoint_health = health.clone();
    let objects = watcher(endpoints, watcher::Config::default())
        .default_backoff()
        .inspect(move |item| endpoint_health.observe(WATCHES[0], item))
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
        .inspect(move |item| health.observe(WATCHES[1], item))
        .reflect(secret_writer)
        .touched_objects()
        .predicate_filter(predicates::resource_version, Default::default());
    let config = kube::runtime::controller::Config::default().concurrency(ctx.settings.concurrency);
    Controller::for_stream(objects, reader)
        .with_config(config)
        .watches_stream(secret_changes, move |s| index.endpoints_for(&s))
        .graceful_shutdown_on(token.cancelled_owned())
        .run(
            endpoint_controller::reconcile,
            endpoint_controller::error_policy,
            ctx,
        )
        .for_each(|r| async move {
            // watch errors are reported by `Health::observe`, reconcile errors by the
            // reconciler's error policy
            if let Err(e) = r {
                tracing::debug!(error = %e, "webhookendpoint controller");
            }
        })
}

fn source_controller_stream(
    client: Client,
    namespace: Option<&str>,
    ctx: Arc<Context>,
    health: Arc<Health>,
    token: CancellationToken,
) -> impl std::future::Future<Output = ()> {
    let sources: Api<WebhookSource> = watched(client.clone(), namespace);
    let secrets: Api<PartialObjectMeta<Secret>> = watched(client, namespace);
    let (reader, writer) = reflector::store();
    let source_health = health.clone();
    let objects = watcher(sources, watcher::Config::default())
        .default_backoff()
        .inspect(move |item| source_health.observe(WATCHES[4], item))
        .reflect(writer)
        .applied_objects()
        .predicate_filter(spec_or_finalizers, Default::default());
    let secret_changes = watcher(secrets, watcher::Config::default())
        .default_backoff()
        .inspect(move |item| health.observe(WATCHES[5], item))
        .touched_objects()
        .predicate_filter(predicates::resource_version, Default::default());
    let store = reader.clone();
    let config = kube::runtime::controller::Config::default().concurrency(ctx.settings.concurrency);
    Controller::for_stream(objects, reader)
        .with_config(config)
        .watches_stream(secret_changes, move |s| {
            source_controller::sources_for(&store, &s)
        })
        .graceful_shutdown_on(token.cancelled_owned())
        .run(
            source_controller::reconcile,
            source_controller::error_policy,
            ctx,
        )
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "webhooksource controller");
            }
        })
}

fn event_type_controller_stream(
    client: Client,
    namespace: Option<&str>,
    ctx: Arc<Context>,
    health: Arc<Health>,
    token: CancellationToken,
) -> impl std::future::Future<Output = ()> {
    let event_types: Api<WebhookEventType> = watched(client, namespace);
    let (reader, writer) = reflector::store();
    let objects = watcher(event_types, watcher::Config::default())
        .default_backoff()
        .inspect(move |item| health.observe(WATCHES[6], item))
        .reflect(writer)
        .applied_objects()
        .predicate_filter(spec_or_finalizers, Default::default());
    let config = kube::runtime::controller::Config::default().concurrency(ctx.settings.concurrency);
    Controller::for_stream(objects, reader)
        .with_config(config)
        .graceful_shutdown_on(token.cancelled_owned())
        .run(
            event_type_controller::reconcile,
            event_type_controller::error_policy,
            ctx,
        )
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "webhookeventtype controller");
            }
        })
}

fn dispatcher_controller_stream(
    client: Client,
    namespace: &str,
    ctx: Arc<Context>,
    health: Arc<Health>,
    token: CancellationToken,
) -> impl std::future::Future<Output = ()> {
    let dispatchers: Api<WebhookDispatcher> = Api::namespaced(client.clone(), namespace);
    let deployments: Api<PartialObjectMeta<Deployment>> = Api::namespaced(client, namespace);
    let (reader, writer) = reflector::store();
    let dispatcher_health = health.clone();
    let objects = watcher(dispatchers, watcher::Config::default())
        .default_backoff()
        .inspect(move |item| dispatcher_health.observe(WATCHES[2], item))
        .reflect(writer)
        .applied_objects()
        .predicate_filter(spec_or_finalizers, Default::default());
    let (k, v) = dispatcher_controller::MANAGED_BY;
    let owned = watcher(
        deployments,
        watcher::Config::default().labels(&format!("{k}={v}")),
    )
    .default_backoff()
    .inspect(move |item| health.observe(WATCHES[3], item))
    .touched_objects()
    .predicate_filter(predicates::resource_version, Default::default());
    let config = kube::runtime::controller::Config::default().concurrency(ctx.settings.concurrency);
    Controller::for_stream(objects, reader)
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
        })
}

/// `/healthz` (the process is up), `/readyz` (the leader's watches are synced, or why not;
/// a standby replica is ready to take over, so it answers ready too) and `/metrics`.
fn health_router(health: Arc<Health>, metrics: Metrics) -> Router {
    crate::ops::router_with_readiness(move || health.readiness(), metrics)
}

#[cfg(test)]
mod tests {
    use super::*;

    type Item = Result<watcher::Event<WebhookDispatcher>, watcher::Error>;

    fn not_found() -> Item {
        Err(watcher::Error::InitialListFailed(kube::Error::Api(
            Box::new(kube::core::Status::failure("404 page not found", "NotFound").with_code(404)),
        )))
    }

    fn synced(h: &Health) {
        for name in WATCHES {
            h.observe::<WebhookDispatcher>(name, &Ok(watcher::Event::Init));
            h.observe::<WebhookDispatcher>(name, &Ok(watcher::Event::InitDone));
        }
    }

    #[test]
    fn a_standby_is_ready_and_a_leader_only_once_every_watch_has_listed() {
        let h = Health::default();
        assert_eq!(h.readiness(), (StatusCode::OK, "standby".into()));
        h.start_term();
        let (code, why) = h.readiness();
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
        assert!(why.contains("webhookendpoints.hookd.dev"), "{why}");
        synced(&h);
        assert_eq!(h.readiness(), (StatusCode::OK, "ready".into()));
        h.end_term();
        assert_eq!(h.readiness(), (StatusCode::OK, "standby".into()));
    }

    /// A CRD deleted while running: the watch's relist fails with 404. Before, readiness
    /// was set once at the first sync and stayed 200.
    #[test]
    fn a_failing_watch_turns_readiness_false_and_says_why_until_it_lists_again() {
        let h = Health::default();
        h.start_term();
        synced(&h);
        h.observe("webhookdispatchers.hookd.dev", &not_found());
        let (code, why) = h.readiness();
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            why.contains("watch of webhookdispatchers.hookd.dev failing")
                && why.contains("404")
                && why.contains("kubectl apply -k crds/"),
            "{why}"
        );
        // retried with a backoff: the same error again changes nothing
        h.observe("webhookdispatchers.hookd.dev", &not_found());
        assert_eq!(h.readiness().0, StatusCode::SERVICE_UNAVAILABLE);
        h.observe::<WebhookDispatcher>("webhookdispatchers.hookd.dev", &Ok(watcher::Event::Init));
        assert_eq!(h.readiness().0, StatusCode::SERVICE_UNAVAILABLE);
        h.observe::<WebhookDispatcher>(
            "webhookdispatchers.hookd.dev",
            &Ok(watcher::Event::InitDone),
        );
        assert_eq!(h.readiness(), (StatusCode::OK, "ready".into()));
    }

    /// A watch resumed from its resourceVersion lists nothing: the accepted watch request
    /// is what shows it works again.
    #[test]
    fn a_failing_watch_that_resumes_without_a_relist_is_ready_again() {
        let h = Health::default();
        h.start_term();
        synced(&h);
        h.observe("webhookdispatchers.hookd.dev", &not_found());
        assert_eq!(h.readiness().0, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            watch_of_path("/apis/hookd.dev/v1alpha1/namespaces/hookd-system/webhookdispatchers"),
            Some("webhookdispatchers.hookd.dev")
        );
        h.watch_started("webhookdispatchers.hookd.dev");
        assert_eq!(h.readiness(), (StatusCode::OK, "ready".into()));
    }

    #[test]
    fn a_410_is_a_relist_not_a_failure_to_warn_about() {
        let expired: Item = Err(watcher::Error::WatchError(Box::new(
            kube::core::Status::failure("too old resource version: 1 (2)", "Expired")
                .with_code(410),
        )));
        assert!(is_expired(&expired));
        assert!(!is_expired(&not_found()));
    }
}
