#![doc = include_str!("../README.md")]

mod backend;

pub use backend::{MysqlBackend, MysqlConfig, lock_name};
