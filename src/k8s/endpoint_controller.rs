//! The WebhookEndpoint controller: a `WebhookEndpoint` and its Secret become an endpoint
//! row through the sync core (the same code as `hookd apply`), and the row's health comes
//! back as the object's status.
//!
//! - A finalizer (`hookd.dev/endpoint`) guarantees the row is disabled and its unfinished
//!   deliveries end as `cancelled` before the object goes away.
//! - Secrets are watched metadata-only and mapped back to the endpoints that reference
//!   them, so a rotation reaches Postgres within seconds; the reconciler GETs the one
//!   Secret it needs.
//! - A missing, unreadable or malformed Secret, or `paused: true`, holds deliveries (the
//!   row is `paused`), never drops them, and says why in `Ready`/`SecretResolved`.
//! - Status is written with server-side apply only when it changed, and the figures from
//!   Postgres (circuit, backlog, last success/failure, dead letters) are refreshed by a
//!   periodic requeue.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use chrono::Utc;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::PartialObjectMeta;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;

use super::conditions::{condition, find, to_time};
use super::crd::{SecretKeyRef, WebhookEndpoint, WebhookEndpointStatus};
use super::sync::{self, ResolvedSecret, SecretProblem, SyncOutcome};
use super::{Context, Error, ObjectEvent};
use crate::db::{self, endpoints::EndpointStats};
use crate::domain::{CircuitState, EndpointState};

/// The finalizer that holds deletion until the endpoint row is disabled.
pub const FINALIZER: &str = "hookd.dev/endpoint";
/// Label value in metrics and logs.
pub const CONTROLLER: &str = "webhookendpoint";
/// Status counts stop here (a saturated figure, not a table scan).
pub const STATS_CAP: i64 = 100_000;

/// Entry point for the `Controller`: finalizer first, then apply or cleanup.
pub async fn reconcile(ep: Arc<WebhookEndpoint>, ctx: Arc<Context>) -> Result<Action, Error> {
    ctx.reconcile_finalized(
        CONTROLLER,
        FINALIZER,
        ep,
        |e| {
            let ctx = &ctx;
            async move { apply(&e, ctx).await }
        },
        |e| {
            let ctx = &ctx;
            async move { cleanup(&e, ctx).await }
        },
    )
    .await
}

/// Retries with per-object exponential backoff and jitter: an outage (database, API
/// server) is retried from a second up to five minutes, a refusal (403, 422, a write the
/// database rejects) from 30 s up to 30 minutes.
pub fn error_policy(ep: Arc<WebhookEndpoint>, err: &Error, ctx: Arc<Context>) -> Action {
    ctx.retry_after(
        CONTROLLER,
        &ep.namespace().unwrap_or_default(),
        &ep.name_any(),
        err,
    )
}

