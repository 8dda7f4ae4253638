//! OpenTelemetry traces over OTLP (issue 34, item 5), on when the standard
//! `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set (and
//! `OTEL_SDK_DISABLED` is not `true`, `OTEL_TRACES_EXPORTER` not `none`): HTTP with
//! protobuf, the exporter's own `OTEL_EXPORTER_OTLP_*` settings (headers, timeout) and the
//! batch processor's `OTEL_BSP_*` apply.
//!
//! The spans, each a `tracing` span of target [`TARGET`] that only the OTLP layer sees:
//! `hookd.ingest` (an enqueue request, a child of the producer's `traceparent`),
//! `hookd.claim` (one claim), `hookd.send` (one attempt, a child of the event's trace
//! context, which the receiver gets as its `traceparent`), `hookd.outcome` (one batch of
//! outcomes written). Unset, none of them is created: every site asks [`enabled`] first,
//! one atomic load, and nothing is exported.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::domain::TraceContext;

/// The target of hookd's spans: the OTLP layer takes these, the log output none.
pub const TARGET: &str = "hookd::telemetry";

static ENABLED: AtomicBool = AtomicBool::new(false);

/// Whether spans are exported (see the module's documentation).
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Whether the environment asks for traces.
fn configured() -> bool {
    let set = |k: &str| std::env::var(k).is_ok_and(|v| !v.trim().is_empty());
    let is = |k: &str, v: &str| std::env::var(k).is_ok_and(|x| x.trim().eq_ignore_ascii_case(v));
    (set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
        && !is("OTEL_SDK_DISABLED", "true")
        && !is("OTEL_TRACES_EXPORTER", "none")
}

/// Flushes what is left to export when the process ends (dropped last in `main`).
pub struct Exporting(Option<SdkTracerProvider>);

impl Drop for Exporting {
    fn drop(&mut self) {
        if let Some(p) = self.0.take()
            && let Err(e) = p.shutdown()
        {
            eprintln!("hookd: the last traces were not exported: {e}");
        }
    }
}

/// The OTLP layer when the environment asks for traces, with what flushes it at exit.
/// `service` names the process (`OTEL_SERVICE_NAME` wins).
pub fn layer<S>(
    service: &str,
) -> (
    Option<tracing_opentelemetry::OpenTelemetryLayer<S, opentelemetry_sdk::trace::Tracer>>,
    Exporting,
)
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    if !configured() {
        return (None, Exporting(None));
    }
    if std::env::var("OTEL_EXPORTER_OTLP_PROTOCOL")
        .or_else(|_| std::env::var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"))
        .is_ok_and(|p| p.trim() != "http/protobuf")
    {
        eprintln!(
            "hookd: OTEL_EXPORTER_OTLP_PROTOCOL: hookd exports traces over http/protobuf only (port 4318 by convention)"
        );
    }
    // the exporter's reqwest is built with `rustls-no-provider` (as the dispatcher's, see
    // `outbound::build_client`): building its client without a provider panics
    let _ = rustls::crypto::ring::default_provider().install_default();
    let exporter = match opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
    {
        Ok(e) => e,
        Err(e) => {
            eprintln!("hookd: traces are not exported: the OTLP exporter: {e}");
            return (None, Exporting(None));
        }
    };
    let mut resource = opentelemetry_sdk::Resource::builder();
    if std::env::var("OTEL_SERVICE_NAME").is_err() {
        resource = resource.with_service_name(service.to_string());
    }
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build();
    let tracer = provider.tracer("hookd");
    ENABLED.store(true, Ordering::Relaxed);
    (
        Some(tracing_opentelemetry::layer().with_tracer(tracer)),
        Exporting(Some(provider)),
    )
}

/// Makes `span` a child of a producer's trace context.
pub fn set_parent(span: &tracing::Span, parent: Option<&TraceContext>) {
    let Some(t) = parent else { return };
    let mut carrier = HashMap::from([("traceparent".to_string(), t.traceparent.clone())]);
    if let Some(s) = &t.tracestate {
        carrier.insert("tracestate".to_string(), s.clone());
    }
    let _ = span.set_parent(TraceContextPropagator::new().extract(&carrier));
}

/// The trace context of `span`, to store with an event or send to a receiver; `None`
/// when it has none (not sampled, or no exporter).
pub fn context_of(span: &tracing::Span) -> Option<TraceContext> {
    let mut carrier: HashMap<String, String> = HashMap::new();
    TraceContextPropagator::new().inject_context(&span.context(), &mut carrier);
    let traceparent = carrier.remove("traceparent")?;
    crate::domain::is_traceparent(&traceparent).then(|| TraceContext {
        traceparent,
        tracestate: carrier.remove("tracestate").filter(|s| !s.is_empty()),
    })
}
