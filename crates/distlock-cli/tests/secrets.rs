//! Passwords from a file or the environment, never from the command line, and never in a
//! message: against a real redis-server with `requirepass`.

use distlock_testkit::RedisServer;

mod common;
use common::distlock;

#[test]
fn the_password_comes_from_a_file_or_the_environment_and_is_never_shown() {
    let Some(server) = RedisServer::start_with(&["--requirepass", "s3cret-pw"]) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let url = format!("redis://127.0.0.1:{}", server.port());
    let file = tmp.path().join("password");

    // The right password from a file (its first line), then from the environment.
    std::fs::write(&file, "s3cret-pw\n").unwrap();
    let o = distlock(tmp.path())
        .args(["status", "--json", "--url", &url, "--password-file"])
        .arg(&file)
        .arg("k")
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let o = distlock(tmp.path())
        .env("DISTLOCK_PASSWORD", "s3cret-pw")
        .args(["run", "--url", &url, "k", "--", "true"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");

    // A wrong one: refused credentials (77), and the password appears nowhere.
    std::fs::write(&file, "wrong-horse-battery\n").unwrap();
    let o = distlock(tmp.path())
        .env("DISTLOCK_PASSWORD_FILE", &file)
        .args(["status", "--url", &url, "k"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(77), "{o:?}");
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(!all.contains("wrong-horse-battery"), "{all}");

    // No password at all: refused too.
    let o = distlock(tmp.path())
        .args(["status", "--url", &url, "k"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(77), "{o:?}");

    // A password file that cannot be read: a configuration error (78) naming the file.
    let o = distlock(tmp.path())
        .args([
            "status",
            "--url",
            &url,
            "--password-file",
            "/nonexistent/pw",
            "k",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(78), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("/nonexistent/pw"),
        "{o:?}"
    );
}
