//! Request limits with JSON errors: URL length (414), header size (431), a deadline on
//! the whole request (408), and the per-tenant ingest rate (429).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::AppState;
use super::error::ApiError;

/// Refuses oversized request targets and headers before any handler runs, and answers
/// 408 when a request (its body upload included) outlives the request timeout. A slow
/// client therefore cannot hold a handler forever; hyper's header-read timeout covers the
/// time before the request head is complete (see `server`).
///
/// A request cut off by the deadline may still have been committed if it was an enqueue
/// that reached the committer; its 408 is not a 2xx, and the producer's retry with the same
/// idempotency key returns the original ids.
pub async fn enforce(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let limits = &state.limits;
    let target = req.uri().path_and_query().map_or(0, |pq| pq.as_str().len());
    if target > limits.max_url_bytes {
        return ApiError::new(
            StatusCode::URI_TOO_LONG,
            "uri_too_long",
            format!(
                "the request target is {target} bytes; the limit is {}",
                limits.max_url_bytes
            ),
        )
        .into_response();
    }
    // name, ": ", value and CRLF, as on the wire
    let header_bytes: usize = req
        .headers()
        .iter()
        .map(|(k, v)| k.as_str().len() + v.len() + 4)
        .sum();
    if header_bytes > limits.max_header_bytes {
        return ApiError::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "headers_too_large",
            format!(
                "the request headers are {header_bytes} bytes; the limit is {}",
                limits.max_header_bytes
            ),
        )
        .into_response();
    }
    let timeout = limits.request_timeout;
    match tokio::time::timeout(timeout, next.run(req)).await {
        Ok(resp) => resp,
        Err(_) => ApiError::request_timeout(timeout).into_response(),
    }
}

/// Token buckets per tenant, refilled at `rate` events per second up to one second's worth.
///
/// The limit is per API process: with R replicas behind a Service a tenant can reach R
/// times it. Keeping it in memory costs nothing per request, where a shared counter in
/// Postgres would add a write (on the hottest row: the busy tenant's) to every ingest.
pub struct TenantRateLimiter {
    rate: f64,
    burst: f64,
    buckets: Mutex<HashMap<String, Bucket>>,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// Buckets kept before idle (full) ones are forgotten.
const MAX_BUCKETS: usize = 10_000;

impl TenantRateLimiter {
    pub fn new(rate: f64) -> Self {
        TenantRateLimiter {
            rate,
            burst: rate.max(1.0),
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Admits `n` events of `tenant` for every entry of `demand`, all or none. Err carries
    /// the first refused tenant and how long until it would be admitted.
    ///
    /// A request is admitted when its tenant's bucket holds `n` events, or is full when `n`
    /// is more than a full bucket (a batch larger than one second's worth): it then takes
    /// all `n` and leaves the bucket in debt, so the average rate still holds and a large
    /// batch is never refused forever.
    pub fn admit<'a>(
        &self,
        demand: &[(&'a str, u32)],
        now: Instant,
    ) -> Result<(), (&'a str, Duration)> {
        let mut buckets = self.buckets.lock().expect("rate limiter lock");
        let refill = |b: Option<&Bucket>| match b {
            None => self.burst,
            Some(b) => (b.tokens + now.saturating_duration_since(b.at).as_secs_f64() * self.rate)
                .min(self.burst),
        };
        for &(tenant, n) in demand {
            let have = refill(buckets.get(tenant));
            let need = f64::from(n).min(self.burst);
            if have < need {
                return Err((tenant, Duration::from_secs_f64((need - have) / self.rate)));
            }
        }
        if buckets.len() >= MAX_BUCKETS {
            let (rate, burst) = (self.rate, self.burst);
            buckets.retain(|_, b| {
                b.tokens + now.saturating_duration_since(b.at).as_secs_f64() * rate < burst
            });
        }
        for &(tenant, n) in demand {
            let tokens = refill(buckets.get(tenant)) - f64::from(n);
            buckets.insert(tenant.to_string(), Bucket { tokens, at: now });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_refill_at_the_rate_and_batches_take_debt() {
        let l = TenantRateLimiter::new(10.0);
        let t0 = Instant::now();
        for _ in 0..10 {
            assert!(l.admit(&[("a", 1)], t0).is_ok());
        }
        let (who, wait) = l.admit(&[("a", 1)], t0).unwrap_err();
        assert_eq!(who, "a");
        assert!((wait.as_secs_f64() - 0.1).abs() < 1e-6, "{wait:?}");
        // other tenants are unaffected
        assert!(l.admit(&[("b", 1)], t0).is_ok());
        // 100 ms later one more event fits
        let t1 = t0 + Duration::from_millis(100);
        assert!(l.admit(&[("a", 1)], t1).is_ok());
        assert!(l.admit(&[("a", 1)], t1).is_err());
        // a batch of 30 is admitted into a full bucket and leaves 2 s of debt
        let t2 = t1 + Duration::from_secs(5);
        assert!(l.admit(&[("a", 30)], t2).is_ok());
        let (_, wait) = l.admit(&[("a", 1)], t2).unwrap_err();
        assert!((wait.as_secs_f64() - 2.1).abs() < 1e-6, "{wait:?}");
        // all or none: b's events are not taken when a is refused
        assert!(l.admit(&[("b", 10), ("a", 50)], t2).is_err());
        assert!(l.admit(&[("b", 10)], t2).is_ok());
    }

    #[test]
    fn a_fractional_rate_still_admits_single_events() {
        let l = TenantRateLimiter::new(0.5);
        let t0 = Instant::now();
        assert!(l.admit(&[("a", 1)], t0).is_ok());
        let (_, wait) = l.admit(&[("a", 1)], t0).unwrap_err();
        assert_eq!(wait, Duration::from_secs(2));
    }
}
