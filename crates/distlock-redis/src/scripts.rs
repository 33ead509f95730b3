//! The Lua scripts of the Redis engines, each with its reply type, loaded once per engine and
//! run by hash; and the helpers that turn arguments into their text.
//!
//! Each script is one file, run as it is written: its source is the helper files it uses,
//! prepended in order and named here explicitly, followed by its file. The helpers are
//! `token.lua` (`is_ours`, the token check, written once), `fence.lua` (`next_fence`, a new
//! holder's fence), `queue.lua` (`tell` and `pass_on`, the hand-over to the next waiting client,
//! which calls `next_fence`) and `permits.lua` (the semaphore's). Each script file says which it
//! uses in its header, and a test checks that the two agree.

use std::marker::PhantomData;
use std::time::Duration;

use distlock_core::engine::LeaseCheck;

use crate::replies::{
    AcquireReply, FencedWrite, LeaveReply, ManyReply, MasterAcquireReply, MasterManyReply,
    PermitReply, ReadReply, ReleaseReply, ScriptReply, StatusReply,
};

/// The token check.
macro_rules! token_lua {
    () => {
        include_str!("scripts/token.lua")
    };
}
/// The fence of a new holder.
macro_rules! fence_lua {
    () => {
        include_str!("scripts/fence.lua")
    };
}
/// The helpers of the waiting clients' queue.
macro_rules! queue_lua {
    () => {
        include_str!("scripts/queue.lua")
    };
}

/// The helper of the multi-name scripts.
macro_rules! many_lua {
    () => {
        include_str!("scripts/many.lua")
    };
}

/// The helpers of the semaphore's scripts.
macro_rules! permits_lua {
    () => {
        include_str!("scripts/permits.lua")
    };
}

/// The release script's source (compare-and-delete, or hand-over to the next queued client),
/// as the engine runs it (but for the seeded bug `counter-fence`).
pub(crate) const RELEASE_SOURCE: &str = concat!(
    token_lua!(),
    fence_lua!(),
    queue_lua!(),
    include_str!("scripts/release.lua")
);
const ACQUIRE_SOURCE: &str = concat!(
    token_lua!(),
    fence_lua!(),
    include_str!("scripts/acquire.lua")
);
const EXTEND_SOURCE: &str = concat!(token_lua!(), include_str!("scripts/extend.lua"));
const ACQUIRE_MANY_SOURCE: &str = concat!(
    token_lua!(),
    fence_lua!(),
    many_lua!(),
    include_str!("scripts/acquire_many.lua")
);
const EXTEND_MANY_SOURCE: &str = concat!(
    token_lua!(),
    many_lua!(),
    include_str!("scripts/extend_many.lua")
);
const RELEASE_MANY_SOURCE: &str = concat!(
    token_lua!(),
    fence_lua!(),
    queue_lua!(),
    many_lua!(),
    include_str!("scripts/release_many.lua")
);
const RELABEL_SOURCE: &str = concat!(token_lua!(), include_str!("scripts/relabel.lua"));
const STATUS_SOURCE: &str = include_str!("scripts/status.lua");
const LEAVE_SOURCE: &str = concat!(
    token_lua!(),
    fence_lua!(),
    queue_lua!(),
    include_str!("scripts/leave.lua")
);
const MASTER_ACQUIRE_SOURCE: &str =
    concat!(token_lua!(), include_str!("scripts/redlock_acquire.lua"));
const MASTER_RELEASE_SOURCE: &str =
    concat!(token_lua!(), include_str!("scripts/redlock_release.lua"));
