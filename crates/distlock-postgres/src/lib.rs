#![doc = include_str!("../README.md")]

mod backend;
mod config;
mod error;

pub use backend::{PgBackend, lock_id};
pub use config::PgConfig;
