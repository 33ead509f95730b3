//! The Lua scripts of the Redis engines, each with its reply type, loaded once per engine and
//! run by hash; and the helpers that turn arguments into their text.
//!
//! A script's source is its file with the helper files it uses prepended, named here
//! explicitly: `token.lua` (`is_ours`, the token check, written once) and `queue.lua` (`tell`
//! and `pass_on`, the hand-over to the next waiting client). Each script file says which it
//! uses in its header, and a test checks that the two agree.

use std::marker::PhantomData;
use std::time::Duration;

use distlock_core::engine::LeaseCheck;
use distlock_core::seeded::{self, SeededBug};

use crate::replies::{
    AcquireReply, FencedWrite, LeaveReply, MasterAcquireReply, ReleaseReply, ScriptReply,
    StatusReply,
};

/// The token check.
macro_rules! token_lua {
    () => {
        include_str!("scripts/token.lua")
    };
}
/// The helpers of the waiting clients' queue.
macro_rules! queue_lua {
    () => {
        include_str!("scripts/queue.lua")
    };
}

/// The release script's source (compare-and-delete, or hand-over to the next queued client).
pub(crate) const RELEASE_SOURCE: &str = concat!(
    token_lua!(),
    queue_lua!(),
    include_str!("scripts/release.lua")
);
const ACQUIRE_SOURCE: &str = concat!(token_lua!(), include_str!("scripts/acquire.lua"));
const EXTEND_SOURCE: &str = concat!(token_lua!(), include_str!("scripts/extend.lua"));
const STATUS_SOURCE: &str = include_str!("scripts/status.lua");
const LEAVE_SOURCE: &str = concat!(
    token_lua!(),
    queue_lua!(),
    include_str!("scripts/leave.lua")
);
const MASTER_ACQUIRE_SOURCE: &str =
    concat!(token_lua!(), include_str!("scripts/redlock_acquire.lua"));
const MASTER_RELEASE_SOURCE: &str =
    concat!(token_lua!(), include_str!("scripts/redlock_release.lua"));
const FENCED_SET_SOURCE: &str = include_str!("scripts/fenced_set.lua");

/// Seeded bug `plain-del`: release deletes the key whoever holds it.
const SEEDED_PLAIN_DEL: &str = "redis.call('DEL', KEYS[1]) return 1";
/// Seeded bug `unconditional-pexpire`: renewal extends the key whoever holds it.
const SEEDED_PEXPIRE: &str = "return redis.call('PEXPIRE', KEYS[1], ARGV[2])";

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
}

impl Scripts {
    pub(crate) fn new() -> Self {
        Scripts {
            acquire: LuaScript::new(ACQUIRE_SOURCE),
            extend: extend(),
            release: LuaScript::new(if seeded::on(SeededBug::PlainDel) {
                SEEDED_PLAIN_DEL
            } else {
                RELEASE_SOURCE
            }),
            status: LuaScript::new(STATUS_SOURCE),
            leave: LuaScript::new(LEAVE_SOURCE),
        }
    }
}

/// Redlock's scripts, run on each master.
pub(crate) struct MasterScripts {
    pub(crate) acquire: LuaScript<MasterAcquireReply>,
    pub(crate) extend: LuaScript<LeaseCheck>,
    pub(crate) release: LuaScript<LeaseCheck>,
}

impl MasterScripts {
    pub(crate) fn new() -> Self {
        MasterScripts {
            acquire: LuaScript::new(MASTER_ACQUIRE_SOURCE),
            extend: extend(),
            release: LuaScript::new(MASTER_RELEASE_SOURCE),
        }
    }
}

/// The compare-and-pexpire renewal (or, under the seeded bug, the unconditional one).
fn extend() -> LuaScript<LeaseCheck> {
    LuaScript::new(if seeded::on(SeededBug::UnconditionalPexpire) {
        SEEDED_PEXPIRE
    } else {
        EXTEND_SOURCE
    })
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
    u64::try_from(distlock_core::engine::unix_ms()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The script files and the helpers prepended to each here.
    const SCRIPTS: [(&str, &str, &[&str]); 8] = [
        ("acquire.lua", ACQUIRE_SOURCE, &["token.lua"]),
        ("extend.lua", EXTEND_SOURCE, &["token.lua"]),
        ("release.lua", RELEASE_SOURCE, &["token.lua", "queue.lua"]),
        ("status.lua", STATUS_SOURCE, &[]),
        ("leave.lua", LEAVE_SOURCE, &["token.lua", "queue.lua"]),
        ("redlock_acquire.lua", MASTER_ACQUIRE_SOURCE, &["token.lua"]),
        ("redlock_release.lua", MASTER_RELEASE_SOURCE, &["token.lua"]),
        ("fenced_set.lua", FENCED_SET_SOURCE, &[]),
    ];

    const HELPERS: [(&str, &str, &[&str]); 2] = [
        ("token.lua", token_lua!(), &["is_ours"]),
        ("queue.lua", queue_lua!(), &["tell", "pass_on"]),
    ];

    #[test]
    fn each_script_gets_the_helpers_it_calls_and_says_so() {
        for (file, source, included) in SCRIPTS {
            let own = source.rsplit("-- distlock").next().unwrap_or(source);
            for (helper, helper_source, functions) in HELPERS {
                let calls = functions.iter().any(|f| own.contains(&format!("{f}(")));
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
