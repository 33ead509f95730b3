//! P5: the other engines, each beside its raw client floor.

use std::time::{Duration, Instant};

use distlock_core::LockClient;

use crate::common::{distlock_cycles, median};

/// One P5 row: an engine's uncontended cycle beside its raw client floor.
pub(crate) struct P5Row {
    pub(crate) engine: &'static str,
    pub(crate) floor_name: &'static str,
    pub(crate) floor: f64,
    pub(crate) ours: f64,
}

/// A raw floor and our cycle in interleaved rounds (after a warm-up of each): their medians.
pub(crate) async fn interleaved(
    ours: &LockClient,
    rounds: usize,
    cycles: usize,
    mut floor: impl AsyncFnMut(usize) -> f64,
) -> (f64, f64) {
    floor(50).await;
    distlock_cycles(ours, "p5", 50).await;
    let (mut f, mut o) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        f.push(floor(cycles).await);
        o.push(distlock_cycles(ours, "p5", cycles).await);
    }
    (median(f), median(o))
}

/// etcd's floor: a create-if-absent transaction and a delete, as bare gRPC calls on one
/// connection (no member fail-over, no leader check, no lease).
pub(crate) async fn etcd_floor(conn: &distlock_etcd::wire::Conn, cycles: usize) -> f64 {
    use distlock_etcd::wire::{Compare, CompareResult, DeleteRangeRequest, RequestOp, TxnRequest};
    let t0 = Instant::now();
    for i in 0..cycles {
        let txn = TxnRequest::new(
            vec![Compare::create_revision(
                "raw/lock",
                CompareResult::Equal,
                0,
            )],
            vec![RequestOp::put("raw/lock", format!("t{i}"), 0)],
            vec![],
        );
        let r = conn.txn(txn).await.expect("txn");
        assert!(r.succeeded, "raw lock busy");
        conn.delete_range(DeleteRangeRequest {
            key: b"raw/lock".to_vec(),
            ..Default::default()
        })
        .await
        .expect("delete");
    }
    cycles as f64 / t0.elapsed().as_secs_f64()
}

/// ZooKeeper's floor: an ephemeral create and a delete, with zookeeper-client.
pub(crate) async fn zk_floor(client: &zookeeper_client::Client, cycles: usize) -> f64 {
    let options =
        zookeeper_client::CreateMode::Ephemeral.with_acls(zookeeper_client::Acls::anyone_all());
    let t0 = Instant::now();
    for _ in 0..cycles {
        client
            .create("/rawlock", b"x", &options)
            .await
            .expect("create");
        client.delete("/rawlock", None).await.expect("delete");
    }
    cycles as f64 / t0.elapsed().as_secs_f64()
}

/// P5's table (as the report shows it).
pub(crate) fn render(rows: &[P5Row]) -> String {
    let mut out = String::from(
        "| engine | raw floor | floor cycles/s | distlock cycles/s | vs floor |\n|---|---|---:|---:|---:|\n",
    );
    for r in rows {
        out.push_str(&format!(
            "| {} | {} | {:.0} | {:.0} | {:.2} |\n",
            r.engine,
            r.floor_name,
            r.floor,
            r.ours,
            r.ours / r.floor
        ));
    }
    out
}

/// P5: etcd, ZooKeeper, PostgreSQL, MariaDB and memcached (started here, pinned like the
/// rest), each beside its raw floor, in interleaved rounds.
pub(crate) fn p5(
    rt: &tokio::runtime::Runtime,
    rounds: usize,
    cycles: usize,
    pin: bool,
) -> Vec<P5Row> {
    p5_of(rt, rounds, cycles, pin, &[])
}

