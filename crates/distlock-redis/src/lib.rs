#![doc = include_str!("../README.md")]
#![cfg_attr(not(test), warn(clippy::unwrap_used))]

mod backend;
mod config;
mod error;
mod keys;
mod lane;
mod subscriber;

pub use backend::RedisBackend;
pub use config::RedisConfig;
