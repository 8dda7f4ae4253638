//! What a dispatcher has in flight: slots taken per endpoint, tenant and consumer (the
//! shares each claim asks for), and the leases it holds, renewed while their sends run.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::db::{
    self,
    deliveries::{ClaimedDelivery, ConsumerBusy, TenantBusy, TenantShares},
};

/// In-flight bookkeeping shared by the claimer, the lease renewer and delivery tasks.
#[derive(Default)]
pub(super) struct InFlight {
    pub(super) per_endpoint: HashMap<Uuid, i32>,
    pub(super) per_tenant: HashMap<String, i32>,
    /// by tenant and consumer (None: the tenant's tenant-wide endpoints)
    pub(super) per_consumer: HashMap<(String, Option<String>), i32>,
    /// to renew leases, and to hand them back if the shutdown deadline passes
    pub(super) leases: HashMap<Uuid, HeldLease>,
    /// Since the last scan read what is in flight, a slot was given back that may let a
    /// claim take what that scan held back: its endpoint, consumer or tenant was at its
    /// cap, or it was its tenant's or consumer's last (the others' shares grow). Only
    /// then does a freed slot scan: after every one, at 200 events/s most new deliveries
    /// were leased by those scans instead of as handed (90 of 600 handed).
    pub(super) freed_at_cap: bool,
}

pub(super) struct HeldLease {
    pub(super) claim_token: Uuid,
    /// whether the send had begun
    pub(super) started: bool,
    /// until when the lease is surely ours: measured from before the statement that set
    /// it, on this host's monotonic clock, so the database's expiry is never earlier
    pub(super) until: Instant,
    /// stops the send when the lease is lost, or about to lapse unrenewed, so no other
    /// worker can send the delivery while this one still is
    pub(super) stop: CancellationToken,
}

/// The most of `slots` one holder may take, given how many holders have deliveries in
/// flight here (issue 19): an equal share of the slots, less a reserve that no single
/// holder can take, so a holder whose receivers are slow can never take every slot and
/// another's delivery waits for a free slot, not for those receivers. A holder alone may
/// use all but the reserve. Applied twice: tenants share the worker's slots, and the
/// consumers of a tenant share that tenant's share.
pub fn share_cap(slots: usize, holders_in_flight: usize) -> i32 {
    let reserve = if slots > 1 { (slots / 16).max(1) } else { 0 };
    let shared = slots - reserve;
    let cap = shared.div_ceil(holders_in_flight.max(1)).max(1);
    i32::try_from(cap).unwrap_or(i32::MAX)
}

impl InFlight {
    /// Every tenant's and consumer's share for the next claim.
    pub(super) fn shares(&self, concurrency: usize) -> TenantShares {
        let cap = share_cap(concurrency, self.per_tenant.len());
        let tenant_slots = usize::try_from(cap).unwrap_or(usize::MAX);
        let mut groups: HashMap<&str, usize> = HashMap::new();
        for (tenant, _) in self.per_consumer.keys() {
            *groups.entry(tenant.as_str()).or_default() += 1;
        }
        TenantShares {
            cap,
            busy: self
                .per_tenant
                .iter()
                .map(|(tenant, n)| TenantBusy {
                    tenant: tenant.clone(),
                    in_flight: *n,
                    consumer_cap: share_cap(
                        tenant_slots,
                        groups.get(tenant.as_str()).copied().unwrap_or(0),
                    ),
                })
                .collect(),
            consumer_cap: share_cap(tenant_slots, 0),
            consumers_busy: self
                .per_consumer
                .iter()
                .map(|((tenant, consumer), n)| ConsumerBusy {
                    tenant: tenant.clone(),
                    consumer: consumer.clone(),
                    in_flight: *n,
                })
                .collect(),
        }
    }

    pub(super) fn take(&mut self, row: &ClaimedDelivery) {
        *self.per_endpoint.entry(row.endpoint_id).or_insert(0) += 1;
        *self.per_tenant.entry(row.tenant.clone()).or_insert(0) += 1;
        *self
            .per_consumer
            .entry((row.tenant.clone(), row.consumer.clone()))
            .or_insert(0) += 1;
    }

