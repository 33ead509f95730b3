//! The few meta-protocol commands the engine needs (`ms`, `md`, `mg`), over one TCP
//! connection per request in flight, with a small pool.

use std::sync::Mutex;
use std::time::Duration;

use distlock_core::{ErrorKind, LockError};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// One reply: its two-letter code (`HD`, `NS`, `EX`, `NF`, `EN`, `VA`…), its flags (`c123`,
/// `t30`…) and, for `VA`, the value.
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) code: String,
    pub(crate) flags: Vec<String>,
    pub(crate) value: Option<Vec<u8>>,
}

impl Reply {
    /// The numeric value of the flag `letter` (`c` → the CAS), if returned.
    pub(crate) fn flag(&self, letter: char) -> Option<i64> {
        self.flags
            .iter()
            .find_map(|f| f.strip_prefix(letter).and_then(|v| v.parse().ok()))
    }
}

/// Connections to one server.
pub(crate) struct Pool {
    host: String,
    connect_timeout: Duration,
    response_timeout: Duration,
    idle: Mutex<Vec<BufReader<TcpStream>>>,
}

fn io_err(doing: &str, e: std::io::Error) -> LockError {
    LockError::new(ErrorKind::Connection, format!("{doing}: {e}")).with_source(e)
}

/// The largest value the engine ever reads back (a holder label); a bigger one is not ours.
const MAX_VALUE: usize = 64 * 1024;

impl Pool {
    pub(crate) fn new(host: String, connect_timeout: Duration, response_timeout: Duration) -> Self {
        Pool {
            host,
            connect_timeout,
            response_timeout,
            idle: Mutex::new(Vec::new()),
        }
    }

    async fn connect(&self) -> Result<BufReader<TcpStream>, LockError> {
        let doing = format!("connecting to memcached at {}", self.host);
        let stream = tokio::time::timeout(self.connect_timeout, TcpStream::connect(&self.host))
            .await
            .map_err(|_| LockError::new(ErrorKind::Timeout, format!("{doing}: no answer")))?
            .map_err(|e| io_err(&doing, e))?;
        let _ = stream.set_nodelay(true);
        Ok(BufReader::new(stream))
    }

    /// Sends one command (`line` without its `\r\n`, and `data` for `ms`) and reads its reply.
    /// A connection that fails or times out is dropped (a late reply must not be read as the
    /// answer to the next command).
    pub(crate) async fn call(&self, line: &str, data: Option<&[u8]>) -> Result<Reply, LockError> {
        let pooled = self
            .idle
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .pop();
        let mut conn = match pooled {
            Some(c) => c,
            None => self.connect().await?,
        };
        let reply = tokio::time::timeout(self.response_timeout, exchange(&mut conn, line, data))
            .await
            .map_err(|_| {
                LockError::new(
                    ErrorKind::Timeout,
                    format!("memcached at {}: no answer to {line:?}", self.host),
                )
            })??;
        let mut idle = self
            .idle
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if idle.len() < 8 {
            idle.push(conn);
        }
        Ok(reply)
    }
}

async fn exchange(
    conn: &mut BufReader<TcpStream>,
    line: &str,
    data: Option<&[u8]>,
) -> Result<Reply, LockError> {
    const DOING: &str = "talking to memcached";
    let mut out = Vec::with_capacity(line.len() + 2 + data.map_or(0, |d| d.len() + 2));
    out.extend_from_slice(line.as_bytes());
    out.extend_from_slice(b"\r\n");
    if let Some(d) = data {
        out.extend_from_slice(d);
        out.extend_from_slice(b"\r\n");
    }
    conn.get_mut()
        .write_all(&out)
        .await
        .map_err(|e| io_err(DOING, e))?;
    let mut head = String::new();
    let n = conn
        .read_line(&mut head)
        .await
        .map_err(|e| io_err(DOING, e))?;
    if n == 0 {
        return Err(LockError::new(
            ErrorKind::Connection,
            format!("{DOING}: the server closed the connection"),
        ));
    }
    let head = head.trim_end();
    let mut words = head.split(' ');
    let code = words.next().unwrap_or_default().to_owned();
    match code.as_str() {
        "HD" | "NS" | "EX" | "NF" | "EN" | "VA" => {}
        "CLIENT_ERROR" | "SERVER_ERROR" | "ERROR" => {
            return Err(LockError::new(
                ErrorKind::Protocol,
                format!("memcached refused {line:?}: {head}"),
            ));
        }
        _ => {
            return Err(LockError::new(
                ErrorKind::Protocol,
                format!("memcached answered {head:?} to {line:?} (not a meta-protocol server?)"),
            ));
        }
    }
    let mut value = None;
    let mut flags: Vec<String> = words.map(str::to_owned).collect();
    if code == "VA" {
        let size: usize = flags
            .first()
            .and_then(|s| s.parse().ok())
            .filter(|&s| s <= MAX_VALUE)
            .ok_or_else(|| {
                LockError::new(
                    ErrorKind::Protocol,
                    format!("memcached answered {head:?}: a bad value size"),
                )
            })?;
        flags.remove(0);
        let mut buf = vec![0u8; size + 2];
        conn.read_exact(&mut buf)
            .await
            .map_err(|e| io_err(DOING, e))?;
        buf.truncate(size);
        value = Some(buf);
    }
    Ok(Reply { code, flags, value })
}
