//! The lock's time inside a request's OpenTelemetry trace: with a `tracing-opentelemetry`
//! layer installed (as a service that exports traces has one), `distlock.acquire`,
//! `distlock.attempt` and `distlock.release` become spans of the request's trace.
//!
//! `cargo run -p distlock --example opentelemetry [URL]` (default: the local file engine).
//! The spans go to an in-memory exporter here and are printed as a tree; a service would use
//! its OTLP exporter instead.

use std::collections::HashMap;
use std::time::Duration;

use opentelemetry::trace::{SpanId, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use tracing::Instrument;
use tracing_subscriber::layer::SubscriberExt;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("invoices")))
        .with(tracing_subscriber::filter::LevelFilter::DEBUG);
    tracing::subscriber::set_global_default(subscriber)?;

    let url = std::env::args().nth(1).unwrap_or_else(|| "file://".into());
    let locks = distlock::connect(&url).await?;
    // The application's request, with the lock's work inside it.
    async {
        let guard = locks.acquire("invoices:2026-11").await?;
        tokio::time::sleep(Duration::from_millis(20)).await; // the critical section
        assert!(guard.release().await?.was_held());
        Ok::<_, distlock::LockError>(())
    }
    .instrument(tracing::info_span!("POST /invoices"))
    .await?;
    provider.force_flush()?;

    let spans = exporter.get_finished_spans()?;
    print_tree(&spans);
    Ok(())
}

/// Prints the spans as a tree, and checks that the lock's spans belong to the request.
fn print_tree(spans: &[SpanData]) {
    // Each span's parent, by id.
    let parent_of: HashMap<SpanId, SpanId> = spans
        .iter()
        .map(|s| (s.span_context.span_id(), s.parent_span_id))
        .collect();
    let depth = |s: &SpanData| {
        let (mut d, mut at) = (0, s.parent_span_id);
        while let Some(next) = parent_of.get(&at) {
            d += 1;
            at = *next;
        }
        d
    };
    let mut ordered: Vec<&SpanData> = spans.iter().collect();
    ordered.sort_by_key(|s| s.start_time);
    for s in &ordered {
        let took = s.end_time.duration_since(s.start_time).unwrap_or_default();
        let fields: Vec<String> = s
            .attributes
            .iter()
            .filter(|kv| {
                let k = kv.key.as_str();
                !k.starts_with("code.") && !k.starts_with("thread.") && !k.starts_with("target")
            })
            .map(|kv| format!("{}={}", kv.key, kv.value))
            .collect();
        println!(
            "{}{} {:.1} ms  {}",
            "  ".repeat(depth(s)),
            s.name,
            took.as_secs_f64() * 1e3,
            fields.join(" ")
        );
    }
    let request = ordered
        .iter()
        .find(|s| s.name == "POST /invoices")
        .expect("the request's span");
    for name in ["distlock.acquire", "distlock.release"] {
        let span = ordered
            .iter()
            .find(|s| s.name == name)
            .expect("the lock's span");
        assert_eq!(
            span.parent_span_id,
            request.span_context.span_id(),
            "{name}"
        );
        assert_eq!(
            span.span_context.trace_id(),
            request.span_context.trace_id()
        );
    }
}