async fn apply(ep: &WebhookEndpoint, ctx: &Context) -> Result<Action, Error> {
    let ns = ep.namespace().unwrap_or_default();
    // A namespace subscribes only to its own tenant's events (the same mapping the API
    // uses for its ServiceAccounts), or any team could declare an endpoint that receives
    // another team's webhooks.
    let own_tenant = ctx.settings.namespace_tenants.tenant_of(&ns);
    let effective;
    let ep = match &ep.spec.tenant {
        Some(t) if *t != own_tenant => return refuse_tenant(ep, ctx, t, &own_tenant).await,
        Some(_) => ep,
        None if own_tenant == ns => ep,
        None => {
            let mut e = ep.clone();
            e.spec.tenant = Some(own_tenant);
            effective = e;
            &effective
        }
    };
    if let Err(problem) = crate::endpoints::validate_declared(&ep.spec.declared()) {
        return refuse_spec(ep, ctx, &problem).await;
    }
    let key = cache_key(&ns, &ep.name_any());
    let secret_version = ctx.secrets.version(&ns, &ep.spec.secret_ref.name);
    if let Some(synced) =
        ctx.secrets
            .fresh(&key, ep, secret_version.as_deref(), ctx.settings.resync)
    {
        return refresh_figures(ep, ctx, &synced).await;
    }
    let secret = read_secret(ctx, &ns, &ep.spec.secret_ref).await?;
    let problem = secret.as_ref().err().cloned();
    let desired = sync::desired_endpoint(ep, secret);
    let now = to_time(Utc::now());
    let (outcome, stats) = match sync_to_db(ctx, &desired).await {
        Ok(v) => v,
        Err(e) => {
            // Say so on the object too, so `kubectl get` does not keep showing a stale
            // Ready=True while nothing can be written.
            if e.is_unavailable() {
                let status = unavailable_status(ep, &now);
                if ep.status.as_ref() != Some(&status)
                    && let Err(pe) = ctx.apply_status(ep, &status).await
                {
                    tracing::debug!(error = %pe, "could not report DatabaseUnavailable");
                }
            }
            return Err(e.into());
        }
    };
    let status = desired_status(ep, problem.as_ref(), &outcome, &stats, &now);
    let mut events = status_events(ep.status.as_ref(), &status, &outcome);
    // said when the secret is stored (a new endpoint or a rotation), not on every resync
    if (outcome.created || outcome.secret_rotated)
        && desired
            .secret
            .as_ref()
            .is_some_and(|s| crate::signing::is_published_test_secret(&s.value))
    {
        events.push(ObjectEvent::warning(
            "PublishedSigningSecret",
            "the signing secret is a published Standard Webhooks test-vector secret: anyone can forge its signatures. Put a generated one in the Secret: whsec_ followed by base64 of 32 random bytes".into(),
        ));
    }
    if ep.status.as_ref() != Some(&status) {
        ctx.apply_status(ep, &status).await?;
    }
    for e in events {
        ctx.publish(ep, e).await;
    }
    ctx.secrets.remember(
        key,
        Synced {
            generation: ep.metadata.generation,
            secret_version,
            problem,
            outcome: SyncOutcome {
                created: false,
                changed: false,
                secret_rotated: false,
                ..outcome
            },
            at: Instant::now(),
        },
    );
    Ok(Action::requeue(ctx.settings.status_interval))
}

/// The periodic pass over an endpoint whose spec and Secret have not changed since its
/// last full sync: only its figures are read back from Postgres. No Secret GET and no
/// sync transaction, and no API request at all unless the figures changed — so idle
/// endpoints cost the API server nothing between resyncs.
async fn refresh_figures(
    ep: &WebhookEndpoint,
    ctx: &Context,
    synced: &Synced,
) -> Result<Action, Error> {
    let Some(stats) =
        db::endpoints::stats(&ctx.pool, synced.outcome.endpoint_id, STATS_CAP).await?
    else {
        // the row went away behind the controller's back: sync it again at once
        ctx.secrets.forget(&cache_key(
            &ep.namespace().unwrap_or_default(),
            &ep.name_any(),
        ));
        return Ok(Action::requeue(std::time::Duration::ZERO));
    };
    let now = to_time(Utc::now());
    let status = desired_status(ep, synced.problem.as_ref(), &synced.outcome, &stats, &now);
    let events = status_events(ep.status.as_ref(), &status, &synced.outcome);
    if ep.status.as_ref() != Some(&status) {
        ctx.apply_status(ep, &status).await?;
    }
    for e in events {
        ctx.publish(ep, e).await;
    }
    Ok(Action::requeue(ctx.settings.status_interval))
}

fn cache_key(ns: &str, name: &str) -> String {
    format!("{ns}/{name}")
}

/// What the last full sync of an endpoint saw and did.
#[derive(Debug, Clone)]
pub struct Synced {
    generation: Option<i64>,
    /// resourceVersion of the Secret as the metadata watch reported it
    secret_version: Option<String>,
    problem: Option<SecretProblem>,
    outcome: SyncOutcome,
    at: Instant,
}

