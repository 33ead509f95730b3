//! The verification modes and the error kinds, against a rustls server in the same process,
//! with certificates made at run time.

use std::path::Path;
use std::sync::Arc;

use distlock_testkit::{CertFiles, Pki};
use rustls::server::WebPkiClientVerifier;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::*;

/// A TLS server for one connection at a time that answers `ok` after its handshake; with
/// `client_ca`, it demands a client certificate from that CA.
async fn serve(files: &CertFiles, client_ca: Option<&Path>) -> u16 {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap();
    let builder = match client_ca {
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for c in read_certs(ca).unwrap() {
                roots.add(c).unwrap();
            }
            builder.with_client_cert_verifier(
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                    .build()
                    .unwrap(),
            )
        }
        None => builder.with_no_client_auth(),
    };
    let config = builder
        .with_single_cert(
            read_certs(&files.cert).unwrap(),
            read_key(&files.key).unwrap(),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                if let Ok(mut tls) = acceptor.accept(tcp).await {
                    let _ = tls.write_all(b"ok").await;
                    let _ = tls.flush().await;
                }
            });
        }
    });
    port
}

/// Connects with `settings` to `host` (the name checked) and reads the server's `ok`.
async fn talk(settings: &TlsSettings, port: u16, host: &str) -> Result<(), LockError> {
    let connector = settings.connector()?;
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let mut tls = settings.connect(&connector, host, tcp).await?;
    let mut buf = [0u8; 2];
    tls.read_exact(&mut buf)
        .await
        .map_err(|e| error("reading from the server", &e))?;
    assert_eq!(&buf, b"ok");
    Ok(())
}

fn trusting(pki: &Pki, verify: Verify) -> TlsSettings {
    TlsSettings {
        verify,
        ca: Some(pki.ca.clone()),
        ..TlsSettings::default()
    }
}

#[track_caller]
fn auth_error(r: Result<(), LockError>, words: &str) {
    let e = r.expect_err(words);
    assert_eq!(e.kind(), ErrorKind::Auth, "{e}");
    assert!(e.to_string().contains(words), "{e} lacks {words:?}");
}

#[tokio::test]
async fn the_server_certificate_is_checked_as_the_mode_says() {
    let pki = Pki::generate();
    let good = serve(&pki.server, None).await;
    for verify in [Verify::Full, Verify::Chain, Verify::EncryptOnly] {
        talk(&trusting(&pki, verify), good, "127.0.0.1")
            .await
            .unwrap_or_else(|e| panic!("{verify:?}: {e}"));
    }
    // A CA we do not trust: refused unless nothing is checked.
    let other = TlsSettings {
        ca: Some(pki.other_ca.clone()),
        ..TlsSettings::default()
    };
    auth_error(talk(&other, good, "127.0.0.1").await, "UnknownIssuer");
    auth_error(
        talk(
            &TlsSettings {
                verify: Verify::Chain,
                ..other.clone()
            },
            good,
            "127.0.0.1",
        )
        .await,
        "UnknownIssuer",
    );
    // Another host's certificate: only the full check sees it.
    let named = serve(&pki.wrong_name, None).await;
    auth_error(
        talk(&trusting(&pki, Verify::Full), named, "127.0.0.1").await,
        "not valid for name",
    );
    talk(&trusting(&pki, Verify::Chain), named, "127.0.0.1")
        .await
        .expect("verify-ca takes any name");
    // The server name override checks the certificate for that name instead.
    let mut renamed = trusting(&pki, Verify::Full);
    renamed.server_name = Some("db.example.com".to_owned());
    talk(&renamed, named, "127.0.0.1")
        .await
        .expect("the name given");
    // Expired: refused by both checks.
    let expired = serve(&pki.expired, None).await;
    for verify in [Verify::Full, Verify::Chain] {
        auth_error(
            talk(&trusting(&pki, verify), expired, "127.0.0.1").await,
            "certificate expired",
        );
    }
    talk(&trusting(&pki, Verify::EncryptOnly), expired, "127.0.0.1")
        .await
        .expect("encryption only");
}

#[tokio::test]
async fn a_server_that_wants_a_client_certificate_refuses_the_wrong_one() {
    let pki = Pki::generate();
    let port = serve(&pki.server, Some(&pki.ca)).await;
    let with = |files: Option<&CertFiles>| TlsSettings {
        cert: files.map(|f| f.cert.clone()),
        key: files.map(|f| f.key.clone()),
        ..trusting(&pki, Verify::Full)
    };
    talk(&with(Some(&pki.client)), port, "127.0.0.1")
        .await
        .expect("a certificate from its CA");
    auth_error(
        talk(&with(None), port, "127.0.0.1").await,
        "refused our client certificate",
    );
    auth_error(
        talk(&with(Some(&pki.stranger)), port, "127.0.0.1").await,
        "refused our client certificate",
    );
}

