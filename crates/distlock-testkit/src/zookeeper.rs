//! Real ZooKeeper servers for tests: one standalone, or an ensemble of three, run as
//! `java -cp … QuorumPeerMain zoo.cfg` on free loopback ports in temporary directories.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::process::{Daemon, free_port, loopback_url, require_binary, scratch_dir, tail};

const JAR: &str = "/usr/share/java/zookeeper.jar";

/// The classes of the server, with Netty's codec beside Debian's jar: the jar's manifest names
/// the Netty jars of the plain server, and TLS (Netty's `SslHandler`) also needs the codec, which
/// the same Debian package (`libnetty-java`) ships.
const CLASSPATH: &str =
    "/etc/zookeeper/conf:/usr/share/java/zookeeper.jar:/usr/share/java/netty-codec.jar";
const NETTY_CODEC: &str = "/usr/share/java/netty-codec.jar";

/// One ZooKeeper server. Killed when dropped.
#[derive(Debug)]
pub struct ZkServer {
    child: Daemon,
    port: u16,
    /// The TLS client port (`secureClientPort`), when the server has one.
    secure_port: Option<u16>,
    dir: tempfile::TempDir,
}

/// A standalone server or an ensemble.
#[derive(Debug)]
pub struct ZooKeeper {
    servers: Vec<ZkServer>,
}

impl ZooKeeper {
    /// Starts one standalone server. `None` (after printing `SKIP`) when ZooKeeper is missing
    /// outside CI.
    pub fn start() -> Option<Self> {
        Self::start_ensemble(1)
    }

    /// Starts `n` servers forming one ensemble (`n` = 1: standalone), and waits until each
    /// serves requests. Ticks of 100 ms: sessions may be as short as 400 ms.
    pub fn start_ensemble(n: usize) -> Option<Self> {
        Self::start_with(n, "")
    }

    /// Starts one server that refuses sessions without `digest` authentication
    /// (`enforce.auth.enabled`, ZooKeeper 3.7 and later).
    pub fn start_requiring_digest() -> Option<Self> {
        Self::start_with(
            1,
            "enforce.auth.enabled=true\nenforce.auth.schemes=digest\n",
        )
    }

    /// Starts one standalone server that also serves TLS on a second client port
    /// (`secureClientPort`, through Netty), with the kit's server certificate, and that demands
    /// a client certificate from the kit's CA (`ssl.clientAuth=need`). The plain port stays
    /// open for the kit's own health checks; [`tls_url`](Self::tls_url) names the TLS one.
    pub fn start_tls(pki: &crate::Pki) -> Option<Self> {
        if !require_binary(NETTY_CODEC, "ZooKeeper's TLS (package libnetty-java)") {
            return None;
        }
        let mut tls = TlsFiles {
            keystore: std::fs::read_to_string(&pki.server.key).expect("server key"),
            ca: pki.ca.clone(),
        };
        // A PEM key store is the private key (PKCS #8) followed by the certificate.
        tls.keystore
            .push_str(&std::fs::read_to_string(&pki.server.cert).expect("server cert"));
        Self::start_configured(1, "", Some(&tls))
    }

    fn start_with(n: usize, extra: &str) -> Option<Self> {
        Self::start_configured(n, extra, None)
    }

    fn start_configured(n: usize, extra: &str, tls: Option<&TlsFiles>) -> Option<Self> {
        if !require_binary("java", "the ZooKeeper engine")
            || !require_binary(JAR, "the ZooKeeper engine (package zookeeper)")
        {
            return None;
        }
        let mut last = String::new();
        for _ in 0..3 {
            let ports: Vec<(u16, u16, u16)> = (0..n)
                .map(|_| (free_port(), free_port(), free_port()))
                .collect();
            let mut servers = Vec::new();
            for (i, (client, _, _)) in ports.iter().enumerate() {
                let dir = scratch_dir("distlock-zk-");
                let data = dir.path().join("data");
                std::fs::create_dir_all(&data).expect("data dir");
                let mut cfg = format!(
                    "tickTime=100\ninitLimit=20\nsyncLimit=10\ndataDir={}\nclientPort={client}\n\
                     clientPortAddress=127.0.0.1\nadmin.enableServer=false\n\
                     4lw.commands.whitelist=*\nminSessionTimeout=400\nmaxSessionTimeout=60000\n",
                    data.display()
                );
                cfg.push_str(extra);
                let secure_port = tls.map(|tls| {
                    let port = free_port();
                    let keystore = dir.path().join("keystore.pem");
                    std::fs::write(&keystore, &tls.keystore).expect("key store");
                    cfg.push_str(&format!(
                        "secureClientPort={port}\nsecureClientPortAddress=127.0.0.1\n\
                         serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory\n\
                         ssl.keyStore.location={}\nssl.keyStore.type=PEM\n\
                         ssl.trustStore.location={}\nssl.trustStore.type=PEM\n\
                         ssl.clientAuth=need\n",
                        keystore.display(),
                        tls.ca.display()
                    ));
                    port
                });
                if n > 1 {
                    std::fs::write(data.join("myid"), format!("{}\n", i + 1)).expect("myid");
                    for (j, (_, peer, election)) in ports.iter().enumerate() {
                        cfg.push_str(&format!("server.{}=127.0.0.1:{peer}:{election}\n", j + 1));
                    }
                }
                std::fs::write(dir.path().join("zoo.cfg"), cfg).expect("zoo.cfg");
                let mut s = ZkServer {
                    child: Daemon::default(),
                    port: *client,
                    secure_port,
                    dir,
                };
                s.spawn();
                servers.push(s);
            }
            let zk = ZooKeeper { servers };
            match zk.wait_serving(Duration::from_secs(40)) {
                Ok(()) => return Some(zk),
                Err(e) => last = e,
            }
        }
        panic!("ZooKeeper did not start after 3 tries:\n{last}");
    }