/// The Secrets' versions from the metadata-only watch, and each endpoint's last full
/// sync: a Secret is read again only when its resourceVersion moved (or at resync).
#[derive(Default)]
pub struct SecretCache {
    store: OnceLock<Store<PartialObjectMeta<Secret>>>,
    synced: Mutex<HashMap<String, Synced>>,
}

impl SecretCache {
    /// Connects the cache to the Secret metadata watch's store.
    pub fn set_store(&self, store: Store<PartialObjectMeta<Secret>>) {
        let _ = self.store.set(store);
    }

    /// The Secret's resourceVersion as watched; None when unknown (no watch yet, or the
    /// Secret does not exist), which always means a full pass.
    pub fn version(&self, ns: &str, name: &str) -> Option<String> {
        let store = self.store.get()?;
        store
            .get(&ObjectRef::new(name).within(ns))
            .and_then(|s| s.metadata.resource_version.clone())
    }

    /// The last sync, if it still describes the object: same generation, same Secret
    /// version, younger than `resync`.
    fn fresh(
        &self,
        key: &str,
        ep: &WebhookEndpoint,
        secret_version: Option<&str>,
        resync: std::time::Duration,
    ) -> Option<Synced> {
        let secret_version = secret_version?;
        let synced = self.synced.lock().unwrap_or_else(|e| e.into_inner());
        let s = synced.get(key)?;
        (s.generation == ep.metadata.generation
            && s.secret_version.as_deref() == Some(secret_version)
            && s.at.elapsed() < resync)
            .then(|| s.clone())
    }

    fn remember(&self, key: String, s: Synced) {
        self.synced
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, s);
    }

    fn forget(&self, key: &str) {
        self.synced
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
    }
}

/// Secret -> endpoints that reference it, maintained from the WebhookEndpoint watch, so a
/// Secret event is a map lookup instead of a scan of every endpoint in the store.
#[derive(Default, Clone)]
pub struct SecretIndex(Arc<Mutex<IndexState>>);

#[derive(Default)]
struct IndexState {
    current: SecretMap,
    /// built during a (re)list, swapped in when it completes
    relisting: Option<SecretMap>,
}

#[derive(Default)]
struct SecretMap {
    /// (namespace, Secret name) -> endpoint names
    by_secret: HashMap<(String, String), BTreeSet<String>>,
    /// (namespace, endpoint name) -> Secret name
    by_endpoint: HashMap<(String, String), String>,
}

impl SecretMap {
    fn insert(&mut self, ep: &WebhookEndpoint) {
        let ns = ep.namespace().unwrap_or_default();
        let name = ep.name_any();
        self.remove(&ns, &name);
        let secret = ep.spec.secret_ref.name.clone();
        self.by_secret
            .entry((ns.clone(), secret.clone()))
            .or_default()
            .insert(name.clone());
        self.by_endpoint.insert((ns, name), secret);
    }

    fn remove(&mut self, ns: &str, name: &str) {
        if let Some(secret) = self.by_endpoint.remove(&(ns.to_string(), name.to_string())) {
            let k = (ns.to_string(), secret);
            if let Some(set) = self.by_secret.get_mut(&k) {
                set.remove(name);
                if set.is_empty() {
                    self.by_secret.remove(&k);
                }
            }
        }
    }
}

impl SecretIndex {
    /// Follows one event of the WebhookEndpoint watch.
    pub fn apply(&self, event: &watcher::Event<WebhookEndpoint>) {
        let mut st = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match event {
            watcher::Event::Apply(ep) => st.current.insert(ep),
            watcher::Event::Delete(ep) => st
                .current
                .remove(&ep.namespace().unwrap_or_default(), &ep.name_any()),
            watcher::Event::Init => st.relisting = Some(SecretMap::default()),
            watcher::Event::InitApply(ep) => match st.relisting.as_mut() {
                Some(m) => m.insert(ep),
                None => st.current.insert(ep),
            },
            watcher::Event::InitDone => {
                if let Some(m) = st.relisting.take() {
                    st.current = m;
                }
            }
        }
    }

