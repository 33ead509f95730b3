//! The metrics (feature `metrics`) after a scripted sequence on a real Redis: an acquire, a
//! contended lock (busy, a timed-out wait, a wait that gets it), a lease lost while the
//! server is frozen (SIGSTOP), a refused stale write, and the releases.

use std::collections::HashMap;
use std::time::Duration;

use distlock::redis::RedisBackend;
use distlock::{LockClient, LockOptions, LostReason};
use distlock_testkit::RedisServer;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::{CompositeKey, MetricKind};

/// Every series: (kind, name, sorted labels) → value.
type Series = HashMap<(MetricKind, String, Vec<(String, String)>), DebugValue>;

/// What was recorded since the recorder was installed. The debugging recorder's snapshot
/// takes what it reports (counters and gauges go back to zero, histograms are emptied), so
/// the totals add each snapshot to the ones before.
struct Recorded {
    snaps: Snapshotter,
    total: Series,
}

impl Recorded {
    fn now(&mut self) -> &Series {
        for (key, _, _, value) in self.snaps.snapshot().into_vec() {
            let key: CompositeKey = key;
            let (kind, key) = key.into_parts();
            let mut labels: Vec<(String, String)> = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            labels.sort();
            let entry = (kind, key.name().to_owned(), labels);
            let merged = match (self.total.remove(&entry), value) {
                (Some(DebugValue::Counter(a)), DebugValue::Counter(b)) => {
                    DebugValue::Counter(a + b)
                }
                (Some(DebugValue::Gauge(a)), DebugValue::Gauge(b)) => DebugValue::Gauge(a + b),
                (Some(DebugValue::Histogram(mut a)), DebugValue::Histogram(b)) => {
                    a.extend(b);
                    DebugValue::Histogram(a)
                }
                (_, v) => v,
            };
            self.total.insert(entry, merged);
        }
        &self.total
    }
}

fn labels(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    v.sort();
    v
}

fn counter(s: &Series, name: &str, l: &[(&str, &str)]) -> u64 {
    match s.get(&(MetricKind::Counter, name.to_owned(), labels(l))) {
        Some(DebugValue::Counter(n)) => *n,
        _ => 0,
    }
}

fn gauge(s: &Series, name: &str, l: &[(&str, &str)]) -> f64 {
    match s.get(&(MetricKind::Gauge, name.to_owned(), labels(l))) {
        Some(DebugValue::Gauge(g)) => g.into_inner(),
        _ => 0.0,
    }
}

/// The values of a histogram (each sample, in seconds).
fn histogram(s: &Series, name: &str, l: &[(&str, &str)]) -> Vec<f64> {
    match s.get(&(MetricKind::Histogram, name.to_owned(), labels(l))) {
        Some(DebugValue::Histogram(v)) => v.iter().map(|x| x.into_inner()).collect(),
        _ => Vec::new(),
    }
}

