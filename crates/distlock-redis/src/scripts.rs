//! The Lua scripts of the Redis engines, each with its reply type, loaded once per engine and
//! run by hash; and the helpers that turn arguments into their text.
//!
//! A script's source is its file with the helper files it uses prepended, named here
//! explicitly: `token.lua` (`is_ours`, the token check, written once), `fence.lua`
//! (`next_fence`, a new holder's fence) and `queue.lua` (`tell` and `pass_on`, the hand-over to
//! the next waiting client, which calls `next_fence`). Each script file says which it
//! uses in its header, and a test checks that the two agree.
//!
//! The token check is then written inline at each call ([`inline_token_check`]): Redis runs a
//! script's whole chunk at every call, so a helper function is a closure created anew each
//! time, and the check is on every acquire, renewal and release. What the closure costs the
//! server: `bench/notes.md`, "The Redis engine's direct connections".

use std::marker::PhantomData;
use std::sync::LazyLock;
use std::time::Duration;

use distlock_core::engine::LeaseCheck;
use distlock_core::seeded::{self, SeededBug};

use crate::replies::{
    AcquireReply, FencedWrite, LeaveReply, MasterAcquireReply, PermitReply, ReadReply,
    ReleaseReply, ScriptReply, StatusReply,
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

/// The helpers of the semaphore's scripts.
macro_rules! permits_lua {
    () => {
        include_str!("scripts/permits.lua")
    };
}

/// The release script's source (compare-and-delete, or hand-over to the next queued client).
const RELEASE_SOURCE: &str = concat!(
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
const FENCED_SET_SOURCE: &str = include_str!("scripts/fenced_set.lua");
// The reader's scripts, like the permit's, decide their common path before the helpers are
// defined.
const READ_ACQUIRE_SOURCE: &str = concat!(
    include_str!("scripts/read_acquire.lua"),
    fence_lua!(),
    queue_lua!(),
    include_str!("scripts/read_acquire_rest.lua")
);
const READ_EXTEND_SOURCE: &str = include_str!("scripts/read_extend.lua");
const READ_RELEASE_SOURCE: &str = concat!(
    include_str!("scripts/read_release.lua"),
    fence_lua!(),
    queue_lua!(),
    include_str!("scripts/read_release_rest.lua")
);
const DOWNGRADE_SOURCE: &str = concat!(
    token_lua!(),
    fence_lua!(),
    queue_lua!(),
    include_str!("scripts/downgrade.lua")
);
// The permit scripts run their common path before the helpers are defined (each definition
// is a closure made at every call): only their other paths, which follow, use them. The
// acquire's helpers are defined inside the block permit_acquire.lua opens and
// permit_acquire_rest.lua closes.
const PERMIT_ACQUIRE_SOURCE: &str = concat!(
    fence_lua!(),
    include_str!("scripts/permit_acquire.lua"),
    permits_lua!(),
    include_str!("scripts/permit_acquire_rest.lua")
);
const PERMIT_EXTEND_SOURCE: &str =
    concat!(permits_lua!(), include_str!("scripts/permit_extend.lua"));
const PERMIT_RELEASE_SOURCE: &str = concat!(
    include_str!("scripts/permit_release.lua"),
    fence_lua!(),
    queue_lua!(),
    permits_lua!(),
    include_str!("scripts/permit_release_rest.lua")
);

/// The release script as it is run (the token check inline).
pub(crate) static RELEASE: LazyLock<String> = LazyLock::new(|| inline_token_check(RELEASE_SOURCE));

/// `source` with the token check written inline wherever it calls `is_ours(a, b)` (each
/// argument a name or `ARGV[n]`), and `token.lua`'s definition of it taken out. The inline
/// text is the one expression the definition returns, its parameters replaced by the
/// arguments, so the check is still written once, in `token.lua`.
fn inline_token_check(source: &str) -> String {
    const HEAD: &str = "local function is_ours(cur, tok)\n  return ";
    let Some(start) = source.find(HEAD) else {
        return source.to_owned();
    };
    let body = &source[start + HEAD.len()..];
    let end = body
        .find("\nend\n")
        .expect("token.lua: is_ours ends with `end`");
    let check = &body[..end];
    let mut out = String::with_capacity(source.len());
    out.push_str(&source[..start]);
    let mut rest = &body[end + "\nend\n".len()..];
    while let Some(at) = rest.find("is_ours(") {
        let before = &rest[..at];
        // A name that only ends in is_ours (say my_is_ours) is not a call of it.
        if before.ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_') {
            out.push_str(&rest[..at + "is_ours(".len()]);
            rest = &rest[at + "is_ours(".len()..];
            continue;
        }
        out.push_str(before);
        let args = &rest[at + "is_ours(".len()..];
        let close = args.find(')').expect("is_ours(…) is closed");
        let (cur, tok) = args[..close]
            .split_once(',')
            .map(|(a, b)| (a.trim(), b.trim()))
            .expect("is_ours takes two arguments");
        for arg in [cur, tok] {
            assert!(
                simple_lua_arg(arg),
                "is_ours({cur}, {tok}): each argument a name or ARGV[n]"
            );
        }
        out.push('(');
        out.push_str(&substitute(check, &[("cur", cur), ("tok", tok)]));
        out.push(')');
        rest = &args[close + 1..];
    }
    out.push_str(rest);
    out
}

/// A Lua name, or `ARGV[n]`: safe to write in place of a parameter as it is.
fn simple_lua_arg(arg: &str) -> bool {
    let name = |s: &str| {
        s.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    name(arg)
        || arg
            .strip_prefix("ARGV[")
            .and_then(|r| r.strip_suffix(']'))
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// `expr` with each whole-word name in `names` replaced by its value.
fn substitute(expr: &str, names: &[(&str, &str)]) -> String {
    let mut out = String::with_capacity(expr.len() * 2);
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        let value = names.iter().find(|(n, _)| n == word).map(|(_, v)| *v);
        out.push_str(value.unwrap_or(word));
        word.clear();
    };
    let mut in_string = false;
    for c in expr.chars() {
        if c == '\'' {
            in_string = !in_string;
        }
        if !in_string && (c.is_ascii_alphanumeric() || c == '_') {
            word.push(c);
            continue;
        }
        flush(&mut word, &mut out);
        out.push(c);
    }
    flush(&mut word, &mut out);
    out
}

/// Seeded bug `plain-del`: release deletes the key whoever holds it.
const SEEDED_PLAIN_DEL: &str = "redis.call('DEL', KEYS[1]) return 1";
/// Seeded bug `counter-fence`: the fence is the bare counter (`ZINCRBY` without the floor of
/// `ZADD GT`); it replaces `fence.lua` in every script (and the first attempt's pipeline leaves
/// its `ZADD` out).
const SEEDED_COUNTER_FENCE: &str = "local function next_fence(fkey, seen)
  local f = redis.pcall('ZINCRBY', fkey, 1, 'f')
  if type(f) ~= 'string' then
    return nil, (type(f) == 'table' and f.err) or 'WRONGTYPE distlock: not a sorted set'
  end
  return tonumber(f)
end
";

/// `source`, or under the seeded bug `counter-fence`, `source` with the bare counter in place
/// of `fence.lua`.
fn fenced(source: &str) -> String {
    if seeded::on(SeededBug::CounterFence) {
        source.replace(fence_lua!(), SEEDED_COUNTER_FENCE)
    } else {
        source.to_owned()
    }
}

/// Seeded bugs `reader-ignores-writer` (the read script takes a share whoever holds the lock)
/// and `permit-over-count` (one permit more than asked: `held <= n` wherever the scripts ask
/// whether a permit is free).
fn seeded_kinds(source: &str) -> String {
    if seeded::on(SeededBug::ReaderIgnoresWriter) {
        source.replace("if cur and cur ~= MARK then", "if false then")
    } else if seeded::on(SeededBug::PermitOverCount) {
        source.replace("held < n", "held <= n")
    } else {
        source.to_owned()
    }
}

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
    /// The readers': a share, its renewal, its release.
    pub(crate) read_acquire: LuaScript<ReadReply>,
    pub(crate) read_extend: LuaScript<LeaseCheck>,
    pub(crate) read_release: LuaScript<LeaseCheck>,
    /// A writer turned into a reader.
    pub(crate) downgrade: LuaScript<LeaseCheck>,
    /// The semaphore's: a permit, its renewal, its release.
    pub(crate) permit_acquire: LuaScript<PermitReply>,
    pub(crate) permit_extend: LuaScript<LeaseCheck>,
    pub(crate) permit_release: LuaScript<LeaseCheck>,
}

impl Scripts {
    pub(crate) fn new() -> Self {
        Scripts {
            acquire: LuaScript::new(&inline_token_check(&fenced(ACQUIRE_SOURCE))),
            extend: extend(),
            release: LuaScript::new(&if seeded::on(SeededBug::PlainDel) {
                SEEDED_PLAIN_DEL.to_owned()
            } else {
                fenced(&RELEASE)
            }),
            status: LuaScript::new(STATUS_SOURCE),
            leave: LuaScript::new(&inline_token_check(&fenced(LEAVE_SOURCE))),
            read_acquire: LuaScript::new(&seeded_kinds(&fenced(READ_ACQUIRE_SOURCE))),
            read_extend: LuaScript::new(READ_EXTEND_SOURCE),
            read_release: LuaScript::new(&fenced(READ_RELEASE_SOURCE)),
            downgrade: LuaScript::new(&inline_token_check(&fenced(DOWNGRADE_SOURCE))),
            permit_acquire: LuaScript::new(&seeded_kinds(&fenced(PERMIT_ACQUIRE_SOURCE))),
            permit_extend: LuaScript::new(PERMIT_EXTEND_SOURCE),
            permit_release: LuaScript::new(&fenced(PERMIT_RELEASE_SOURCE)),
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
            acquire: LuaScript::new(&inline_token_check(MASTER_ACQUIRE_SOURCE)),
            extend: extend(),
            release: LuaScript::new(&inline_token_check(MASTER_RELEASE_SOURCE)),
        }
    }
}

/// The compare-and-pexpire renewal (or, under the seeded bug, the unconditional one).
fn extend() -> LuaScript<LeaseCheck> {
    if seeded::on(SeededBug::UnconditionalPexpire) {
        LuaScript::new(SEEDED_PEXPIRE)
    } else {
        LuaScript::new(&inline_token_check(EXTEND_SOURCE))
    }
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
    const SCRIPTS: [(&str, &str, &[&str]); 15] = [
        ("acquire.lua", ACQUIRE_SOURCE, &["token.lua", "fence.lua"]),
        ("extend.lua", EXTEND_SOURCE, &["token.lua"]),
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

    const HELPERS: [(&str, &str, &[&str]); 4] = [
        ("token.lua", token_lua!(), &["is_ours"]),
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
    fn the_token_check_is_written_inline_as_token_lua_says() {
        let extend = inline_token_check(EXTEND_SOURCE);
        assert!(!extend.contains("is_ours("), "{extend}");
        assert!(
            extend.contains(
                "if (cur == ARGV[1] or string.sub(cur, 1, #ARGV[1] + 1) == ARGV[1] .. ' ') then"
            ),
            "{extend}"
        );
        for (file, source, helpers) in SCRIPTS {
            let run = inline_token_check(source);
            assert!(!run.contains("is_ours("), "{file}: {run}");
            assert!(!run.contains("local function is_ours"), "{file}");
            // Everything else is kept as it was.
            if !helpers.contains(&"token.lua") {
                assert_eq!(run, source, "{file}");
            }
        }
        assert_eq!(
            substitute("cur == tok .. ' tok'", &[("cur", "c"), ("tok", "ARGV[2]")]),
            "c == ARGV[2] .. ' tok'"
        );
        assert!(simple_lua_arg("ARGV[12]") && simple_lua_arg("cur"));
        assert!(!simple_lua_arg("a .. b") && !simple_lua_arg("ARGV[]"));
    }

    #[test]
    fn the_seeded_kinds_bugs_find_the_lines_they_break() {
        assert!(READ_ACQUIRE_SOURCE.contains("if cur and cur ~= MARK then"));
        // The common path's test and the rest's.
        assert_eq!(PERMIT_ACQUIRE_SOURCE.matches("held < n").count(), 2);
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