    /// The endpoints that reference a (metadata-only) Secret.
    pub fn endpoints_for(
        &self,
        secret: &PartialObjectMeta<Secret>,
    ) -> Vec<ObjectRef<WebhookEndpoint>> {
        let ns = secret.namespace().unwrap_or_default();
        let st = self.0.lock().unwrap_or_else(|e| e.into_inner());
        st.current
            .by_secret
            .get(&(ns.clone(), secret.name_any()))
            .into_iter()
            .flatten()
            .map(|name| ObjectRef::new(name).within(&ns))
            .collect()
    }
}

/// The declared tenant is not the namespace's: keep the last accepted row (if any) but
/// hold its deliveries, and say why.
async fn refuse_tenant(
    ep: &WebhookEndpoint,
    ctx: &Context,
    requested: &str,
    own: &str,
) -> Result<Action, Error> {
    let ns = ep.namespace().unwrap_or_default();
    let message = format!(
        "spec.tenant {requested:?} is not the tenant of namespace {ns:?} ({own:?}); an operator maps namespaces to tenants with HOOKD_AUTH_NAMESPACE_TENANTS. Deliveries are held"
    );
    hold(ep, ctx, "TenantNotAllowed", &message).await
}

/// A spec the endpoint rules refuse (`crate::endpoints`), stored before the CRD refused
/// it (a CRD of an older hookd; the API server does not check stored objects again when
/// their rules tighten): held like an unreadable Secret, never delivered with it.
async fn refuse_spec(ep: &WebhookEndpoint, ctx: &Context, problem: &str) -> Result<Action, Error> {
    let message = format!("spec.{problem}. Deliveries are held");
    hold(ep, ctx, "InvalidSpec", &message).await
}

/// Holds the object's endpoint row (deliveries kept, none sent) and says why on the object.
async fn hold(
    ep: &WebhookEndpoint,
    ctx: &Context,
    reason: &str,
    message: &str,
) -> Result<Action, Error> {
    let ns = ep.namespace().unwrap_or_default();
    let mut conn = ctx.pool.acquire().await.map_err(db::DbError::from)?;
    let held = db::endpoints::hold_declared(&mut conn, &ns, &ep.name_any(), message).await?;
    drop(conn);
    let stats = match held {
        Some(id) => db::endpoints::stats(&ctx.pool, id, STATS_CAP).await?,
        None => None,
    };
    let status = refused_status(ep, reason, message, stats.as_ref(), &to_time(Utc::now()));
    let events = status_events(ep.status.as_ref(), &status, &SyncOutcome::unchanged());
    if ep.status.as_ref() != Some(&status) {
        ctx.apply_status(ep, &status).await?;
    }
    for e in events {
        ctx.publish(ep, e).await;
    }
    Ok(Action::requeue(ctx.settings.status_interval))
}

/// The object is being deleted: disable the row and cancel what was still pending, so
/// those deliveries are visible as `cancelled` rather than silently dropped.
async fn cleanup(ep: &WebhookEndpoint, ctx: &Context) -> Result<Action, Error> {
    let ns = ep.namespace().unwrap_or_default();
    let mut conn = ctx.pool.acquire().await.map_err(db::DbError::from)?;
    let removed = sync::remove_endpoint(&mut conn, &ns, &ep.name_any()).await?;
    drop(conn);
    ctx.secrets.forget(&cache_key(&ns, &ep.name_any()));
    if let Some((id, cancelled)) = removed {
        tracing::info!(endpoint = %id, cancelled, "WebhookEndpoint deleted; endpoint disabled");
        // Best effort: a namespace being deleted refuses new Events, and the finalizer
        // must still come off.
        ctx.publish(
            ep,
            ObjectEvent::normal(
                "Deleted",
                format!("endpoint {id} disabled; {cancelled} unfinished deliveries cancelled"),
            ),
        )
        .await;
    }
    Ok(Action::await_change())
}

