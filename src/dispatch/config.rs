//! The dispatcher's settings, validated: what `hookd dispatch`'s flags and variables
//! become before the loop starts.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use uuid::Uuid;

use super::policy::{self, RetryPolicy};
use crate::config::DispatchSettings;
use crate::outbound::{AllowList, HostResolver};

/// The shortest lease accepted. Leases are renewed (fenced on the claim token) every
/// quarter lease while a request runs, so a lease need not outlive the request timeout;
/// short leases are what lets a replacement take over a killed dispatcher's deliveries
/// within seconds (issue 13).
pub const MIN_LEASE_SECS: u64 = 2;

/// Validated dispatcher configuration.
#[derive(Clone)]
pub struct DispatchConfig {
    pub worker_id: Uuid,
    pub lease: Duration,
    pub request_timeout: Duration,
    pub concurrency: usize,
    pub endpoint_concurrency: usize,
    pub allow: AllowList,
    pub retry: RetryPolicy,
    pub circuit_threshold: u32,
    pub circuit_cooldown: Duration,
    pub poll_interval: Duration,
    pub notify: bool,
    /// A direct URL for LISTEN (see `DispatchSettings::notify_database_url`)
    pub notify_url: Option<String>,
    pub shutdown_grace: Duration,
    pub snippet_bytes: usize,
    /// DNS for receiver host names; `None` is the system resolver. Tests script answers
    /// here (e.g. DNS rebinding); whatever it answers still passes the outbound guard.
    pub resolver: Option<Arc<dyn HostResolver>>,
    /// Told each delivery a worker reaches a [`Stage`] with, and awaited before the
    /// worker goes on: tests set it to hold a worker between claim and completion (as
    /// River's test signals do) and look at the queue meanwhile. `None` outside tests,
    /// where it costs one branch per stage. A held worker keeps its slot and its lease
    /// (still renewed), and is stopped like a send if the lease is lost.
    pub stage_hook: Option<StageHook>,
}

/// Where a worker is with a claimed delivery, as [`DispatchConfig::stage_hook`] sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// leased and about to be sent
    Claimed,
    /// sent and classified; the outcome is not yet handed to the completer
    Sent,
}

/// See [`DispatchConfig::stage_hook`]: called with the stage and the delivery's id.
pub type StageHook = Arc<dyn Fn(Stage, Uuid) -> BoxFuture<'static, ()> + Send + Sync>;

impl std::fmt::Debug for DispatchConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DispatchConfig")
            .field("worker_id", &self.worker_id)
            .field("lease", &self.lease)
            .field("request_timeout", &self.request_timeout)
            .field("concurrency", &self.concurrency)
            .field("endpoint_concurrency", &self.endpoint_concurrency)
            .field("allow", &self.allow)
            .field("retry", &self.retry)
            .field("resolver", &self.resolver.as_ref().map(|_| "custom"))
            .field("stage_hook", &self.stage_hook.as_ref().map(|_| "set"))
            .finish_non_exhaustive()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "HOOKD_LEASE_SECS ({lease}s) must be at least {MIN_LEASE_SECS}s: a lease is renewed every quarter of it while its request runs, and a shorter one would lapse between renewals"
    )]
    LeaseTooShort { lease: u64 },
    #[error("HOOKD_ALLOWED_DESTINATIONS: {0}")]
    AllowList(String),
    #[error(
        "HOOKD_RETRY_SCHEDULE: {0:?} is not a comma-separated list of seconds, each from 1 to 2592000 (30 days)"
    )]
    Schedule(String),
    #[error("{0} must be at least 1")]
    Zero(&'static str),
}

impl DispatchConfig {
    pub fn from_settings(s: &DispatchSettings) -> Result<Self, ConfigError> {
        if s.lease_secs < MIN_LEASE_SECS {
            return Err(ConfigError::LeaseTooShort {
                lease: s.lease_secs,
            });
        }
        if s.concurrency == 0 {
            return Err(ConfigError::Zero("HOOKD_CONCURRENCY"));
        }
        if s.endpoint_concurrency == 0 {
            return Err(ConfigError::Zero("HOOKD_ENDPOINT_CONCURRENCY"));
        }
        let schedule = s
            .retry_schedule
            .split(',')
            .map(|p| {
                p.trim()
                    .parse::<u64>()
                    .ok()
                    .filter(|v| *v > 0 && *v <= policy::MAX_RETRY_DELAY.as_secs())
                    .map(Duration::from_secs)
            })
            .collect::<Option<Vec<_>>>()
            .filter(|v| !v.is_empty())
            .ok_or_else(|| ConfigError::Schedule(s.retry_schedule.clone()))?;
        let max_attempts = s
            .max_attempts
            .unwrap_or(u32::try_from(schedule.len() + 1).unwrap_or(u32::MAX));
        Ok(DispatchConfig {
            worker_id: Uuid::now_v7(),
            lease: Duration::from_secs(s.lease_secs),
            request_timeout: Duration::from_secs(s.request_timeout_secs),
            concurrency: s.concurrency,
            endpoint_concurrency: s.endpoint_concurrency,
            allow: AllowList::parse(&s.allowed_destinations).map_err(ConfigError::AllowList)?,
            retry: RetryPolicy {
                schedule,
                max_attempts: max_attempts.max(1),
                jitter: s.retry_jitter.clamp(0.0, 1.0),
                max_retry_after: Duration::from_secs(s.max_retry_after_secs),
            },
            circuit_threshold: s.circuit_failures.max(1),
            circuit_cooldown: Duration::from_secs(s.circuit_cooldown_secs),
            poll_interval: Duration::from_millis(s.poll_ms.max(10)),
            notify: s.notify,
            notify_url: s.notify_database_url.clone(),
            shutdown_grace: Duration::from_secs(s.shutdown_grace_secs),
            snippet_bytes: s.response_snippet_bytes,
            resolver: None,
            stage_hook: None,
        })
    }
}
