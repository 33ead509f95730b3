//! TLS and authentication against a real MariaDB server that requires secure transport, with
//! certificates made at run time.

use distlock_core::{ErrorKind, LockError};
use distlock_mysql::MysqlBackend;
use distlock_testkit::tls_cases::refused;
use distlock_testkit::{MARIADB_CERT_USER, MARIADB_PASSWORD_USER, MariaDb, Pki};

async fn lock_once(url: &str) -> Result<(), LockError> {
    distlock_testkit::tls_cases::lock_once(MysqlBackend::connect(url).await).await
}

fn url(db: &MariaDb, (user, password): (&str, &str), params: &str) -> String {
    format!(
        "mysql://{user}:{password}@127.0.0.1:{}/distlock?{params}",
        db.port()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_requiring_tls_takes_good_clients_and_refuses_the_rest() {
    let pki = Pki::generate();
    let Some(db) = MariaDb::start_tls(&pki) else {
        return;
    };
    let ca = pki.ca.display().to_string();
    let (cert, key) = (pki.client.cert.display(), pki.client.key.display());
    let user = MARIADB_PASSWORD_USER;
    for params in [
        format!("ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}"),
        format!("ssl-mode=verify_ca&ssl_ca={ca}"),
        format!("ssl-ca={ca}"),
        "ssl-mode=REQUIRED".to_owned(),
        "ssl-mode=PREFERRED".to_owned(),
        String::new(),
    ] {
        lock_once(&url(&db, user, &params))
            .await
            .unwrap_or_else(|e| panic!("{params}: {e}"));
    }
    lock_once(&url(
        &db,
        MARIADB_CERT_USER,
        &format!("ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}&ssl-cert={cert}&ssl-key={key}"),
    ))
    .await
    .expect("a client certificate from the CA");

    let other = pki.other_ca.display();
    refused(
        lock_once(&url(
            &db,
            user,
            &format!("ssl-mode=VERIFY_CA&ssl-ca={other}"),
        ))
        .await,
        ErrorKind::Auth,
        "the server's certificate was refused",
        "another CA",
    );
    refused(
        lock_once(&url(&db, user, "ssl-mode=DISABLED")).await,
        ErrorKind::Auth,
        // MariaDB answers 1045 (access denied) here; MySQL 3159 (insecure transport).
        "",
        "no TLS where the server requires it",
    );
    refused(
        lock_once(&url(&db, (user.0, "wrong"), "ssl-mode=REQUIRED")).await,
        ErrorKind::Auth,
        "Access denied",
        "a wrong password",
    );
    refused(
        lock_once(&url(&db, MARIADB_CERT_USER, "ssl-mode=REQUIRED")).await,
        ErrorKind::Auth,
        "Access denied",
        "no client certificate for a REQUIRE X509 account",
    );
    let (scert, skey) = (pki.stranger.cert.display(), pki.stranger.key.display());
    refused(
        lock_once(&url(
            &db,
            MARIADB_CERT_USER,
            &format!("ssl-mode=REQUIRED&ssl-cert={scert}&ssl-key={skey}"),
        ))
        .await,
        ErrorKind::Auth,
        "refused our client certificate",
        "a client certificate from another CA",
    );
    refused(
        lock_once(&url(&db, user, "ssl-ca=/nonexistent/ca.pem")).await,
        ErrorKind::Config,
        "/nonexistent/ca.pem",
        "a missing CA file",
    );
    refused(
        lock_once(&url(&db, user, "ssl-mode=SOMETIMES")).await,
        ErrorKind::Config,
        "VERIFY_IDENTITY",
        "an unknown mode",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preferred_falls_back_to_clear_text_and_required_does_not() {
    let Some(db) = MariaDb::start() else {
        return;
    };
    let user = MARIADB_PASSWORD_USER;
    lock_once(&url(&db, user, ""))
        .await
        .expect("the default (PREFERRED) against a server without TLS");
    for mode in ["REQUIRED", "VERIFY_IDENTITY"] {
        refused(
            lock_once(&url(&db, user, &format!("ssl-mode={mode}"))).await,
            ErrorKind::Config,
            "does not offer TLS",
            mode,
        );
    }
}