/// GETs the referenced Secret and validates it. A Secret the controller may not read is
/// a problem of the object (reported in its status), not an error of the controller.
async fn read_secret(
    ctx: &Context,
    ns: &str,
    r: &SecretKeyRef,
) -> Result<Result<ResolvedSecret, SecretProblem>, Error> {
    Ok(ctx
        .get_secret(ns, &r.name)
        .await?
        .and_then(|s| sync::resolve_secret(ns, &r.name, &r.key, s.as_ref())))
}

async fn sync_to_db(
    ctx: &Context,
    desired: &sync::DesiredEndpoint,
) -> Result<(SyncOutcome, EndpointStats), db::DbError> {
    let mut tx = crate::db::begin(&ctx.pool).await?;
    let outcome = sync::apply_endpoint(&mut tx, desired, &ctx.keys).await?;
    tx.commit().await?;
    let stats = db::endpoints::stats(&ctx.pool, outcome.endpoint_id, STATS_CAP)
        .await?
        // the row was just written; only a concurrent manual DELETE gets here
        .ok_or(db::DbError::Query(sqlx::Error::RowNotFound))?;
    Ok((outcome, stats))
}

/// Pure: the status for what the sync and the database report. Conditions keep their
/// `lastTransitionTime` while their status holds, so an unchanged world yields an
/// identical status and no write.
pub fn desired_status(
    ep: &WebhookEndpoint,
    problem: Option<&SecretProblem>,
    outcome: &SyncOutcome,
    stats: &EndpointStats,
    now: &Time,
) -> WebhookEndpointStatus {
    let prev = ep
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or(&[]);
    let generation = ep.metadata.generation;
    let r = &ep.spec.secret_ref;
    let secret_resolved = match problem {
        None => condition(
            prev,
            "SecretResolved",
            "True",
            "SecretResolved",
            format!(
                "Secret {}/{} key {:?} holds a valid signing secret",
                ep.namespace().unwrap_or_default(),
                r.name,
                r.key
            ),
            generation,
            now,
        ),
        Some(p) => condition(
            prev,
            "SecretResolved",
            "False",
            p.reason(),
            p.to_string(),
            generation,
            now,
        ),
    };
    let (ready, reason, message) = if let Some(p) = problem {
        (
            false,
            p.reason(),
            format!("{p}; deliveries are held until it is fixed"),
        )
    } else if let Some(e) = &stats.secret_unreadable {
        (
            false,
            "SecretUnreadable",
            format!(
                "a dispatcher cannot decrypt this endpoint's signing secret ({e}): give it the key in HOOKD_ENCRYPTION_KEY or HOOKD_ENCRYPTION_OLD_KEYS, or re-apply the Secret; deliveries are held, not sent and not counted, and tried again every minute"
            ),
        )
    } else if stats.state == EndpointState::Disabled {
        (
            false,
            "EndpointDisabled",
            stats
                .state_reason
                .clone()
                .unwrap_or_else(|| "the endpoint is disabled".into()),
        )
    } else if ep.spec.paused {
        (
            false,
            "Paused",
            "spec.paused is true: deliveries are created and held".to_string(),
        )
    } else {
        (true, "Active", "deliveries are being sent".to_string())
    };
    let ready = condition(
        prev,
        "Ready",
        super::conditions::status_str(ready),
        reason,
        message,
        generation,
        now,
    );
    let healthy = match stats.circuit_state {
        CircuitState::Closed => condition(
            prev,
            "Healthy",
            "True",
            "CircuitClosed",
            "the receiver is accepting deliveries",
            generation,
            now,
        ),
        CircuitState::Open => condition(
            prev,
            "Healthy",
            "False",
            "CircuitOpen",
            format!(
                "{} consecutive failed attempts opened the circuit; deliveries are held until a probe succeeds",
                stats.circuit_failures
            ),
            generation,
            now,
        ),
        CircuitState::HalfOpen => condition(
            prev,
            "Healthy",
            "False",
            "CircuitHalfOpen",
            "one probe delivery decides whether the circuit closes",
            generation,
            now,
        ),
    };
    WebhookEndpointStatus {
        observed_generation: generation,
        conditions: vec![ready, secret_resolved, healthy],
        endpoint_id: Some(stats.id.to_string()),
        active_secrets: Some(outcome.active_secrets),
        circuit: Some(stats.circuit_state.to_string()),
        backlog: Some(stats.backlog),
        dead_letters: Some(stats.dead_letters),
        last_success_time: stats.last_success.as_ref().map(|a| to_time(a.started_at)),
        last_failure_time: stats.last_failure_at.map(to_time),
    }
}