    /// `zk://127.0.0.1:p1,…` followed by `rest` (a chroot, parameters).
    pub fn url(&self, rest: &str) -> String {
        loopback_url("zk", self.servers.iter().map(|s| s.port), rest)
    }

    /// `zks://127.0.0.1:secure_port,…` followed by `rest`, for a server started with
    /// [`start_tls`](Self::start_tls).
    ///
    /// # Panics
    /// When a server has no TLS port.
    pub fn tls_url(&self, rest: &str) -> String {
        let ports = self
            .servers
            .iter()
            .map(|s| s.secure_port.expect("a server started with start_tls"));
        loopback_url("zks", ports, rest)
    }

    /// The servers.
    pub fn servers(&self) -> &[ZkServer] {
        &self.servers
    }

    /// The servers, to kill or pause one.
    pub fn servers_mut(&mut self) -> &mut [ZkServer] {
        &mut self.servers
    }

    fn wait_serving(&self, limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        for s in &self.servers {
            while !s.four_letter("ruok").contains("imok")
                || s.four_letter("srvr").contains("not currently serving")
                || !s.four_letter("srvr").contains("Mode:")
            {
                if Instant::now() >= deadline {
                    return Err(format!(
                        "server on port {} never served; log tail:\n{}",
                        s.port,
                        tail(&s.dir.path().join("zk.log"), 30)
                    ));
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            // The TLS port is Netty's second listener: the plain port answering does not say
            // it is bound yet (a client's first connect over TLS once found nobody there).
            while let Some(port) = s.secure_port
                && std::net::TcpStream::connect(("127.0.0.1", port)).is_err()
            {
                if Instant::now() >= deadline {
                    return Err(format!("the TLS port {port} was never bound"));
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        Ok(())
    }
}

/// What a TLS server is started with.
struct TlsFiles {
    /// The key store's text: the server's key, then its certificate.
    keystore: String,
    ca: std::path::PathBuf,
}

impl ZkServer {
    fn spawn(&mut self) {
        let log = std::fs::File::create(self.dir.path().join("zk.log")).expect("log file");
        let child = Command::new("java")
            .arg("-Xmx256m")
            .arg("-Dzookeeper.jmx.log4j.disable=true")
            .args(["-cp", CLASSPATH])
            .arg("org.apache.zookeeper.server.quorum.QuorumPeerMain")
            .arg(self.dir.path().join("zoo.cfg"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("run java");
        self.child = Daemon::new(child);
    }

    /// The client port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Kills it (SIGKILL), starts it again on the same ports and data, and waits until it
    /// serves (`ruok`, then `srvr` names a mode).
    ///
    /// # Panics
    /// When it does not serve within 60 s.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !(self.four_letter("ruok").contains("imok")
            && self.four_letter("srvr").contains("Mode:"))
        {
            assert!(
                std::time::Instant::now() < deadline,
                "ZooKeeper on port {} did not come back",
                self.port
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Sends a four-letter command (`ruok`, `srvr`, `cons`…) and returns the answer (empty when
    /// the server does not answer).
    pub fn four_letter(&self, cmd: &str) -> String {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return String::new();
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        if s.write_all(cmd.as_bytes()).is_err() {
            return String::new();
        }
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    }

    /// Whether this server holds the connection of the session `id`.
    pub fn serves_session(&self, id: i64) -> bool {
        self.four_letter("cons")
            .contains(&format!("sid=0x{:x}", id as u64))
    }
}

crate::process::process_controls!(
    ZkServer,
    child,
    kill = "Kills it with SIGKILL and reaps it (its data stays)."
);
