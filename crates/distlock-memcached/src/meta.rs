//! The few meta-protocol commands the engine needs (`ms`, `md`, `mg`), over one TCP
//! connection per request in flight, with a small pool; and a pipeline of many requests on one
//! connection (the watchdog's renewals: memcached answers a connection's requests in order).

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Mutex;
use std::time::Duration;

/// Idle connections kept for the next requests.
const IDLE_KEPT: usize = 32;

use distlock_core::recipes::MutexExt;
use distlock_core::{ErrorKind, LockError};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

mod head;

use head::{Head, parse_head, value_of};

/// A reply's first line and value, read (for the fuzz targets: `crate::fuzzing`).
#[cfg(fuzzing)]
pub(crate) fn fuzz_reply(bytes: &[u8]) {
    let line_end = bytes.iter().take(head::MAX_LINE).position(|&b| b == b'\n');
    let Some(end) = line_end else { return };
    let (line, rest) = bytes.split_at(end + 1);
    if let Ok(Head {
        size: Some(size), ..
    }) = parse_head(line, "mg fuzz")
    {
        let read = rest[..rest.len().min(size + 2)].to_vec();
        if let Ok(value) = value_of(read, size) {
            assert_eq!(value.len(), size);
            let _ = distlock_core::recipes::HolderValue::parse(&String::from_utf8_lossy(&value));
        }
    }
}

/// One reply: its two-letter code (`HD`, `NS`, `EX`, `NF`, `EN`, `VA`), the flags the engine
/// asks for (`c`: the CAS, `t`: the seconds left) and, for `VA`, the value.
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) code: &'static str,
    /// The item's CAS (`c`), when asked for.
    pub(crate) cas: Option<u64>,
    /// The item's seconds left (`t`, `-1` for none), when asked for.
    pub(crate) ttl: Option<i64>,
    pub(crate) value: Option<Vec<u8>>,
}

impl std::fmt::Display for Reply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.code)?;
        if let Some(c) = self.cas {
            write!(f, " c{c}")?;
        }
        if let Some(t) = self.ttl {
            write!(f, " t{t}")?;
        }
        Ok(())
    }
}

/// A word of a command line. The line is written straight into the connection's buffer, with no
/// `format!` and no allocation per request.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Arg<'a> {
    /// A word as it is (a command, an item key, a flag without a value).
    Word(&'a str),
    /// A number.
    Num(u64),
    /// A flag with a numeric value: `T30`, `C123`.
    Flag(char, u64),
}

