#![doc = include_str!("../README.md")]

mod backend;
mod config;

pub use backend::{MysqlBackend, lock_name, semaphore_name};
pub use config::MysqlConfig;
