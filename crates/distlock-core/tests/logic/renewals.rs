//! Renewals on an engine without a batch command (one request a lease, as the file engine): the
//! client keeps a few in flight at once, however many batches its watchdog has going.

use super::*;

/// Two groups of leases come due 600 ms apart, and each group's renewals take longer than
/// that (400 leases, 50 ms each, 16 at a time): the watchdog has two batches in flight at
/// once. The engine still sees at most 16 renewals at a time (a limit per batch let it see 32,
/// and a client holding 100,000 locks on memcached open more connections than the server
/// allows).
#[tokio::test]
async fn renewals_in_flight_stay_few_however_many_batches_are_going() {
    let mut fake = Fake::new();
    fake.per_lease = Some(Duration::from_millis(50));
    let fake = Arc::new(fake);
    let client = LockClient::builder(FakeEngine(fake.clone()))
        .options(ttl_opts(3_000).build().unwrap())
        .build();
    let mut guards = Vec::new();
    for group in 0..2 {
        for i in 0..400 {
            let name = format!("g{group}-{i}");
            guards.push(client.try_acquire(&name).await.unwrap().expect("free"));
        }
        tokio::time::sleep(Duration::from_millis(600)).await;
    }
    // Until the second group's first batch is well under way.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let most = fake.most_renewing.load(Ordering::SeqCst);
    assert!(fake.extends.load(Ordering::SeqCst) >= 400, "renewals ran");
    assert!(most <= 16, "{most} renewals in flight at once");
    assert!(
        most >= 8,
        "only {most} at once: the renewals did not overlap"
    );
}
