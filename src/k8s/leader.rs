//! Leader election on a `coordination.k8s.io` Lease (kube-lease-manager): only the holder
//! reconciles; the other replicas wait and take over within the lease duration when the
//! holder dies.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http::{Method, Request, Response};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use kube_lease_manager::LeaseManagerBuilder;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

/// The holder renews this long before expiry (also the clock skew tolerated), at most a
/// third of the lease so that renewal always has time to land.
const LEASE_GRACE_SECS: u64 = 5;

/// Which Lease, and who this replica is.
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    pub name: String,
    pub namespace: String,
    /// unique per replica (the pod name)
    pub identity: String,
    /// seconds the lease stays valid without renewal: how long work pauses when a leader dies
    pub duration_secs: u64,
}

/// Records when a write of the Lease last succeeded (the time the request was sent, a
/// lower bound of the `renewTime` it wrote), as a tower layer on the lease manager's
/// client. kube-lease-manager reports only changes of leadership, and a renewal that fails
/// or hangs is retried silently while the Lease runs out; this is how the leader knows how
/// long its Lease is certainly still valid.
#[derive(Clone)]
pub struct RenewalObserver {
    lease_path_suffix: String,
    renewed: watch::Sender<Option<Instant>>,
}

impl RenewalObserver {
    pub fn new(lease: &LeaseConfig) -> (Self, watch::Receiver<Option<Instant>>) {
        let (renewed, rx) = watch::channel(None);
        (
            RenewalObserver {
                lease_path_suffix: format!("/namespaces/{}/leases/{}", lease.namespace, lease.name),
                renewed,
            },
            rx,
        )
    }
}

