//! TLS for tokio-postgres through distlock-tls (rustls), with libpq's `sslmode`s, and the
//! `tls-server-end-point` channel binding that lets SCRAM (`SCRAM-SHA-256-PLUS`) detect a man
//! in the middle.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use distlock_tls::rustls::pki_types::ServerName;
use distlock_tls::{TlsConnector, TlsSettings};
use sha2::{Digest, Sha256, Sha384, Sha512};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect};

/// Makes a TLS connector per connection (tokio-postgres's interface).
#[derive(Clone)]
pub(crate) struct MakeRustls {
    connector: TlsConnector,
    settings: Arc<TlsSettings>,
}

impl MakeRustls {
    pub(crate) fn new(settings: TlsSettings) -> Result<Self, distlock_core::LockError> {
        Ok(MakeRustls {
            connector: settings.connector()?,
            settings: Arc::new(settings),
        })
    }
}

impl<S> MakeTlsConnect<S> for MakeRustls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type TlsConnect = RustlsConnect;
    type Error = distlock_core::LockError;

    fn make_tls_connect(&mut self, domain: &str) -> Result<RustlsConnect, Self::Error> {
        Ok(RustlsConnect {
            connector: self.connector.clone(),
            name: self.settings.server_name_for(domain)?,
        })
    }
}

/// Connects one stream.
pub(crate) struct RustlsConnect {
    connector: TlsConnector,
    name: ServerName<'static>,
}

impl<S> TlsConnect<S> for RustlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<RustlsStream<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            let tls = self.connector.connect(self.name, stream).await?;
            Ok(RustlsStream(tls))
        })
    }
}

/// A TLS stream that can give its channel binding.
pub(crate) struct RustlsStream<S>(distlock_tls::TlsStream<S>);

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for RustlsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for RustlsStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> tokio_postgres::tls::TlsStream for RustlsStream<S> {
    fn channel_binding(&self) -> ChannelBinding {
        let (_, conn) = self.0.get_ref();
        conn.peer_certificates()
            .and_then(|certs| certs.first())
            .and_then(|cert| end_point_hash(cert))
            .map_or_else(ChannelBinding::none, ChannelBinding::tls_server_end_point)
    }
}

/// RFC 5929's `tls-server-end-point`: the server certificate's hash, by the hash of its
/// signature algorithm (SHA-256 for MD5 and SHA-1). `None` for algorithms without one
/// (Ed25519) or a certificate we cannot read: SCRAM then goes without channel binding.
fn end_point_hash(der: &[u8]) -> Option<Vec<u8>> {
    let oid = signature_algorithm(der)?;
    // The OIDs' DER contents (without tag and length).
    const SHA256: &[&[u8]] = &[
        &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0b], // sha256WithRSAEncryption
        &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02],       // ecdsa-with-SHA256
        &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x05], // sha1WithRSAEncryption
        &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x04], // md5WithRSAEncryption
        &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x01],             // ecdsa-with-SHA1
    ];
    const SHA384: &[&[u8]] = &[
        &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0c], // sha384WithRSAEncryption
        &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x03],       // ecdsa-with-SHA384
    ];
    const SHA512: &[&[u8]] = &[
        &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0d], // sha512WithRSAEncryption
        &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x04],       // ecdsa-with-SHA512
    ];
    if SHA256.contains(&oid) {
        Some(Sha256::digest(der).to_vec())
    } else if SHA384.contains(&oid) {
        Some(Sha384::digest(der).to_vec())
    } else if SHA512.contains(&oid) {
        Some(Sha512::digest(der).to_vec())
    } else {
        None
    }
}

/// One DER element at the start of `input`: its tag, contents and what follows.
fn element(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |acc, &b| (acc << 8) | usize::from(b));
        (len, &rest[n..])
    };
    if rest.len() < len {
        return None;
    }
    Some((tag, &rest[..len], &rest[len..]))
}

/// The OID of `Certificate.signatureAlgorithm`.
fn signature_algorithm(der: &[u8]) -> Option<&[u8]> {
    const SEQUENCE: u8 = 0x30;
    const OID: u8 = 0x06;
    let (tag, cert, _) = element(der)?;
    if tag != SEQUENCE {
        return None;
    }
    let (_, _tbs, rest) = element(cert)?;
    let (tag, alg, _) = element(rest)?;
    if tag != SEQUENCE {
        return None;
    }
    let (tag, oid, _) = element(alg)?;
    (tag == OID).then_some(oid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_signature_algorithm_of_a_certificate() {
        // A minimal structure: SEQUENCE { SEQUENCE {} (tbs), SEQUENCE { OID ecdsa-with-SHA256 } }.
        let oid = [0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02];
        let mut alg = vec![0x06, oid.len() as u8];
        alg.extend_from_slice(&oid);
        let mut body = vec![0x30, 0x00, 0x30, alg.len() as u8];
        body.extend_from_slice(&alg);
        let mut der = vec![0x30, body.len() as u8];
        der.extend_from_slice(&body);
        assert_eq!(signature_algorithm(&der), Some(&oid[..]));
        assert_eq!(end_point_hash(&der).map(|h| h.len()), Some(32));
        // Truncated or not a certificate: no binding, no panic.
        for bad in [
            &der[..3],
            &[0x31, 0x00][..],
            &[][..],
            &[0x30, 0x84, 0xff][..],
        ] {
            assert_eq!(end_point_hash(bad), None);
        }
    }
}
