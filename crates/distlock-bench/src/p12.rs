//! P12: a group of 8 members × 256 partitions, each member a `distlock join` process. After
//! the group settles (every partition owned by the member rendezvous hashing assigns it), it
//! measures the engine's requests per second per member at rest, then three changes: a
//! ninth member joins, that member leaves gracefully (SIGTERM), and a member is killed with
//! SIGKILL. For each: the time until every partition is owned again as assigned, and the
//! partitions that changed owner (each with a higher fence, checked).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use distlock_core::{LockClient, PartitionState};
use distlock_testkit::{Etcd, RedisServer};

use crate::p6::P6Server;

/// The group's shape and its members' settings.
const MEMBERS: usize = 8;
const PARTITIONS: u32 = 256;
const TTL: &str = "3s";
const INTERVAL: &str = "500ms";
/// How long the group is left at rest while its requests are counted (1 s with `--quick`).
const REST: Duration = Duration::from_secs(10);
/// How often the map is read while a change settles.
const POLL: Duration = Duration::from_millis(20);

/// One engine's figures.
pub(crate) struct Row {
    pub(crate) engine: &'static str,
    pub(crate) settle_first: Duration,
    pub(crate) rest_per_member: f64,
    pub(crate) unit: &'static str,
    /// (change, time to settle, partitions moved).
    pub(crate) changes: Vec<(&'static str, Duration, usize)>,
}

fn member(bin: &PathBuf, url: &str, id: &str) -> Child {
    Command::new(bin)
        .args(["join", "--url", url, "--ttl", TTL, "--interval", INTERVAL])
        .args(["--partitions", &PARTITIONS.to_string()])
        .args(["--value", &format!("{id}.example:8080"), "p12", id])
        .env("DISTLOCK_LOG", "off")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start distlock join")
}

/// The member processes of a run: whatever is still running when it ends (a settle that
/// failed and panicked included) is killed.
struct Members(Vec<Child>);

impl Drop for Members {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn signal(child: &Child, sig: nix::sys::signal::Signal) {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("a pid"));
    let _ = nix::sys::signal::kill(pid, sig);
}

/// Reads the map until every partition is owned as assigned among exactly `ids`: the map, and
/// how long it took from `since`.
async fn settled(
    client: &LockClient,
    ids: &[String],
    since: Instant,
) -> (Vec<PartitionState>, Duration) {
    let group = client.group("p12").partitions(PARTITIONS);
    let limit = Duration::from_secs(120);
    loop {
        let members = group.members().await.unwrap_or_default();
        let same = members.iter().map(|m| &m.id).eq(ids.iter());
        if same && let Ok(map) = group.partition_map().await {
            let done = map.len() == PARTITIONS as usize
                && map
                    .iter()
                    .all(|p| p.holder.is_some() && p.holder == p.assigned);
            if done {
                return (map, since.elapsed());
            }
        }
        assert!(
            since.elapsed() < limit,
            "P12: the group did not settle among {ids:?} within {limit:?}"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// The partitions whose owner changed; panics if one changed without a higher fence.
fn moved(before: &[PartitionState], after: &[PartitionState]) -> usize {
    before
        .iter()
        .zip(after)
        .filter(|(b, a)| {
            let changed = b.holder != a.holder;
            if changed {
                assert!(
                    a.fence > b.fence,
                    "P12: partition {} changed owner without a higher fence",
                    a.partition
                );
            }
            changed
        })
        .count()
}

/// The group on one engine.
async fn on_engine(engine: &'static str, url: &str, server: P6Server<'_>, rest: Duration) -> Row {
    let bin = crate::p10::stampede::distlock_binary();
    let client = LockClient::new(distlock::open_backend(url).await.expect("open the engine"));
    let mut ids: Vec<String> = (0..MEMBERS).map(|i| format!("m-{i}")).collect();
    let t0 = Instant::now();
    let mut members = Members(ids.iter().map(|id| member(&bin, url, id)).collect());
    let (mut map, settle_first) = settled(&client, &ids, t0).await;
    // At rest: nobody reads the map meanwhile.
    let before = server.requests();
    tokio::time::sleep(rest).await;
    let rest = (server.requests() - before) / rest.as_secs_f64() / MEMBERS as f64;
    let mut changes = Vec::new();
    // A ninth member joins.
    let newcomer = "m-8".to_owned();
    let t = Instant::now();
    members.0.push(member(&bin, url, &newcomer));
    ids.push(newcomer);
    let (after, took) = settled(&client, &ids, t).await;
    changes.push(("a ninth member joins", took, moved(&map, &after)));
    map = after;
    // It leaves gracefully.
    let t = Instant::now();
    let leaver = members.0.pop().expect("the newcomer");
    signal(&leaver, nix::sys::signal::Signal::SIGTERM);
    ids.pop();
    let (after, took) = settled(&client, &ids, t).await;
    changes.push(("it leaves (SIGTERM)", took, moved(&map, &after)));
    map = after;
    reap(leaver);
    // A member is killed.
    let t = Instant::now();
    let killed = members.0.remove(0);
    signal(&killed, nix::sys::signal::Signal::SIGKILL);
    ids.remove(0);
    let (after, took) = settled(&client, &ids, t).await;
    changes.push(("a member is killed (SIGKILL)", took, moved(&map, &after)));
    reap(killed);
    for m in &members.0 {
        signal(m, nix::sys::signal::Signal::SIGTERM);
    }
    for m in std::mem::take(&mut members.0) {
        reap(m);
    }
    Row {
        engine,
        settle_first,
        rest_per_member: rest,
        unit: server.unit(),
        changes,
    }
}

fn reap(mut child: Child) {
    let t0 = Instant::now();
    while child.try_wait().ok().flatten().is_none() {
        if t0.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let _ = child.wait();
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// P12 on Redis and etcd (or the engines named): one row each.
pub(crate) fn run(rt: &tokio::runtime::Runtime, engines: &[String], quick: bool) -> Vec<Row> {
    let rest = if quick { Duration::from_secs(1) } else { REST };
    let wanted = |e: &str| engines.is_empty() || engines.iter().any(|n| n == e);
    let mut rows = Vec::new();
    if wanted("redis") {
        let server = RedisServer::start().expect("P12 needs redis-server");
        rows.push(rt.block_on(on_engine(
            "Redis",
            &server.url(),
            P6Server::Redis(&server),
            rest,
        )));
    }
    if wanted("etcd") {
        let etcd = Etcd::start().expect("P12 needs etcd");
        rows.push(rt.block_on(on_engine(
            "etcd",
            &etcd.url(""),
            P6Server::Etcd(&etcd),
            rest,
        )));
    }
    rows
}

/// The table.
pub(crate) fn render(rows: &[Row]) -> String {
    let mut out = format!(
        "P12 a group of {MEMBERS} members × {PARTITIONS} partitions, each member a `distlock \
         join` process (TTL {TTL}, members read every {INTERVAL}, no grace; unpinned)\n\
         | engine | change | owned again after | partitions moved |\n|---|---|---:|---:|\n"
    );
    for r in rows {
        out.push_str(&format!(
            "| {} | {MEMBERS} members start | {:.2} s | - |\n",
            r.engine,
            r.settle_first.as_secs_f64()
        ));
        for (what, took, n) in &r.changes {
            out.push_str(&format!(
                "| {} | {what} | {:.2} s | {n} ({:.1} %) |\n",
                r.engine,
                took.as_secs_f64(),
                *n as f64 * 100.0 / f64::from(PARTITIONS)
            ));
        }
    }
    out.push_str(
        "\n| engine | requests per second per member at rest | counted as |\n|---|---:|---|\n",
    );
    for r in rows {
        out.push_str(&format!(
            "| {} | {:.1} | {} |\n",
            r.engine, r.rest_per_member, r.unit
        ));
    }
    out
}
