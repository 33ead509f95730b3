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
