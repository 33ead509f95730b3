//! A real MariaDB server for tests (`mariadbd --user=root`), on a free loopback port, data in a
//! temporary directory on tmpfs when there is one.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::process::{Daemon, free_port, require_binary, scratch_dir, tail};

/// One MariaDB server: `root` without a password on 127.0.0.1, a database `distlock`, and a
/// password-checked user `locker` (password `locker-pw`) with rights on it. Killed when dropped.
#[derive(Debug)]
pub struct MariaDb {
    child: Daemon,
    port: u16,
    dir: tempfile::TempDir,
    /// The TLS options of a server from `start_tls`.
    tls: Vec<String>,
}

/// The user that needs a client certificate (from the test CA) as well as its password, on a
/// server from [`MariaDb::start_tls`].
pub const MARIADB_CERT_USER: (&str, &str) = ("distlock", "distlock-pw");

/// The user that logs in with a password, for credential tests.
pub const MARIADB_PASSWORD_USER: (&str, &str) = ("locker", "locker-pw");

impl MariaDb {
    /// Starts a server and waits until it answers. `None` (after printing `SKIP`) when MariaDB
    /// is missing outside CI.
    pub fn start() -> Option<Self> {
        Self::start_with(None)
    }

    /// Starts a server that takes TLS connections only over TCP (`require_secure_transport`),
    /// with `pki`'s server certificate; [`MARIADB_CERT_USER`] must show a client certificate
    /// from `pki`'s CA (`REQUIRE X509`).
    pub fn start_tls(pki: &crate::Pki) -> Option<Self> {
        Self::start_with(Some(pki))
    }

    fn start_with(pki: Option<&crate::Pki>) -> Option<Self> {
        if !require_binary(
            "mariadbd",
            "the MySQL/MariaDB engine (package mariadb-server)",
        ) || !require_binary("mariadb-install-db", "the MySQL/MariaDB engine")
        {
            return None;
        }
        let mut last = String::new();
        for _ in 0..3 {
            let dir = scratch_dir("distlock-maria-");
            // A temporary directory of its own: MariaDB clears stray temporary files in its
            // tmpdir at start, which breaks another server bootstrapping in a shared /tmp.
            let tmp = dir.path().join("tmp");
            std::fs::create_dir_all(&tmp).expect("tmp dir");
            let out = Command::new("mariadb-install-db")
                .arg("--no-defaults")
                .arg(format!("--datadir={}", dir.path().join("data").display()))
                .arg(format!("--tmpdir={}", tmp.display()))
                .args(["--auth-root-authentication-method=normal", "--skip-test-db"])
                .args(["--user=root", "--innodb-flush-method=fsync"])
                .stdin(Stdio::null())
                .output()
                .expect("run mariadb-install-db");
            if !out.status.success() {
                last = format!(
                    "mariadb-install-db failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                continue;
            }
            let tls = match pki {
                Some(pki) => {
                    let files = pki.install(&pki.server, dir.path());
                    vec![
                        format!("--ssl-cert={}", files.cert.display()),
                        format!("--ssl-key={}", files.key.display()),
                        format!("--ssl-ca={}", pki.ca.display()),
                        "--require-secure-transport=ON".to_owned(),
                    ]
                }
                None => Vec::new(),
            };
            let mut m = MariaDb {
                child: Daemon::default(),
                port: free_port(),
                dir,
                tls,
            };
            m.spawn();
            match m.wait_ready(Duration::from_secs(30)) {
                Ok(()) => {
                    let (user, pw) = MARIADB_PASSWORD_USER;
                    m.sql(&format!(
                        "CREATE DATABASE distlock; \
                         CREATE USER '{user}'@'127.0.0.1' IDENTIFIED BY '{pw}'; \
                         GRANT ALL ON distlock.* TO '{user}'@'127.0.0.1'"
                    ));
                    if pki.is_some() {
                        let (user, pw) = MARIADB_CERT_USER;
                        m.sql(&format!(
                            "CREATE USER '{user}'@'127.0.0.1' IDENTIFIED BY '{pw}' REQUIRE X509; \
                             GRANT ALL ON distlock.* TO '{user}'@'127.0.0.1'"
                        ));
                    }
                    return Some(m);
                }
                Err(e) => last = e,
            }
        }
        panic!("MariaDB did not start after 3 tries:\n{last}");
    }

    fn spawn(&mut self) {
        let d = self.dir.path();
        // Durability off (tmpfs, no binlog, lazy log flush): the tests check locking.
        let child = Command::new("mariadbd")
            .arg("--no-defaults")
            .arg("--user=root")
            .arg(format!("--datadir={}", d.join("data").display()))
            .arg(format!("--socket={}", d.join("sock").display()))
            .arg(format!("--pid-file={}", d.join("pid").display()))
            .arg(format!("--log-error={}", d.join("err.log").display()))
            .arg(format!("--tmpdir={}", d.join("tmp").display()))
            .arg(format!("--port={}", self.port))
            .args([
                "--bind-address=127.0.0.1",
                "--skip-name-resolve",
                "--skip-log-bin",
            ])
            .args([
                "--innodb-flush-method=fsync",
                "--innodb-flush-log-at-trx-commit=2",
            ])
            // max_connections stays at its default (151): the engine holds many locks per
            // session, and the scale figures are for a server as it comes.
            .args(["--innodb-buffer-pool-size=32M", "--innodb-log-file-size=8M"])
            .args(&self.tls)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("run mariadbd");
        self.child = Daemon::new(child);
    }

    fn wait_ready(&self, limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        loop {
            if self.try_sql("SELECT 1").is_ok_and(|o| o.status.success()) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "mariadbd on port {} never answered; log tail:\n{}",
                    self.port,
                    tail(&self.dir.path().join("err.log"), 30)
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn try_sql(&self, sql: &str) -> std::io::Result<Output> {
        Command::new("mariadb")
            .arg(format!(
                "--socket={}",
                self.dir.path().join("sock").display()
            ))
            .args(["-uroot", "--batch", "--skip-column-names", "-e", sql])
            .stdin(Stdio::null())
            .output()
    }

    /// Runs `sql` as root through the `mariadb` client and returns its tab-separated output.
    ///
    /// # Panics
    /// When the statement fails.
    pub fn sql(&self, sql: &str) -> String {
        crate::process::checked_stdout(&format!("mariadb -e {sql:?}"), self.try_sql(sql))
    }

    /// `mysql://root@127.0.0.1:<port>/distlock` followed by `rest` (parameters).
    pub fn url(&self, rest: &str) -> String {
        format!("mysql://root@127.0.0.1:{}/distlock{rest}", self.port)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// SIGKILL, then starts it again on the same port and data, and waits until it answers:
    /// what a crash and a restart leave behind (InnoDB's tables, sequences included; no
    /// connection, so no lock).
    ///
    /// # Panics
    /// When it does not answer within 30 s.
    pub fn restart(&mut self) {
        self.child.kill();
        self.spawn();
        if let Err(e) = self.wait_ready(Duration::from_secs(30)) {
            panic!("{e}");
        }
    }
}

crate::process::process_controls!(
    MariaDb,
    child,
    kill = "Kills it with SIGKILL (every session ends with it)."
);
