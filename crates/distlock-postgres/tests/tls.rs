//! TLS and authentication against a real PostgreSQL server that takes TLS connections only
//! (`hostssl` lines alone), with certificates made at run time.

use distlock_core::{ErrorKind, LockError};
use distlock_postgres::PgBackend;
use distlock_testkit::tls_cases::refused;
use distlock_testkit::{PG_CERT_USER, PG_PASSWORD_USER, Pki, Postgres};

async fn lock_once(url: &str) -> Result<(), LockError> {
    distlock_testkit::tls_cases::lock_once(PgBackend::connect(url).await).await
}

fn url(pg: &Postgres, (user, password): (&str, &str), params: &str) -> String {
    format!(
        "postgres://{user}:{password}@127.0.0.1:{}/postgres?{params}",
        pg.port()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_only_server_takes_good_clients_and_refuses_the_rest() {
    let pki = Pki::generate();
    let Some(pg) = Postgres::start_tls(&pki) else {
        return;
    };
    let ca = pki.ca.display().to_string();
    let (cert, key) = (pki.client.cert.display(), pki.client.key.display());
    let user = PG_PASSWORD_USER;

    // Good clients: every mode that makes TLS, with SCRAM over it.
    for params in [
        format!("sslmode=verify-full&sslrootcert={ca}"),
        format!("sslmode=verify-ca&sslrootcert={ca}"),
        "sslmode=require".to_owned(),
        "sslmode=prefer".to_owned(),
        String::new(),
    ] {
        lock_once(&url(&pg, user, &params))
            .await
            .unwrap_or_else(|e| panic!("{params}: {e}"));
    }
    // The client certificate as well as the password, where pg_hba.conf wants both.
    lock_once(&url(
        &pg,
        PG_CERT_USER,
        &format!("sslmode=verify-full&sslrootcert={ca}&sslcert={cert}&sslkey={key}"),
    ))
    .await
    .expect("a client certificate from the CA");

    // The server's certificate is not from the CA we trust: refused by us.
    let other = pki.other_ca.display();
    refused(
        lock_once(&url(
            &pg,
            user,
            &format!("sslmode=verify-full&sslrootcert={other}"),
        ))
        .await,
        ErrorKind::Auth,
        "the server's certificate was refused",
        "another CA",
    );
    // Without TLS the server has no pg_hba.conf line for us.
    refused(
        lock_once(&url(&pg, user, "sslmode=disable")).await,
        ErrorKind::Auth,
        "no encryption",
        "sslmode=disable",
    );
    refused(
        lock_once(&url(&pg, (user.0, "wrong"), "sslmode=require")).await,
        ErrorKind::Auth,
        "password authentication failed",
        "a wrong password",
    );
    // pg_hba.conf asks this role for a certificate.
    refused(
        lock_once(&url(&pg, PG_CERT_USER, "sslmode=require")).await,
        ErrorKind::Auth,
        "certificate",
        "no client certificate",
    );
    let (scert, skey) = (pki.stranger.cert.display(), pki.stranger.key.display());
    refused(
        lock_once(&url(
            &pg,
            PG_CERT_USER,
            &format!("sslmode=require&sslcert={scert}&sslkey={skey}"),
        ))
        .await,
        ErrorKind::Auth,
        "refused our client certificate",
        "a client certificate from another CA",
    );
    // Files that cannot be used are configuration errors, before any connection.
    refused(
        lock_once(&url(
            &pg,
            user,
            "sslmode=verify-full&sslrootcert=/nonexistent/ca.pem",
        ))
        .await,
        ErrorKind::Config,
        "/nonexistent/ca.pem",
        "a missing CA file",
    );
    refused(
        lock_once(&url(&pg, user, &format!("sslmode=require&sslcert={cert}"))).await,
        ErrorKind::Config,
        "sslkey",
        "a certificate without its key",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefer_falls_back_to_clear_text_and_require_does_not() {
    let Some(pg) = Postgres::start() else {
        return;
    };
    let user = PG_PASSWORD_USER;
    pg.psql(&format!("GRANT CREATE ON SCHEMA public TO {}", user.0));
    lock_once(&url(&pg, user, "sslmode=prefer"))
        .await
        .expect("prefer against a server without TLS");
    lock_once(&url(&pg, user, ""))
        .await
        .expect("the default (prefer) against a server without TLS");
    for mode in ["require", "verify-full&sslrootcert=system"] {
        refused(
            lock_once(&url(&pg, user, &format!("sslmode={mode}"))).await,
            ErrorKind::Config,
            "does not offer TLS",
            mode,
        );
    }
}
