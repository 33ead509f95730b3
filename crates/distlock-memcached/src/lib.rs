#![doc = include_str!("../README.md")]

mod backend;
mod config;
mod meta;

pub use backend::MemcachedBackend;
pub use config::MemcachedConfig;

/// The fuzz targets' way in (`fuzz/`): built only with `--cfg fuzzing`, never in a normal
/// build.
#[cfg(fuzzing)]
#[doc(hidden)]
pub mod fuzzing {
    /// A meta-protocol reply as a server could send it: its first line read, and the value
    /// after a `VA` line checked and read as a holder value.
    pub fn meta_reply(bytes: &[u8]) {
        crate::meta::fuzz_reply(bytes);
    }
}
