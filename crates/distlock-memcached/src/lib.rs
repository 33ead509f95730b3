#![doc = include_str!("../README.md")]

mod backend;
mod config;
mod meta;

pub use backend::MemcachedBackend;
pub use config::MemcachedConfig;
