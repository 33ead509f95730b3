//! The conformance suite over TLS (`sslmode=verify-full`, a client certificate and SCRAM) on
//! a PostgreSQL server that takes TLS connections only.

use distlock_postgres::PgBackend;
use distlock_testkit::conformance::{MakeClient, clients_on};
use distlock_testkit::{PG_CERT_USER, Pki, Postgres};

fn setup() -> Option<impl MakeClient> {
    let pki = Pki::generate();
    let pg = Postgres::start_tls(&pki)?;
    let (user, password) = PG_CERT_USER;
    let url = format!(
        "postgres://{user}:{password}@127.0.0.1:{}/postgres?sslmode=verify-full&sslrootcert={}\
         &sslcert={}&sslkey={}",
        pg.port(),
        pki.ca.display(),
        pki.client.cert.display(),
        pki.client.key.display()
    );
    Some(clients_on((pg, pki), url, |url| async move {
        PgBackend::connect(&url).await
    }))
}

distlock_testkit::conformance_tests!(setup());