    /// Gives back one delivery's place (`endpoint_cap`: the most its endpoint may have in
    /// flight here), noting in [`InFlight::freed_at_cap`] whether the slot it frees
    /// matters to a scan. The caps are [`InFlight::shares`]'s.
    pub(super) fn give_back(
        &mut self,
        endpoint_id: Uuid,
        owner: (String, Option<String>),
        endpoint_cap: i32,
        concurrency: usize,
    ) {
        let tenant_cap = share_cap(concurrency, self.per_tenant.len());
        let groups = self
            .per_consumer
            .keys()
            .filter(|(t, _)| *t == owner.0)
            .count();
        let consumer_cap = share_cap(usize::try_from(tenant_cap).unwrap_or(usize::MAX), groups);
        let tenant_n = self.per_tenant.get(&owner.0).copied().unwrap_or(0);
        let consumer_n = self.per_consumer.get(&owner).copied().unwrap_or(0);
        if self.per_endpoint.get(&endpoint_id).copied().unwrap_or(0) >= endpoint_cap
            || tenant_n >= tenant_cap
            || consumer_n >= consumer_cap
            || (tenant_n == 1 && self.per_tenant.len() > 1)
            || (consumer_n == 1 && groups > 1)
        {
            self.freed_at_cap = true;
        }
        fn dec<K: std::hash::Hash + Eq>(map: &mut HashMap<K, i32>, key: &K) {
            if let Some(n) = map.get_mut(key) {
                *n -= 1;
                if *n <= 0 {
                    map.remove(key);
                }
            }
        }
        dec(&mut self.per_endpoint, &endpoint_id);
        dec(&mut self.per_tenant, &owner.0);
        dec(&mut self.per_consumer, &owner);
    }
}

/// Renews the leases of deliveries in flight every quarter lease, fenced on their claim
/// tokens. A send whose lease was taken over is stopped at once; one whose lease could not
/// be renewed (database unreachable) is stopped shortly before the lease could lapse, so a
/// slow receiver is never sent the same delivery by two workers at once.
pub(super) fn spawn_lease_renewer(
    pool: PgPool,
    lease: Duration,
    in_flight: Arc<Mutex<InFlight>>,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let every = lease / 4;
    // stop a send this long before its lease could lapse: a stopped request is dropped
    // at once, but the margin also covers a renewal statement still in flight
    let margin = (lease / 4).min(Duration::from_secs(1));
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = stop.cancelled() => return,
            }
            let held: Vec<(Uuid, Uuid)> = {
                let f = in_flight.lock().expect("in-flight lock");
                f.leases
                    .iter()
                    .map(|(id, l)| (*id, l.claim_token))
                    .collect()
            };
            if !held.is_empty() {
                let sent = Instant::now();
                let renewal = tokio::time::timeout(
                    every.max(Duration::from_millis(500)),
                    db::deliveries::renew_leases(&pool, &held, lease.as_secs_f64()),
                )
                .await;
                match renewal {
                    Ok(Ok(renewed)) => {
                        let renewed: std::collections::HashSet<Uuid> =
                            renewed.into_iter().collect();
                        let mut f = in_flight.lock().expect("in-flight lock");
                        for (id, token) in &held {
                            if let Some(l) = f.leases.get_mut(id)
                                && l.claim_token == *token
                            {
                                if renewed.contains(id) {
                                    l.until = sent + lease;
                                } else {
                                    // taken over (or completed meanwhile, when nothing is
                                    // left to stop)
                                    l.stop.cancel();
                                }
                            }
                        }
                    }
                    Ok(Err(e)) => tracing::warn!(error = %e, "renewing leases failed"),
                    Err(_) => tracing::warn!("renewing leases timed out"),
                }
            }
            let now = Instant::now();
            let f = in_flight.lock().expect("in-flight lock");
            for l in f.leases.values() {
                if l.until.saturating_duration_since(now) <= margin && !l.stop.is_cancelled() {
                    l.stop.cancel();
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hold(f: &mut InFlight, endpoint: Uuid, tenant: &str) {
        *f.per_endpoint.entry(endpoint).or_insert(0) += 1;
        *f.per_tenant.entry(tenant.into()).or_insert(0) += 1;
        *f.per_consumer.entry((tenant.into(), None)).or_insert(0) += 1;
    }

    #[test]
    fn a_freed_slot_matters_to_a_scan_only_at_a_cap() {
        let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
        let owner = |t: &str| (t.to_string(), None);
        // two of an endpoint whose cap is 4, a tenant's share of 64 slots: no cap met
        let mut f = InFlight::default();
        hold(&mut f, a, "t");
        hold(&mut f, a, "t");
        f.give_back(a, owner("t"), 4, 64);
        assert!(!f.freed_at_cap);
        // the endpoint's own cap (max_in_flight 1) was met
        f.give_back(a, owner("t"), 1, 64);
        assert!(f.freed_at_cap);
        // a tenant's last one grows the share of the other tenant in flight
        let mut f = InFlight::default();
        hold(&mut f, a, "t");
        hold(&mut f, b, "u");
        f.give_back(a, owner("t"), 32, 64);
        assert!(f.freed_at_cap);
        // the only tenant's share of 17 slots (16, one held back) was met
        let mut f = InFlight::default();
        for _ in 0..16 {
            hold(&mut f, Uuid::now_v7(), "t");
        }
        let e = *f.per_endpoint.keys().next().expect("held");
        f.give_back(e, owner("t"), 32, 17);
        assert!(f.freed_at_cap);
        assert_eq!(f.per_tenant["t"], 15);
    }
}
