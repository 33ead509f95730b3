//! P1: one client's uncontended acquire + release, beside the raw redis-rs floors (sync and
//! async) and the peers, in interleaved rounds; and the distribution of one cycle's time.

use std::time::Instant;

use distlock_core::LockClient;
use distlock_redis::RedisBackend;

use crate::common::{RELEASE_LUA, distlock_cycles, median, rtt_us};
use crate::peers;

pub(crate) fn floor_sync(
    conn: &mut redis::Connection,
    script: &redis::Script,
    cycles: usize,
) -> f64 {
    let t0 = Instant::now();
    for i in 0..cycles {
        let token = format!("t{i}");
        let ok: Option<String> = redis::cmd("SET")
            .arg("raw:sync")
            .arg(&token)
            .arg("NX")
            .arg("PX")
            .arg(30_000)
            .query(conn)
            .expect("SET");
        assert!(ok.is_some(), "raw lock busy");
        let _: i64 = script
            .key("raw:sync")
            .arg(&token)
            .invoke(conn)
            .expect("EVALSHA");
    }
    cycles as f64 / t0.elapsed().as_secs_f64()
}

pub(crate) async fn floor_async(
    conn: &mut redis::aio::MultiplexedConnection,
    script: &redis::Script,
    cycles: usize,
) -> f64 {
    let t0 = Instant::now();
    for i in 0..cycles {
        let token = format!("t{i}");
        let ok: Option<String> = redis::cmd("SET")
            .arg("raw:async")
            .arg(&token)
            .arg("NX")
            .arg("PX")
            .arg(30_000)
            .query_async(conn)
            .await
            .expect("SET");
        assert!(ok.is_some(), "raw lock busy");
        let _: i64 = script
            .key("raw:async")
            .arg(&token)
            .invoke_async(conn)
            .await
            .expect("EVALSHA");
    }
    cycles as f64 / t0.elapsed().as_secs_f64()
}

/// P1's figures: medians over the rounds, in cycles per second.
pub(crate) struct Figures {
    pub(crate) sync_floor: f64,
    pub(crate) async_floor: f64,
    pub(crate) ours: f64,
    /// A `PING` round trip, back to back, in µs.
    pub(crate) rtt: f64,
    pub(crate) peers: Vec<peers::Figure>,
    /// One cycle's time: the async floor's, and ours.
    pub(crate) latency: [hdrhistogram::Histogram<u64>; 2],
}

/// Interleaved rounds of the floors, distlock and every peer on the server at `url`; then the
/// distribution of one cycle's time, the async floor's and ours alternating.
pub(crate) async fn measure(
    raw: &redis::Client,
    url: &str,
    async_conn: &mut redis::aio::MultiplexedConnection,
    rounds: usize,
    cycles: usize,
    peer_list: &[peers::Peer],
) -> Figures {
    let mut sync_conn = raw.get_connection().expect("sync connection");
    let script = redis::Script::new(RELEASE_LUA);
    let ours = LockClient::new(RedisBackend::connect(url).await.expect("connect"));
    // Warm-up: load scripts, fill connection pools.
    floor_sync(&mut sync_conn, &script, 50);
    floor_async(async_conn, &script, 50).await;
    distlock_cycles(&ours, "p1", 50).await;
    let (mut s, mut a, mut d) = (Vec::new(), Vec::new(), Vec::new());
    let mut r: Vec<Vec<peers::Figure>> = vec![Vec::new(); peer_list.len()];
    let urls = [url.to_owned()];
    for _ in 0..rounds {
        s.push(floor_sync(&mut sync_conn, &script, cycles));
        a.push(floor_async(async_conn, &script, cycles).await);
        d.push(distlock_cycles(&ours, "p1", cycles).await);
        for (i, peer) in peer_list.iter().enumerate() {
            r[i].push(peer.cycles(cycles, &urls));
        }
    }
    let rtt = rtt_us(async_conn, 1000, None).await;
    let mut lat_floor = hdrhistogram::Histogram::<u64>::new(3).expect("histogram");
    let mut lat_ours = hdrhistogram::Histogram::<u64>::new(3).expect("histogram");
    for _ in 0..cycles {
        let t = Instant::now();
        floor_async(async_conn, &script, 1).await;
        let _ = lat_floor.record(t.elapsed().as_nanos() as u64);
        let t = Instant::now();
        distlock_cycles(&ours, "p1", 1).await;
        let _ = lat_ours.record(t.elapsed().as_nanos() as u64);
    }
    Figures {
        sync_floor: median(s),
        async_floor: median(a),
        ours: median(d),
        rtt,
        peers: r.iter().map(|v| peers::median_figure(v)).collect(),
        latency: [lat_floor, lat_ours],
    }
}

