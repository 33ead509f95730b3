//! A gRPC connection to one etcd member: the calls distlock makes, with the metadata etcd
//! expects (`hasleader`, the auth `token`).

use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use http::uri::PathAndQuery;
use tokio::sync::mpsc;
use tonic::metadata::AsciiMetadataValue;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Status, Streaming};

use super::listing::LeaseTimeToLiveResponse;
use super::messages::*;

/// One member's connection. Cheap to clone: the clones share the channel and the auth token.
#[derive(Clone)]
pub struct Conn {
    channel: Channel,
    settings: Arc<CallSettings>,
}

struct CallSettings {
    /// Ask the member to refuse at once when it has no leader (an election, the minority side
    /// of a partition) rather than hold the request.
    require_leader: bool,
    credentials: Option<(String, String)>,
    /// The token from the last `Authenticate`, sent with every request.
    token: RwLock<Option<AsciiMetadataValue>>,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("require_leader", &self.settings.require_leader)
            .field(
                "user",
                &self.settings.credentials.as_ref().map(|(user, _)| user),
            )
            .finish_non_exhaustive()
    }
}

/// The keep-alive stream of one lease: send a keep-alive, read its answer.
#[derive(Debug)]
pub struct KeepAlive {
    id: i64,
    requests: mpsc::Sender<LeaseKeepAliveRequest>,
    replies: Streaming<LeaseKeepAliveResponse>,
}

impl KeepAlive {
    /// Sends one keep-alive of the lease.
    ///
    /// # Errors
    /// `Unavailable` when the stream has closed.
    pub async fn send(&mut self) -> Result<(), Status> {
        self.requests
            .send(LeaseKeepAliveRequest { id: self.id })
            .await
            .map_err(|_| Status::unavailable("the keep-alive stream has closed"))
    }

    /// The next answer; `None` when the member ended the stream.
    ///
    /// # Errors
    /// The stream's error.
    pub async fn message(&mut self) -> Result<Option<LeaseKeepAliveResponse>, Status> {
        self.replies.message().await
    }
}

/// A watch's events. The request side stays open while this lives (etcd ends a watch stream
/// whose client went away).
#[derive(Debug)]
pub struct WatchStream {
    _requests: mpsc::Sender<WatchRequest>,
    replies: Streaming<WatchResponse>,
}

impl WatchStream {
    /// The next batch of events; `None` when the member ended the stream.
    ///
    /// # Errors
    /// The stream's error.
    pub async fn message(&mut self) -> Result<Option<WatchResponse>, Status> {
        self.replies.message().await
    }
}

/// A request stream fed by a channel.
fn stream_of<T: Send + 'static>(
    rx: mpsc::Receiver<T>,
) -> impl futures_util::Stream<Item = T> + Send + 'static {
    futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) })
}

/// etcd's answer to a request whose token it no longer knows (it expired, or the member
/// restarted).
fn token_expired(s: &Status) -> bool {
    s.code() == Code::Unauthenticated && s.message().contains("invalid auth token")
}

/// What a TLS connection to a member needs: the connector (its files read once) and the
/// settings (the name to check).
#[cfg(feature = "tls")]
#[derive(Clone)]
#[allow(missing_debug_implementations)]
pub struct Tls {
    pub connector: distlock_tls::TlsConnector,
    pub settings: Arc<distlock_tls::TlsSettings>,
}

/// A TLS stream whose first bytes from the server were read at connection time. In TLS 1.3 a
/// server refuses our certificate only after the handshake, in an alert that the first read
/// meets: read there, it fails the connection with the rustls error in it (an `Auth` error),
/// where inside hyper's HTTP/2 task it would come out as a bare "operation was canceled". An
/// HTTP/2 server speaks first (its SETTINGS frame), so this read does not wait.
#[cfg(feature = "tls")]
struct Primed<S> {
    inner: S,
    first: Vec<u8>,
    at: usize,
}

#[cfg(feature = "tls")]
impl<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin> Primed<S> {
    async fn read_first(mut inner: S, limit: Duration) -> std::io::Result<Self> {
        use tokio::io::AsyncReadExt;
        let mut first = vec![0u8; 1024];
        let n = match tokio::time::timeout(limit, inner.read(&mut first)).await {
            Ok(read) => read?,
            // A server that does not speak first: nothing to hand on.
            Err(_) => 0,
        };
        first.truncate(n);
        Ok(Primed {
            inner,
            first,
            at: 0,
        })
    }
}