fn write_line(out: &mut Vec<u8>, args: &[Arg<'_>]) {
    let mut digits = itoa::Buffer::new();
    for (i, a) in args.iter().enumerate() {
        if i > 0 {
            out.push(b' ');
        }
        match *a {
            Arg::Word(w) => out.extend_from_slice(w.as_bytes()),
            Arg::Num(n) => out.extend_from_slice(digits.format(n).as_bytes()),
            Arg::Flag(letter, n) => {
                let mut b = [0; 4];
                out.extend_from_slice(letter.encode_utf8(&mut b).as_bytes());
                out.extend_from_slice(digits.format(n).as_bytes());
            }
        }
    }
}

/// The first line of a request (no data), as text, for error messages.
fn request_text(out: &[u8]) -> String {
    let line = out.split(|&b| b == b'\r').next().unwrap_or_default();
    String::from_utf8_lossy(line).into_owned()
}

/// A connection's byte stream: TCP, or TLS over it.
enum Stream {
    Plain(TcpStream),
    #[cfg(feature = "tls")]
    Tls(Box<distlock_tls::TlsStream<TcpStream>>),
}

impl tokio::io::AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            #[cfg(feature = "tls")]
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl tokio::io::AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            #[cfg(feature = "tls")]
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            #[cfg(feature = "tls")]
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            #[cfg(feature = "tls")]
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// TLS to the server: the connector (files read once) and the settings (the name to check).
#[cfg(feature = "tls")]
pub(crate) struct Tls {
    pub(crate) connector: distlock_tls::TlsConnector,
    pub(crate) settings: distlock_tls::TlsSettings,
}

/// One connection, with what it reuses from request to request.
struct Conn {
    io: BufReader<Stream>,
    /// The reply deadline. One timer per connection, moved later before each request: that is
    /// an atomic store while the timer is registered, where a `timeout` per request would
    /// register and remove a timer in the runtime's wheel each time.
    deadline: Pin<Box<Sleep>>,
    /// The request being sent (`sent` bytes of it written so far), and the reply's first line
    /// (as much of it as has been read).
    out: Vec<u8>,
    sent: usize,
    head: Vec<u8>,
}

/// The most connections kept with a request whose reply was never read.
const MAX_ORPHANS: usize = 64;

/// Connections to one server.
pub(crate) struct Pool {
    host: String,
    connect_timeout: Duration,
    response_timeout: Duration,
    idle: Mutex<Vec<Conn>>,
    #[cfg(feature = "tls")]
    tls: Option<Tls>,
    /// Connections whose requests were given up before their replies came (cancelled, or no
    /// answer in time). The server may still carry such a request out after any request sent
    /// later on another connection: [`Pool::settle`] reads its reply first, so that what comes
    /// next sees its effect.
    orphans: Mutex<Vec<Orphan>>,
}

/// A connection given up with replies still to read: the tags of their requests, in order (one
/// for a request alone, one a request of a pipeline).
struct Orphan {
    tags: VecDeque<String>,
    conn: Conn,
}

/// One request of a pipeline: its line, its data (for `ms`), and its tag (see
/// [`Pool::call_tagged`]).
pub(crate) struct Request<'a> {
    pub(crate) args: Vec<Arg<'a>>,
    pub(crate) data: Option<&'a [u8]>,
    pub(crate) tag: &'a str,
}

fn io_err(doing: &str, e: std::io::Error) -> LockError {
    // A certificate refused, ours or the server's (TLS 1.3 says ours at the first read).
    #[cfg(feature = "tls")]
    if let Some((kind, words)) = distlock_tls::classify(&e) {
        return LockError::new(kind, format!("{doing}: {words}"));
    }
    LockError::caused_by(ErrorKind::Connection, doing, e)
}

/// A connection with requests on it. Dropped before their replies were read, it becomes an
/// orphan under their tags (if they have them), else it is closed: a late reply must never be
/// read as the answer to the next request.
struct InFlight<'a> {
    pool: &'a Pool,
    conn: Option<Conn>,
    /// A request alone: its tag.
    tag: Option<&'a str>,
    /// A pipeline: the tags of the replies still to read, in order.
    tags: VecDeque<String>,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else { return };
        let tags = match self.tag {
            Some(tag) if self.tags.is_empty() => VecDeque::from([tag.to_owned()]),
            _ => std::mem::take(&mut self.tags),
        };
        if tags.is_empty() {
            return;
        }
        let mut orphans = self.pool.orphans.locked();
        if orphans.len() >= MAX_ORPHANS {
            orphans.remove(0);
        }
        orphans.push(Orphan { tags, conn });
    }
}

impl Pool {
    pub(crate) fn new(
        host: String,
        connect_timeout: Duration,
        response_timeout: Duration,
        #[cfg(feature = "tls")] tls: Option<Tls>,
    ) -> Self {
        Pool {
            host,
            connect_timeout,
            response_timeout,
            idle: Mutex::new(Vec::new()),
            #[cfg(feature = "tls")]
            tls,
            orphans: Mutex::new(Vec::new()),
        }
    }