#[test]
fn files_that_cannot_be_used_are_configuration_errors() {
    let pki = Pki::generate();
    let config_error = |s: TlsSettings, words: &str| {
        let e = s.client_config().expect_err(words);
        assert_eq!(e.kind(), ErrorKind::Config, "{e}");
        assert!(e.to_string().contains(words), "{e} lacks {words:?}");
    };
    config_error(
        TlsSettings {
            ca: Some("/nonexistent/ca.pem".into()),
            ..TlsSettings::default()
        },
        "/nonexistent/ca.pem",
    );
    // A key where the CA belongs: no certificate in it.
    config_error(
        TlsSettings {
            ca: Some(pki.client.key.clone()),
            ..TlsSettings::default()
        },
        "no PEM certificate",
    );
    // A certificate where the key belongs.
    config_error(
        TlsSettings {
            ca: Some(pki.ca.clone()),
            cert: Some(pki.client.cert.clone()),
            key: Some(pki.client.cert.clone()),
            ..TlsSettings::default()
        },
        "private key",
    );
    // A key that is not the certificate's.
    config_error(
        TlsSettings {
            ca: Some(pki.ca.clone()),
            cert: Some(pki.client.cert.clone()),
            key: Some(pki.stranger.key.clone()),
            ..TlsSettings::default()
        },
        "client certificate",
    );
    // Half a client identity.
    let mut s = TlsSettings::default();
    let cert = pki.client.cert.display().to_string();
    let e = s
        .take_files(DISTLOCK_PARAMS, |name| {
            (name == "tls_cert").then(|| cert.clone())
        })
        .expect_err("a certificate without its key");
    assert_eq!(e.kind(), ErrorKind::Config);
    assert!(Verify::parse("sometimes").is_err());
    assert_eq!(Verify::parse("ca").unwrap(), Verify::Chain);
}

#[test]
fn the_debug_form_names_files_not_contents() {
    let pki = Pki::generate();
    let s = TlsSettings {
        key: Some(pki.client.key.clone()),
        ..TlsSettings::default()
    };
    let shown = format!("{s:?}");
    assert!(shown.contains("client-key.pem"), "{shown}");
    assert!(!shown.contains("PRIVATE KEY"), "{shown}");
}

#[test]
fn failures_kept_only_as_words_are_classified_too() {
    let (kind, words) = classify_text("talking to x: invalid peer certificate: UnknownIssuer")
        .expect("a server certificate refused");
    assert_eq!(kind, ErrorKind::Auth);
    assert!(words.contains("UnknownIssuer"), "{words}");
    let (kind, words) = classify_text("io error: received fatal alert: CertificateRequired")
        .expect("our certificate refused");
    assert_eq!(kind, ErrorKind::Auth);
    assert!(words.contains("refused our client certificate"), "{words}");
    assert_eq!(classify_text("received fatal alert: DecodeError"), None);
    assert_eq!(classify_text("Connection refused (os error 111)"), None);
}

#[test]
fn base64_is_rfc_4648() {
    // The test vectors of RFC 4648, section 10.
    for (plain, encoded) in [
        ("", ""),
        ("f", "Zg=="),
        ("fo", "Zm8="),
        ("foo", "Zm9v"),
        ("foob", "Zm9vYg=="),
        ("fooba", "Zm9vYmE="),
        ("foobar", "Zm9vYmFy"),
    ] {
        assert_eq!(super::base64(plain.as_bytes()), encoded, "{plain:?}");
    }
    assert_eq!(super::base64(&[0xfb, 0xff, 0xbf]), "+/+/");
}

#[test]
fn system_roots_as_pem_read_back_as_the_same_certificates() {
    let native = rustls_native_certs::load_native_certs().certs;
    let pem = match super::system_roots_pem() {
        Ok(pem) => pem,
        Err(e) => {
            // Only a system without roots, with the documented error.
            assert!(native.is_empty(), "{e}");
            assert_eq!(e.kind(), ErrorKind::Config);
            return;
        }
    };
    let back: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<_, _>>()
        .expect("our PEM parses");
    assert_eq!(back.len(), native.len());
    assert!(back.iter().zip(&native).all(|(a, b)| a == b));
}