#[cfg(feature = "tls")]
impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Primed<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = &mut *self;
        if this.at < this.first.len() {
            let n = buf.remaining().min(this.first.len() - this.at);
            buf.put_slice(&this.first[this.at..this.at + n]);
            this.at += n;
            if this.at == this.first.len() {
                this.first = Vec::new();
                this.at = 0;
            }
            return std::task::Poll::Ready(Ok(()));
        }
        std::pin::Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

#[cfg(feature = "tls")]
impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Primed<S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// No TLS in this build.
#[cfg(not(feature = "tls"))]
#[derive(Clone, Debug)]
pub enum Tls {}

impl Conn {
    /// A connection to `endpoint`, opened at the first request (a member that is down fails
    /// that request, not this call).
    pub fn lazy(
        endpoint: Endpoint,
        connect_timeout: Duration,
        require_leader: bool,
        credentials: Option<(String, String)>,
        tls: Option<&Tls>,
    ) -> Conn {
        let endpoint = endpoint.connect_timeout(connect_timeout).tcp_nodelay(true);
        let channel = match tls {
            None => endpoint.connect_lazy(),
            #[cfg(feature = "tls")]
            Some(tls) => {
                let tls = tls.clone();
                endpoint.connect_with_connector_lazy(tower::service_fn(move |uri: http::Uri| {
                    let tls = tls.clone();
                    async move {
                        let host = uri.host().unwrap_or_default().to_owned();
                        let port = uri.port_u16().unwrap_or(2379);
                        let tcp = tokio::net::TcpStream::connect((host.as_str(), port)).await?;
                        let _ = tcp.set_nodelay(true);
                        let name = tls
                            .settings
                            .server_name_for(&host)
                            .map_err(std::io::Error::other)?;
                        // A refused certificate stays an io::Error around the rustls error,
                        // which `distlock_tls::classify` finds in the status.
                        let stream = tls.connector.connect(name, tcp).await?;
                        let stream = Primed::read_first(stream, connect_timeout).await?;
                        Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
                    }
                }))
            }
            #[cfg(not(feature = "tls"))]
            Some(never) => match *never {},
        };
        Conn {
            channel,
            settings: Arc::new(CallSettings {
                require_leader,
                credentials,
                token: RwLock::new(None),
            }),
        }
    }

    /// Logs in with the connection's credentials (if it has any): later requests carry the
    /// token.
    ///
    /// # Errors
    /// The member's answer: `InvalidArgument` "authentication failed" for a wrong password.
    pub async fn authenticate(&self) -> Result<(), Status> {
        let Some((name, password)) = &self.settings.credentials else {
            return Ok(());
        };
        let reply: AuthenticateResponse = self
            .call(
                "/etcdserverpb.Auth/Authenticate",
                AuthenticateRequest {
                    name: name.clone(),
                    password: password.clone(),
                },
                false,
            )
            .await?;
        let token = AsciiMetadataValue::try_from(reply.token.as_str())
            .map_err(|_| Status::internal("etcd sent an auth token that is not ASCII"))?;
        *self
            .settings
            .token
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Some(token);
        Ok(())
    }

    fn request<T>(&self, message: T, with_token: bool) -> Request<T> {
        let mut req = Request::new(message);
        let meta = req.metadata_mut();
        if self.settings.require_leader {
            meta.insert("hasleader", AsciiMetadataValue::from_static("true"));
        }
        if with_token
            && let Some(token) = self
                .settings
                .token
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .clone()
        {
            meta.insert("token", token);
        }
        req
    }

    async fn grpc(&self) -> Result<tonic::client::Grpc<Channel>, Status> {
        let mut grpc = tonic::client::Grpc::new(self.channel.clone());
        grpc.ready()
            .await
            .map_err(|e| Status::from_error(Box::new(e)))?;
        Ok(grpc)
    }

    async fn call<Q, A>(
        &self,
        path: &'static str,
        message: Q,
        with_token: bool,
    ) -> Result<A, Status>
    where
        Q: prost::Message + Clone + Send + Sync + 'static,
        A: prost::Message + Default + Send + Sync + 'static,
    {
        let codec = tonic_prost::ProstCodec::<Q, A>::default();
        let reply = self
            .grpc()
            .await?
            .unary(
                self.request(message, with_token),
                PathAndQuery::from_static(path),
                codec,
            )
            .await?;
        Ok(reply.into_inner())
    }

