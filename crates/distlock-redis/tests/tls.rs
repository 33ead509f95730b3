//! `rediss://` takes the direct connection (see the crate's `direct` module) as plain TCP
//! does, with the multiplexed connection's certificate checks.

use distlock_core::{ErrorKind, LockClient, Released};
use distlock_redis::RedisBackend;
use distlock_testkit::{Pki, RedisServer};

/// The server's clients connected to `port` since the client `since`, as `(id, last
/// command)`, oldest first.
fn clients_on(server: &RedisServer, port: u16, since: u64) -> Vec<(u64, String)> {
    let laddr = format!("laddr=127.0.0.1:{port} ");
    let mut clients: Vec<(u64, String)> = server
        .cli(&["CLIENT", "LIST"])
        .lines()
        .filter(|line| line.contains(&laddr))
        .map(|line| {
            let field = |name: &str| {
                line.split(' ')
                    .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
                    .unwrap_or_default()
                    .to_owned()
            };
            (field("id").parse().expect("a client id"), field("cmd"))
        })
        .filter(|(id, _)| *id > since)
        .collect();
    clients.sort();
    clients
}

/// Takes and releases a lock `cycles` times through a client of `url`, then checks that the
/// client has two connections to the TLS port: the multiplexed one (opened first, for the
/// `PING` of `connect`) which carried none of the cycles, and the direct one, which carried
/// them.
async fn cycles_take_the_direct_connection(server: &RedisServer, url: &str, name: &str) {
    // Ids grow: this one's (redis-cli's) is below every connection the client opens.
    let since: u64 = server.cli(&["CLIENT", "ID"]).parse().expect("an id");
    let c = LockClient::new(
        RedisBackend::connect(url)
            .await
            .unwrap_or_else(|e| panic!("{url}: {e}")),
    );
    for _ in 0..20 {
        let g = c.try_acquire(name).await.unwrap().expect("free");
        assert_eq!(g.release().await.unwrap(), Released::Held);
    }
    let clients = clients_on(server, server.tls_port(), since);
    let [(_, multiplexed), (_, direct)] = clients.as_slice() else {
        panic!("{url}: two TLS connections expected, the server has {clients:?}");
    };
    assert_eq!(
        direct, "evalsha",
        "{url}: the cycles took the direct connection"
    );
    assert_ne!(multiplexed, "evalsha", "{url}: and not the multiplexed one");
}

/// A server that demands client certificates (`tls-auth-clients yes`): ours, from its CA, is
/// shown on the direct connection too, with every check of `rediss://`, and with
/// `#insecure` (which checks no server certificate).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_over_tls_take_the_direct_connection() {
    let pki = Pki::generate();
    let Some(server) = RedisServer::start_tls(&pki, true, &[]) else {
        return;
    };
    let base = format!("rediss://127.0.0.1:{}/", server.tls_port());
    let ours = format!(
        "tls_cert={}&tls_key={}",
        pki.client.cert.display(),
        pki.client.key.display()
    );
    let checked = format!("{base}?tls_ca={}&{ours}", pki.ca.display());
    cycles_take_the_direct_connection(&server, &checked, "direct-tls").await;
    let insecure = format!("{base}?{ours}#insecure");
    cycles_take_the_direct_connection(&server, &insecure, "direct-tls-insecure").await;
    // With a password and a database: AUTH and SELECT on the direct connection's open.
    server.cli(&["ACL", "SETUSER", "locker", "on", ">pw", "~*", "&*", "+@all"]);
    let authed = format!(
        "rediss://locker:pw@127.0.0.1:{}/3?tls_ca={}&{ours}",
        server.tls_port(),
        pki.ca.display()
    );
    cycles_take_the_direct_connection(&server, &authed, "direct-tls-db").await;
}

/// A server certificate from a CA we do not trust is refused as before: the engine does not
/// open (`Auth`), whichever connection finds it first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_certificate_from_another_ca_is_refused() {
    let pki = Pki::generate();
    let Some(server) = RedisServer::start_tls(&pki, true, &[]) else {
        return;
    };
    let url = format!(
        "rediss://127.0.0.1:{}/?tls_ca={}&tls_cert={}&tls_key={}",
        server.tls_port(),
        pki.other_ca.display(),
        pki.client.cert.display(),
        pki.client.key.display()
    );
    let e = RedisBackend::connect(&url)
        .await
        .map(|_| ())
        .expect_err("another CA's certificate");
    assert_eq!(e.kind(), ErrorKind::Auth, "{e}");
    assert!(
        e.to_string()
            .contains("the server's certificate was refused"),
        "{e}"
    );
}
