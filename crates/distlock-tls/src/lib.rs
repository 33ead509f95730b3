//! The TLS of every distlock engine, chosen once: rustls with the `ring` provider, so that
//! building needs nothing beyond the Rust toolchain (no OpenSSL, no C library to find).
//!
//! An engine takes a [`TlsSettings`] from its URL (each engine with the parameter names its own
//! users know: libpq's `sslmode`, MySQL's `ssl-mode`, `tls_ca` elsewhere) and gets a rustls
//! [`rustls::ClientConfig`] or a [`TlsConnector`] from it. The three levels of
//! [`Verify`] are libpq's and MySQL's:
//!
//! | [`Verify`] | libpq `sslmode` | MySQL `ssl-mode` | checks |
//! |---|---|---|---|
//! | `Full` | `verify-full` | `VERIFY_IDENTITY` | a chain to a trusted CA, and the host name |
//! | `Chain` | `verify-ca` | `VERIFY_CA` | a chain to a trusted CA, any name |
//! | `EncryptOnly` | `require`, `prefer` | `REQUIRED`, `PREFERRED` | nothing: encryption only |
//!
//! `EncryptOnly` still checks that the server holds the key of the certificate it shows; it
//! does not check whose certificate it is, so an attacker on the path can stand in the middle.
//!
//! [`classify`] turns a refused certificate, found anywhere in a client library's error chain,
//! into a typed [`LockError`]: [`ErrorKind::Auth`] when a certificate was refused (the
//! server's by us, or ours by the server), [`ErrorKind::Config`] for a file that cannot be
//! used.

#![cfg_attr(docsrs, feature(doc_cfg))]

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use distlock_core::{ErrorKind, LockError};
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    AlertDescription, CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore,
    SignatureScheme,
};

/// rustls itself, for engines that hand a configuration to their client library.
pub use rustls;
pub use tokio_rustls::TlsConnector;
pub use tokio_rustls::client::TlsStream;

/// How much of the server's certificate is checked (see the table in the crate docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Verify {
    /// A chain to a trusted CA, and the certificate names the host we connected to.
    #[default]
    Full,
    /// A chain to a trusted CA; the name is not checked.
    Chain,
    /// No check of the certificate: encryption against a passive listener only.
    EncryptOnly,
}

impl Verify {
    /// `full`, `ca` or `none`: the words of the `tls_verify` URL parameter.
    ///
    /// # Errors
    /// `Config` for any other word.
    pub fn parse(word: &str) -> Result<Self, LockError> {
        match word {
            "full" => Ok(Verify::Full),
            "ca" => Ok(Verify::Chain),
            "none" => Ok(Verify::EncryptOnly),
            other => Err(LockError::new(
                ErrorKind::Config,
                format!("tls_verify={other:?}: expected full, ca or none"),
            )),
        }
    }
}

/// What a TLS connection trusts and shows: built from URL parameters by each engine.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct TlsSettings {
    /// How much of the server's certificate is checked.
    pub verify: Verify,
    /// The PEM file of the CA certificates to trust; the system's roots when `None`.
    pub ca: Option<PathBuf>,
    /// The PEM file of our certificate (and its chain), for servers that ask for one.
    pub cert: Option<PathBuf>,
    /// The PEM file of our certificate's private key.
    pub key: Option<PathBuf>,
    /// The name to expect in the server's certificate (and to send as SNI), when it is not the
    /// host of the URL.
    pub server_name: Option<String>,
    /// ALPN protocols to offer (`h2` for gRPC).
    pub alpn: Vec<Vec<u8>>,
}

impl fmt::Debug for TlsSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Paths only: never the contents of a key.
        f.debug_struct("TlsSettings")
            .field("verify", &self.verify)
            .field("ca", &self.ca)
            .field("cert", &self.cert)
            .field("key", &self.key)
            .field("server_name", &self.server_name)
            .finish()
    }
}

/// The names of the URL parameters and environment variables an engine reads its TLS files
/// from, for [`TlsSettings::take_files`].
#[derive(Debug, Clone, Copy)]
pub struct ParamNames {
    /// CA file parameter and its environment variable.
    pub ca: (&'static str, &'static str),
    /// Client certificate parameter and environment variable.
    pub cert: (&'static str, &'static str),
    /// Client key parameter and environment variable.
    pub key: (&'static str, &'static str),
}