/// Pure: the status of a declaration the controller refuses (`reason`): `Ready=False`,
/// the other conditions as they were, figures from the held row if there is one.
pub fn refused_status(
    ep: &WebhookEndpoint,
    reason: &str,
    message: &str,
    stats: Option<&EndpointStats>,
    now: &Time,
) -> WebhookEndpointStatus {
    let prev = ep.status.clone().unwrap_or_default();
    let ready = condition(
        &prev.conditions,
        "Ready",
        "False",
        reason,
        message,
        ep.metadata.generation,
        now,
    );
    let mut conditions = vec![ready];
    conditions.extend(prev.conditions.into_iter().filter(|c| c.type_ != "Ready"));
    WebhookEndpointStatus {
        observed_generation: ep.metadata.generation,
        conditions,
        endpoint_id: stats.map(|s| s.id.to_string()),
        // a held row signs nothing
        active_secrets: stats.map(|_| 0),
        circuit: stats.map(|s| s.circuit_state.to_string()),
        backlog: stats.map(|s| s.backlog),
        dead_letters: stats.map(|s| s.dead_letters),
        last_success_time: stats
            .and_then(|s| s.last_success.as_ref().map(|a| to_time(a.started_at))),
        last_failure_time: stats.and_then(|s| s.last_failure_at.map(to_time)),
    }
}

/// The previous status with `Ready=Unknown` (the database cannot be reached, so nothing
/// is known about the endpoint right now).
fn unavailable_status(ep: &WebhookEndpoint, now: &Time) -> WebhookEndpointStatus {
    let mut status = ep.status.clone().unwrap_or_default();
    let ready = condition(
        &status.conditions,
        "Ready",
        "Unknown",
        "DatabaseUnavailable",
        "the database cannot be reached; retrying",
        ep.metadata.generation,
        now,
    );
    status.conditions.retain(|c| c.type_ != "Ready");
    status.conditions.insert(0, ready);
    status
}

