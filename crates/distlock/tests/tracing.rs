//! The lock's spans on a real Redis, inside the caller's own span, as an OpenTelemetry layer
//! (or any `tracing` subscriber) sees them: `distlock.acquire` with its attempts, and
//! `distlock.release`, each with their fields; the watchdog's `distlock.renew` batches; and
//! lock names left out when asked.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock::redis::RedisBackend;
use distlock::{LockClient, LockOptions};
use distlock_testkit::RedisServer;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Instrument, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// A span as recorded: its name, its parent's name, and its fields.
#[derive(Debug, Clone, Default)]
struct Seen {
    name: String,
    parent: Option<String>,
    fields: BTreeMap<String, String>,
}

#[derive(Clone, Default)]
struct Spans(Arc<Mutex<BTreeMap<u64, Seen>>>);

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Spans {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let parent = ctx
            .span(id)
            .and_then(|s| s.parent())
            .map(|p| p.name().to_owned());
        let mut seen = Seen {
            name: attrs.metadata().name().to_owned(),
            parent,
            fields: BTreeMap::new(),
        };
        attrs.record(&mut Fields(&mut seen.fields));
        self.0.lock().unwrap().insert(id.into_u64(), seen);
    }
    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        if let Some(seen) = self.0.lock().unwrap().get_mut(&id.into_u64()) {
            values.record(&mut Fields(&mut seen.fields));
        }
    }
}

impl Spans {
    fn named(&self, name: &str) -> Vec<Seen> {
        self.0
            .lock()
            .unwrap()
            .values()
            .filter(|s| s.name == name)
            .cloned()
            .collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_locks_work_shows_inside_the_callers_trace() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let spans = Spans::default();
    let subscriber = tracing_subscriber::registry()
        .with(spans.clone())
        .with(tracing_subscriber::filter::LevelFilter::DEBUG);
    tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
    let options = LockOptions::builder()
        .ttl(Duration::from_millis(900))
        .wait_timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let backend = RedisBackend::connect(&redis.url()).await.unwrap();
    let a = LockClient::builder(backend).options(options).build();
    let b = LockClient::builder(RedisBackend::connect(&redis.url()).await.unwrap())
        .options(options)
        .build();

    // A request of the application's: the lock's spans are its children.
    let request = tracing::info_span!("handle_request", route = "/invoices");
    let fence = async {
        let g = a.acquire("invoice:42").await.unwrap();
        // The watchdog renews while the work runs (every TTL/3).
        tokio::time::sleep(Duration::from_millis(700)).await;
        let fence = g.fence();
        assert!(g.release().await.unwrap().was_held());
        fence
    }
    .instrument(request)
    .await;
    let acquire = spans.named("distlock.acquire");
    assert_eq!(acquire.len(), 1, "{acquire:#?}");
    let acq = &acquire[0];
    assert_eq!(acq.parent.as_deref(), Some("handle_request"));
    assert_eq!(acq.fields["engine"], "redis");
    assert_eq!(acq.fields["key"], "invoice:42");
    assert_eq!(acq.fields["kind"], "exclusive");
    assert_eq!(acq.fields["outcome"], "acquired");
    assert_eq!(acq.fields["attempts"], "1");
    assert_eq!(acq.fields["fence"], fence.unwrap().to_string());
    let attempts = spans.named("distlock.attempt");
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0].parent.as_deref(), Some("distlock.acquire"));
    let release = spans.named("distlock.release");
    assert_eq!(release.len(), 1);
    assert_eq!(release[0].parent.as_deref(), Some("handle_request"));
    assert_eq!(release[0].fields["outcome"], "released");
    let renewals = spans.named("distlock.renew");
    assert!(!renewals.is_empty(), "no renewal span");
    assert_eq!(renewals[0].fields["leases"], "1");

    // A wait: several attempts, counted on the acquire's span.
    let held = a.acquire("report").await.unwrap();
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move { b.acquire("report").await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(held.release().await.unwrap().was_held());
    let g = waiter.await.unwrap().unwrap();
    assert!(g.release().await.unwrap().was_held());
    let waited: Vec<Seen> = spans
        .named("distlock.acquire")
        .into_iter()
        .filter(|s| s.fields.get("key").map(String::as_str) == Some("report"))
        .collect();
    assert_eq!(waited.len(), 2);
    assert!(
        waited
            .iter()
            .any(|s| s.fields["attempts"].parse::<u32>().unwrap() >= 2),
        "{waited:#?}"
    );

    // Names left out.
    distlock::trace::record_keys(false);
    let g = a.acquire("secret-customer-7").await.unwrap();
    assert!(g.release().await.unwrap().was_held());
    distlock::trace::record_keys(true);
    let all = spans.0.lock().unwrap();
    assert!(
        !all.values()
            .any(|s| s.fields.values().any(|v| v.contains("secret-customer-7"))),
        "a name was recorded"
    );
}