/// `tls_ca`, `tls_cert`, `tls_key`, or `DISTLOCK_TLS_CA`, `DISTLOCK_TLS_CERT`,
/// `DISTLOCK_TLS_KEY`: the names of the engines that have no convention of their own (Redis,
/// etcd, ZooKeeper, memcached).
pub const DISTLOCK_PARAMS: ParamNames = ParamNames {
    ca: ("tls_ca", "DISTLOCK_TLS_CA"),
    cert: ("tls_cert", "DISTLOCK_TLS_CERT"),
    key: ("tls_key", "DISTLOCK_TLS_KEY"),
};

impl TlsSettings {
    /// Takes the CA, certificate and key paths from a URL's parameters (through `take`, which
    /// removes a parameter and returns its decoded value), else from the environment.
    ///
    /// # Errors
    /// `Config` when only one of the certificate and its key is given.
    pub fn take_files(
        &mut self,
        names: ParamNames,
        mut take: impl FnMut(&str) -> Option<String>,
    ) -> Result<(), LockError> {
        let mut one = |(param, env): (&str, &str)| {
            take(param)
                .or_else(|| std::env::var(env).ok())
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        self.ca = one(names.ca).or(self.ca.take());
        self.cert = one(names.cert).or(self.cert.take());
        self.key = one(names.key).or(self.key.take());
        if self.cert.is_some() != self.key.is_some() {
            return Err(LockError::new(
                ErrorKind::Config,
                format!(
                    "a client certificate needs both {} and {} (or {} and {})",
                    names.cert.0, names.key.0, names.cert.1, names.key.1
                ),
            ));
        }
        Ok(())
    }

    /// The settings of a URL that follows distlock's own names (Redis, etcd, memcached):
    /// `tls_ca`, `tls_cert`, `tls_key` (else `DISTLOCK_TLS_*`), `tls_verify` (`full`, `ca`,
    /// `none`) and `tls_server_name`, each taken through `take`.
    ///
    /// # Errors
    /// `Config` for a bad `tls_verify`, or half a client identity.
    pub fn from_params(mut take: impl FnMut(&str) -> Option<String>) -> Result<Self, LockError> {
        let mut settings = TlsSettings::default();
        settings.take_files(DISTLOCK_PARAMS, &mut take)?;
        if let Some(v) = take("tls_verify") {
            settings.verify = Verify::parse(&v)?;
        }
        settings.server_name = take("tls_server_name");
        Ok(settings)
    }

    /// The rustls configuration: the trusted roots, our certificate if any, and the verifier
    /// of [`verify`](Self::verify).
    ///
    /// # Errors
    /// `Config` when a file cannot be read or holds no usable certificate or key, or when no
    /// CA is given and the system has no root certificates.
    pub fn client_config(&self) -> Result<Arc<ClientConfig>, LockError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| config_error("choosing the TLS versions", e))?;
        let verifier: Arc<dyn ServerCertVerifier> = match self.verify {
            Verify::EncryptOnly => Arc::new(Relaxed {
                chain: None,
                provider: provider.clone(),
            }),
            Verify::Full | Verify::Chain => {
                let roots = Arc::new(self.roots()?);
                let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
                    .build()
                    .map_err(|e| config_error("building the certificate verifier", e))?;
                if self.verify == Verify::Chain {
                    Arc::new(Relaxed {
                        chain: Some(webpki),
                        provider: provider.clone(),
                    })
                } else {
                    webpki
                }
            }
        };
        let builder = builder
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let mut config = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => {
                let chain = read_certs(cert)?;
                let key = read_key(key)?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| config_error("using the client certificate and key", e))?
            }
            _ => builder.with_no_client_auth(),
        };
        config.alpn_protocols.clone_from(&self.alpn);
        Ok(Arc::new(config))
    }

    /// A connector for tokio streams with [`client_config`](Self::client_config).
    ///
    /// # Errors
    /// As [`client_config`](Self::client_config).
    pub fn connector(&self) -> Result<TlsConnector, LockError> {
        Ok(TlsConnector::from(self.client_config()?))
    }

    /// The name to expect in the server's certificate for `host`: the
    /// [`server_name`](Self::server_name) override, else the host (a name or an address).
    ///
    /// # Errors
    /// `Config` for a host that is neither a DNS name nor an IP address.
    pub fn server_name_for(&self, host: &str) -> Result<ServerName<'static>, LockError> {
        let name = self.server_name.as_deref().unwrap_or(host);
        let name = name.trim_start_matches('[').trim_end_matches(']');
        ServerName::try_from(name.to_owned()).map_err(|_| {
            LockError::new(
                ErrorKind::Config,
                format!("{name:?} cannot be checked against a certificate (not a DNS name or an IP address)"),
            )
        })
    }

    /// Connects a TCP stream with TLS to `host` (the name checked, see
    /// [`server_name_for`](Self::server_name_for)).
    ///
    /// # Errors
    /// Through [`classify`]: `Auth` for a refused certificate, else `Connection`.
    pub async fn connect<IO>(
        &self,
        connector: &TlsConnector,
        host: &str,
        stream: IO,
    ) -> Result<TlsStream<IO>, LockError>
    where
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        let name = self.server_name_for(host)?;
        connector
            .connect(name, stream)
            .await
            .map_err(|e| error(&format!("TLS handshake with {host}"), &e))
    }

    fn roots(&self) -> Result<RootCertStore, LockError> {
        let mut roots = RootCertStore::empty();
        match &self.ca {
            Some(path) => {
                for cert in read_certs(path)? {
                    roots.add(cert).map_err(|e| {
                        config_error(&format!("using the CA certificate {}", path.display()), e)
                    })?;
                }
            }
            None => {
                let found = rustls_native_certs::load_native_certs();
                let (added, _) = roots.add_parsable_certificates(found.certs);
                if added == 0 {
                    return Err(LockError::new(
                        ErrorKind::Config,
                        "no CA to check the server's certificate against: the system has no \
                         root certificates; name a CA file (tls_ca, sslrootcert, ssl-ca)",
                    ));
                }
            }
        }
        Ok(roots)
    }
}

