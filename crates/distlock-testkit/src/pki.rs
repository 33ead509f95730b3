//! Certificates made at run time for the TLS tests: a CA, a server certificate for the
//! loopback address, a client certificate, and the wrong ones (another CA's, an expired one,
//! one for another name).

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, date_time_ymd,
};

/// A certificate and its key, as PEM files.
#[derive(Debug, Clone)]
pub struct CertFiles {
    /// The certificate.
    pub cert: PathBuf,
    /// Its private key (PKCS#8).
    pub key: PathBuf,
}

/// A test PKI in a temporary directory (deleted with it).
#[derive(Debug)]
pub struct Pki {
    dir: tempfile::TempDir,
    /// The CA every good certificate chains to.
    pub ca: PathBuf,
    /// Its key, for servers that sign (none here) and for tests that make more.
    pub ca_key: PathBuf,
    /// The server's certificate: `127.0.0.1`, `::1` and `localhost`.
    pub server: CertFiles,
    /// A client certificate (CN `distlock`) the servers trust.
    pub client: CertFiles,
    /// Another CA, which nobody trusts.
    pub other_ca: PathBuf,
    /// A client certificate signed by the other CA.
    pub stranger: CertFiles,
    /// A server certificate from the good CA that expired in 2020.
    pub expired: CertFiles,
    /// A server certificate from the good CA for `db.example.com` only.
    pub wrong_name: CertFiles,
}

struct Ca {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
    key_pem: String,
}

fn make_ca(name: &str) -> Ca {
    let key = KeyPair::generate().expect("CA key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, name);
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let cert = params.self_signed(&key).expect("self-signed CA");
    let key_pem = key.serialize_pem();
    Ca {
        pem: cert.pem(),
        key_pem,
        issuer: Issuer::new(params, key),
    }
}

fn leaf(ca: &Ca, cn: &str, names: &[&str], server: bool, expired: bool) -> (String, String) {
    let key = KeyPair::generate().expect("leaf key");
    let mut params =
        CertificateParams::new(names.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())
            .expect("leaf params");
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    params.distinguished_name = dn;
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![if server {
        ExtendedKeyUsagePurpose::ServerAuth
    } else {
        ExtendedKeyUsagePurpose::ClientAuth
    }];
    if expired {
        params.not_before = date_time_ymd(2019, 1, 1);
        params.not_after = date_time_ymd(2020, 1, 1);
    } else {
        params.not_before = date_time_ymd(2020, 1, 1);
        params.not_after = date_time_ymd(2090, 1, 1);
    }
    let cert = params.signed_by(&key, &ca.issuer).expect("sign leaf");
    (cert.pem(), key.serialize_pem())
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write a PEM file");
    path
}

fn pair(dir: &Path, name: &str, (cert, key): (String, String)) -> CertFiles {
    CertFiles {
        cert: write(dir, &format!("{name}.pem"), &cert),
        key: write(dir, &format!("{name}-key.pem"), &key),
    }
}

impl Pki {
    /// Makes every certificate (ECDSA P-256), in a new temporary directory readable by the
    /// server processes the kit starts under other users.
    pub fn generate() -> Pki {
        let dir = tempfile::Builder::new()
            .prefix("distlock-pki-")
            .tempdir()
            .expect("temp dir");
        crate::process::open_to_all(dir.path());
        let p = dir.path();
        let ca = make_ca("distlock test CA");
        let other = make_ca("nobody's CA");
        let loopback = ["127.0.0.1", "::1", "localhost"];
        let pki = Pki {
            ca: write(p, "ca.pem", &ca.pem),
            ca_key: write(p, "ca-key.pem", &ca.key_pem),
            server: pair(p, "server", leaf(&ca, "localhost", &loopback, true, false)),
            client: pair(p, "client", leaf(&ca, "distlock", &[], false, false)),
            other_ca: write(p, "other-ca.pem", &other.pem),
            stranger: pair(p, "stranger", leaf(&other, "distlock", &[], false, false)),
            expired: pair(p, "expired", leaf(&ca, "localhost", &loopback, true, true)),
            wrong_name: pair(
                p,
                "wrong-name",
                leaf(&ca, "db.example.com", &["db.example.com"], true, false),
            ),
            dir,
        };
        for entry in std::fs::read_dir(pki.dir.path()).expect("list the PKI") {
            crate::process::open_to_all(&entry.expect("entry").path());
        }
        pki
    }

    /// The directory of the files.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Copies a certificate and its key into `dir` (a server's data directory), the key
    /// readable by its owner only, as PostgreSQL and MariaDB demand; returns the copies.
    pub fn install(&self, files: &CertFiles, dir: &Path) -> CertFiles {
        let cert = dir.join("tls-cert.pem");
        let key = dir.join("tls-key.pem");
        std::fs::copy(&files.cert, &cert).expect("copy the certificate");
        std::fs::copy(&files.key, &key).expect("copy the key");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600))
            .expect("key permissions");
        CertFiles { cert, key }
    }
}
