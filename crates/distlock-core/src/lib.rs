#![doc = include_str!("../README.md")]
#![cfg_attr(not(test), warn(clippy::unwrap_used))]

mod backend;
mod client;
mod clock;
mod duration;
mod error;
mod guard;
mod key;
mod lease;
mod local;
mod options;
#[doc(hidden)]
pub mod seeded;
mod token;
pub mod url;
mod wake;
mod watchdog;

pub use backend::{
    AcquireRequest, AnyBackend, Attempt, Backend, BoxFuture, Capabilities, DynBackend, Fencing,
    LeaseCheck, LockStatus, NextWaiter, RenewItem,
};
pub use client::{LockClient, LockClientBuilder, default_owner};
pub use clock::{Clock, ManualClock, SystemClock};
pub use duration::parse_duration;
pub use error::{BoxError, ErrorKind, LockError};
pub use guard::{LeakedLease, LockGuard, Released};
pub use key::{MAX_KEY_LEN, validate_key};
pub use lease::{LeaseHandle, LostReason};
pub use options::{
    Backoff, DEFAULT_HANDOFF_STREAK, DEFAULT_WAKE_FALLBACK, LockOptions, LockOptionsBuilder,
    MAX_TTL, Wait, default_drift,
};
pub use token::{MAX_TOKEN_LEN, Token, describe_holder_value, holder_value, unix_ms};
pub use wake::{PredecessorWatches, Subscription, WakeHub};