fn config_error(doing: &str, e: impl std::error::Error + Send + Sync + 'static) -> LockError {
    LockError::caused_by(ErrorKind::Config, doing, e)
}

/// Every certificate of a PEM file.
///
/// # Errors
/// `Config` when the file cannot be read or holds no certificate.
pub fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, LockError> {
    let doing = format!("reading the certificates in {}", path.display());
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|e| config_error(&doing, e))?
        .collect::<Result<_, _>>()
        .map_err(|e| config_error(&doing, e))?;
    if certs.is_empty() {
        return Err(LockError::new(
            ErrorKind::Config,
            format!("{doing}: the file holds no PEM certificate"),
        ));
    }
    Ok(certs)
}

/// The private key of a PEM file (PKCS#8, PKCS#1 or SEC1).
///
/// # Errors
/// `Config` when the file cannot be read or holds no key. The message names the file, never
/// its contents.
pub fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, LockError> {
    PrivateKeyDer::from_pem_file(path)
        .map_err(|e| config_error(&format!("reading the private key in {}", path.display()), e))
}

/// Makes `ring` the process's default rustls provider, unless a default is installed already.
///
/// Engines whose client library builds its own rustls configuration with
/// `ClientConfig::builder()` (redis-rs, mysql_async, zookeeper-client) call it before their
/// first TLS connection. With ring alone in the build, rustls would make the same choice by
/// itself; the ZooKeeper client's TLS also compiles rustls's other provider (aws-lc-rs), and
/// with two providers and no default, `ClientConfig::builder()` panics. An application that
/// installs its own default first keeps it.
pub fn install_default_provider() {
    if CryptoProvider::get_default().is_none() {
        // Another thread may install one between the check and here: either way, one is set.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// The system's root certificates as PEM text, for a client library that takes its CA only as
/// PEM (the ZooKeeper client).
///
/// # Errors
/// `Config` when the system has no root certificates.
pub fn system_roots_pem() -> Result<String, LockError> {
    let found = rustls_native_certs::load_native_certs();
    if found.certs.is_empty() {
        return Err(LockError::new(
            ErrorKind::Config,
            "no CA to check the server's certificate against: the system has no root \
             certificates; name a CA file (tls_ca)",
        ));
    }
    let mut pem = String::new();
    for cert in &found.certs {
        pem.push_str("-----BEGIN CERTIFICATE-----\n");
        let text = base64(cert.as_ref());
        for line in text.as_bytes().chunks(64) {
            pem.push_str(std::str::from_utf8(line).unwrap_or_default());
            pem.push('\n');
        }
        pem.push_str("-----END CERTIFICATE-----\n");
    }
    Ok(pem)
}

/// Standard base64 with padding (RFC 4648 section 4), for PEM.
fn base64(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i)) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The two checks weaker than rustls's own: the chain without the name (libpq `verify-ca`),
/// or nothing (`require`). Either way the server must sign the handshake with the key of the
/// certificate it shows.
#[derive(Debug)]
struct Relaxed {
    /// The chain's verifier (`verify-ca`), or none (`require`).
    chain: Option<Arc<WebPkiServerVerifier>>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Relaxed {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// A TLS failure found in an error chain, as a kind and a sentence for users: `Auth` when a
/// certificate was refused (the server's, by us: an unknown CA, expired, another name; or
/// ours, by the server), `Connection` for other TLS failures. `None` when the chain holds no
/// rustls error.
pub fn classify(e: &(dyn std::error::Error + 'static)) -> Option<(ErrorKind, String)> {
    let tls = find_rustls(e)?;
    Some(match tls {
        rustls::Error::InvalidCertificate(c) => (
            ErrorKind::Auth,
            format!(
                "the server's certificate was refused ({c}): check the CA file and the host \
                 name, or the verification mode"
            ),
        ),
        rustls::Error::AlertReceived(
            a @ (AlertDescription::BadCertificate
            | AlertDescription::CertificateRequired
            | AlertDescription::UnknownCA
            | AlertDescription::CertificateUnknown
            | AlertDescription::CertificateExpired
            | AlertDescription::CertificateRevoked
            | AlertDescription::UnsupportedCertificate
            | AlertDescription::AccessDenied),
        ) => (
            ErrorKind::Auth,
            format!(
                "the server refused our client certificate (TLS alert {a:?}): give one it \
                 trusts (a certificate and its key)"
            ),
        ),
        other => (ErrorKind::Connection, format!("TLS failed: {other}")),
    })
}

/// [`classify`] for a client library that kept only the words of the TLS failure (redis-rs
/// clones its connection errors as text): rustls's own phrases, `invalid peer certificate: …`
/// and `received fatal alert: …`, found in `text`.
pub fn classify_text(text: &str) -> Option<(ErrorKind, String)> {
    if let Some(i) = text.find("invalid peer certificate: ") {
        let why = &text[i + "invalid peer certificate: ".len()..];
        return Some((
            ErrorKind::Auth,
            format!(
                "the server's certificate was refused ({why}): check the CA file and the host \
                 name, or the verification mode"
            ),
        ));
    }
    let i = text.find("received fatal alert: ")?;
    let alert = text[i + "received fatal alert: ".len()..]
        .split(|c: char| !c.is_ascii_alphanumeric())
        .next()
        .unwrap_or_default();
    const REFUSED: [&str; 8] = [
        "BadCertificate",
        "CertificateRequired",
        "UnknownCA",
        "CertificateUnknown",
        "CertificateExpired",
        "CertificateRevoked",
        "UnsupportedCertificate",
        "AccessDenied",
    ];
    REFUSED.contains(&alert).then(|| {
        (
            ErrorKind::Auth,
            format!(
                "the server refused our client certificate (TLS alert {alert}): give one it \
                 trusts (a certificate and its key)"
            ),
        )
    })
}

fn find_rustls<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut cur: Option<&'a (dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(t) = err.downcast_ref::<rustls::Error>() {
            return Some(t);
        }
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && let Some(inner) = io.get_ref()
            && let Some(t) = inner.downcast_ref::<rustls::Error>()
        {
            return Some(t);
        }
        cur = err.source();
    }
    None
}

/// `doing: …` as a typed error: [`classify`]'s kind and words when the chain holds a TLS
/// failure, else `Connection` with `e` as the cause.
pub fn error(doing: &str, e: &(dyn std::error::Error + 'static)) -> LockError {
    match classify(e) {
        Some((kind, words)) => LockError::new(kind, format!("{doing}: {words}")),
        None => LockError::new(ErrorKind::Connection, format!("{doing}: {e}")),
    }
}

#[cfg(test)]
mod tests;
