#![doc = include_str!("../README.md")]
#![cfg_attr(not(test), warn(clippy::unwrap_used))]

mod backend;
mod config;
#[cfg(fuzzing)]
#[doc(hidden)]
pub mod fuzzing;
mod layout;
mod list;
mod many;
mod session;
mod store;

pub use backend::ZkBackend;
pub use config::ZkConfig;
pub use layout::Layout;
