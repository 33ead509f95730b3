//! `distlock join`, `distlock group` and `distlock owner` as real processes, on Redis and etcd:
//! members share a group's partitions, one owner each, as rendezvous hashing assigns them; a
//! killed member's partitions are owned again within its TTL and a wake-up, a paused one's
//! too (and it finds its membership lost when it wakes), a newcomer takes about its share and
//! no more, and a member that leaves hands its partitions over at once. Each new owner of a
//! partition has a higher fence than the one before.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use distlock_testkit::{Etcd, RedisServer};
use nix::sys::signal::Signal;

mod common;
use common::{distlock, signal, wait_exit, wait_until};

const P: u32 = 32;
const TTL: Duration = Duration::from_secs(2);
const INTERVAL: &str = "100ms";

/// `distlock join` as member `id` of `orders`, its events to `<id>.log`.
fn member(tmp: &Path, url: &str, id: &str) -> Child {
    distlock(tmp)
        .args([
            "join",
            "--json",
            "--url",
            url,
            "--ttl",
            "2s",
            "--interval",
            INTERVAL,
        ])
        .args([
            "--partitions",
            &P.to_string(),
            "--value",
            &format!("host-{id}"),
        ])
        .args(["orders", id])
        .stdout(std::fs::File::create(tmp.join(format!("{id}.log"))).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// A partition as `distlock group --json` shows it: its owner, fence and assigned member.
type Slot = (Option<String>, Option<u64>, Option<String>);

/// `distlock group --json`, parsed: the members' ids, and each partition's slot.
struct Map {
    members: Vec<String>,
    partitions: BTreeMap<u64, Slot>,
}

fn map(tmp: &Path, url: &str) -> Map {
    let o = distlock(tmp)
        .args([
            "group",
            "--json",
            "--url",
            url,
            "--partitions",
            &P.to_string(),
            "orders",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let text = |v: &serde_json::Value| v.as_str().map(str::to_owned);
    Map {
        members: v["members"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap().to_owned())
            .collect(),
        partitions: v["map"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                (
                    p["partition"].as_u64().unwrap(),
                    (text(&p["owner"]), p["fence"].as_u64(), text(&p["assigned"])),
                )
            })
            .collect(),
    }
}

impl Map {
    /// Every partition owned by the member assigned to it, among exactly `ids`.
    fn settled(&self, ids: &[&str]) -> bool {
        self.members == ids
            && self.partitions.len() == P as usize
            && self.partitions.values().all(|(owner, fence, assigned)| {
                owner.is_some() && fence.is_some() && owner == assigned
            })
    }

    fn owner(&self, p: u64) -> (&str, u64) {
        let (o, f, _) = &self.partitions[&p];
        (o.as_deref().unwrap(), f.unwrap())
    }
}

/// Waits until the map is settled among `ids`; the map and how long it took.
fn settle(tmp: &Path, url: &str, ids: &[&str], limit: Duration) -> (Map, Duration) {
    let t0 = Instant::now();
    let mut last = None;
    wait_until(
        &format!("{url}: the partitions settled among {ids:?}"),
        limit,
        || {
            let m = map(tmp, url);
            let done = m.settled(ids);
            last = Some(m);
            done
        },
    );
    (last.unwrap(), t0.elapsed())
}

/// Checks that every partition that changed owner between `before` and `after` has a higher
/// fence, and that one that kept its owner kept its fence; the partitions moved.
fn moved(url: &str, before: &Map, after: &Map) -> usize {
    let mut n = 0;
    for p in 0..u64::from(P) {
        let ((was, f0), (now, f1)) = (before.owner(p), after.owner(p));
        if was == now {
            assert_eq!(f0, f1, "{url}: partition {p} kept {was} with another fence");
        } else {
            assert!(
                f1 > f0,
                "{url}: partition {p} from {was} to {now}: fence {f0} then {f1}"
            );
            n += 1;
        }
    }
    n
}

fn scenario(url: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let tmp = tmp.path();
    let mut a = member(tmp, url, "m-a");
    let mut b = member(tmp, url, "m-b");
    let mut c = member(tmp, url, "m-c");
    let (first, _) = settle(tmp, url, &["m-a", "m-b", "m-c"], Duration::from_secs(20));
    // A key's owner, as a router asks.
    for key in ["order:1", "order:42", "user:7"] {
        let o = distlock(tmp)
            .args([
                "owner",
                "--json",
                "--url",
                url,
                "--partitions",
                &P.to_string(),
            ])
            .args(["orders", key])
            .output()
            .unwrap();
        assert!(o.status.success(), "{o:?}");
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let (id, fence) = first.owner(v["partition"].as_u64().unwrap());
        assert_eq!(v["member"], id);
        assert_eq!(v["fence"], fence);
        assert_eq!(v["value"], format!("host-{id}"));
    }
    // Killed: its partitions owned again within the TTL, a read of the members and a wake-up.
    signal(&a, Signal::SIGKILL);
    let _ = a.wait();
    let bound = TTL + Duration::from_millis(100) + Duration::from_millis(1500);
    let (after_kill, took) = settle(tmp, url, &["m-b", "m-c"], Duration::from_secs(20));
    assert!(
        took < bound,
        "{url}: {took:?} after the kill (bound {bound:?})"
    );
    let gone = first
        .partitions
        .values()
        .filter(|(o, ..)| o.as_deref() == Some("m-a"))
        .count();
    assert_eq!(
        moved(url, &first, &after_kill),
        gone,
        "{url}: only m-a's moved"
    );
    // Paused: the same, and it finds its membership lost when it wakes.
    signal(&b, Signal::SIGSTOP);
    let (after_pause, took) = settle(tmp, url, &["m-c"], Duration::from_secs(20));
    assert!(
        took < bound,
        "{url}: {took:?} after the pause (bound {bound:?})"
    );
    moved(url, &after_kill, &after_pause);
    signal(&b, Signal::SIGCONT);
    let status = wait_exit(&mut b, Duration::from_secs(10));
    assert_eq!(status.code(), Some(70), "{url}: the paused member's exit");
    // A newcomer takes about its share (1/N + 5 %), no more.
    let mut d = member(tmp, url, "m-d");
    let (after_join, _) = settle(tmp, url, &["m-c", "m-d"], Duration::from_secs(20));
    let n = moved(url, &after_pause, &after_join);
    assert!(
        n as f64 <= f64::from(P) * (0.5 + 0.05),
        "{url}: {n} of {P} moved to the newcomer"
    );
    // A member that leaves hands its partitions over within a read of the members and a few
    // round trips.
    signal(&c, Signal::SIGTERM);
    let (after_leave, took) = settle(tmp, url, &["m-d"], Duration::from_secs(20));
    assert!(
        took < Duration::from_millis(1500),
        "{url}: {took:?} after the leave"
    );
    moved(url, &after_join, &after_leave);
    assert_eq!(wait_exit(&mut c, Duration::from_secs(10)).code(), Some(0));
    let log = std::fs::read_to_string(tmp.join("m-c.log")).unwrap();
    assert!(log.lines().last().unwrap().contains("\"left\""), "{log}");
    signal(&d, Signal::SIGTERM);
    assert_eq!(wait_exit(&mut d, Duration::from_secs(10)).code(), Some(0));
}

#[test]
fn members_and_owners_on_redis() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    scenario(&redis.url());
}

#[test]
fn members_and_owners_on_etcd() {
    let Some(etcd) = Etcd::start() else { return };
    scenario(&etcd.url(""));
}
