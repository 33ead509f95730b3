//! A memcached that answers wrongly: a tiny TCP server that answers the engine's probe at
//! connect (`mg distlock-probe…` → `EN`) and every other request with bad bytes. Each case
//! must end the lock call with a typed error within the response timeout and a margin, with
//! no panic and no large allocation (a counting allocator watches the whole test binary).

use std::time::Duration;

use distlock_core::{ErrorKind, LockClient};
use distlock_memcached::MemcachedBackend;
use distlock_testkit::wrong_server::{Counting, expect_error, listen};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

#[global_allocator]
static ALLOC: Counting = Counting;

/// The client's response timeout, in the URL.
const RESPONSE_TIMEOUT: Duration = Duration::from_millis(1500);

/// What the server sends in place of a reply.
#[derive(Clone)]
enum Answer {
    /// These bytes, then the connection closed.
    ThenClose(Vec<u8>),
    /// These bytes, the connection kept open.
    Bytes(Vec<u8>),
    /// These bytes one at a time, `gap` apart.
    Trickle(Vec<u8>, Duration),
    /// These bytes over and over, as fast as the client reads them, with no line end.
    Endless(Vec<u8>),
}

/// Answers one connection: the probe properly, every other request with `answer`.
async fn serve(stream: TcpStream, answer: Answer) {
    let mut io = BufReader::new(stream);
    let mut line = Vec::new();
    loop {
        line.clear();
        match io.read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        if line.starts_with(b"ms ") {
            // The data line after it.
            let mut data = Vec::new();
            if io.read_until(b'\n', &mut data).await.is_err() {
                return;
            }
        }
        let text = String::from_utf8_lossy(&line);
        if text.contains("distlock-probe") {
            if io.get_mut().write_all(b"EN\r\n").await.is_err() {
                return;
            }
            continue;
        }
        let stream = io.get_mut();
        match &answer {
            Answer::ThenClose(bytes) => {
                let _ = stream.write_all(bytes).await;
                return;
            }
            Answer::Bytes(bytes) => {
                if stream.write_all(bytes).await.is_err() {
                    return;
                }
            }
            Answer::Trickle(bytes, gap) => {
                for b in bytes {
                    if stream.write_all(&[*b]).await.is_err() {
                        return;
                    }
                    tokio::time::sleep(*gap).await;
                }
            }
            Answer::Endless(bytes) => {
                while stream.write_all(bytes).await.is_ok() {}
                return;
            }
        }
    }
}

/// A server on a free port that answers every lock request with `answer`.
async fn wrong_server(answer: Answer) -> String {
    let port = listen(move |stream| serve(stream, answer.clone())).await;
    format!(
        "memcached://127.0.0.1:{port}?response_timeout={}ms&connect_timeout=1s",
        RESPONSE_TIMEOUT.as_millis()
    )
}

/// Connects to a server answering `answer`, tries to take a lock, and checks that the call
/// ends with an error of one of `kinds` in time, with no large allocation.
async fn case(what: &str, answer: Answer, kinds: &[ErrorKind]) {
    let url = wrong_server(answer).await;
    let client = LockClient::new(
        MemcachedBackend::connect(&url)
            .await
            .unwrap_or_else(|e| panic!("{what}: connect: {e}")),
    );
    expect_error(what, RESPONSE_TIMEOUT, kinds, client.try_acquire("wrong")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_reply_is_a_connection_error() {
    case(
        "truncated",
        Answer::ThenClose(b"VA 10 c1\r\nabc".to_vec()),
        &[ErrorKind::Connection],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_size_of_ten_to_the_thirteen_is_refused_unallocated() {
    case(
        "value size 10^13",
        Answer::Bytes(b"VA 10000000000000 c1\r\nabc\r\n".to_vec()),
        &[ErrorKind::Protocol],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_line_is_refused_without_filling_memory() {
    case(
        "an endless line",
        Answer::Endless(vec![b'A'; 64 * 1024]),
        &[ErrorKind::Protocol],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wrong_reply_type_is_a_protocol_error() {
    for (what, bytes) in [
        ("a miss", &b"EN\r\n"[..]),
        ("a value", b"VA 5 c1\r\nhello\r\n"),
        ("a value without its line end", b"VA 5 c1\r\nhelloXY"),
        ("a Redis reply", b"+OK\r\n"),
        ("a bad CAS", b"HD cxyz\r\n"),
    ] {
        case(what, Answer::Bytes(bytes.to_vec()), &[ErrorKind::Protocol]).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_byte_every_few_seconds_is_a_timeout() {
    case(
        "one byte every 2 s",
        Answer::Trickle(b"HD c1 t30\r\n".to_vec(), Duration::from_secs(2)),
        &[ErrorKind::Timeout],
    )
    .await;
}
