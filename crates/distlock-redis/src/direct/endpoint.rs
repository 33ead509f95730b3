//! Where a direct connection goes, and the stream it talks over: TCP (`TCP_NODELAY`), a Unix
//! socket, or TLS over TCP (with the `tls` feature) configured as redis-rs's connection to the
//! same URL (see the parent module's docs).

use std::io;
#[cfg(unix)]
use std::path::PathBuf;

use redis::{ConnectionAddr, ConnectionInfo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::config::RedisConfig;

/// Where and how a direct connection connects (the direct connection's, and the subscriber's).
#[derive(Clone)]
pub(crate) struct Endpoint {
    addr: Addr,
    pub(super) username: Option<String>,
    pub(super) password: Option<String>,
    pub(super) db: i64,
}

#[derive(Clone)]
enum Addr {
    Tcp(String, u16),
    /// TLS over TCP to host and port.
    #[cfg(feature = "tls")]
    Tls(String, u16, Tls),
    #[cfg(unix)]
    Unix(PathBuf),
}

/// How a TLS connection is opened: the rustls configuration (built once, so reconnections
/// may resume the session) and the name the server's certificate must show.
#[cfg(feature = "tls")]
#[derive(Clone)]
struct Tls {
    connector: distlock_tls::TlsConnector,
    name: distlock_tls::rustls::pki_types::ServerName<'static>,
}

#[cfg(feature = "tls")]
impl Tls {
    /// The configuration redis-rs's connection would use for `host` with these settings:
    /// every check, or with `insecure` (the URL's `#insecure`) none and no SNI.
    fn new(
        settings: &distlock_tls::TlsSettings,
        host: &str,
        insecure: bool,
    ) -> Result<Tls, distlock_core::LockError> {
        let mut settings = settings.clone();
        if insecure {
            settings.verify = distlock_tls::Verify::EncryptOnly;
        }
        let mut config = settings.client_config()?;
        if insecure {
            std::sync::Arc::make_mut(&mut config).enable_sni = false;
        }
        Ok(Tls {
            connector: distlock_tls::TlsConnector::from(config),
            name: settings.server_name_for(host)?,
        })
    }
}

pub(super) enum Stream {
    Tcp(tokio::net::TcpStream),
    /// Boxed: a TLS session is large, and the connection moves in and out of its slot at
    /// every request.
    #[cfg(feature = "tls")]
    Tls(Box<distlock_tls::TlsStream<tokio::net::TcpStream>>),
    #[cfg(unix)]
    Unix(tokio::net::UnixStream),
}

impl Stream {
    /// Writes all of `buf` (over TLS, flushed to the socket).
    pub(super) async fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.write_all(buf).await,
            #[cfg(feature = "tls")]
            Stream::Tls(s) => {
                s.write_all(buf).await?;
                s.flush().await
            }
            #[cfg(unix)]
            Stream::Unix(s) => s.write_all(buf).await,
        }
    }

    /// Reads what has come into `buf`'s spare capacity; 0 when the server closed.
    ///
    /// # Cancel safety
    /// Cancel-safe: bytes are appended only when it returns (over TLS, records read before a
    /// cancellation stay in the session).
    pub(super) async fn read_buf(&mut self, buf: &mut Vec<u8>) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read_buf(buf).await,
            #[cfg(feature = "tls")]
            Stream::Tls(s) => s.read_buf(buf).await,
            #[cfg(unix)]
            Stream::Unix(s) => s.read_buf(buf).await,
        }
    }
}

impl Endpoint {
    /// Where `info` (a client of `config`'s) points, with `config`'s TLS files for `rediss://`.
    /// `None` when the direct connection cannot go there: TLS in a build without the `tls`
    /// feature, or TLS settings that do not make a configuration (the multiplexed connection
    /// reports that).
    pub(crate) fn of(info: &ConnectionInfo, config: &RedisConfig) -> Option<Endpoint> {
        let settings = info.redis_settings();
        let addr = match info.addr() {
            ConnectionAddr::Tcp(host, port) => Addr::Tcp(host.clone(), *port),
            #[cfg(feature = "tls")]
            ConnectionAddr::TcpTls {
                host,
                port,
                insecure,
                ..
            } => {
                let tls = config.tls.as_ref()?;
                match Tls::new(tls, host, *insecure) {
                    Ok(tls) => Addr::Tls(host.clone(), *port, tls),
                    Err(e) => {
                        tracing::debug!(target: "distlock", error = %e,
                            "no direct TLS connection; using the shared one");
                        return None;
                    }
                }
            }
            #[cfg(unix)]
            ConnectionAddr::Unix(path) => Addr::Unix(path.clone()),
            _ => return None,
        };
        #[cfg(not(feature = "tls"))]
        let _ = config;
        Some(Endpoint {
            addr,
            username: settings.username().map(str::to_owned),
            password: settings.password().map(str::to_owned),
            db: settings.db(),
        })
    }

    /// Opens the stream to it: a TCP connection, a Unix socket, or TLS over TCP once its
    /// handshake is done.
    pub(super) async fn open(&self) -> io::Result<Stream> {
        Ok(match &self.addr {
            Addr::Tcp(host, port) => Stream::Tcp(tcp(host, *port).await?),
            #[cfg(feature = "tls")]
            Addr::Tls(host, port, tls) => {
                let s = tcp(host, *port).await?;
                let s = tls.connector.connect(tls.name.clone(), s).await?;
                Stream::Tls(Box::new(s))
            }
            #[cfg(unix)]
            Addr::Unix(path) => Stream::Unix(tokio::net::UnixStream::connect(path).await?),
        })
    }

    /// Whether connections to it speak TLS.
    pub(crate) fn is_tls(&self) -> bool {
        #[cfg(feature = "tls")]
        {
            matches!(self.addr, Addr::Tls(..))
        }
        #[cfg(not(feature = "tls"))]
        {
            false
        }
    }
}

async fn tcp(host: &str, port: u16) -> io::Result<tokio::net::TcpStream> {
    let s = tokio::net::TcpStream::connect((host, port)).await?;
    s.set_nodelay(true)?;
    Ok(s)
}
