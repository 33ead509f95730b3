//! The conformance cases of the read-write lock and the semaphore. An engine that does not hold
//! a kind must refuse it with `Unsupported` and say why; an engine that does must keep the
//! kind's exclusion, and the order of waiters when it claims one.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use distlock_core::engine::{Fencing, LeaseKind};
use distlock_core::{DowngradeError, ErrorKind, LockClient, LockError, LockGuard, ReadGuard};

use super::{MakeClient, key, opts};

/// Whether the engine behind `c` holds `kind`; if not, checks that asking for it fails with
/// `Unsupported` and a reason, before anything is taken.
async fn holds(c: &LockClient, kind: LeaseKind) -> bool {
    if c.backend().capabilities().supports(kind) {
        return true;
    }
    let k = key("unsupported");
    let e = c
        .lock(&k)
        .options(opts().build().unwrap())
        .kind(kind)
        .try_acquire()
        .await
        .expect_err("an engine that cannot hold the kind took it");
    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
    let why = e.to_string();
    assert!(
        why.split_once(": ").is_some_and(|(_, r)| r.len() > 10),
        "the refusal does not say why: {why}"
    );
    // A mutex of the same name is untouched.
    let g = c.try_acquire(&k).await.unwrap().expect("the name is free");
    assert!(g.release().await.unwrap().was_held());
    false
}

fn fenced(c: &LockClient) -> bool {
    c.backend().capabilities().fencing == Fencing::Monotonic
}

async fn read(c: &LockClient, k: &str) -> Option<LockGuard> {
    let g = c.read_lock(k).try_acquire().await.unwrap();
    g.map(ReadGuard::into_inner)
}

/// Three clients with options `o`, as three processes would have.
async fn three(
    make: &impl MakeClient,
    o: distlock_core::LockOptions,
) -> (LockClient, LockClient, LockClient) {
    (
        make.client(o).await,
        make.client(o).await,
        make.client(o).await,
    )
}

/// A task of `c` that waits up to `secs` for a lease of `kind` on `k`.
fn waiter(
    c: &LockClient,
    k: &str,
    kind: LeaseKind,
    secs: u64,
) -> tokio::task::JoinHandle<Result<LockGuard, LockError>> {
    let (c, k) = (c.clone(), k.to_owned());
    tokio::spawn(async move {
        c.lock(&k)
            .kind(kind)
            .wait_timeout(Duration::from_secs(secs))
            .acquire()
            .await
    })
}

