#![doc = include_str!("../README.md")]

mod backend;
mod config;
mod error;
mod fenced;
#[cfg(feature = "tls")]
mod tls;
mod xact;

pub use backend::{PgBackend, lock_id};
pub use config::PgConfig;
pub use fenced::FencedUpdate;
/// The client library, whose `Client` runs the statements of an [`XactLock`]'s transaction.
pub use tokio_postgres;
pub use xact::XactLock;

/// The fuzz targets' way in (`fuzz/`): built only with `--cfg fuzzing`, never in a normal
/// build.
#[cfg(fuzzing)]
#[doc(hidden)]
pub mod fuzzing {
    /// A holder label as `status` reads it from a session's `application_name` (`<tag>
    /// <fence or -> <ttl ms> <owner>`): its fence, TTL and owner, if it is one.
    pub fn holder_label(app: &str) -> Option<(Option<u64>, i64, String)> {
        crate::backend::fuzz_label(app)
    }
}
