#![doc = include_str!("../README.md")]
#![allow(clippy::unwrap_used, clippy::missing_panics_doc)]

pub mod conformance;
mod process;
mod redis_server;

pub use process::{free_port, require_binary};
pub use redis_server::RedisServer;