/// Pure: the Events for what changed between two statuses (and what the sync did).
/// Transitions only, so a steady state publishes nothing.
pub fn status_events(
    old: Option<&WebhookEndpointStatus>,
    new: &WebhookEndpointStatus,
    outcome: &SyncOutcome,
) -> Vec<ObjectEvent> {
    let mut out = Vec::new();
    let no_conditions = Vec::new();
    let old_conditions = old.map(|s| &s.conditions).unwrap_or(&no_conditions);
    if outcome.created {
        out.push(ObjectEvent::normal(
            "Created",
            format!("endpoint {} created", outcome.endpoint_id),
        ));
    }
    if outcome.secret_rotated {
        out.push(ObjectEvent::normal(
            "SecretRotated",
            format!(
                "signing secret changed; {} secrets sign until the previous one's grace period ends",
                outcome.active_secrets
            ),
        ));
    }
    let was = |t: &str| find(old_conditions, t).map(|c| (c.status.as_str(), c.reason.as_str()));
    if let Some(c) = find(&new.conditions, "SecretResolved") {
        match (was("SecretResolved"), c.status.as_str()) {
            (Some(("True", _)) | None, "False") => out.push(ObjectEvent::warning(
                reason_static(&c.reason),
                c.message.clone(),
            )),
            (Some(("False", _)), "True") => {
                out.push(ObjectEvent::normal("SecretResolved", c.message.clone()))
            }
            _ => {}
        }
    }
    if let Some(c) = find(&new.conditions, "Ready")
        && let Some(reason) = ["EndpointDisabled", "TenantNotAllowed", "InvalidSpec"]
            .into_iter()
            .find(|r| *r == c.reason)
        && was("Ready").map(|w| w.1) != Some(reason)
    {
        out.push(ObjectEvent::warning(reason, c.message.clone()));
    }
    // the status carries the circuit as its database spelling
    let circuit = |s: &WebhookEndpointStatus| s.circuit.as_deref().and_then(CircuitState::parse);
    match (old.and_then(circuit), circuit(new)) {
        (o, Some(CircuitState::Open))
            if !matches!(o, Some(CircuitState::Open | CircuitState::HalfOpen)) =>
        {
            out.push(ObjectEvent::warning(
                "CircuitOpened",
                find(&new.conditions, "Healthy")
                    .map(|c| c.message.clone())
                    .unwrap_or_default(),
            ))
        }
        (Some(CircuitState::Open | CircuitState::HalfOpen), Some(CircuitState::Closed)) => out
            .push(ObjectEvent::normal(
                "CircuitClosed",
                "a probe succeeded; deliveries flow again".into(),
            )),
        _ => {}
    }
    out
}

