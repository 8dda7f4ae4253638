//! The load generator: HTTP/1.1 keep-alive connections to the API on loopback, one per
//! simulated client, straight on hyper (no client-side pool or redirect logic to pay
//! for: the generator shares the machine's two cores with everything it measures).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use http::{Request, StatusCode};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;

use crate::BenchError;

/// A request's own body and headers, made from its sequence number (unique across the
/// run's clients): for a provider's signed webhooks, each with its own event id.
pub type PerRequest = Arc<dyn Fn(u64) -> (Bytes, Vec<(&'static str, String)>) + Send + Sync>;

/// What each request sends.
#[derive(Clone)]
pub struct Target {
    pub addr: SocketAddr,
    pub path: &'static str,
    pub body: Bytes,
    /// `Authorization` header value, when the API runs with authentication on
    pub authorization: Option<String>,
    /// events one request carries (1, or the batch size)
    pub events_per_request: u64,
    /// the status every request must get
    pub expect: StatusCode,
    /// when set, each request's body and extra headers instead of `body`
    pub per_request: Option<PerRequest>,
}

/// One open connection to the API.
pub struct Conn {
    sender: SendRequest<Body>,
}

impl Conn {
    pub async fn open(addr: SocketAddr) -> Result<Conn, BenchError> {
        let stream = tokio::net::TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| BenchError::Load(format!("HTTP handshake: {e}")))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(Conn { sender })
    }

    /// Sends one request and reads the whole response: (status, body).
    pub async fn send(
        &mut self,
        target: &Target,
        body: Bytes,
        extra: &[(&'static str, String)],
    ) -> Result<(StatusCode, Bytes), BenchError> {
        let mut req = Request::post(target.path)
            .header(http::header::HOST, "127.0.0.1")
            .header(http::header::CONTENT_TYPE, "application/json");
        if let Some(a) = &target.authorization {
            req = req.header(http::header::AUTHORIZATION, a);
        }
        for (name, value) in extra {
            req = req.header(*name, value);
        }
        let req = req
            .body(Body::from(body))
            .map_err(|e| BenchError::Load(e.to_string()))?;
        self.sender
            .ready()
            .await
            .map_err(|e| BenchError::Load(format!("connection closed: {e}")))?;
        let resp = self
            .sender
            .send_request(req)
            .await
            .map_err(|e| BenchError::Load(format!("request failed: {e}")))?;
        let status = resp.status();
        let body = axum::body::to_bytes(Body::new(resp.into_body()), 1 << 20)
            .await
            .map_err(|e| BenchError::Load(format!("reading the response: {e}")))?;
        Ok((status, body))
    }
}

/// Outcome of a closed-loop run (each client sends its next request when the previous
/// one is answered).
#[derive(Debug, Clone)]
pub struct LoadResult {
    /// requests started inside the measured window and answered as expected
    pub requests: u64,
    pub events: u64,
    /// requests answered otherwise (any of them fails the run)
    pub errors: u64,
    pub first_error: Option<String>,
    /// every request answered as expected (warm-up included): the rows that must exist
    pub events_acked_total: u64,
    pub window: Duration,
    /// ack latencies of the measured requests, sorted
    pub latencies: Vec<Duration>,
}

impl LoadResult {
    pub fn events_per_sec(&self) -> f64 {
        self.events as f64 / self.window.as_secs_f64()
    }
}

/// `concurrency` clients, each on its own connection, sending `target` back to back for
/// `warmup + window`; only requests started after the warm-up are measured.
pub async fn closed_loop(
    target: Arc<Target>,
    concurrency: usize,
    warmup: Duration,
    window: Duration,
) -> Result<LoadResult, BenchError> {
    let mut conns = Vec::with_capacity(concurrency);
    for _ in 0..concurrency {
        conns.push(Conn::open(target.addr).await?);
    }
    let start = Instant::now();
    let measure_from = start + warmup;
    let end = measure_from + window;
    let mut tasks = tokio::task::JoinSet::new();
    let seq = Arc::new(std::sync::atomic::AtomicU64::new(0));
    for mut conn in conns {
        let target = target.clone();
        let seq = seq.clone();
        tasks.spawn(async move {
            let mut lat = Vec::with_capacity(4096);
            let (mut ok_total, mut errors, mut first_error) = (0u64, 0u64, None);
            loop {
                let t0 = Instant::now();
                if t0 >= end {
                    break;
                }
                let (body, extra) = match &target.per_request {
                    Some(make) => make(seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed)),
                    None => (target.body.clone(), Vec::new()),
                };
                match conn.send(&target, body, &extra).await {
                    Ok((status, _)) if status == target.expect => {
                        ok_total += 1;
                        if t0 >= measure_from {
                            lat.push(t0.elapsed());
                        }
                    }
                    Ok((status, body)) => {
                        errors += 1;
                        first_error.get_or_insert_with(|| {
                            format!("HTTP {status}: {}", String::from_utf8_lossy(&body))
                        });
                    }
                    Err(e) => {
                        errors += 1;
                        first_error.get_or_insert_with(|| e.to_string());
                        break; // the connection is gone
                    }
                }
            }
            (lat, ok_total, errors, first_error)
        });
    }
    let mut latencies = Vec::new();
    let (mut ok_total, mut errors, mut first_error) = (0u64, 0u64, None);
    while let Some(joined) = tasks.join_next().await {
        let (lat, ok, err, first) =
            joined.map_err(|e| BenchError::Load(format!("load task: {e}")))?;
        latencies.extend(lat);
        ok_total += ok;
        errors += err;
        if first_error.is_none() {
            first_error = first;
        }
    }
    latencies.sort_unstable();
    let requests = latencies.len() as u64;
    Ok(LoadResult {
        requests,
        events: requests * target.events_per_request,
        errors,
        first_error,
        events_acked_total: ok_total * target.events_per_request,
        window,
        latencies,
    })
}

/// The `p`-th percentile (0-100) of sorted samples, nearest-rank.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The mean of `values`, or `None` when any of them is missing (a figure measured in some
/// runs only says nothing) or there are none.
pub fn mean_of_all(values: impl IntoIterator<Item = Option<f64>>) -> Option<f64> {
    let v: Vec<f64> = values.into_iter().collect::<Option<_>>()?;
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// `"<label> p50 X ms p99 Y ms"` of sorted samples: the detail line of latency rows.
pub fn p50_p99(label: &str, sorted: &[Duration]) -> String {
    format!(
        "{label} p50 {:.2} ms p99 {:.2} ms",
        ms(percentile(sorted, 50.0)),
        ms(percentile(sorted, 99.0))
    )
}
