//! Retry policy: what an attempt's result means for the delivery. Pure functions, so the
//! schedule, jitter bounds, Retry-After handling and exhaustion are unit-tested without
//! a clock or a database.

use std::time::Duration;

use chrono::{DateTime, Utc};
use rand::Rng;

use crate::domain::ErrorClass;

/// What one HTTP attempt produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptResult {
    /// 2xx
    Success { status: u16 },
    /// 410 Gone: the receiver asks us to stop; the endpoint gets disabled.
    Gone,
    /// non-2xx, timeout, connection error: retry per schedule.
    Retryable {
        status: Option<u16>,
        class: ErrorClass,
        error: String,
        retry_after: Option<Duration>,
    },
    /// Nothing a retry can fix (destination refused by policy, unparseable URL): dead now.
    Permanent { class: ErrorClass, error: String },
}

/// The longest delay a retry schedule may hold (30 days). Checked at start, so a typo in
/// `HOOKD_RETRY_SCHEDULE` is an error, not an overflow or an immediate retry.
pub const MAX_RETRY_DELAY: Duration = Duration::from_secs(30 * 24 * 3600);

#[derive(Debug, Clone)]
pub struct RetryPolicy {
    /// delay before retry n (n = 1 is the first retry); past the end the last entry repeats
    pub schedule: Vec<Duration>,
    pub max_attempts: u32,
    /// ±fraction applied to each delay
    pub jitter: f64,
    pub max_retry_after: Duration,
}

/// The state a delivery moves to after an attempt.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    Succeeded,
    /// due again this long after the outcome is written (the database adds it to its own
    /// now(), so this host's clock never matters)
    Retry {
        delay: Duration,
    },
    Dead {
        reason: String,
    },
}

impl RetryPolicy {
    /// The default schedule of webhook senders: after 5 s, 5 min, 30 min, 2 h, 5 h, 10 h,
    /// 10 h (8 attempts in all, about 27.5 h end to end).
    pub fn standard_schedule() -> Vec<Duration> {
        [5, 300, 1800, 7200, 18000, 36000, 36000]
            .into_iter()
            .map(Duration::from_secs)
            .collect()
    }

    /// An endpoint's own schedule / max attempts override the process defaults.
    pub fn for_endpoint(
        &self,
        schedule_secs: Option<&[i32]>,
        max_attempts: Option<i32>,
    ) -> RetryPolicy {
        let mut p = self.clone();
        if let Some(s) = schedule_secs.filter(|s| !s.is_empty()) {
            p.schedule = s
                .iter()
                .map(|&v| Duration::from_secs(u64::try_from(v.max(1)).unwrap_or(1)))
                .collect();
            if max_attempts.is_none() {
                p.max_attempts = u32::try_from(p.schedule.len() + 1).unwrap_or(u32::MAX);
            }
        }
        if let Some(m) = max_attempts {
            p.max_attempts = u32::try_from(m.max(1)).unwrap_or(1);
        }
        p
    }

    /// Delay before the retry that follows attempt `attempt` (1-based), jittered.
    pub fn backoff(&self, attempt: u32, rng: &mut impl Rng) -> Duration {
        let idx = (attempt.max(1) as usize - 1).min(self.schedule.len().saturating_sub(1));
        let base = self
            .schedule
            .get(idx)
            .copied()
            .unwrap_or(Duration::from_secs(5));
        if self.jitter <= 0.0 {
            return base;
        }
        let f = rng.random_range((1.0 - self.jitter)..=(1.0 + self.jitter));
        // never panics: schedules are bounded at start (MAX_RETRY_DELAY), and an
        // out-of-range product keeps the base delay rather than becoming immediate
        Duration::try_from_secs_f64(base.as_secs_f64() * f.max(0.0)).unwrap_or(base)
    }

    pub fn decide(&self, attempt: u32, result: &AttemptResult, rng: &mut impl Rng) -> Decision {
        match result {
            AttemptResult::Success { .. } => Decision::Succeeded,
            AttemptResult::Permanent { class, error } => Decision::Dead {
                reason: format!("{class}: {error}"),
            },
            AttemptResult::Gone => {
                // The endpoint is disabled, so this row is held (not claimable) rather than
                // dead: re-enabling the endpoint lets it drain.
                let delay = self.backoff(attempt, rng);
                Decision::Retry { delay }
            }
            AttemptResult::Retryable {
                status,
                class,
                retry_after,
                ..
            } => {
                if attempt >= self.max_attempts {
                    let last = match status {
                        Some(s) => format!("HTTP {s}"),
                        None => class.to_string(),
                    };
                    return Decision::Dead {
                        reason: format!("exhausted {attempt} attempts; last: {last}"),
                    };
                }
                let mut delay = self.backoff(attempt, rng);
                // Retry-After can only postpone (never hurry) the schedule, within bounds.
                if let Some(ra) = retry_after {
                    delay = delay.max((*ra).min(self.max_retry_after));
                }
                Decision::Retry { delay }
            }
        }
    }
}