async fn client(url: &str, ttl: Duration) -> LockClient {
    let backend = RedisBackend::connect(url).await.expect("connect");
    let options = LockOptions::builder()
        .ttl(ttl)
        .wait_timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    LockClient::builder(backend).options(options).build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_follow_a_scripted_sequence() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let recorder = DebuggingRecorder::new();
    let mut rec = Recorded {
        snaps: recorder.snapshotter(),
        total: Series::new(),
    };
    recorder
        .install()
        .expect("the only recorder of this test binary");
    distlock::metrics::label_keys(["orders"]);
    let url = redis.url();
    let a = client(&url, Duration::from_secs(10)).await;
    let b = client(&url, Duration::from_secs(10)).await;
    let redis_ex = [("engine", "redis"), ("kind", "exclusive")];

    // Acquire.
    let g = a.acquire("orders").await.unwrap();
    let s = rec.now();
    assert_eq!(gauge(s, "distlock_locks_held", &redis_ex), 1.0);
    let acquired = [
        ("engine", "redis"),
        ("kind", "exclusive"),
        ("outcome", "acquired"),
        ("key", "orders"),
    ];
    assert_eq!(
        histogram(s, "distlock_acquire_duration_seconds", &acquired).len(),
        1
    );

    // Contend: busy at once, a wait that times out, a wait that gets it.
    assert!(b.try_acquire("orders").await.unwrap().is_none());
    let timed_out = b
        .lock("orders")
        .wait_timeout(Duration::from_millis(200))
        .acquire()
        .await
        .expect_err("held");
    assert_eq!(timed_out.kind(), distlock::ErrorKind::Timeout);
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move { b.acquire("orders").await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(g.release().await.unwrap().was_held());
    let g2 = waiter.await.unwrap().unwrap();
    let s = rec.now();
    let outcome = |o: &'static str| {
        [
            ("engine", "redis"),
            ("kind", "exclusive"),
            ("outcome", o),
            ("key", "orders"),
        ]
    };
    assert_eq!(
        histogram(s, "distlock_acquire_duration_seconds", &outcome("busy")).len(),
        1
    );
    let timeouts = histogram(s, "distlock_acquire_duration_seconds", &outcome("timeout"));
    assert_eq!(timeouts.len(), 1);
    assert!(timeouts[0] >= 0.2, "{timeouts:?}");
    assert_eq!(
        histogram(s, "distlock_acquire_duration_seconds", &outcome("acquired")).len(),
        2
    );
    let waits = histogram(
        s,
        "distlock_wait_duration_seconds",
        &[
            ("engine", "redis"),
            ("kind", "exclusive"),
            ("key", "orders"),
        ],
    );
    assert_eq!(waits.len(), 1, "{waits:?}");
    assert!(waits[0] >= 0.25, "{waits:?}");
    assert_eq!(gauge(s, "distlock_locks_held", &redis_ex), 1.0);
    assert!(g2.release().await.unwrap().was_held());

    // Lost while the server is frozen: renewals fail, the lease runs out.
    let short = client(&url, Duration::from_millis(600)).await;
    let g3 = short.acquire("reports").await.unwrap();
    // Renewed a few times (every 200 ms), none of them failed: none is counted as failed.
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(g3.is_held());
    assert_eq!(
        counter(
            rec.now(),
            "distlock_renew_failures_total",
            &[("engine", "redis")]
        ),
        0,
        "renewals that succeeded were counted as failures"
    );
    redis.pause();
    let why = tokio::time::timeout(Duration::from_secs(5), g3.lost())
        .await
        .expect("lost while the server is frozen");
    redis.resume();
    assert_eq!(why, LostReason::Unreachable);
    // The lease ends at its deadline, which is also the end of its renewal's budget: the
    // watchdog counts the failed renewal as that budget runs out, an instant after `lost()`.
    let counted = tokio::time::timeout(Duration::from_secs(2), async {
        while counter(
            rec.now(),
            "distlock_renew_failures_total",
            &[("engine", "redis")],
        ) < 1
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(counted.is_ok(), "no failed renewal counted");
    let s = rec.now();
    assert_eq!(
        counter(
            s,
            "distlock_lost_total",
            &[("engine", "redis"), ("reason", "unreachable")]
        ),
        1
    );
    assert!(counter(s, "distlock_renew_failures_total", &[("engine", "redis")]) >= 1);
    // A name outside the labelled set is `_other`.
    let other = [
        ("engine", "redis"),
        ("kind", "exclusive"),
        ("outcome", "acquired"),
        ("key", "_other"),
    ];
    assert_eq!(
        histogram(s, "distlock_acquire_duration_seconds", &other).len(),
        1
    );
    drop(g3);

    // A stale fenced write is refused, and counted.
    let mut conn = distlock::redis::client::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    assert!(
        distlock::redis::fenced_set(&mut conn, "invoice", 5, "new")
            .await
            .unwrap()
    );
    assert!(
        !distlock::redis::fenced_set(&mut conn, "invoice", 4, "old")
            .await
            .unwrap()
    );
    let s = rec.now();
    assert_eq!(
        counter(s, "distlock_fence_refusals_total", &[("engine", "redis")]),
        1
    );
    // Everything released or lost: nothing held.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(gauge(rec.now(), "distlock_locks_held", &redis_ex), 0.0);
}