const MASTER_ACQUIRE_MANY_SOURCE: &str = concat!(
    token_lua!(),
    include_str!("scripts/redlock_acquire_many.lua")
);
const MASTER_RELEASE_MANY_SOURCE: &str = concat!(
    token_lua!(),
    include_str!("scripts/redlock_release_many.lua")
);
const FENCED_SET_SOURCE: &str = include_str!("scripts/fenced_set.lua");
const READ_ACQUIRE_SOURCE: &str = concat!(
    fence_lua!(),
    queue_lua!(),
    include_str!("scripts/read_acquire.lua")
);
const READ_EXTEND_SOURCE: &str = include_str!("scripts/read_extend.lua");
const READ_RELEASE_SOURCE: &str = concat!(
    fence_lua!(),
    queue_lua!(),
    include_str!("scripts/read_release.lua")
);
const DOWNGRADE_SOURCE: &str = concat!(
    token_lua!(),
    fence_lua!(),
    queue_lua!(),
    include_str!("scripts/downgrade.lua")
);
const PERMIT_ACQUIRE_SOURCE: &str = concat!(
    fence_lua!(),
    permits_lua!(),
    include_str!("scripts/permit_acquire.lua")
);
const PERMIT_EXTEND_SOURCE: &str =
    concat!(permits_lua!(), include_str!("scripts/permit_extend.lua"));
const PERMIT_RELEASE_SOURCE: &str = concat!(
    fence_lua!(),
    queue_lua!(),
    permits_lua!(),
    include_str!("scripts/permit_release.lua")
);

/// `source`; under the seeded bug `counter-fence` (a build with `--cfg distlock_seeded_bugs`),
/// `source` with the helper file `seeded_counter_fence.lua` in place of `fence.lua`: the fence is
/// the bare counter (`ZINCRBY` without the floor of `ZADD GT`), and the first attempt's pipeline
/// leaves its `ZADD` out.
fn fenced(source: &str) -> String {
    #[cfg(distlock_seeded_bugs)]
    if distlock_core::seeded::on(distlock_core::seeded::SeededBug::CounterFence) {
        return source.replace(
            fence_lua!(),
            include_str!("scripts/seeded_counter_fence.lua"),
        );
    }
    source.to_owned()
}

/// A Lua script and the type of its reply.
pub(crate) struct LuaScript<R> {
    script: redis::Script,
    reply: PhantomData<fn() -> R>,
}

impl<R: ScriptReply> LuaScript<R> {
    fn new(source: &str) -> Self {
        LuaScript {
            script: redis::Script::new(source),
            reply: PhantomData,
        }
    }

    /// The script's SHA1, for `EVALSHA`.
    pub(crate) fn hash(&self) -> &str {
        self.script.get_hash()
    }

    /// The script, to load it (after a `NOSCRIPT`).
    pub(crate) fn script(&self) -> &redis::Script {
        &self.script
    }
}

/// The single-instance engine's scripts, hashed once per backend and run with `EVALSHA`
/// (loaded on `NOSCRIPT`).
pub(crate) struct Scripts {
    pub(crate) acquire: LuaScript<AcquireReply>,
    pub(crate) extend: LuaScript<LeaseCheck>,
    pub(crate) release: LuaScript<ReleaseReply>,
    pub(crate) status: LuaScript<StatusReply>,
    pub(crate) leave: LuaScript<LeaveReply>,
    /// The readers': a share, its renewal, its release.
    pub(crate) read_acquire: LuaScript<ReadReply>,
    pub(crate) read_extend: LuaScript<LeaseCheck>,
    pub(crate) read_release: LuaScript<LeaseCheck>,
    /// A writer turned into a reader.
    pub(crate) downgrade: LuaScript<LeaseCheck>,
    /// A new label for a holder (an election's new value).
    pub(crate) relabel: LuaScript<LeaseCheck>,
    /// The semaphore's: a permit, its renewal, its release.
    pub(crate) permit_acquire: LuaScript<PermitReply>,
    pub(crate) permit_extend: LuaScript<LeaseCheck>,
    pub(crate) permit_release: LuaScript<LeaseCheck>,
    /// Several names at once (`lock_many`): taken, renewed, released.
    pub(crate) acquire_many: LuaScript<ManyReply>,
    pub(crate) extend_many: LuaScript<LeaseCheck>,
    pub(crate) release_many: LuaScript<LeaseCheck>,
}