/// P1 over TLS, beside P1 over TCP on the same server process: the async floor and distlock,
/// medians over interleaved rounds, in cycles per second.
pub(crate) struct TlsFigures {
    pub(crate) tcp_floor: f64,
    pub(crate) tcp_ours: f64,
    pub(crate) tls_floor: f64,
    pub(crate) tls_ours: f64,
}

/// P1 over TLS beside TCP, as the report shows it.
pub(crate) fn render_tls(t: &TlsFigures, rounds: usize, cycles: usize) -> String {
    format!(
        "P1 over TLS: another redis-server listening both ways, rediss:// checking its \
         certificate (CA and name), {rounds} round(s) × {cycles} cycles, alternating, medians\n\
         | transport | async floor cycles/s | distlock cycles/s | distlock vs floor |\n\
         |---|---:|---:|---:|\n\
         | TCP | {:.0} | {:.0} | {:.2} |\n\
         | TLS | {:.0} | {:.0} | {:.2} |\n\
         | TLS / TCP | {:.2} | {:.2} | |\n",
        t.tcp_floor,
        t.tcp_ours,
        t.tcp_ours / t.tcp_floor,
        t.tls_floor,
        t.tls_ours,
        t.tls_ours / t.tls_floor,
        t.tls_floor / t.tcp_floor,
        t.tls_ours / t.tcp_ours
    )
}

/// Starts a redis-server that listens both in clear text and with TLS (a certificate from a
/// CA made now; clients checked against it, as `rediss://` does by default), and measures P1
/// over each, alternating.
pub(crate) async fn measure_tls(rounds: usize, cycles: usize, pin: bool) -> Option<TlsFigures> {
    let pki = distlock_testkit::Pki::generate();
    let server = distlock_testkit::RedisServer::start_tls(&pki, false, &[])?;
    let tls_port = server.tls_port();
    if pin {
        server.pin_to_cpu(0);
    }
    let tcp_url = server.url();
    let tls_base = format!("rediss://127.0.0.1:{tls_port}/");
    let tls_url = format!("{tls_base}?tls_ca={}", pki.ca.display());
    let script = redis::Script::new(RELEASE_LUA);
    let ca = std::fs::read(&pki.ca).expect("the CA");
    // The raw client, like the engine, builds its TLS with the process's default provider.
    distlock_tls::install_default_provider();
    let tls_raw = redis::Client::build_with_tls(
        tls_base.as_str(),
        redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(ca),
        },
    )
    .expect("TLS client");
    let mut tcp_conn = redis::Client::open(tcp_url.as_str())
        .expect("client")
        .get_multiplexed_async_connection()
        .await
        .expect("TCP connection");
    let mut tls_conn = tls_raw
        .get_multiplexed_async_connection()
        .await
        .expect("TLS connection");
    let tcp_ours = LockClient::new(RedisBackend::connect(&tcp_url).await.expect("connect"));
    let tls_ours = LockClient::new(RedisBackend::connect(&tls_url).await.expect("connect TLS"));
    floor_async(&mut tcp_conn, &script, 50).await;
    floor_async(&mut tls_conn, &script, 50).await;
    distlock_cycles(&tcp_ours, "p1tcp", 50).await;
    distlock_cycles(&tls_ours, "p1tls", 50).await;
    let mut v: [Vec<f64>; 4] = Default::default();
    for _ in 0..rounds {
        v[0].push(floor_async(&mut tcp_conn, &script, cycles).await);
        v[1].push(distlock_cycles(&tcp_ours, "p1tcp", cycles).await);
        v[2].push(floor_async(&mut tls_conn, &script, cycles).await);
        v[3].push(distlock_cycles(&tls_ours, "p1tls", cycles).await);
    }
    let [a, b, c, d] = v;
    Some(TlsFigures {
        tcp_floor: median(a),
        tcp_ours: median(b),
        tls_floor: median(c),
        tls_ours: median(d),
    })
}
