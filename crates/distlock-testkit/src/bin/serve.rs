//! `distlock-testkit-serve ENGINE…`: starts a real server of each engine named (redis, etcd,
//! zookeeper, postgres, mariadb, memcached) on free loopback ports in temporary folders, as
//! the Rust tests do, prints `ENGINE URL` for each on a line of its own, then `ready`, and
//! stops them all when its standard input closes. The Python package's tests start their
//! servers through it, so the servers are started one way for every language.
//!
//! An engine whose server is not installed prints `ENGINE missing` (outside CI; under CI it is
//! a failure, as in every test of the project).

use std::io::{BufRead, Write};

use distlock_testkit::{Etcd, MariaDb, Memcached, Postgres, RedisServer, ZooKeeper};

/// A started server, kept until the end.
type Running = Box<dyn std::any::Any>;

/// Starts `engine`'s server: its URL and the server, `None` if it is not installed.
fn start(engine: &str) -> Result<Option<(String, Running)>, String> {
    fn keep<S: 'static>(s: Option<S>, url: impl Fn(&S) -> String) -> Option<(String, Running)> {
        s.map(|s| (url(&s), Box::new(s) as Running))
    }
    Ok(match engine {
        "redis" => keep(RedisServer::start(), RedisServer::url),
        "etcd" => keep(Etcd::start(), |s| s.url("")),
        "zookeeper" => keep(ZooKeeper::start(), |s| s.url("")),
        "postgres" => keep(Postgres::start(), |s| s.url("")),
        "mariadb" => keep(MariaDb::start(), |s| s.url("")),
        "memcached" => keep(Memcached::start(), |s| s.url("")),
        other => {
            return Err(format!(
                "unknown engine {other:?}: redis, etcd, zookeeper, postgres, mariadb or memcached"
            ));
        }
    })
}

fn main() {
    let mut running = Vec::new();
    let mut out = std::io::stdout().lock();
    for engine in std::env::args().skip(1) {
        match start(&engine) {
            Ok(Some((url, server))) => {
                running.push(server);
                let _ = writeln!(out, "{engine} {url}");
            }
            Ok(None) => {
                let _ = writeln!(out, "{engine} missing");
            }
            Err(e) => {
                eprintln!("distlock-testkit-serve: {e}");
                std::process::exit(2);
            }
        }
    }
    let _ = writeln!(out, "ready");
    let _ = out.flush();
    drop(out);
    // Until the caller closes our standard input (or exits).
    let mut sink = String::new();
    let stdin = std::io::stdin();
    while stdin.lock().read_line(&mut sink).is_ok_and(|n| n > 0) {
        sink.clear();
    }
    drop(running);
}