/// Event reasons are `&'static str`; the secret problems' reasons are a closed set.
fn reason_static(r: &str) -> &'static str {
    match r {
        "SecretNotFound" => "SecretNotFound",
        "SecretUnreadable" => "SecretUnreadable",
        "SecretKeyMissing" => "SecretKeyMissing",
        "SecretMalformed" => "SecretMalformed",
        _ => "SecretProblem",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;
    use uuid::Uuid;

    fn ep() -> WebhookEndpoint {
        let mut ep: WebhookEndpoint = serde_json::from_value(serde_json::json!({
            "apiVersion": "hookd.dev/v1alpha1", "kind": "WebhookEndpoint",
            "metadata": {"name": "e", "namespace": "team-a", "generation": 3},
            "spec": {"url": "https://example.com/h", "secretRef": {"name": "s"}}
        }))
        .unwrap();
        ep.status = None;
        ep
    }

    fn outcome() -> SyncOutcome {
        SyncOutcome {
            endpoint_id: Uuid::nil(),
            created: false,
            changed: false,
            secret_rotated: false,
            active_secrets: 1,
            state: Some(EndpointState::Active),
        }
    }

    fn stats(circuit: CircuitState) -> EndpointStats {
        EndpointStats {
            id: Uuid::nil(),
            state: EndpointState::Active,
            state_reason: None,
            circuit_state: circuit,
            circuit_failures: 0,
            circuit_open_until: None,
            last_success: None,
            last_failure_at: None,
            backlog: 7,
            dead_letters: 2,
            secret_unreadable: None,
            secret_unreadable_since: None,
        }
    }

    #[test]
    fn a_secret_no_dispatcher_can_open_makes_the_endpoint_not_ready() {
        let mut st = stats(CircuitState::Closed);
        st.secret_unreadable = Some("no key \"k2\" in this keyring".into());
        let s = desired_status(&ep(), None, &outcome(), &st, &t(1));
        let ready = s.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!(ready.status, "False");
        assert_eq!(ready.reason, "SecretUnreadable");
        assert!(ready.message.contains("no key \"k2\""), "{}", ready.message);
        assert!(ready.message.contains("held"), "{}", ready.message);
    }

    fn t(s: i64) -> Time {
        Time(Timestamp::from_second(s).unwrap())
    }

    #[test]
    fn unchanged_world_gives_identical_status() {
        let mut e = ep();
        let first = desired_status(&e, None, &outcome(), &stats(CircuitState::Closed), &t(100));
        e.status = Some(first.clone());
        let second = desired_status(&e, None, &outcome(), &stats(CircuitState::Closed), &t(200));
        assert_eq!(
            first, second,
            "a later reconcile must not rewrite the status"
        );
        assert!(status_events(Some(&first), &second, &outcome()).is_empty());
    }

    #[test]
    fn missing_secret_is_not_ready_and_says_why() {
        let problem = SecretProblem::NotFound {
            namespace: "team-a".into(),
            name: "s".into(),
        };
        let s = desired_status(
            &ep(),
            Some(&problem),
            &outcome(),
            &stats(CircuitState::Closed),
            &t(1),
        );
        let ready = find(&s.conditions, "Ready").unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "SecretNotFound")
        );
        assert!(ready.message.contains("held"), "{}", ready.message);
        let sr = find(&s.conditions, "SecretResolved").unwrap();
        assert_eq!(sr.status, "False");
        assert_eq!(sr.observed_generation, Some(3));
        let ev = status_events(None, &s, &outcome());
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].reason, "SecretNotFound");
        assert!(ev[0].warning);
    }

    #[test]
    fn paused_disabled_and_circuit() {
        let mut paused = ep();
        paused.spec.paused = true;
        let s = desired_status(
            &paused,
            None,
            &outcome(),
            &stats(CircuitState::Closed),
            &t(1),
        );
        assert_eq!(find(&s.conditions, "Ready").unwrap().reason, "Paused");

        let mut st = stats(CircuitState::Closed);
        st.state = EndpointState::Disabled;
        st.state_reason = Some("receiver answered 410 Gone".into());
        let closed = desired_status(&ep(), None, &outcome(), &stats(CircuitState::Closed), &t(1));
        let disabled = desired_status(&ep(), None, &outcome(), &st, &t(2));
        let ready = find(&disabled.conditions, "Ready").unwrap();
        assert_eq!(ready.reason, "EndpointDisabled");
        assert!(ready.message.contains("410"));
        let ev = status_events(Some(&closed), &disabled, &outcome());
        assert_eq!(
            ev.iter().map(|e| e.reason).collect::<Vec<_>>(),
            vec!["EndpointDisabled"]
        );

        let mut open = stats(CircuitState::Open);
        open.circuit_failures = 5;
        let opened = desired_status(&ep(), None, &outcome(), &open, &t(3));
        assert_eq!(opened.circuit.as_deref(), Some("open"));
        let healthy = find(&opened.conditions, "Healthy").unwrap();
        assert_eq!(
            (healthy.status.as_str(), healthy.reason.as_str()),
            ("False", "CircuitOpen")
        );
        let ev = status_events(Some(&closed), &opened, &outcome());
        assert_eq!(
            ev.iter().map(|e| e.reason).collect::<Vec<_>>(),
            vec!["CircuitOpened"]
        );
        let ev = status_events(Some(&opened), &closed, &outcome());
        assert_eq!(
            ev.iter().map(|e| e.reason).collect::<Vec<_>>(),
            vec!["CircuitClosed"]
        );
        // Ready stays True while the circuit is open: the endpoint is configured right,
        // the receiver is what fails (shown by Healthy and the CIRCUIT column).
        assert_eq!(find(&opened.conditions, "Ready").unwrap().status, "True");
    }

    #[test]
    fn rotation_and_creation_events() {
        let mut o = outcome();
        o.created = true;
        let s = desired_status(&ep(), None, &o, &stats(CircuitState::Closed), &t(1));
        let ev = status_events(None, &s, &o);
        assert_eq!(
            ev.iter().map(|e| e.reason).collect::<Vec<_>>(),
            vec!["Created"]
        );
        let mut r = outcome();
        r.secret_rotated = true;
        r.active_secrets = 2;
        let ev = status_events(Some(&s), &s, &r);
        assert_eq!(
            ev.iter().map(|e| e.reason).collect::<Vec<_>>(),
            vec!["SecretRotated"]
        );
    }
}