impl Scripts {
    pub(crate) fn new() -> Self {
        Scripts {
            acquire: LuaScript::new(&fenced(ACQUIRE_SOURCE)),
            extend: extend(),
            release: LuaScript::new(&fenced(RELEASE_SOURCE)),
            status: LuaScript::new(STATUS_SOURCE),
            relabel: LuaScript::new(RELABEL_SOURCE),
            leave: LuaScript::new(&fenced(LEAVE_SOURCE)),
            read_acquire: LuaScript::new(&fenced(READ_ACQUIRE_SOURCE)),
            read_extend: LuaScript::new(READ_EXTEND_SOURCE),
            read_release: LuaScript::new(&fenced(READ_RELEASE_SOURCE)),
            downgrade: LuaScript::new(&fenced(DOWNGRADE_SOURCE)),
            permit_acquire: LuaScript::new(&fenced(PERMIT_ACQUIRE_SOURCE)),
            permit_extend: LuaScript::new(PERMIT_EXTEND_SOURCE),
            permit_release: LuaScript::new(&fenced(PERMIT_RELEASE_SOURCE)),
            acquire_many: LuaScript::new(&fenced(ACQUIRE_MANY_SOURCE)),
            extend_many: LuaScript::new(EXTEND_MANY_SOURCE),
            release_many: LuaScript::new(&fenced(RELEASE_MANY_SOURCE)),
        }
    }
}

/// Redlock's scripts, run on each master.
pub(crate) struct MasterScripts {
    pub(crate) acquire: LuaScript<MasterAcquireReply>,
    pub(crate) extend: LuaScript<LeaseCheck>,
    pub(crate) release: LuaScript<LeaseCheck>,
    /// Several names at once (`lock_many`): taken all or none, renewed all or none (the single
    /// engine's `extend_many.lua`, which reads and extends the lock keys only), released.
    pub(crate) acquire_many: LuaScript<MasterManyReply>,
    pub(crate) extend_many: LuaScript<LeaseCheck>,
    pub(crate) release_many: LuaScript<LeaseCheck>,
}

impl MasterScripts {
    pub(crate) fn new() -> Self {
        MasterScripts {
            acquire: LuaScript::new(MASTER_ACQUIRE_SOURCE),
            extend: extend(),
            release: LuaScript::new(MASTER_RELEASE_SOURCE),
            acquire_many: LuaScript::new(MASTER_ACQUIRE_MANY_SOURCE),
            extend_many: LuaScript::new(EXTEND_MANY_SOURCE),
            release_many: LuaScript::new(MASTER_RELEASE_MANY_SOURCE),
        }
    }
}

/// The compare-and-pexpire renewal.
fn extend() -> LuaScript<LeaseCheck> {
    LuaScript::new(EXTEND_SOURCE)
}

/// The fenced write to a protected resource.
pub(crate) fn fenced_set() -> LuaScript<FencedWrite> {
    LuaScript::new(FENCED_SET_SOURCE)
}

/// A TTL as the scripts take it: whole milliseconds.
pub(crate) fn ttl_ms(ttl: Duration) -> u64 {
    // Options guarantee whole milliseconds ≥ 1 and at most a year; clamp anyway.
    (ttl.as_millis() as u64).max(1)
}

