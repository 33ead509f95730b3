//! A real PostgreSQL server for tests: `initdb` and `postgres` run as the `postgres` user when
//! the tests run as root (PostgreSQL refuses root), on a free loopback port, with its data in a
//! temporary directory (on tmpfs when there is one).

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::process::{Daemon, free_port, require_binary, scratch_dir, tail};

/// One PostgreSQL server with trust authentication for `postgres` on 127.0.0.1 and a
/// password-checked role `locker` (password `locker-pw`). Killed when dropped. Its process is
/// the postmaster: `pause` freezes it alone (sessions already open keep running in their own
/// backends), and backends forked after `pin_to_cpu` inherit the CPU.
#[derive(Debug)]
pub struct Postgres {
    child: Daemon,
    port: u16,
    bin: PathBuf,
    dir: tempfile::TempDir,
}

/// The role that logs in with a password (scram-sha-256), for credential tests.
pub const PG_PASSWORD_USER: (&str, &str) = ("locker", "locker-pw");

/// The role that needs a client certificate (CN `distlock`, from the test CA) as well as its
/// password, on a server from [`Postgres::start_tls`].
pub const PG_CERT_USER: (&str, &str) = ("distlock", "distlock-pw");

/// The directory of PostgreSQL's server programs: `pg_config --bindir`, else the newest
/// `/usr/lib/postgresql/<version>/bin`.
fn bin_dir() -> Option<PathBuf> {
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output()
        && out.status.success()
    {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if dir.join("postgres").is_file() {
            return Some(dir);
        }
    }
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|d| d.join("postgres").is_file())
        .collect();
    versions.sort();
    versions.pop()
}

/// The `postgres` account (uid, gid) when we run as root, who must not run the server.
fn server_account() -> Option<(u32, u32)> {
    if !nix::unistd::geteuid().is_root() {
        return None;
    }
    let user = nix::unistd::User::from_name("postgres")
        .ok()
        .flatten()
        .expect("running as root, PostgreSQL needs the 'postgres' account (package postgresql)");
    Some((user.uid.as_raw(), user.gid.as_raw()))
}

fn as_server(cmd: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    if let Some((uid, gid)) = server_account() {
        cmd.uid(uid).gid(gid);
    }
    cmd
}

impl Postgres {
    /// Starts a server and waits until it accepts queries. `None` (after printing `SKIP`) when
    /// PostgreSQL is missing outside CI.
    pub fn start() -> Option<Self> {
        Self::start_with(None)
    }

    /// Starts a server that takes TLS connections only (`ssl=on`, `hostssl` lines alone in
    /// `pg_hba.conf`), with `pki`'s server certificate. `locker` logs in with its password
    /// (scram-sha-256); [`PG_CERT_USER`] needs its password and a client certificate from
    /// `pki`'s CA whose CN is its name (`clientcert=verify-full`).
    pub fn start_tls(pki: &crate::Pki) -> Option<Self> {
        Self::start_with(Some(pki))
    }