/// `Retry-After: <seconds>` or an HTTP date.
pub fn parse_retry_after(value: &str, now: DateTime<Utc>) -> Option<Duration> {
    let v = value.trim();
    if let Ok(secs) = v.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = DateTime::parse_from_rfc2822(v).ok()?.with_timezone(&Utc);
    (at - now).to_std().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    fn policy(jitter: f64) -> RetryPolicy {
        RetryPolicy {
            schedule: RetryPolicy::standard_schedule(),
            max_attempts: 8,
            jitter,
            max_retry_after: Duration::from_secs(3600),
        }
    }

    fn fail(retry_after: Option<u64>) -> AttemptResult {
        AttemptResult::Retryable {
            status: Some(503),
            class: ErrorClass::HttpStatus,
            error: "HTTP 503".into(),
            retry_after: retry_after.map(Duration::from_secs),
        }
    }

    #[test]
    fn standard_schedule_without_jitter() {
        let p = policy(0.0);
        let mut rng = StdRng::seed_from_u64(1);
        let got: Vec<u64> = (1..=7).map(|a| p.backoff(a, &mut rng).as_secs()).collect();
        assert_eq!(got, vec![5, 300, 1800, 7200, 18000, 36000, 36000]);
        // past the end the last delay repeats
        assert_eq!(p.backoff(20, &mut rng).as_secs(), 36000);
    }

    #[test]
    fn jitter_stays_within_bounds_and_varies() {
        let p = policy(0.2);
        let mut rng = StdRng::seed_from_u64(7);
        let samples: Vec<f64> = (0..500)
            .map(|_| p.backoff(2, &mut rng).as_secs_f64())
            .collect();
        assert!(
            samples.iter().all(|s| (240.0..=360.0).contains(s)),
            "{samples:?}"
        );
        let min = samples.iter().cloned().fold(f64::MAX, f64::min);
        let max = samples.iter().cloned().fold(f64::MIN, f64::max);
        assert!(
            max - min > 60.0,
            "jitter should spread retries: {min}..{max}"
        );
    }

    #[test]
    fn exhaustion_after_max_attempts() {
        let p = policy(0.0);
        let mut rng = StdRng::seed_from_u64(1);
        assert!(matches!(
            p.decide(7, &fail(None), &mut rng),
            Decision::Retry { .. }
        ));
        match p.decide(8, &fail(None), &mut rng) {
            Decision::Dead { reason } => assert!(
                reason.contains("exhausted 8 attempts") && reason.contains("503"),
                "{reason}"
            ),
            d => panic!("expected dead, got {d:?}"),
        }
    }

    #[test]
    fn retry_after_postpones_within_bounds() {
        let p = policy(0.0);
        let mut rng = StdRng::seed_from_u64(1);
        let mut at = |ra| match p.decide(1, &fail(ra), &mut rng) {
            Decision::Retry { delay } => delay.as_secs() as i64,
            d => panic!("{d:?}"),
        };
        assert_eq!(at(None), 5);
        assert_eq!(at(Some(120)), 120);
        assert_eq!(at(Some(1)), 5, "Retry-After never hurries the schedule");
        assert_eq!(at(Some(999_999)), 3600, "capped at max_retry_after");
    }

    #[test]
    fn retry_after_formats() {
        let now = DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        assert_eq!(parse_retry_after("30", now), Some(Duration::from_secs(30)));
        assert_eq!(
            parse_retry_after("Thu, 01 Jan 2026 00:02:00 GMT", now),
            Some(Duration::from_secs(120))
        );
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(
            parse_retry_after("Wed, 31 Dec 2025 00:00:00 GMT", now),
            None
        );
    }

    #[test]
    fn endpoint_overrides() {
        let p = policy(0.0).for_endpoint(Some(&[1, 2]), None);
        assert_eq!(p.max_attempts, 3);
        assert_eq!(
            p.schedule,
            vec![Duration::from_secs(1), Duration::from_secs(2)]
        );
        let p = policy(0.0).for_endpoint(None, Some(2));
        assert_eq!(p.max_attempts, 2);
        assert_eq!(p.schedule.len(), 7);
    }

    #[test]
    fn permanent_is_dead_at_once_and_gone_is_held() {
        let p = policy(0.0);
        let mut rng = StdRng::seed_from_u64(1);
        let perm = AttemptResult::Permanent {
            class: ErrorClass::DestinationForbidden,
            error: "x".into(),
        };
        assert!(matches!(
            p.decide(1, &perm, &mut rng),
            Decision::Dead { .. }
        ));
        assert!(matches!(
            p.decide(8, &AttemptResult::Gone, &mut rng),
            Decision::Retry { .. }
        ));
    }
}