/// [`p5`] on the engines named in `only` (all when empty).
pub(crate) fn p5_of(
    rt: &tokio::runtime::Runtime,
    rounds: usize,
    cycles: usize,
    pin: bool,
    only: &[String],
) -> Vec<P5Row> {
    let on = |name: &str| only.is_empty() || only.iter().any(|o| o == name);
    let mut rows = Vec::new();
    if let Some(etcd) = on("etcd").then(distlock_testkit::Etcd::start).flatten() {
        if pin {
            etcd.members()[0].pin_to_cpu(0);
        }
        let url = etcd.url("");
        rows.push(rt.block_on(async {
            let endpoint = format!("http://127.0.0.1:{}", etcd.members()[0].port());
            let raw = distlock_etcd::wire::Conn::lazy(
                endpoint.parse().expect("an endpoint"),
                Duration::from_secs(3),
                false,
                None,
                None,
            );
            let ours = LockClient::new(
                distlock_etcd::EtcdBackend::connect(&url)
                    .await
                    .expect("connect"),
            );
            let (floor, ours) =
                interleaved(&ours, rounds, cycles, async |n| etcd_floor(&raw, n).await).await;
            P5Row {
                engine: "etcd 3.4 (data on tmpfs)",
                floor_name: "raw gRPC txn create-if-absent + delete",
                floor,
                ours,
            }
        }));
    }
    if let Some(zk) = on("zookeeper")
        .then(distlock_testkit::ZooKeeper::start)
        .flatten()
    {
        if pin {
            zk.servers()[0].pin_to_cpu(0);
        }
        let url = zk.url("");
        rows.push(rt.block_on(async {
            let raw = zookeeper_client::Client::connect(&url["zk://".len()..])
                .await
                .expect("connect");
            let ours = LockClient::new(
                distlock_zookeeper::ZkBackend::connect(&url)
                    .await
                    .expect("connect"),
            );
            let (floor, ours) =
                interleaved(&ours, rounds, cycles, async |n| zk_floor(&raw, n).await).await;
            P5Row {
                engine: "ZooKeeper 3.8",
                floor_name: "zookeeper-client ephemeral create + delete",
                floor,
                ours,
            }
        }));
    }
    if let Some(pg) = on("postgres")
        .then(distlock_testkit::Postgres::start)
        .flatten()
    {
        if pin {
            pg.pin_to_cpu(0);
        }
        let url = pg.url("");
        rows.push(rt.block_on(async {
            let (raw, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .expect("connect");
            tokio::spawn(conn);
            let lock = raw
                .prepare("SELECT pg_try_advisory_lock($1)")
                .await
                .expect("prepare");
            let unlock = raw
                .prepare("SELECT pg_advisory_unlock($1)")
                .await
                .expect("prepare");
            let floor = |n: usize| {
                let (raw, lock, unlock) = (&raw, &lock, &unlock);
                async move {
                    let t0 = Instant::now();
                    for _ in 0..n {
                        let got: bool = raw.query_one(lock, &[&42i64]).await.expect("lock").get(0);
                        assert!(got, "raw lock busy");
                        raw.query_one(unlock, &[&42i64]).await.expect("unlock");
                    }
                    n as f64 / t0.elapsed().as_secs_f64()
                }
            };
            let ours = LockClient::new(
                distlock_postgres::PgBackend::connect(&url)
                    .await
                    .expect("connect"),
            );
            let (floor, ours) = interleaved(&ours, rounds, cycles, async |n| floor(n).await).await;
            P5Row {
                engine: "PostgreSQL 15 (data on tmpfs)",
                floor_name: "tokio-postgres pg_try_advisory_lock + pg_advisory_unlock",
                floor,
                ours,
            }
        }));
    }
    if let Some(db) = on("mariadb")
        .then(distlock_testkit::MariaDb::start)
        .flatten()
    {
        if pin {
            db.pin_to_cpu(0);
        }
        let url = db.url("");
        rows.push(rt.block_on(async {
            use mysql_async::prelude::Queryable;
            let mut raw = mysql_async::Conn::new(mysql_async::Opts::from_url(&url).expect("url"))
                .await
                .expect("connect");
            async fn floor(raw: &mut mysql_async::Conn, n: usize) -> f64 {
                use mysql_async::prelude::Queryable;
                let t0 = Instant::now();
                // Prepared statements (mysql_async caches them per connection), as the engine
                // uses: the strongest raw client, not one that makes the server parse each time.
                for _ in 0..n {
                    let got: Option<i64> = raw
                        .exec_first("SELECT GET_LOCK(?, 0)", ("raw",))
                        .await
                        .expect("GET_LOCK");
                    assert_eq!(got, Some(1), "raw lock busy");
                    let _: Option<i64> = raw
                        .exec_first("SELECT RELEASE_LOCK(?)", ("raw",))
                        .await
                        .expect("RELEASE_LOCK");
                }
                n as f64 / t0.elapsed().as_secs_f64()
            }
            raw.query_drop("DO 1").await.expect("ping");
            let ours = LockClient::new(
                distlock_mysql::MysqlBackend::connect(&url)
                    .await
                    .expect("connect"),
            );
            let (floor, ours) =
                interleaved(&ours, rounds, cycles, async |n| floor(&mut raw, n).await).await;
            P5Row {
                engine: "MariaDB 10.11 (data on tmpfs)",
                floor_name: "mysql_async GET_LOCK + RELEASE_LOCK (prepared)",
                floor,
                ours,
            }
        }));
    }
    if let Some(mc) = on("memcached")
        .then(distlock_testkit::Memcached::start)
        .flatten()
    {
        if pin {
            mc.pin_to_cpu(0);
        }
        let url = mc.url("");
        rows.push(rt.block_on(async {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut raw = tokio::net::TcpStream::connect(("127.0.0.1", mc.port()))
                .await
                .expect("connect");
            raw.set_nodelay(true).expect("nodelay");
            async fn floor(raw: &mut tokio::net::TcpStream, n: usize) -> f64 {
                let mut buf = [0u8; 64];
                let t0 = Instant::now();
                for _ in 0..n {
                    raw.write_all(b"add raw 0 30 1\r\nx\r\n")
                        .await
                        .expect("add");
                    let k = raw.read(&mut buf).await.expect("add reply");
                    assert!(buf[..k].starts_with(b"STORED"), "raw lock busy");
                    raw.write_all(b"delete raw\r\n").await.expect("delete");
                    let k = raw.read(&mut buf).await.expect("delete reply");
                    assert!(buf[..k].starts_with(b"DELETED"), "raw delete failed");
                }
                n as f64 / t0.elapsed().as_secs_f64()
            }
            let ours = LockClient::new(
                distlock_memcached::MemcachedBackend::connect(&url)
                    .await
                    .expect("connect"),
            );
            let (floor, ours) =
                interleaved(&ours, rounds, cycles, async |n| floor(&mut raw, n).await).await;
            P5Row {
                engine: "memcached 1.6",
                floor_name: "raw TCP add + delete",
                floor,
                ours,
            }
        }));
    }
    rows
}
