//! Waiting for a Redis lock, on a real redis-server, in one test binary (one link, not three):
//! the watchdog and the lost signal (`watchdog`), the wake-ups a release sends and what they
//! cost (`wakeups`), and the server-side hand-over to the next client (`handover`). The
//! helpers they share are in `common`.

mod common;
mod handover;
mod wakeups;
mod watchdog;