/// Waits until `k` has `n` waiters queued, where the engine counts them (at most 10 s: the
/// test's own checks then say what is wrong), and a fixed pause where it does not. Waiters
/// spawned one after the other must queue in that order: on a loaded machine a waiter's set-up
/// (a TLS connect, say) can outlast a fixed pause, and then the later one goes first.
async fn queued(c: &LockClient, k: &str, n: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match c.status(k).await.map(|st| st.waiters) {
            Ok(Some(w)) if w >= n => return,
            Ok(None) => {
                tokio::time::sleep(Duration::from_millis(300)).await;
                return;
            }
            _ if tokio::time::Instant::now() >= deadline => return,
            _ => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// Readers share a name, a writer excludes them and is excluded by them, and a reader's fence
/// sits between the writers before and after it.
pub async fn readers_share_and_writers_exclude(make: &impl MakeClient) {
    let o = opts().build().unwrap();
    let (a, b, w) = three(make, o).await;
    if !holds(&a, LeaseKind::Shared).await {
        return;
    }
    let k = key("rw");
    let w1 = w.write_lock(&k).try_acquire().await.unwrap().expect("free");
    assert!(
        read(&a, &k).await.is_none(),
        "a reader got in beside a writer"
    );
    let f1 = w1.fence();
    assert!(w1.release().await.unwrap().was_held());

    let r1 = read(&a, &k).await.expect("a reader on a free lock");
    let r2 = read(&b, &k)
        .await
        .expect("a second reader beside the first");
    let r3 = read(&a, &k)
        .await
        .expect("a second reader of the same client");
    assert_eq!(r1.kind(), LeaseKind::Shared);
    assert!(r1.is_held() && r2.is_held() && r3.is_held());
    assert!(
        w.write_lock(&k).try_acquire().await.unwrap().is_none(),
        "a writer got in beside readers"
    );
    assert!(
        a.try_acquire(&k).await.unwrap().is_none(),
        "a reader's own client took the write lock"
    );
    let reader_fence = r1.fence();
    for r in [r1, r2, r3] {
        assert!(r.release().await.unwrap().was_held());
    }
    let w2 = w
        .write_lock(&k)
        .try_acquire()
        .await
        .unwrap()
        .expect("the last reader's release frees the lock");
    if fenced(&w) {
        let (f1, fr, f2) = (f1.unwrap(), reader_fence.unwrap(), w2.fence().unwrap());
        assert!(
            f1 <= fr && fr < f2,
            "writer {f1}, then reader {fr}, then writer {f2}"
        );
    }
    assert!(w2.release().await.unwrap().was_held());
}

/// A writer waits for the readers; on engines that order their waiters, a waiting writer holds
/// back the readers that come after it, and gets the lock when the readers ahead leave.
pub async fn a_waiting_writer_holds_back_new_readers(make: &impl MakeClient) {
    let o = opts().build().unwrap();
    let (a, b, w) = three(make, o).await;
    if !holds(&a, LeaseKind::Shared).await {
        return;
    }
    let k = key("rw-order");
    let r1 = read(&a, &k).await.expect("free");
    let writer = waiter(&w, &k, LeaseKind::Exclusive, 20);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(!writer.is_finished(), "the writer got in beside a reader");
    let ordered = a.backend().capabilities().ordered;
    let late = read(&b, &k).await;
    if ordered {
        assert!(late.is_none(), "a reader got in ahead of a waiting writer");
    }
    drop(late);
    assert!(r1.release().await.unwrap().was_held());
    let g = tokio::time::timeout(Duration::from_secs(15), writer)
        .await
        .expect("the writer was not let in after the reader left")
        .unwrap()
        .expect("writer");
    assert!(read(&b, &k).await.is_none(), "a reader beside the writer");
    assert!(g.release().await.unwrap().was_held());
    let r = b
        .read_lock(&k)
        .wait_timeout(Duration::from_secs(10))
        .acquire()
        .await
        .expect("a reader after the writer");
    assert!(r.release().await.unwrap().was_held());
}

/// A writer turns into a reader without a gap: it keeps its token and fence, a reader queued
/// right behind it comes in, a writer queued after that reader still waits (and no other writer
/// gets in meanwhile), and gets the lock once both readers leave. The downgraded reader is
/// renewed as one. An engine that cannot downgrade says why, and the writer stays held.
pub async fn a_writer_downgrades_without_a_gap(make: &impl MakeClient) {
    let o = opts().ttl(Duration::from_secs(2)).build().unwrap();
    let (a, b, w) = three(make, o).await;
    if !holds(&a, LeaseKind::Shared).await {
        // The kind is refused already: so is its downgrade.
        let k = key("dg-none");
        let g = a.write_lock(&k).try_acquire().await.unwrap().expect("free");
        let DowngradeError {
            error: e,
            writer: g,
        } = g
            .downgrade()
            .await
            .expect_err("a downgrade without readers");
        assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
        assert!(g.release().await.unwrap().was_held());
        return;
    }
    let k = key("dg");
    let ordered = a.backend().capabilities().ordered;
    // A writer queued right behind: it keeps waiting through the downgrade.
    let g = a.write_lock(&k).try_acquire().await.unwrap().expect("free");
    let writer = waiter(&w, &k, LeaseKind::Exclusive, 30);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let g = match g.downgrade().await {
        Ok(reader) => reader,
        Err(DowngradeError {
            error: e,
            writer: g,
        }) => {
            assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
            assert!(
                e.to_string()
                    .split_once(": ")
                    .is_some_and(|(_, r)| r.len() > 10),
                "the refusal does not say why: {e}"
            );
            assert!(g.is_held(), "a refused downgrade ended the writer");
            assert_eq!(g.kind(), LeaseKind::Exclusive);
            assert!(g.release().await.unwrap().was_held());
            writer.abort();
            return;
        }
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!writer.is_finished(), "a writer got in during a downgrade");
    assert!(g.release().await.unwrap().was_held());
    let g2 = tokio::time::timeout(Duration::from_secs(15), writer)
        .await
        .expect("the writer was not let in after the reader left")
        .unwrap()
        .expect("writer");
    assert!(g2.release().await.unwrap().was_held());

    // A reader, then a writer, queued behind a writer that downgrades.
    let g = a.write_lock(&k).try_acquire().await.unwrap().expect("free");
    let fence = g.fence();
    // Queued behind the writer: a reader, then a writer.
    let reader = waiter(&b, &k, LeaseKind::Shared, 20);
    queued(&a, &k, 1).await;
    let writer = waiter(&w, &k, LeaseKind::Exclusive, 30);
    queued(&a, &k, 2).await;
    assert!(!reader.is_finished() && !writer.is_finished());
    let g = g.downgrade().await.expect("downgrade");
    assert_eq!(g.kind(), LeaseKind::Shared);
    assert_eq!(g.fence(), fence, "a downgrade changed the fence");
    assert!(g.is_held());
    let r = tokio::time::timeout(Duration::from_secs(10), reader)
        .await
        .expect("the reader queued behind the writer was not let in by its downgrade")
        .unwrap()
        .expect("reader");
    assert!(
        w.write_lock(&k).try_acquire().await.unwrap().is_none(),
        "a writer got in beside the downgraded reader"
    );
    if ordered {
        let late = b.read_lock(&k).try_acquire().await.unwrap();
        assert!(
            late.is_none(),
            "a reader got in ahead of the waiting writer"
        );
    }
    // Renewed as a reader, past two TTLs.
    tokio::time::sleep(Duration::from_millis(4500)).await;
    assert!(g.is_held(), "the downgraded reader was not renewed");
    assert!(
        !writer.is_finished(),
        "the writer got in beside the readers"
    );
    assert!(g.release().await.unwrap().was_held());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!writer.is_finished(), "the writer got in beside a reader");
    assert!(r.release().await.unwrap().was_held());
    let g2 = tokio::time::timeout(Duration::from_secs(15), writer)
        .await
        .expect("the writer was not let in after the readers left")
        .unwrap()
        .expect("writer");
    if fenced(&w) {
        assert!(
            g2.fence().unwrap() > fence.unwrap(),
            "the next writer's fence"
        );
    }
    assert!(g2.release().await.unwrap().was_held());
}

/// `status` lists every holder of a name: each reader, each permit (kind, token, label,
/// fence, TTL), and the waiters where the engine keeps a queue. (The file engine's readers do
/// not write the file, so it shows them as one shared hold.)
pub async fn status_lists_every_holder(make: &impl MakeClient) {
    let o = opts().build().unwrap();
    let (a, b, w) = three(make, o).await;
    let caps = a.backend().capabilities();
    let listed = a.backend().name() != "file";
    let check = |h: &distlock_core::HolderStatus, g: &LockGuard, c: &LockClient| {
        assert_eq!(h.kind, g.kind());
        if let Some(t) = &h.token {
            assert_eq!(t, g.token().as_str());
        }
        if listed {
            let owner = h.owner.as_deref().expect("a holder's label");
            assert!(
                owner.contains(c.owner()),
                "{owner:?} does not name {:?}",
                c.owner()
            );
            // Where the engine names the token, it names the fence too.
            if h.token.is_some() && (g.kind() != LeaseKind::Shared || fenced(c)) {
                assert_eq!(h.fence, g.fence().filter(|f| *f > 0), "{h:?}");
            }
        }
        if caps.expiring && listed {
            let ttl = h.ttl.expect("an expiring engine reports each holder's TTL");
            assert!(ttl <= Duration::from_secs(10), "{ttl:?}");
        }
    };
    if holds(&a, LeaseKind::Shared).await {
        let k = key("status-rw");
        let r1 = read(&a, &k).await.expect("free");
        let r2 = read(&b, &k).await.expect("a second reader");
        let writer = waiter(&w, &k, LeaseKind::Exclusive, 20);
        tokio::time::sleep(Duration::from_millis(400)).await;
        let st = w.status(&k).await.unwrap();
        assert!(st.held);
        assert!(
            st.holders.iter().all(|h| h.kind == LeaseKind::Shared),
            "{st:?}"
        );
        if listed {
            assert_eq!(st.holders.len(), 2, "{st:?}");
            let by_token = |g: &LockGuard| {
                st.holders
                    .iter()
                    .find(|h| h.token.as_deref() == Some(g.token().as_str()))
                    .or_else(|| st.holders.iter().find(|h| h.token.is_none()))
                    .expect("the reader listed")
            };
            check(by_token(&r1), &r1, &a);
            check(by_token(&r2), &r2, &b);
        }
        if caps.ordered {
            assert_eq!(st.waiters, Some(1), "the waiting writer: {st:?}");
        }
        assert!(r1.release().await.unwrap().was_held());
        assert!(r2.release().await.unwrap().was_held());
        let g = tokio::time::timeout(Duration::from_secs(15), writer)
            .await
            .expect("writer")
            .unwrap()
            .expect("writer");
        let st = a.status(&k).await.unwrap();
        assert_eq!(st.holders.len(), 1, "{st:?}");
        assert_eq!(st.holders[0].kind, LeaseKind::Exclusive);
        if caps.ordered {
            assert_eq!(st.waiters, Some(0), "{st:?}");
        }
        assert!(g.release().await.unwrap().was_held());
        assert!(!a.status(&k).await.unwrap().held);
    }
    if holds(&a, LeaseKind::Permit { permits: 3 }).await {
        let k = key("status-sem");
        let p1 = a
            .semaphore(&k, 3)
            .try_acquire()
            .await
            .unwrap()
            .expect("a permit");
        let p2 = b
            .semaphore(&k, 3)
            .try_acquire()
            .await
            .unwrap()
            .expect("a permit");
        let st = w.status(&k).await.unwrap();
        assert!(st.held);
        assert_eq!(st.holders.len(), 2, "{st:?}");
        for (g, c) in [(&p1, &a), (&p2, &b)] {
            let h = st
                .holders
                .iter()
                .find(|h| h.token.as_deref() == Some(g.token().as_str()))
                .or_else(|| st.holders.iter().find(|h| h.fence == g.fence()))
                // (PostgreSQL knows a permit's session, not its token or fence.)
                .or_else(|| {
                    st.holders
                        .iter()
                        .find(|h| h.token.is_none() && h.fence.is_none())
                })
                .expect("the permit listed");
            check(h, g, c);
        }
        assert!(p1.release().await.unwrap().was_held());
        assert!(p2.release().await.unwrap().was_held());
        assert!(!a.status(&k).await.unwrap().held);
    }
}

/// The watchdog keeps a mutex, a reader and a permit of one client alive together, past
/// three TTLs (on engines that batch renewals, in the same batch).
pub async fn every_kind_is_renewed(make: &impl MakeClient) {
    let c = make
        .client(opts().ttl(Duration::from_secs(1)).build().unwrap())
        .await;
    let mut guards = vec![c.try_acquire(&key("renew-x")).await.unwrap().expect("free")];
    if c.backend().capabilities().supports(LeaseKind::Shared) {
        guards.push(read(&c, &key("renew-r")).await.expect("free"));
    }
    if c.backend()
        .capabilities()
        .supports(LeaseKind::Permit { permits: 2 })
    {
        let p = c.semaphore(&key("renew-p"), 2).try_acquire().await.unwrap();
        guards.push(p.expect("free").into_inner());
    }
    tokio::time::sleep(Duration::from_millis(3500)).await;
    for g in guards {
        let kind = g.kind();
        assert!(g.is_held(), "a {kind:?} lease was not renewed");
        assert!(g.release().await.unwrap().was_held(), "{kind:?}");
    }
}

/// A reader that stops renewing loses its share after its own TTL, while another reader keeps
/// its own; the waiting writer gets in only when both are gone. (Engines whose leases expire.)
pub async fn a_dead_reader_frees_only_its_share(make: &impl MakeClient) {
    let short = opts()
        .ttl(Duration::from_millis(1500))
        .auto_renew(false)
        .build()
        .unwrap();
    let renewed = opts().ttl(Duration::from_millis(1500)).build().unwrap();
    let (dead, alive, w) = (
        make.client(short).await,
        make.client(renewed).await,
        make.client(renewed).await,
    );
    if !holds(&dead, LeaseKind::Shared).await || !dead.backend().capabilities().expiring {
        return;
    }
    let k = key("rw-dead");
    let gone = read(&dead, &k).await.expect("free");
    let kept = read(&alive, &k).await.expect("shared");
    let leaked = gone.leak();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(kept.is_held(), "a reader lost its share with another's");
    assert!(
        w.write_lock(&k).try_acquire().await.unwrap().is_none(),
        "a writer got in beside a live reader"
    );
    drop(leaked);
    assert!(kept.release().await.unwrap().was_held());
    let g = w
        .write_lock(&k)
        .wait_timeout(Duration::from_secs(10))
        .acquire()
        .await
        .expect("the dead reader's share ran out");
    assert!(g.release().await.unwrap().was_held());
}

/// A semaphore of N admits N holders and no more; each permit has a fence above every earlier
/// one; a release lets the next in; another size of the same name is a `KindConflict`.
pub async fn a_semaphore_admits_n(make: &impl MakeClient) {
    let o = opts().build().unwrap();
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(make.client(o).await);
    }
    if !holds(&clients[0], LeaseKind::Permit { permits: 3 }).await {
        return;
    }
    let k = key("sem");
    let mut held = Vec::new();
    for c in &clients[..3] {
        held.push(
            c.semaphore(&k, 3)
                .try_acquire()
                .await
                .unwrap()
                .expect("a free permit"),
        );
    }
    assert!(
        clients[3]
            .semaphore(&k, 3)
            .try_acquire()
            .await
            .unwrap()
            .is_none(),
        "a fourth permit of three"
    );
    assert_eq!(held[0].kind(), LeaseKind::Permit { permits: 3 });
    let other = clients[3].semaphore(&k, 2).try_acquire().await;
    assert_eq!(
        other.as_ref().map(|_| ()).map_err(LockError::kind),
        Err(ErrorKind::KindConflict),
        "another number of permits for a name in use"
    );
    // Where every kind of a name waits in one queue, a lock sees the permits ahead of it.
    // (Redis's mutex path is a plain SET NX, which does not look at the semaphore's keys: there
    // a permit sees a lock, but not the other way round.)
    if matches!(clients[0].backend().name(), "etcd" | "zookeeper") {
        let e = clients[3].try_acquire(&k).await.map(|_| ());
        assert_eq!(
            e.map_err(|e| e.kind()),
            Err(ErrorKind::KindConflict),
            "a lock on a semaphore's name"
        );
    }
    let fences: Vec<Option<u64>> = held.iter().map(|p| p.fence()).collect();
    let first = held.remove(0);
    assert!(first.release().await.unwrap().was_held());
    let fourth = clients[3]
        .semaphore(&k, 3)
        .wait_timeout(Duration::from_secs(10))
        .acquire()
        .await
        .expect("a released permit goes to the next");
    if fenced(&clients[0]) {
        let mut all: Vec<u64> = fences.into_iter().map(Option::unwrap).collect();
        let last = fourth.fence().unwrap();
        assert!(all.iter().all(|&f| f < last), "fence {last} after {all:?}");
        all.push(last);
        let unique: BTreeSet<u64> = all.iter().copied().collect();
        assert_eq!(
            unique.len(),
            all.len(),
            "two permits shared a fence: {all:?}"
        );
    }
    for g in held {
        assert!(g.release().await.unwrap().was_held());
    }
    assert!(fourth.release().await.unwrap().was_held());
    assert_eq!(
        clients[0]
            .semaphore(&k, 0)
            .try_acquire()
            .await
            .map(|_| ())
            .map_err(|e| e.kind()),
        Err(ErrorKind::Config),
        "a semaphore of no permits"
    );
}