    fn start_with(pki: Option<&crate::Pki>) -> Option<Self> {
        let found = bin_dir();
        if found.is_none() {
            // Reports (and under CI fails) as any missing server does.
            require_binary("postgres", "the PostgreSQL engine (package postgresql)");
            return None;
        }
        let bin = found.expect("checked");
        let mut last = String::new();
        for _ in 0..3 {
            let dir = scratch_dir("distlock-pg-");
            if let Some((uid, gid)) = server_account() {
                nix::unistd::chown(
                    dir.path(),
                    Some(nix::unistd::Uid::from_raw(uid)),
                    Some(nix::unistd::Gid::from_raw(gid)),
                )
                .expect("chown the data dir to postgres");
            }
            let data = dir.path().join("data");
            let out = as_server(&mut Command::new(bin.join("initdb")))
                .arg("-D")
                .arg(&data)
                .args(["-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"])
                .args(["--locale", "C"])
                .stdin(Stdio::null())
                .output()
                .expect("run initdb");
            assert!(
                out.status.success(),
                "initdb failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            // Passwords for `locker`, trust for the superuser (the tests' own queries).
            let hba = if let Some(pki) = pki {
                let files = pki.install(&pki.server, &data);
                std::fs::copy(&pki.ca, data.join("tls-ca.pem")).expect("copy the CA");
                if let Some((uid, gid)) = server_account() {
                    for f in [&files.cert, &files.key, &data.join("tls-ca.pem")] {
                        nix::unistd::chown(
                            f,
                            Some(nix::unistd::Uid::from_raw(uid)),
                            Some(nix::unistd::Gid::from_raw(gid)),
                        )
                        .expect("chown the TLS files to postgres");
                    }
                }
                format!(
                    "local all all trust\n\
                     hostssl all postgres 127.0.0.1/32 trust\n\
                     hostssl all {} 127.0.0.1/32 scram-sha-256 clientcert=verify-full\n\
                     hostssl all all 127.0.0.1/32 scram-sha-256\n",
                    PG_CERT_USER.0
                )
            } else {
                "local all all trust\n\
                 host all postgres 127.0.0.1/32 trust\n\
                 host all all 127.0.0.1/32 scram-sha-256\n"
                    .to_owned()
            };
            std::fs::write(data.join("pg_hba.conf"), hba).expect("pg_hba.conf");
            let mut pg = Postgres {
                child: Daemon::default(),
                port: free_port(),
                bin: bin.clone(),
                dir,
            };
            pg.spawn();
            match pg.wait_ready(Duration::from_secs(30)) {
                Ok(()) => {
                    let (user, pw) = PG_PASSWORD_USER;
                    pg.psql(&format!("CREATE ROLE {user} LOGIN PASSWORD '{pw}'"));
                    let (user, pw) = PG_CERT_USER;
                    pg.psql(&format!("CREATE ROLE {user} LOGIN PASSWORD '{pw}'"));
                    if pki.is_some() {
                        // The TLS tests lock as these roles from a fresh server: they create
                        // the engine's sequence and waiters' table.
                        let other = PG_PASSWORD_USER.0;
                        pg.psql(&format!("GRANT CREATE ON SCHEMA public TO {user}, {other}"));
                        // Whichever of the two creates them, the other may use them.
                        for (a, b) in [(user, other), (other, user)] {
                            for objects in ["SEQUENCES", "TABLES"] {
                                pg.psql(&format!(
                                    "ALTER DEFAULT PRIVILEGES FOR ROLE {a} IN SCHEMA public \
                                     GRANT ALL ON {objects} TO {b}"
                                ));
                            }
                        }
                    }
                    return Some(pg);
                }
                Err(e) => last = e,
            }
        }
        panic!("PostgreSQL did not start after 3 tries:\n{last}");
    }

    fn spawn(&mut self) {
        let log = std::fs::File::create(self.dir.path().join("pg.log")).expect("log file");
        if let Some((uid, gid)) = server_account() {
            let _ = nix::unistd::chown(
                &self.dir.path().join("pg.log"),
                Some(nix::unistd::Uid::from_raw(uid)),
                Some(nix::unistd::Gid::from_raw(gid)),
            );
        }
        let data = self.dir.path().join("data");
        let mut tls = Vec::new();
        if data.join("tls-cert.pem").is_file() {
            for (name, file) in [
                ("ssl_cert_file", "tls-cert.pem"),
                ("ssl_key_file", "tls-key.pem"),
                ("ssl_ca_file", "tls-ca.pem"),
            ] {
                tls.push("-c".to_owned());
                tls.push(format!("{name}={}", data.join(file).display()));
            }
            tls.extend(["-c".to_owned(), "ssl=on".to_owned()]);
        }
        // Durability off: the tests check locking, not the disk, and fsyncs would be most of
        // every write's time.
        let child = as_server(&mut Command::new(self.bin.join("postgres")))
            .args(&tls)
            .arg("-D")
            .arg(self.dir.path().join("data"))
            .args(["-p", &self.port.to_string()])
            .arg("-k")
            .arg(self.dir.path())
            .args(["-c", "listen_addresses=127.0.0.1"])
            .args(["-c", "fsync=off", "-c", "synchronous_commit=off"])
            // max_connections stays at its default (100): the engine holds many locks per
            // session, and the scale figures are for a server as it comes.
            .args(["-c", "full_page_writes=off"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("run postgres");
        self.child = Daemon::new(child);
    }

    fn wait_ready(&self, limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        loop {
            if self.try_psql("SELECT 1").is_ok_and(|o| o.status.success()) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "postgres on port {} never answered; log tail:\n{}",
                    self.port,
                    tail(&self.dir.path().join("pg.log"), 30)
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn try_psql(&self, sql: &str) -> std::io::Result<Output> {
        Command::new(self.bin.join("psql"))
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-U", "postgres", "-d", "postgres", "-X", "-A", "-t", "-q"])
            .args(["-v", "ON_ERROR_STOP=1", "-c", sql])
            .stdin(Stdio::null())
            .output()
    }

    /// Runs `sql` as the superuser through `psql` and returns its unaligned, trimmed output.
    ///
    /// # Panics
    /// When the statement fails.
    pub fn psql(&self, sql: &str) -> String {
        crate::process::checked_stdout(&format!("psql {sql:?}"), self.try_psql(sql))
    }

    /// `postgres://postgres@127.0.0.1:<port>/postgres` followed by `rest` (parameters).
    pub fn url(&self, rest: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres{rest}", self.port)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops it at once: an immediate shutdown (SIGQUIT), which ends every session, as a crash
    /// would. (A SIGKILL of the postmaster alone would leave its sessions running.)
    pub fn kill(&mut self) {
        self.child
            .stop_with(nix::sys::signal::Signal::SIGQUIT, Duration::from_secs(5));
    }

    /// [`kill`](Self::kill), then starts it again on the same port and data (crash recovery
    /// runs), and waits until it answers.
    ///
    /// # Panics
    /// When it does not answer within 30 s.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
        if let Err(e) = self.wait_ready(Duration::from_secs(30)) {
            panic!("{e}");
        }
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.kill();
    }
}

crate::process::process_controls!(Postgres, child);
