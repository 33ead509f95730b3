//! P4: Redlock over N masters, beside the raw parallel floor and the peers.

use std::time::Instant;

use distlock_core::LockClient;
use distlock_redis::RedlockBackend;
use distlock_testkit::RedisServer;

use crate::common::{RELEASE_LUA, distlock_cycles, median};
use crate::peers;

/// The raw Redlock floor: `SET NX PX` on every master at once, then the release script on every
/// master at once, with redis-rs's multiplexed connections (no quorum logic, no timeouts).
pub(crate) async fn redlock_floor(
    conns: &mut [redis::aio::MultiplexedConnection],
    script: &redis::Script,
    cycles: usize,
) -> f64 {
    let t0 = Instant::now();
    for i in 0..cycles {
        let token = format!("t{i}");
        let sets = conns.iter_mut().map(|c| {
            let token = &token;
            async move {
                redis::cmd("SET")
                    .arg("raw:redlock")
                    .arg(token)
                    .arg("NX")
                    .arg("PX")
                    .arg(30_000)
                    .query_async::<Option<String>>(c)
                    .await
                    .expect("SET")
            }
        });
        let granted = futures_util::future::join_all(sets).await;
        assert!(granted.iter().all(Option::is_some), "raw lock busy");
        let releases = conns.iter_mut().map(|c| {
            let token = &token;
            async move {
                script
                    .key("raw:redlock")
                    .arg(token)
                    .invoke_async::<i64>(c)
                    .await
                    .expect("EVALSHA")
            }
        });
        futures_util::future::join_all(releases).await;
    }
    cycles as f64 / t0.elapsed().as_secs_f64()
}

/// The median time of one `PING` to every master at once, in µs.
pub(crate) async fn parallel_rtt_us(
    conns: &mut [redis::aio::MultiplexedConnection],
    n: usize,
) -> f64 {
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let t0 = Instant::now();
        futures_util::future::join_all(conns.iter_mut().map(|c| async move {
            redis::cmd("PING")
                .query_async::<String>(c)
                .await
                .expect("PING")
        }))
        .await;
        v.push(t0.elapsed().as_secs_f64() * 1e6);
    }
    median(v)
}

/// P4's figures: medians over interleaved rounds.
pub(crate) struct P4 {
    pub(crate) masters: usize,
    pub(crate) floor: f64,
    pub(crate) ours: f64,
    pub(crate) peers: Vec<peers::Figure>,
    pub(crate) parallel_rtt_us: f64,
}

/// P4: uncontended Redlock cycles over `n` masters (started here, pinned like the rest), the
/// raw parallel floor, and the peers, in interleaved rounds.
pub(crate) fn p4(
    rt: &tokio::runtime::Runtime,
    n: usize,
    rounds: usize,
    cycles: usize,
    pin: bool,
    peer_list: &[peers::Peer],
) -> P4 {
    let masters: Vec<RedisServer> = (0..n)
        .map(|_| RedisServer::start().expect("redis-server"))
        .collect();
    if pin {
        for m in &masters {
            m.pin_to_cpu(0);
        }
    }
    let urls: Vec<String> = masters.iter().map(RedisServer::url).collect();
    let redlock_url = format!(
        "redlock://{}",
        masters
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.port()))
            .collect::<Vec<_>>()
            .join(",")
    );
    rt.block_on(async {
        let mut conns = Vec::new();
        for u in &urls {
            let c = redis::Client::open(u.as_str()).expect("client");
            conns.push(c.get_multiplexed_async_connection().await.expect("connect"));
        }
        let script = redis::Script::new(RELEASE_LUA);
        let ours = LockClient::new(
            RedlockBackend::connect(&redlock_url)
                .await
                .expect("connect to the masters"),
        );
        redlock_floor(&mut conns, &script, 50).await;
        distlock_cycles(&ours, "p4", 50).await;
        let (mut f, mut o) = (Vec::new(), Vec::new());
        let mut r: Vec<Vec<peers::Figure>> = vec![Vec::new(); peer_list.len()];
        for _ in 0..rounds {
            f.push(redlock_floor(&mut conns, &script, cycles).await);
            o.push(distlock_cycles(&ours, "p4", cycles).await);
            for (i, peer) in peer_list.iter().enumerate() {
                r[i].push(peer.cycles(cycles, &urls));
            }
        }
        P4 {
            masters: n,
            floor: median(f),
            ours: median(o),
            peers: r.iter().map(|v| peers::median_figure(v)).collect(),
            parallel_rtt_us: parallel_rtt_us(&mut conns, 1000).await,
        }
    })
}