/// The wall clock in ms since the epoch (shown as a holder's start; never used for deadlines).
pub(crate) fn unix_ms() -> u64 {
    u64::try_from(distlock_core::recipes::unix_ms()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The script files and the helpers prepended to each here.
    const SCRIPTS: [(&str, &str, &[&str]); 21] = [
        (
            "acquire_many.lua",
            ACQUIRE_MANY_SOURCE,
            &["token.lua", "fence.lua", "many.lua"],
        ),
        (
            "extend_many.lua",
            EXTEND_MANY_SOURCE,
            &["token.lua", "many.lua"],
        ),
        (
            "release_many.lua",
            RELEASE_MANY_SOURCE,
            &["token.lua", "fence.lua", "queue.lua", "many.lua"],
        ),
        ("acquire.lua", ACQUIRE_SOURCE, &["token.lua", "fence.lua"]),
        ("extend.lua", EXTEND_SOURCE, &["token.lua"]),
        ("relabel.lua", RELABEL_SOURCE, &["token.lua"]),
        (
            "release.lua",
            RELEASE_SOURCE,
            &["token.lua", "fence.lua", "queue.lua"],
        ),
        ("status.lua", STATUS_SOURCE, &[]),
        (
            "leave.lua",
            LEAVE_SOURCE,
            &["token.lua", "fence.lua", "queue.lua"],
        ),
        ("redlock_acquire.lua", MASTER_ACQUIRE_SOURCE, &["token.lua"]),
        ("redlock_release.lua", MASTER_RELEASE_SOURCE, &["token.lua"]),
        (
            "redlock_acquire_many.lua",
            MASTER_ACQUIRE_MANY_SOURCE,
            &["token.lua"],
        ),
        (
            "redlock_release_many.lua",
            MASTER_RELEASE_MANY_SOURCE,
            &["token.lua"],
        ),
        ("fenced_set.lua", FENCED_SET_SOURCE, &[]),
        (
            "permit_acquire.lua",
            PERMIT_ACQUIRE_SOURCE,
            &["fence.lua", "permits.lua"],
        ),
        ("permit_extend.lua", PERMIT_EXTEND_SOURCE, &["permits.lua"]),
        (
            "read_acquire.lua",
            READ_ACQUIRE_SOURCE,
            &["fence.lua", "queue.lua"],
        ),
        ("read_extend.lua", READ_EXTEND_SOURCE, &[]),
        (
            "read_release.lua",
            READ_RELEASE_SOURCE,
            &["fence.lua", "queue.lua"],
        ),
        (
            "downgrade.lua",
            DOWNGRADE_SOURCE,
            &["token.lua", "fence.lua", "queue.lua"],
        ),
        (
            "permit_release.lua",
            PERMIT_RELEASE_SOURCE,
            &["fence.lua", "queue.lua", "permits.lua"],
        ),
    ];

    const HELPERS: [(&str, &str, &[&str]); 5] = [
        ("token.lua", token_lua!(), &["is_ours"]),
        ("many.lua", many_lua!(), &["values_of"]),
        ("fence.lua", fence_lua!(), &["next_fence"]),
        ("queue.lua", queue_lua!(), &["tell", "pass_on"]),
        (
            "permits.lua",
            permits_lua!(),
            &[
                "server_ms",
                "find_holder",
                "sweep_holders",
                "live_holders",
                "sweep_queue",
                "cover",
            ],
        ),
    ];

    #[test]
    fn each_script_gets_the_helpers_it_calls_and_says_so() {
        for (file, source, included) in SCRIPTS {
            let own = source.rsplit("-- distlock").next().unwrap_or(source);
            // What the script runs of its own, and of the other helpers it includes (pass_on
            // calls next_fence).
            let runs: String = HELPERS
                .iter()
                .filter(|(h, _, _)| included.contains(h))
                .map(|(_, src, _)| *src)
                .chain([own])
                .collect();
            for (helper, helper_source, functions) in HELPERS {
                let runs_here = runs.replace(helper_source, "");
                let calls = functions
                    .iter()
                    .any(|f| runs_here.contains(&format!("{f}(")));
                let has = included.contains(&helper);
                assert_eq!(calls, has, "{file}: calls {helper}'s functions: {calls}");
                assert_eq!(source.contains(helper_source), has, "{file}: {helper}");
                assert_eq!(
                    own.contains(&format!("({helper})")),
                    has,
                    "{file} names {helper} in its header"
                );
            }
        }
    }

    #[test]
    fn the_token_check_is_written_once() {
        for (file, source, _) in SCRIPTS {
            let own = source.rsplit("-- distlock").next().unwrap_or(source);
            assert!(
                !own.contains("string.sub(cur, 1, #"),
                "{file} compares a token by hand: use is_ours"
            );
        }
    }
}
