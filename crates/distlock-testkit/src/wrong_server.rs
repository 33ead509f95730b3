//! Servers that answer wrongly: what each engine's `tests/wrong_server.rs` shares. A test
//! binary makes [`Counting`] its global allocator, starts a server of its own with
//! [`listen`], and checks each call with [`expect_error`]: a typed error of the kinds named,
//! within the call's time budget, with no single allocation of [`LARGE`] bytes and no
//! [`LARGE`] bytes more live at once, and no panic.

use std::future::Future;
use std::time::{Duration, Instant};

use distlock_core::{ErrorKind, LockError};
use tokio::net::{TcpListener, TcpStream};

pub use counting::Counting;

mod counting {
    //! The system's allocator, with the largest single request and the most bytes live at
    //! once counted.
    #![allow(unsafe_code)] // a `GlobalAlloc` is an unsafe trait; this one only forwards.

    use std::alloc::{GlobalAlloc, Layout, System};
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// The allocator to make a test binary's `#[global_allocator]`.
    #[derive(Debug)]
    pub struct Counting;

    pub(super) static LARGEST: AtomicUsize = AtomicUsize::new(0);
    pub(super) static LIVE: AtomicUsize = AtomicUsize::new(0);
    pub(super) static PEAK: AtomicUsize = AtomicUsize::new(0);

    fn note(size: usize) {
        LARGEST.fetch_max(size, Ordering::Relaxed);
        let live = LIVE.fetch_add(size, Ordering::Relaxed) + size;
        PEAK.fetch_max(live, Ordering::Relaxed);
    }

    // SAFETY: every call goes to `System` with the caller's own arguments.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            note(layout.size());
            // SAFETY: the caller's contract is `System`'s.
            unsafe { System.alloc(layout) }
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            // SAFETY: as above.
            unsafe { System.dealloc(ptr, layout) }
        }
        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            note(layout.size());
            // SAFETY: as above.
            unsafe { System.alloc_zeroed(layout) }
        }
        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            note(new_size);
            // SAFETY: as above.
            unsafe { System.realloc(ptr, layout, new_size) }
        }
    }
}

/// How long past its budget a call may take to give up: the runtime's timers are coarse under
/// load.
pub const MARGIN: Duration = Duration::from_millis(3500);

/// No allocation of the client may be this large, nor its live bytes grow by this much.
pub const LARGE: usize = 64 << 20;

/// A server on a free loopback port that hands each connection to `serve`; returns the port.
pub async fn listen<F, Fut>(serve: F) -> u16
where
    F: Fn(TcpStream) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port for the wrong server");
    let port = listener.local_addr().expect("its address").port();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(serve(stream));
        }
    });
    port
}

/// Runs `call`, which must fail: checks that it ends within `budget` + [`MARGIN`] with an
/// error of one of `kinds`, and allocates nothing large meanwhile. Returns the error and how
/// long the call took.
///
/// # Panics
/// When any of that does not hold, or when [`Counting`] is not the binary's allocator (the
/// memory checks would then pass without looking).
pub async fn expect_error<T>(
    what: &str,
    budget: Duration,
    kinds: &[ErrorKind],
    call: impl Future<Output = Result<T, LockError>>,
) -> (LockError, Duration) {
    use std::sync::atomic::Ordering::Relaxed;
    let before = counting::LIVE.load(Relaxed);
    let started = Instant::now();
    let result = tokio::time::timeout(budget + MARGIN + Duration::from_secs(20), call)
        .await
        .unwrap_or_else(|_| panic!("{what}: the call never returned"));
    let elapsed = started.elapsed();
    let Err(e) = result else {
        panic!("{what}: the call succeeded against a server that answers wrongly");
    };
    eprintln!("{what}: {:?} after {elapsed:?}: {e}", e.kind());
    assert!(kinds.contains(&e.kind()), "{what}: {:?}: {e}", e.kind());
    assert!(elapsed <= budget + MARGIN, "{what}: took {elapsed:?}");
    let largest = counting::LARGEST.load(Relaxed);
    assert!(
        largest > 0,
        "{what}: make distlock_testkit::wrong_server::Counting the test's #[global_allocator]"
    );
    assert!(largest < LARGE, "{what}: an allocation of {largest} bytes");
    let peak = counting::PEAK.load(Relaxed);
    assert!(
        peak.saturating_sub(before) < LARGE,
        "{what}: {peak} bytes live at once"
    );
    (e, elapsed)
}
