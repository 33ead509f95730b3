//! A ZooKeeper that answers wrongly: a tiny TCP server on a loopback port that reads the
//! client's connect request and answers the handshake with bad bytes (truncated, a length
//! prefix of 2^31 - 1, garbage, the wrong fields, one byte every 2 s). `ZkBackend::connect`
//! must end with a typed error within its limit (the connect timeout plus the session
//! timeout: the client tries a failed handshake again until then) and a margin, with no
//! panic and no large allocation (a counting allocator watches the whole test binary).

use std::time::Duration;

use distlock_core::ErrorKind;
use distlock_testkit::wrong_server::{Counting, expect_error, listen};
use distlock_zookeeper::ZkBackend;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[global_allocator]
static ALLOC: Counting = Counting;

/// The client's timeouts, in the URL: its connect call gives up after their sum.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
const SESSION_TIMEOUT: Duration = Duration::from_secs(2);

/// What the server answers the connect request with.
#[derive(Clone)]
enum Answer {
    /// These bytes, then the connection closed.
    ThenClose(Vec<u8>),
    /// These bytes, the connection kept open.
    Bytes(Vec<u8>),
    /// These bytes one at a time, `gap` apart.
    Trickle(Vec<u8>, Duration),
}

/// Reads one length-prefixed request (the connect request); false when the client left.
async fn read_request(stream: &mut TcpStream) -> bool {
    let mut len = [0u8; 4];
    if stream.read_exact(&mut len).await.is_err() {
        return false;
    }
    let len = u32::from_be_bytes(len).min(1 << 20) as usize;
    let mut body = vec![0u8; len];
    stream.read_exact(&mut body).await.is_ok()
}

async fn serve(mut stream: TcpStream, answer: Answer) {
    if !read_request(&mut stream).await {
        return;
    }
    match answer {
        Answer::ThenClose(bytes) => {
            let _ = stream.write_all(&bytes).await;
        }
        Answer::Bytes(bytes) => {
            if stream.write_all(&bytes).await.is_ok() {
                // Kept open (and drained) until the client gives up.
                let mut buf = [0u8; 4096];
                while matches!(stream.read(&mut buf).await, Ok(n) if n > 0) {}
            }
        }
        Answer::Trickle(bytes, gap) => {
            for b in bytes {
                if stream.write_all(&[b]).await.is_err() {
                    return;
                }
                tokio::time::sleep(gap).await;
            }
        }
    }
}

/// A connect response: protocol version 0, `timeout` ms, session `id`, a 16-byte password
/// (`password_len` as its length field), and the read-only flag.
fn response(timeout: i32, id: i64, password_len: i32) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&0i32.to_be_bytes());
    body.extend_from_slice(&timeout.to_be_bytes());
    body.extend_from_slice(&id.to_be_bytes());
    body.extend_from_slice(&password_len.to_be_bytes());
    body.extend_from_slice(&[7; 16]);
    body.push(0);
    let mut out = u32::try_from(body.len()).unwrap().to_be_bytes().to_vec();
    out.extend_from_slice(&body);
    out
}

/// Serves `answer` on a free port, connects, and checks that connecting ends with an error
/// of one of `kinds` in time, with no large allocation.
async fn case(what: &str, answer: Answer, kinds: &[ErrorKind]) {
    let port = listen(move |stream| serve(stream, answer.clone())).await;
    let url = format!(
        "zk://127.0.0.1:{port}?connect_timeout={}ms&session_timeout={}ms&response_timeout=1500ms",
        CONNECT_TIMEOUT.as_millis(),
        SESSION_TIMEOUT.as_millis()
    );
    let budget = CONNECT_TIMEOUT + SESSION_TIMEOUT;
    expect_error(what, budget, kinds, ZkBackend::connect(&url)).await;
}

/// Every case ends as an unreachable engine (the client keeps no reason for a failed
/// handshake), never as a busy lock.
const KINDS: &[ErrorKind] = &[
    ErrorKind::Connection,
    ErrorKind::Protocol,
    ErrorKind::Timeout,
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_handshake_is_a_typed_error() {
    let mut bytes = response(2000, 42, 16);
    bytes.truncate(14);
    case("truncated", Answer::ThenClose(bytes), KINDS).await;
    case("closed at once", Answer::ThenClose(Vec::new()), KINDS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_length_prefix_of_2_pow_31_is_refused_unallocated() {
    let mut bytes = 0x7fff_ffffu32.to_be_bytes().to_vec();
    bytes.extend_from_slice(&[0; 64]);
    case("length prefix 2^31 - 1", Answer::Bytes(bytes), KINDS).await;
    let mut bytes = 0xffff_ffffu32.to_be_bytes().to_vec();
    bytes.extend_from_slice(&[0; 64]);
    case("length prefix -1", Answer::Bytes(bytes), KINDS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_and_the_wrong_fields_are_typed_errors() {
    case(
        "garbage",
        Answer::ThenClose(b"HTTP/1.1 400 Bad Request\r\n\r\n\x00\x01garbage".to_vec()),
        KINDS,
    )
    .await;
    // A password whose length field says 2^31 - 1 bytes, in a 37-byte response.
    case(
        "password length 2^31 - 1",
        Answer::Bytes(response(2000, 42, i32::MAX)),
        KINDS,
    )
    .await;
    case(
        "password length -5",
        Answer::Bytes(response(2000, 42, -5)),
        KINDS,
    )
    .await;
    // Session id 0 and timeout 0: ZooKeeper's answer to an expired session.
    case("session expired", Answer::Bytes(response(0, 0, 16)), KINDS).await;
    case(
        "negative timeout",
        Answer::Bytes(response(-1, 42, 16)),
        KINDS,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_byte_every_few_seconds_is_a_typed_error() {
    case(
        "one byte every 2 s",
        Answer::Trickle(response(2000, 42, 16), Duration::from_secs(2)),
        KINDS,
    )
    .await;
}
