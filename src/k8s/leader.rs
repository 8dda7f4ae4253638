//! Leader election on a `coordination.k8s.io` Lease (kube-lease-manager): only the holder
//! reconciles; the other replicas wait and take over within the lease duration when the
//! holder dies.

use std::future::Future;

use kube::Client;
use kube_lease_manager::LeaseManagerBuilder;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

/// The holder renews this long before expiry (also the clock skew tolerated), at most a
/// third of the lease so that renewal always has time to land.
const LEASE_GRACE_SECS: u64 = 5;

/// Waits for the lease, runs `work` while holding it, and returns when `shutdown` fires
/// (releasing the lease so a standby takes over at once). If the lease is lost while
/// working, the work is cancelled and an error returned: the process should exit rather
/// than carry on as a possibly stale second leader.
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

pub async fn run_as_leader<F, Fut>(
    client: Client,
    lease: &LeaseConfig,
    metrics: &Metrics,
    shutdown: CancellationToken,
    work: F,
) -> anyhow::Result<()>
where
    F: FnOnce(CancellationToken) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (lease_name, namespace, identity) = (&lease.name, &lease.namespace, &lease.identity);
    let duration = lease.duration_secs.max(3);
    let manager = LeaseManagerBuilder::new(client, lease_name)
        .with_namespace(namespace.as_str())
        .with_identity(identity.as_str())
        .with_duration(duration)
        .with_grace(LEASE_GRACE_SECS.min(duration / 3))
        .build()
        .await?;
    let (mut leading, lease_task) = manager.watch().await;
    tracing::info!(lease = %format!("{namespace}/{lease_name}"), %identity, "waiting for the leader lease");
    loop {
        if *leading.borrow_and_update() {
            break;
        }
        tokio::select! {
            changed = leading.changed() => {
                if changed.is_err() {
                    anyhow::bail!("leader election stopped unexpectedly");
                }
            }
            _ = shutdown.cancelled() => {
                drop(leading);
                let _ = lease_task.await;
                return Ok(());
            }
        }
    }
    tracing::info!(%identity, "acquired the leader lease");
    metrics.leader.set(1);
    let token = shutdown.child_token();
    let mut worker = tokio::spawn(work(token.clone()));
    let (lost, finished) = loop {
        tokio::select! {
            changed = leading.changed() => {
                if changed.is_err() || !*leading.borrow_and_update() {
                    break (true, false);
                }
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
    // Dropping the receiver makes the lease task release the lease and stop.
    drop(leading);
    let _ = lease_task.await;
    if lost {
        anyhow::bail!("lost the leader lease; exiting so that a standby replica takes over");
    }
    tracing::info!("released the leader lease");
    Ok(())
}
