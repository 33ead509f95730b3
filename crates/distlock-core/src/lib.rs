#![doc = include_str!("../README.md")]
#![cfg_attr(not(test), warn(clippy::unwrap_used))]

// The layers, bottom up: the engine interface; a lease's state; the driver that calls the
// engine; the watchdog; the local queues; guards; taking a lease; the client and its requests.
mod acquire;
mod client;
mod clock;
mod driver;
mod duration;
mod election;
pub mod engine;
mod error;
mod fenced;
mod group;
mod guard;
mod key;
mod lease;
mod list;
mod local;
mod many;
pub mod metrics;
mod options;
pub mod recipes;
mod request;
#[doc(hidden)]
pub mod seeded;
mod sync;
mod token;
pub mod trace;
pub mod url;
mod watchdog;

pub use client::{LockClient, LockClientBuilder, default_owner};
pub use clock::{Clock, ManualClock, SystemClock};
pub use duration::parse_duration;
pub use election::{
    DEFAULT_OBSERVE_INTERVAL, Election, Leader, Leadership, MAX_VALUE_LEN, Observer,
};
pub use engine::{Backend, Fencing, HolderStatus, IntoBackend, LeaseKind, LockStatus, MAX_PERMITS};
pub use error::{BoxError, ErrorKind, LockError, error_chain};
pub use fenced::FencedClient;
pub use group::{
    DEFAULT_PARTITIONS, Group, GroupWatch, KeyOwner, MAX_GRACE, MAX_GROUP_LEN, MAX_MEMBER_LEN,
    MAX_PARTITIONS, Member, Membership, Owned, OwnershipEvent, PartitionState, View,
};
pub use guard::{
    DowngradeError, Fence, Fenced, Guard, LeakedLease, LockGuard, Permit, ReadGuard, Released,
    WriteGuard,
};
pub use key::{MAX_KEY_LEN, validate_key};
pub use lease::{LeaseEnd, LeaseHandle, LostReason};
pub use list::{ListedLock, Listing};
pub use many::{MAX_NAMES, ManyLockRequest, MultiGuard};
pub use options::{
    Backoff, DEFAULT_HANDOFF_STREAK, DEFAULT_WAKE_FALLBACK, LockOptions, LockOptionsBuilder,
    MAX_TTL, Wait, default_drift,
};
pub use request::LockRequest;
pub use token::{MAX_TOKEN_LEN, Token};
