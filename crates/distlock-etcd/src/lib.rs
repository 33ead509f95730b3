#![doc = include_str!("../README.md")]
#![cfg_attr(not(test), warn(clippy::unwrap_used))]

mod backend;
mod config;
mod error;
mod list;
mod many;
mod members;
mod names;
mod session;
mod store;
#[doc(hidden)]
pub mod wire;

pub use backend::EtcdBackend;
pub use config::EtcdConfig;
