#![doc = include_str!("../README.md")]
#![cfg_attr(not(test), warn(clippy::unwrap_used))]

mod backend;
mod config;
mod connection;
mod direct;
mod error;
mod fenced;
#[cfg(fuzzing)]
#[doc(hidden)]
pub mod fuzzing;
mod handover;
mod keys;
mod list;
mod redlock;
mod replies;
mod scripts;
mod seen;
mod sentinel;
mod subscriber;

pub use backend::RedisBackend;

/// The release script's source as the engine runs it, for the benchmark's raw-client floor
/// (not a stable API: its arguments are described in `scripts/release.lua`, which
/// follows the helpers).
#[doc(hidden)]
pub fn release_script() -> &'static str {
    scripts::RELEASE_SOURCE
}
pub use config::{ClusterConfig, RedisConfig};
pub use fenced::{fenced_get, fenced_set, lock_error, resource_connection};
/// The client library (redis-rs), whose connections [`fenced_set`] and [`fenced_get`] take: the
/// same version distlock is built with.
pub use redis;
pub use redlock::{RedlockBackend, RedlockConfig};
pub use sentinel::{SentinelBackend, SentinelConfig};