    /// A unary call; a token the member no longer knows is renewed once.
    async fn unary<Q, A>(&self, path: &'static str, message: Q) -> Result<A, Status>
    where
        Q: prost::Message + Clone + Send + Sync + 'static,
        A: prost::Message + Default + Send + Sync + 'static,
    {
        match self.call(path, message.clone(), true).await {
            Err(s) if token_expired(&s) && self.settings.credentials.is_some() => {
                self.authenticate().await?;
                self.call(path, message, true).await
            }
            other => other,
        }
    }

    /// Opens a bidirectional stream, its first message sent at once.
    async fn open<Q, A>(
        &self,
        path: &'static str,
        first: Q,
    ) -> Result<(mpsc::Sender<Q>, Streaming<A>), Status>
    where
        Q: prost::Message + Clone + Send + Sync + 'static,
        A: prost::Message + Default + Send + Sync + 'static,
    {
        let mut renewed = false;
        loop {
            let (tx, rx) = mpsc::channel(4);
            tx.try_send(first.clone())
                .map_err(|_| Status::internal("a new stream's queue is full"))?;
            let codec = tonic_prost::ProstCodec::<Q, A>::default();
            let opened = self
                .grpc()
                .await?
                .streaming(
                    self.request(stream_of(rx), true),
                    PathAndQuery::from_static(path),
                    codec,
                )
                .await;
            match opened {
                Ok(r) => return Ok((tx, r.into_inner())),
                Err(s) if token_expired(&s) && self.settings.credentials.is_some() && !renewed => {
                    renewed = true;
                    self.authenticate().await?;
                }
                Err(s) => return Err(s),
            }
        }
    }

    /// `KV.Range`.
    ///
    /// # Errors
    /// The member's status.
    pub async fn range(&self, req: RangeRequest) -> Result<RangeResponse, Status> {
        self.unary("/etcdserverpb.KV/Range", req).await
    }

    /// `KV.Put`.
    ///
    /// # Errors
    /// The member's status.
    pub async fn put(&self, req: PutRequest) -> Result<PutResponse, Status> {
        self.unary("/etcdserverpb.KV/Put", req).await
    }

    /// `KV.DeleteRange`.
    ///
    /// # Errors
    /// The member's status.
    pub async fn delete_range(
        &self,
        req: DeleteRangeRequest,
    ) -> Result<DeleteRangeResponse, Status> {
        self.unary("/etcdserverpb.KV/DeleteRange", req).await
    }

    /// `KV.Txn`.
    ///
    /// # Errors
    /// The member's status.
    pub async fn txn(&self, req: TxnRequest) -> Result<TxnResponse, Status> {
        self.unary("/etcdserverpb.KV/Txn", req).await
    }

    /// `Lease.LeaseGrant`: a lease of `ttl` seconds.
    ///
    /// # Errors
    /// The member's status.
    pub async fn lease_grant(&self, ttl: i64) -> Result<LeaseGrantResponse, Status> {
        self.unary(
            "/etcdserverpb.Lease/LeaseGrant",
            LeaseGrantRequest { ttl, id: 0 },
        )
        .await
    }

    /// `Lease.LeaseRevoke`.
    ///
    /// # Errors
    /// The member's status (`NotFound` when the lease is already gone).
    pub async fn lease_revoke(&self, id: i64) -> Result<LeaseRevokeResponse, Status> {
        self.unary("/etcdserverpb.Lease/LeaseRevoke", LeaseRevokeRequest { id })
            .await
    }

    /// `Lease.LeaseTimeToLive`; with `keys`, the keys attached to the lease too.
    ///
    /// # Errors
    /// The member's status.
    pub async fn lease_time_to_live(
        &self,
        id: i64,
        keys: bool,
    ) -> Result<LeaseTimeToLiveResponse, Status> {
        self.unary(
            "/etcdserverpb.Lease/LeaseTimeToLive",
            LeaseTimeToLiveRequest { id, keys },
        )
        .await
    }

    /// Opens the keep-alive stream of lease `id` and sends its first keep-alive.
    ///
    /// # Errors
    /// The member's status.
    pub async fn lease_keep_alive(&self, id: i64) -> Result<KeepAlive, Status> {
        let (requests, replies) = self
            .open(
                "/etcdserverpb.Lease/LeaseKeepAlive",
                LeaseKeepAliveRequest { id },
            )
            .await?;
        Ok(KeepAlive {
            id,
            requests,
            replies,
        })
    }

    /// Opens a watch.
    ///
    /// # Errors
    /// The member's status.
    pub async fn watch(&self, create: WatchCreateRequest) -> Result<WatchStream, Status> {
        let (requests, replies) = self
            .open(
                "/etcdserverpb.Watch/Watch",
                WatchRequest {
                    request_union: Some(WatchRequestUnion::Create(create)),
                },
            )
            .await?;
        Ok(WatchStream {
            _requests: requests,
            replies,
        })
    }
}