/// Tasks of several clients that take permits in a loop are never more than N at once, and
/// every permit gets its own fence.
pub async fn permits_never_exceed_n(make: &impl MakeClient) {
    const N: u32 = 2;
    let o = opts()
        .wait_timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(make.client(o).await);
    }
    if !holds(&clients[0], LeaseKind::Permit { permits: N }).await {
        return;
    }
    let k = Arc::new(key("sem-count"));
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for t in 0..6 {
        let c = clients[t % clients.len()].clone();
        let (k, inside, most) = (k.clone(), inside.clone(), most.clone());
        tasks.push(tokio::spawn(async move {
            let mut fences = Vec::new();
            for _ in 0..4 {
                let g = c.semaphore(&k, N).acquire().await.expect("permit");
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(5)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                fences.push(g.fence());
                assert!(g.release().await.unwrap().was_held());
            }
            fences
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let most = most.load(Ordering::SeqCst);
    assert!(most <= N as usize, "{most} holders of {N} permits at once");
    if fenced(&clients[0]) {
        let unique: BTreeSet<Option<u64>> = all.iter().copied().collect();
        assert_eq!(unique.len(), all.len(), "two permits shared a fence");
    }
}

/// A permit whose holder stops renewing comes back after its TTL. (Engines whose leases
/// expire.)
pub async fn a_dead_holders_permit_comes_back(make: &impl MakeClient) {
    let short = opts()
        .ttl(Duration::from_millis(1500))
        .auto_renew(false)
        .build()
        .unwrap();
    let (dead, next) = (
        make.client(short).await,
        make.client(opts().build().unwrap()).await,
    );
    let one = LeaseKind::Permit { permits: 1 };
    if !holds(&dead, one).await || !dead.backend().capabilities().expiring {
        return;
    }
    let k = key("sem-dead");
    let leaked = dead
        .semaphore(&k, 1)
        .try_acquire()
        .await
        .unwrap()
        .expect("free")
        .leak();
    assert!(next.semaphore(&k, 1).try_acquire().await.unwrap().is_none());
    let g = next
        .semaphore(&k, 1)
        .wait_timeout(Duration::from_secs(10))
        .acquire()
        .await
        .expect("the dead holder's permit came back");
    if fenced(&next) {
        assert!(
            g.fence() > leaked.fence,
            "{:?} after {:?}",
            g.fence(),
            leaked.fence
        );
    }
    assert!(g.release().await.unwrap().was_held());
}

/// A reader or permit waiter that gives up (a timeout) leaves no entry that holds back the
/// waiters behind it.
pub async fn a_waiter_that_gives_up_leaves_no_trace(make: &impl MakeClient) {
    let o = opts().build().unwrap();
    let (a, b, c) = three(make, o).await;
    let one = LeaseKind::Permit { permits: 1 };
    if !holds(&a, one).await {
        return;
    }
    let k = key("sem-give-up");
    let held = a
        .semaphore(&k, 1)
        .try_acquire()
        .await
        .unwrap()
        .expect("free");
    let e = b
        .semaphore(&k, 1)
        .wait_timeout(Duration::from_millis(600))
        .acquire()
        .await
        .map(|_| ());
    assert_eq!(e.map_err(|e| e.kind()), Err(ErrorKind::Timeout));
    assert!(held.release().await.unwrap().was_held());
    let g = c
        .semaphore(&k, 1)
        .wait_timeout(Duration::from_secs(5))
        .acquire()
        .await
        .expect("a waiter that gave up held the next one back");
    assert!(g.release().await.unwrap().was_held());
}