impl<S> tower::Layer<S> for RenewalObserver {
    type Service = Observed<S>;
    fn layer(&self, inner: S) -> Observed<S> {
        Observed {
            inner,
            observer: self.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Observed<S> {
    inner: S,
    observer: RenewalObserver,
}

impl<S, B, RB> tower::Service<Request<B>> for Observed<S>
where
    S: tower::Service<Request<B>, Response = Response<RB>>,
    S::Future: Send + 'static,
    S::Error: 'static,
    RB: 'static,
{
    type Response = Response<RB>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<RB>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let lease_write = req.method() == Method::PATCH
            && req.uri().path().ends_with(&self.observer.lease_path_suffix);
        let sent = Instant::now();
        let fut = self.inner.call(req);
        let renewed = self.observer.renewed.clone();
        Box::pin(async move {
            let res = fut.await;
            if lease_write && matches!(&res, Ok(r) if r.status().is_success()) {
                renewed.send_replace(Some(sent));
            }
            res
        })
    }
}

/// Pure: when the leader must stop working: the Lease it last wrote expires `duration`
/// after it was sent, and another replica may take over from then on (less the clock skew
/// it may have); stopping `margin` earlier leaves no moment with two leaders.
pub fn work_deadline(last_renewal: Instant, duration: Duration, margin: Duration) -> Instant {
    last_renewal + duration.saturating_sub(margin)
}

/// Clears the Lease only if this replica still holds it: the patch carries the
/// resourceVersion this replica read, so the API server refuses it (409) if another
/// replica has written the Lease since — a slow shutdown never releases somebody else's
/// leadership.
pub async fn release_if_held(client: Client, lease: &LeaseConfig) -> anyhow::Result<bool> {
    let api: Api<Lease> = Api::namespaced(client, &lease.namespace);
    let Some(current) = api.get_opt(&lease.name).await? else {
        return Ok(false);
    };
    let holder = current
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref());
    if holder != Some(lease.identity.as_str()) {
        return Ok(false);
    }
    let patch = serde_json::json!({
        "metadata": {"resourceVersion": current.metadata.resource_version},
        "spec": {"holderIdentity": null, "renewTime": null, "acquireTime": null,
                 "leaseDurationSeconds": null},
    });
    match api
        .patch(&lease.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if matches!(s.code, 404 | 409) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// How a leadership term ended.
enum Term {
    /// shutdown was requested (or the work ended by itself): stop for good
    Done,
    /// leadership was lost or could not be confirmed in time: campaign again
    Lost,
}

/// Campaigns for the Lease and runs `work` for each term of leadership until `shutdown`
/// fires (releasing the Lease so a standby takes over at once). An API server that cannot
/// be reached — at start, or for longer than the renewal window while leading — never
/// ends this: the work of a term that could not renew in time is cancelled before another
/// replica may take the Lease over, and the replica campaigns again, with a new lease
/// manager, as a restarted process would (without the CrashLoopBackOff).
pub async fn run_as_leader<F, Fut>(
    client: Client,
    lease: &LeaseConfig,
    renewed: watch::Receiver<Option<Instant>>,
    metrics: &Metrics,
    shutdown: CancellationToken,
    mut work: F,
) -> anyhow::Result<()>
where
    F: FnMut(CancellationToken) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut renewed = renewed;
    let mut failures = 0u32;
    loop {
        let term_start = Instant::now();
        let manager = match build_manager(&client, lease).await {
            Ok(m) => {
                failures = 0;
                m
            }
            Err(e) => {
                failures = failures.saturating_add(1);
                let delay = super::backoff_delay(
                    failures,
                    Duration::from_secs(1),
                    Duration::from_secs(30),
                    rand::random::<f64>(),
                );
                tracing::warn!(error = %e, retry_in = ?delay, lease = %format!("{}/{}", lease.namespace, lease.name),
                    "cannot read or create the leader Lease; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(delay) => continue,
                    _ = shutdown.cancelled() => return Ok(()),
                }
            }
        };
        match term(
            manager,
            client.clone(),
            lease,
            &mut renewed,
            term_start,
            metrics,
            &shutdown,
            &mut work,
        )
        .await
        {
            Term::Done => return Ok(()),
            Term::Lost => {
                tracing::warn!(identity = %lease.identity,
                    "stopped reconciling: leadership lost or not renewed in time; campaigning again");
            }
        }
    }
}

async fn build_manager(
    client: &Client,
    lease: &LeaseConfig,
) -> Result<kube_lease_manager::LeaseManager, kube_lease_manager::LeaseManagerError> {
    let duration = lease.duration_secs.max(3);
    LeaseManagerBuilder::new(client.clone(), &lease.name)
        .with_namespace(lease.namespace.as_str())
        .with_identity(lease.identity.as_str())
        .with_duration(duration)
        .with_grace(LEASE_GRACE_SECS.min(duration / 3))
        .build()
        .await
}

/// One campaign and, if it is won, one term of leadership.
#[allow(clippy::too_many_arguments)]
async fn term<F, Fut>(
    manager: kube_lease_manager::LeaseManager,
    client: Client,
    lease: &LeaseConfig,
    renewed: &mut watch::Receiver<Option<Instant>>,
    term_start: Instant,
    metrics: &Metrics,
    shutdown: &CancellationToken,
    work: &mut F,
) -> Term
where
    F: FnMut(CancellationToken) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (lease_name, namespace, identity) = (&lease.name, &lease.namespace, &lease.identity);
    let duration = lease.duration_secs.max(3);
    let grace = LEASE_GRACE_SECS.min(duration / 3);
    // renewals start `grace` before expiry; stop half-way through that window if none
    // has succeeded by then
    let margin = Duration::from_secs_f64(grace as f64 / 2.0);
    let lease_duration = Duration::from_secs(duration);
    let (mut leading, lease_task) = manager.watch().await;
    tracing::info!(lease = %format!("{namespace}/{lease_name}"), %identity, "waiting for the leader lease");
    loop {
        if *leading.borrow_and_update() {
            break;
        }
        tokio::select! {
            changed = leading.changed() => {
                if changed.is_err() {
                    tracing::warn!("the lease manager stopped; campaigning again");
                    lease_task.abort();
                    return Term::Lost;
                }
            }
            _ = shutdown.cancelled() => {
                lease_task.abort();
                return Term::Done;
            }
        }
    }
    tracing::info!(%identity, "acquired the leader lease");
    metrics.leader.set(1);
    // The Lease is certainly ours only as long after the last successful write as it lasts:
    // a new manager that finds this replica still named as holder claims it without
    // writing, so a write of an earlier term is what counts then. Nothing observed at all:
    // "just now" (the acquiring write completed before `leading` turned true).
    let last_write = *renewed.borrow_and_update();
    let mut deadline = work_deadline(
        last_write.unwrap_or_else(Instant::now),
        lease_duration,
        margin,
    );
    if last_write.is_some_and(|t| t < term_start) && deadline <= Instant::now() {
        tracing::warn!(%identity, "still named holder of a Lease not renewed in time; not leading until a renewal succeeds");
        metrics.leader.set(0);
        lease_task.abort();
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(grace.max(1))) => {}
            _ = shutdown.cancelled() => return Term::Done,
        }
        return Term::Lost;
    }
    let token = shutdown.child_token();
    let mut worker = tokio::spawn(work(token.clone()));
    let (lost, finished) = loop {
        tokio::select! {
            changed = leading.changed() => {
                if changed.is_err() || !*leading.borrow_and_update() {
                    break (true, false);
                }
            }
            r = renewed.changed() => {
                if r.is_ok() && let Some(t) = *renewed.borrow_and_update() {
                    deadline = work_deadline(t, lease_duration, margin);
                }
            }
            _ = tokio::time::sleep_until(deadline.into()) => {
                tracing::error!(%identity, "the leader lease could not be renewed in time; stopping before another replica may take it over");
                break (true, false);
            }
            _ = shutdown.cancelled() => break (false, false),
            _ = &mut worker => break (false, true),
        }
    };
    token.cancel();
    if !finished {
        let _ = worker.await;
    }
    metrics.leader.set(0);
    // The lease task would release on its own when the receiver is dropped, checking the
    // holder first but writing without a precondition; stop it and release only what is
    // still this replica's.
    lease_task.abort();
    drop(leading);
    if lost {
        return Term::Lost;
    }
    match release_if_held(client, lease).await {
        Ok(true) => tracing::info!("released the leader lease"),
        Ok(false) => tracing::info!("the leader lease was no longer ours; nothing to release"),
        Err(e) => {
            tracing::warn!(error = %e, "could not release the leader lease; it expires by itself")
        }
    }
    Term::Done
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_stops_before_the_lease_can_be_taken_over() {
        let t0 = Instant::now();
        let d = work_deadline(t0, Duration::from_secs(15), Duration::from_millis(2500));
        assert_eq!(d - t0, Duration::from_millis(12_500));
        // renewals start 5 s before expiry: the deadline leaves them 2.5 s to land
        assert!(d - t0 > Duration::from_secs(10));
        assert!(d - t0 < Duration::from_secs(15));
    }
}