    async fn connect(&self) -> Result<Conn, LockError> {
        let doing = format!("connecting to memcached at {}", self.host);
        let open = async {
            let tcp = TcpStream::connect(&self.host)
                .await
                .map_err(|e| io_err(&doing, e))?;
            let _ = tcp.set_nodelay(true);
            #[cfg(feature = "tls")]
            if let Some(tls) = &self.tls {
                let host = self
                    .host
                    .rsplit_once(':')
                    .map_or(self.host.as_str(), |(h, _)| h);
                let stream = tls.settings.connect(&tls.connector, host, tcp).await?;
                return Ok(Stream::Tls(Box::new(stream)));
            }
            Ok::<_, LockError>(Stream::Plain(tcp))
        };
        let stream = tokio::time::timeout(self.connect_timeout, open)
            .await
            .map_err(|_| LockError::new(ErrorKind::Timeout, format!("{doing}: no answer")))??;
        Ok(Conn {
            io: BufReader::new(stream),
            deadline: Box::pin(tokio::time::sleep(self.response_timeout)),
            out: Vec::with_capacity(256),
            sent: 0,
            head: Vec::with_capacity(64),
        })
    }

    /// Sends one command (the words of its line, and `data` for `ms`) and reads its reply. A
    /// connection that fails or times out is dropped (a late reply must not be read as the
    /// answer to the next command).
    pub(crate) async fn call(
        &self,
        args: &[Arg<'_>],
        data: Option<&[u8]>,
    ) -> Result<Reply, LockError> {
        self.call_tagged(args, data, None).await
    }

    /// As [`call`](Self::call); a request given up before its reply (its future dropped, or
    /// no answer in time) leaves its connection to [`settle`](Self::settle) under `tag`.
    pub(crate) async fn call_tagged(
        &self,
        args: &[Arg<'_>],
        data: Option<&[u8]>,
        tag: Option<&str>,
    ) -> Result<Reply, LockError> {
        let pooled = self.idle.locked().pop();
        let conn = match pooled {
            Some(c) => c,
            None => self.connect().await?,
        };
        let mut flight = InFlight {
            pool: self,
            conn: Some(conn),
            tag,
            tags: VecDeque::new(),
        };
        let conn = flight.conn.as_mut().expect("set above");
        conn.out.clear();
        write_line(&mut conn.out, args);
        conn.out.extend_from_slice(b"\r\n");
        if let Some(d) = data {
            conn.out.extend_from_slice(d);
            conn.out.extend_from_slice(b"\r\n");
        }
        conn.sent = 0;
        conn.head.clear();
        self.finish(flight).await
    }

    /// Whether a request was given up with its reply unread (then [`settle`](Self::settle)
    /// has something to read).
    pub(crate) fn has_orphans(&self) -> bool {
        !self.orphans.locked().is_empty()
    }

    /// The tags of the requests given up with their replies unread.
    pub(crate) fn orphaned_tags(&self) -> std::collections::HashSet<String> {
        let orphans = self.orphans.locked();
        orphans
            .iter()
            .flat_map(|o| o.tags.iter().cloned())
            .collect()
    }

    /// Reads the replies of the given-up requests tagged `tag`, oldest first, with the replies
    /// of the other requests of their pipelines, and hands each to `apply` with its request's
    /// tag as it is read: once it returns, the server has carried them out, and what is sent
    /// next sees their effect.
    ///
    /// Another call for a tag of the same pipeline, meanwhile, finds nothing to read and
    /// returns at once: its request may then be refused for a CAS it has not learned yet,
    /// which the engine mends by reading the item (see the backend's `renew_again`).
    ///
    /// # Errors
    /// As [`call`](Self::call) (the requests left stay to settle on a timeout).
    pub(crate) async fn settle(
        &self,
        tag: &str,
        apply: &mut (dyn FnMut(&str, &Reply) + Send),
    ) -> Result<(), LockError> {
        loop {
            let orphan = {
                let mut orphans = self.orphans.locked();
                match orphans.iter().position(|o| o.tags.iter().any(|t| t == tag)) {
                    Some(i) => orphans.remove(i),
                    None => return Ok(()),
                }
            };
            let mut flight = InFlight {
                pool: self,
                conn: Some(orphan.conn),
                tag: None,
                tags: orphan.tags,
            };
            while let Some(front) = flight.tags.front().cloned() {
                match self.next_reply(&mut flight).await {
                    Ok(reply) => apply(&front, &reply),
                    // That request's own error line: the next replies follow.
                    Err(e) if e.kind() != ErrorKind::Timeout && flight.conn.is_some() => {}
                    // A timeout keeps the rest to settle (dropping `flight`); any other error
                    // has closed the connection.
                    Err(e) => return Err(e),
                }
                flight.tags.pop_front();
            }
            self.keep(flight);
        }
    }

    /// Sends `requests` on one connection, all at once, and reads their replies in order (a
    /// pipeline: one write and a few reads for hundreds of requests, where a request each costs
    /// a round trip). A request the server refuses (an error line) gets its error, and the
    /// others their replies; when the connection breaks, the request and those after it get
    /// the error. Given up half-way (its future dropped, or no answer in time), the replies still to
    /// read are left to [`settle`](Self::settle) under their tags.
    pub(crate) async fn call_many(
        &self,
        requests: &[Request<'_>],
    ) -> Vec<Result<Reply, LockError>> {
        let mut out = Vec::with_capacity(requests.len());
        if requests.is_empty() {
            return out;
        }
        let pooled = self.idle.locked().pop();
        let conn = match pooled {
            Some(c) => c,
            None => match self.connect().await {
                Ok(c) => c,
                Err(e) => {
                    out.extend(
                        requests
                            .iter()
                            .map(|_| Err(LockError::new(e.kind(), e.message().to_owned()))),
                    );
                    return out;
                }
            },
        };
        let mut flight = InFlight {
            pool: self,
            conn: Some(conn),
            tag: None,
            tags: requests.iter().map(|r| r.tag.to_owned()).collect(),
        };
        let conn = flight.conn.as_mut().expect("set above");
        conn.out.clear();
        for r in requests {
            write_line(&mut conn.out, &r.args);
            conn.out.extend_from_slice(b"\r\n");
            if let Some(d) = r.data {
                conn.out.extend_from_slice(d);
                conn.out.extend_from_slice(b"\r\n");
            }
        }
        conn.sent = 0;
        conn.head.clear();
        while !flight.tags.is_empty() {
            match self.next_reply(&mut flight).await {
                Ok(reply) => {
                    flight.tags.pop_front();
                    out.push(Ok(reply));
                }
                // That request's own error line (the server refused it): the next replies
                // follow on the same connection.
                Err(e) if e.kind() != ErrorKind::Timeout && flight.conn.is_some() => {
                    flight.tags.pop_front();
                    out.push(Err(e));
                }
                Err(e) => {
                    // A timeout leaves the connection to `settle`; any other error has closed
                    // it.
                    drop(flight);
                    while out.len() < requests.len() {
                        out.push(Err(LockError::new(e.kind(), e.message().to_owned())));
                    }
                    return out;
                }
            }
        }
        self.keep(flight);
        out
    }

    /// Sends what is left of `flight`'s requests and reads the next reply (its deadline counts
    /// from now). On an error other than a timeout or an error line read whole (the request's
    /// own answer), the connection is closed.
    async fn next_reply(&self, flight: &mut InFlight<'_>) -> Result<Reply, LockError> {
        let conn = flight.conn.as_mut().expect("a connection in flight");
        conn.deadline
            .as_mut()
            .reset(Instant::now() + self.response_timeout);
        let Conn {
            io,
            deadline,
            out,
            sent,
            head,
        } = conn;
        let result = tokio::select! {
            biased;
            r = exchange(io, out, sent, head) => r,
            () = deadline.as_mut() => {
                return Err(LockError::new(
                    ErrorKind::Timeout,
                    format!("memcached at {}: no answer to {:?}", self.host, request_text(out)),
                ));
            }
        };
        match &result {
            Ok(_) => head.clear(),
            // An error line read whole (`CLIENT_ERROR …`, `SERVER_ERROR …`): the request's own
            // answer, and the connection is still in step with its requests.
            Err(_) if refused(head) => head.clear(),
            // Anything else may leave part of a reply unread: the connection goes.
            Err(_) => flight.conn = None,
        }
        result
    }

    /// Keeps `flight`'s connection, its replies all read, for the next requests.
    fn keep(&self, mut flight: InFlight<'_>) {
        if let Some(conn) = flight.conn.take() {
            let mut idle = self.idle.locked();
            // Room for the requests a client has in flight at once (its renewals go out 16 at
            // a time, or as a pipeline on one connection, see the core's driver): a connection
            // is reused, not opened per request.
            if idle.len() < IDLE_KEPT {
                idle.push(conn);
            }
        }
    }

    /// Sends what is left of the request on `flight` and reads its reply.
    async fn finish(&self, mut flight: InFlight<'_>) -> Result<Reply, LockError> {
        match self.next_reply(&mut flight).await {
            // Dropping `flight` keeps the connection for `settle` if the request is tagged.
            Err(e) if e.kind() == ErrorKind::Timeout => Err(e),
            // Answered (or closed, on a broken connection).
            r => {
                self.keep(flight);
                r
            }
        }
    }
}

/// Whether `head` is an error line read whole: the server refused one request, and what it
/// sends next answers the next request.
fn refused(head: &[u8]) -> bool {
    head.ends_with(b"\n")
        && [&b"CLIENT_ERROR"[..], b"SERVER_ERROR", b"ERROR"]
            .iter()
            .any(|w| head.starts_with(w))
}

/// Writes what is left of `out` and reads the reply, into `head` after what it already holds.
async fn exchange(
    conn: &mut BufReader<Stream>,
    out: &[u8],
    sent: &mut usize,
    head: &mut Vec<u8>,
) -> Result<Reply, LockError> {
    const DOING: &str = "talking to memcached";
    while *sent < out.len() {
        let n = conn
            .get_mut()
            .write(&out[*sent..])
            .await
            .map_err(|e| io_err(DOING, e))?;
        if n == 0 {
            return Err(LockError::new(
                ErrorKind::Connection,
                format!("{DOING}: the server closed the connection"),
            ));
        }
        *sent += n;
    }
    // Over TLS a write may return with the records still in the session's buffer (the socket
    // was full): without a flush they would go out only with the next write, and the reply
    // waited for here would never come (a plain socket's flush does nothing).
    conn.get_mut().flush().await.map_err(|e| io_err(DOING, e))?;
    // A line no longer than any meta-protocol reply's (a server that streams bytes without a
    // line end is not one, and would otherwise fill memory until the deadline).
    let room = head::MAX_LINE.saturating_sub(head.len());
    (&mut *conn)
        .take(room as u64)
        .read_until(b'\n', head)
        .await
        .map_err(|e| io_err(DOING, e))?;
    if head.last() != Some(&b'\n') {
        // Stopped at the limit, or at the end of the stream.
        return Err(if head.len() >= head::MAX_LINE {
            LockError::new(
                ErrorKind::Protocol,
                format!(
                    "{DOING}: a reply line longer than {} bytes (not a meta-protocol server?)",
                    head::MAX_LINE
                ),
            )
        } else {
            LockError::new(
                ErrorKind::Connection,
                format!("{DOING}: the server closed the connection"),
            )
        });
    }
    let Head {
        code,
        size,
        cas,
        ttl,
    } = parse_head(head, &request_text(out))?;
    let value = match size {
        Some(size) => {
            let mut buf = vec![0u8; size + 2];
            conn.read_exact(&mut buf)
                .await
                .map_err(|e| io_err(DOING, e))?;
            Some(value_of(buf, size)?)
        }
        None => None,
    };
    Ok(Reply {
        code,
        cas,
        ttl,
        value,
    })
}

#[cfg(test)]
mod tests;
