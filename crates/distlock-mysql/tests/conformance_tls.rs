//! The conformance suite over TLS (`VERIFY_IDENTITY`, a client certificate and a password) on
//! a MariaDB server that requires secure transport.

use distlock_mysql::MysqlBackend;
use distlock_testkit::conformance::{MakeClient, clients_on};
use distlock_testkit::{MARIADB_CERT_USER, MariaDb, Pki};

fn setup() -> Option<impl MakeClient> {
    let pki = Pki::generate();
    let db = MariaDb::start_tls(&pki)?;
    let (user, password) = MARIADB_CERT_USER;
    let url = format!(
        "mysql://{user}:{password}@127.0.0.1:{}/distlock?ssl-mode=VERIFY_IDENTITY&ssl-ca={}\
         &ssl-cert={}&ssl-key={}",
        db.port(),
        pki.ca.display(),
        pki.client.cert.display(),
        pki.client.key.display()
    );
    Some(clients_on((db, pki), url, |url| async move {
        MysqlBackend::connect(&url).await
    }))
}

distlock_testkit::conformance_tests!(setup());
