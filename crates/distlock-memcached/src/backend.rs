//! The memcached engine.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock_core::engine::{
    AcquireRequest, Attempt, Backend, BreakOutcome, Breaker, Capabilities, ErrorKind, Fencing,
    LeaseCheck, LeaseRef, Linger, LockError, LockStatus, Token,
};
use distlock_core::recipes::{CompactToken, HolderValue, MutexExt};
use sha2::{Digest, Sha256};

use crate::config::MemcachedConfig;
use crate::meta::{Arg, Pool, Reply};

/// Why memcached gives no fencing token (shown to users who ask for one).
const NO_FENCING: &str = "memcached has no counter that survives an eviction, a restart or a \
     change of server: a token from it could go backwards (see the crate README)";

/// memcached's longest key.
const MAX_ITEM_KEY: usize = 250;

/// The item's expiry for a lock TTL, in whole seconds: rounded up, plus [`CLOCK_SLACK`].
/// memcached's clock ticks once a second and an item expires when the tick reaches its expiry,
/// so an item can go up to a second before its seconds are up; and the tick is a timer of the
/// server's event loop, which runs late when the server is short of CPU: an item set just
/// before a late tick is a second older still at once. The two seconds keep the server's copy
/// at least as long as the holder trusts its lease with the clock up to a second late (with
/// one, a server starved of CPU let another client take a lock whose lease of 300 ms was still
/// held, in the conformance suite under CI's load).
fn item_ttl(ttl: Duration) -> u64 {
    ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0) + CLOCK_SLACK
}

/// The seconds [`item_ttl`] adds to a lease's.
const CLOCK_SLACK: u64 = 2;

/// A lock we hold: what its value says besides the token (renewals write the value again, made
/// from these) and the item's CAS. The item's name is made again from the lock's name, which
/// every call gives, when needed (a copy of it cost every lock about 80 bytes more, for a
/// concatenation at each renewal), and so is the value (a copy, about 100 bytes more).
struct Held {
    /// The lock's name, hashed (see [`HeldLocks`]).
    name: u64,
    since_ms: u64,
    /// The owner label, one copy for the locks taken with the same one (see `MemcachedShared::owner`);
    /// behind a thin pointer (8 bytes where an `Arc<str>` takes 16).
    owner: Arc<Box<str>>,
    cas: u64,
}

impl Held {
    /// The value we wrote for `token`.
    fn value(&self, token: &str) -> String {
        HolderValue {
            token,
            since_ms: Some(self.since_ms),
            owner: Some(&self.owner),
        }
        .encode()
    }
}

/// Our locks by token (compact: a generated token's 128 bits, 24 bytes with no allocation,
/// where a `Token` takes 40). A record keeps its
/// lock's name as a 64-bit hash, not a copy (a key of 24 bytes cost 40 more a lock): a call
/// whose token is right and name wrong does not reach the lock, and the token, 128 random
/// bits, is the lease's identity. foldhash rather than SipHash: touched at every acquisition
/// and release.
#[derive(Default)]
struct HeldLocks(HashMap<CompactToken, Held, foldhash::fast::RandomState>);

impl HeldLocks {
    fn hash(&self, name: &str) -> u64 {
        std::hash::BuildHasher::hash_one(self.0.hasher(), name)
    }

    /// Records the lock `name` taken with `token`: the item's `cas`, and the parts of the value
    /// written besides the token.
    fn insert(&mut self, token: Token, name: &str, since_ms: u64, owner: Arc<Box<str>>, cas: u64) {
        let held = Held {
            name: self.hash(name),
            since_ms,
            owner,
            cas,
        };
        self.0.insert(CompactToken::from(&token), held);
    }

    /// The record of `token`, if it was taken for the lock `name`.
    fn get(&self, token: &str, name: &str) -> Option<&Held> {
        let name = self.hash(name);
        self.0
            .get(&CompactToken::of(token))
            .filter(|h| h.name == name)
    }

    /// See [`get`](Self::get).
    fn get_mut(&mut self, token: &str, name: &str) -> Option<&mut Held> {
        let name = self.hash(name);
        self.0
            .get_mut(&CompactToken::of(token))
            .filter(|h| h.name == name)
    }

    /// Removes the record of `token`, if it was taken for the lock `name`.
    fn remove(&mut self, token: &str, name: &str) -> Option<Held> {
        self.get(token, name)?;
        self.0.remove(&CompactToken::of(token))
    }

    /// The record of `token`, whatever its lock (a reply tagged with the token).
    fn by_token(&mut self, token: &str) -> Option<&mut Held> {
        self.0.get_mut(&CompactToken::of(token))
    }
}

struct MemcachedShared {
    config: MemcachedConfig,
    pool: Pool,
    held: Mutex<HeldLocks>,
    /// The owner label last used, shared by the locks taken with it.
    owner: Mutex<Option<Arc<Box<str>>>>,
}

impl MemcachedShared {
    /// `owner` as a shared copy (the last one used, when it is the same).
    fn owner(&self, owner: &str) -> Arc<Box<str>> {
        let mut last = self.owner.locked();
        match &*last {
            Some(o) if ***o == *owner => o.clone(),
            _ => {
                let o = Arc::new(Box::<str>::from(owner));
                *last = Some(o.clone());
                o
            }
        }
    }
}

/// A lock engine on memcached, as seed 000 builds it, with its repairs and its limits:
///
/// - **acquire** adds the item (`ms … ME`, "add" mode: only when absent) with an expiry and our
///   holder value, and keeps the CAS memcached gives back;
/// - **extend** writes the same value again only if the item still has our CAS (`ms … C<cas>`)
///   with the new expiry: a compare-and-touch, so a lock that expired and was taken by another
///   holder is never extended by us;
/// - **release** deletes only if the CAS is still ours (`md … C<cas>`), never another holder's
///   lock;
/// - **several names at once** (`lock_many`) are added one by one in their sorted order, and
///   the ones added are deleted again on the first busy name: ordered, not atomic (see
///   `backend/many.rs`);
/// - **no fencing token**: an eviction under memory pressure, a restart (memcached keeps
///   nothing) or a change of servers loses the lock silently, and no counter survives them. The
///   watchdog notices a lost item at its next renewal and the lost signal fires, but another
///   holder may already have started.
#[derive(Clone)]
pub struct MemcachedBackend {
    inner: Arc<MemcachedShared>,
}

impl fmt::Debug for MemcachedBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemcachedBackend")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

fn unexpected(doing: &str, r: &Reply) -> LockError {
    LockError::new(
        ErrorKind::Protocol,
        format!("{doing}: memcached answered {r}"),
    )
}

impl MemcachedBackend {
    /// Connects to the server a URL names (see [`MemcachedConfig`]) and checks that it speaks
    /// the meta protocol (memcached 1.6 or later).
    ///
    /// # Errors
    /// `Config` for a bad URL; `Connection` or `Timeout` when the server does not answer;
    /// `Protocol` when it is not a meta-protocol memcached.
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        Self::with_config(MemcachedConfig::from_url(url)?).await
    }

    /// Connects with an explicit configuration.
    ///
    /// # Errors
    /// As [`connect`](Self::connect).
    pub async fn with_config(config: MemcachedConfig) -> Result<Self, LockError> {
        #[cfg(feature = "tls")]
        let tls = match &config.tls {
            Some(settings) => Some(crate::meta::Tls {
                connector: settings.connector()?,
                settings: settings.clone(),
            }),
            None => None,
        };
        let pool = Pool::new(
            config.host.clone(),
            config.connect_timeout,
            config.response_timeout,
            #[cfg(feature = "tls")]
            tls,
        );
        let backend = MemcachedBackend {
            inner: Arc::new(MemcachedShared {
                config,
                pool,
                held: Mutex::new(HeldLocks::default()),
                owner: Mutex::new(None),
            }),
        };
        // A meta no-op answers `MN`... which our reader does not take; a miss does: `EN`.
        let probe = backend.item("distlock-probe");
        backend
            .inner
            .pool
            .call(&[Arg::Word("mg"), Arg::Word(&probe)], None)
            .await?;
        Ok(backend)
    }

    /// The item of the lock `name`: `<prefix><name>` when memcached can store that key as it
    /// is, else `<prefix>sha256:<hex>` of the name (too long, or with spaces or control bytes).
    pub fn item(&self, name: &str) -> String {
        let prefix = &self.inner.config.prefix;
        let plain = prefix.len() + name.len() <= MAX_ITEM_KEY
            && name.bytes().all(|b| b > b' ' && b != 0x7f);
        if plain {
            let mut item = String::with_capacity(prefix.len() + name.len());
            item.push_str(prefix);
            item.push_str(name);
            return item;
        }
        let digest = Sha256::digest(name.as_bytes());
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        format!("{prefix}sha256:{hex}")
    }

    /// Reads the replies of this token's given-up requests (an add or a renewal whose reply
    /// was lost or never awaited): the server has carried them out once this returns. A stored
    /// one gave the item a CAS that our record must now carry.
    ///
    /// A renewal given up in a pipeline is read with the pipeline's other replies: each gives
    /// its own lock's record its CAS.
    async fn settle(&self, token: &str) -> Result<(), LockError> {
        let held = &self.inner.held;
        let mut apply = |tag: &str, r: &Reply| {
            if r.code == "HD"
                && let Some(cas) = r.cas
                && let Some(h) = held.locked().by_token(tag)
            {
                h.cas = cas;
            }
        };
        self.inner.pool.settle(token, &mut apply).await
    }

    /// The CAS of `item` if it still carries our `token` (read now); `None` when it is gone or
    /// another holder's.
    async fn cas_if_ours(&self, item: &str, token: &str) -> Result<Option<u64>, LockError> {
        Ok(match self.read(item).await? {
            Some((value, cas, _)) if HolderValue::parse(&value).token == token => Some(cas),
            _ => None,
        })
    }

    /// A renewal of our lock `key` refused for its CAS (`EX`). The item may still be ours with a
    /// CAS this client has not learned: a request given up before its reply whose effect came
    /// late (a pipeline's, read by another settle meanwhile, or one whose connection broke).
    /// Read it: if it carries our token, take its CAS and renew once more; otherwise it is
    /// another holder's.
    pub(super) async fn renew_again(
        &self,
        key: &str,
        token: &str,
        ttl: Duration,
    ) -> Result<LeaseCheck, LockError> {
        let item = self.item(key);
        let Some(cas) = self.cas_if_ours(&item, token).await? else {
            return Ok(LeaseCheck::Foreign);
        };
        match self.inner.held.locked().get_mut(token, key) {
            Some(h) => h.cas = cas,
            None => return Ok(LeaseCheck::Missing),
        }
        let Some(renewal) = self.renewal(key, token) else {
            return Ok(LeaseCheck::Missing);
        };
        let r = self
            .inner
            .pool
            .call_tagged(
                &renewal.line(ttl),
                Some(renewal.value.as_bytes()),
                Some(token),
            )
            .await?;
        self.renewed(token, &r)
    }

    /// Reads the item: our token's value and CAS, if it is there.
    async fn read(&self, item: &str) -> Result<Option<(String, u64, Option<i64>)>, LockError> {
        let r = self
            .inner
            .pool
            .call(
                &[
                    Arg::Word("mg"),
                    Arg::Word(item),
                    Arg::Word("v"),
                    Arg::Word("c"),
                    Arg::Word("t"),
                ],
                None,
            )
            .await?;
        match r.code {
            "EN" => Ok(None),
            "VA" => {
                let value =
                    String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned();
                Ok(Some((value, r.cas.unwrap_or(0), r.ttl)))
            }
            _ => Err(unexpected("reading a lock", &r)),
        }
    }
}

#[distlock_core::engine::async_trait]
impl Backend for MemcachedBackend {
    fn name(&self) -> &'static str {
        "memcached"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(Fencing::Unavailable(NO_FENCING), true)
            .other_kinds_because(
                "memcached can change one key at a time and may evict any of them, so a set of \
                 readers or permits cannot be kept whole; use Redis, etcd, ZooKeeper or \
                 PostgreSQL for these kinds",
            )
            .no_list_because(
                "memcached has no bounded scan of its keys (its crawler walks the whole cache), \
                 so it cannot say which locks exist",
            )
    }

    async fn acquire(&self, req: &AcquireRequest<'_>) -> Result<Attempt, LockError> {
        const DOING: &str = "acquiring a memcached lock";
        let item = self.item(req.name);
        // A resend: the add may have been stored before its reply was lost, and is ours if it
        // carries our token. The given-up add is settled first: the read must see its effect.
        if req.mode.is_resend() {
            self.settle(req.token.as_str()).await?;
        }
        if req.mode.is_resend()
            && let Some((value, cas, _)) = self.read(&item).await?
            && HolderValue::parse(&value).token == req.token.as_str()
        {
            // Written by this client: its time and label, which renewals write again.
            let ours = HolderValue::parse(&value);
            let owner = self.inner.owner(ours.owner.unwrap_or(req.owner));
            let since_ms = ours.since_ms.unwrap_or(0);
            let token = req.token.clone();
            self.inner
                .held
                .locked()
                .insert(token, req.name, since_ms, owner, cas);
            return Ok(Attempt::Acquired { fence: None });
        }
        let holder = HolderValue::now(req.token.as_str(), req.owner);
        let value = holder.encode();
        let line = [
            Arg::Word("ms"),
            Arg::Word(&item),
            Arg::Num(value.len() as u64),
            Arg::Flag('T', item_ttl(req.ttl)),
            Arg::Word("ME"),
            Arg::Word("c"),
        ];
        let r = self
            .inner
            .pool
            .call_tagged(&line, Some(value.as_bytes()), Some(req.token.as_str()))
            .await?;
        match r.code {
            "HD" => {
                let cas = r.cas.ok_or_else(|| unexpected(DOING, &r))?;
                let owner = self.inner.owner(req.owner);
                let since_ms = holder.since_ms.unwrap_or(0);
                let token = req.token.clone();
                self.inner
                    .held
                    .locked()
                    .insert(token, req.name, since_ms, owner, cas);
                Ok(Attempt::Acquired { fence: None })
            }
            "NS" => {
                let holder_ttl = if req.mode.waits() {
                    self.read(&item).await?.and_then(|(_, _, t)| {
                        t.filter(|&t| t >= 0)
                            .map(|t| Duration::from_secs(u64::try_from(t).unwrap_or(0)))
                    })
                } else {
                    None
                };
                Ok(Attempt::Busy { holder_ttl })
            }
            _ => Err(unexpected(DOING, &r)),
        }
    }

    async fn renew(&self, lease: &LeaseRef<'_>, ttl: Duration) -> Result<LeaseCheck, LockError> {
        let token = lease.token.as_str();
        self.settle(token).await?;
        let Some(renewal) = self.renewal(lease.name, token) else {
            return Ok(LeaseCheck::Missing);
        };
        let line = renewal.line(ttl);
        let r = self
            .inner
            .pool
            .call_tagged(&line, Some(renewal.value.as_bytes()), Some(token))
            .await?;
        if r.code == "EX" {
            return self.renew_again(lease.name, token, ttl).await;
        }
        self.renewed(token, &r)
    }

    async fn release(&self, lease: &LeaseRef<'_>) -> Result<LeaseCheck, LockError> {
        let (key, token) = (lease.name, lease.token);
        self.settle(token.as_str()).await?;
        let held = self.inner.held.locked().remove(token.as_str(), key);
        let (item, cas) = match held {
            Some(h) => (self.item(key), h.cas),
            None => {
                // No record: an acquire cancelled after its add was sent (the core cleans up
                // with its token). Ours if the item carries our token: delete it by the CAS
                // read now, so a newer holder's lock still survives.
                let item = self.item(key);
                match self.read(&item).await? {
                    Some((value, cas, _)) if HolderValue::parse(&value).token == token.as_str() => {
                        (item, cas)
                    }
                    _ => return Ok(LeaseCheck::Missing),
                }
            }
        };
        let r = self.delete(&item, cas).await?;
        if r.code != "EX" {
            return released(&r);
        }
        // Refused for its CAS: ours with a CAS not learned (see `renew_again`)? Read it, once.
        match self.cas_if_ours(&item, token.as_str()).await? {
            Some(cas) => released(&self.delete(&item, cas).await?),
            None => Ok(LeaseCheck::Foreign),
        }
    }

    async fn inspect(&self, key: &str) -> Result<LockStatus, LockError> {
        Ok(match self.read(&self.item(key)).await? {
            Some((value, _, ttl)) => holder_status(&value, ttl),
            None => LockStatus::free(),
        })
    }

    distlock_core::capability_getters!(
        breaker: Breaker,
        batch_renew: BatchRenew,
        linger: Linger,
        multi_lock: MultiLock,
    );
}

/// An item expires by itself: leaving the lease is renewing it (by its CAS) to the time left,
/// in whole seconds rounded up (and a second more: memcached's clock ticks in seconds), then
/// forgetting it here.
#[distlock_core::engine::async_trait]
impl Linger for MemcachedBackend {
    async fn linger(&self, lease: &LeaseRef<'_>, ttl: Duration) -> Result<LeaseCheck, LockError> {
        let check = self.renew(lease, ttl).await?;
        self.inner
            .held
            .locked()
            .remove(lease.token.as_str(), lease.name);
        Ok(check)
    }
}

#[distlock_core::engine::async_trait]
impl Breaker for MemcachedBackend {
    /// Deletes the item by the CAS it was read with.
    async fn break_once(&self, key: &str) -> Result<BreakOutcome, LockError> {
        let item = self.item(key);
        let Some((value, cas, ttl)) = self.read(&item).await? else {
            return Ok(BreakOutcome::Free);
        };
        let r = self
            .inner
            .pool
            .call(
                &[Arg::Word("md"), Arg::Word(&item), Arg::Flag('C', cas)],
                None,
            )
            .await?;
        match r.code {
            "HD" => Ok(BreakOutcome::Broken(holder_status(&value, ttl))),
            "NF" => Ok(BreakOutcome::Free),
            "EX" => Ok(BreakOutcome::Changed),
            _ => Err(unexpected("breaking a memcached lock", &r)),
        }
    }
}

impl MemcachedBackend {
    /// Deletes `item` if it still has `cas` (`md … C<cas>`).
    async fn delete(&self, item: &str, cas: u64) -> Result<Reply, LockError> {
        let by_cas = [Arg::Word("md"), Arg::Word(item), Arg::Flag('C', cas)];
        self.inner.pool.call(&by_cas, None).await
    }
}

/// What a release's delete answered.
fn released(r: &Reply) -> Result<LeaseCheck, LockError> {
    match r.code {
        "HD" => Ok(LeaseCheck::Ours),
        "NF" => Ok(LeaseCheck::Missing),
        "EX" => Ok(LeaseCheck::Foreign),
        _ => Err(unexpected("releasing a memcached lock", r)),
    }
}

/// A renewal to send: the compare-and-touch of our item (`ms … C<cas>`, writing our value
/// again with the new expiry).
struct Renewal {
    item: String,
    value: String,
    cas: u64,
}

impl Renewal {
    /// Its command line, for a TTL of `ttl`.
    fn line(&self, ttl: Duration) -> Vec<Arg<'_>> {
        vec![
            Arg::Word("ms"),
            Arg::Word(&self.item),
            Arg::Num(self.value.len() as u64),
            Arg::Flag('T', item_ttl(ttl)),
            Arg::Flag('C', self.cas),
            Arg::Word("c"),
        ]
    }
}

impl MemcachedBackend {
    /// The renewal of our lock `key` (our `token`); `None` when we hold no such lock.
    fn renewal(&self, key: &str, token: &str) -> Option<Renewal> {
        let (value, cas) = self
            .inner
            .held
            .locked()
            .get(token, key)
            .map(|h| (h.value(token), h.cas))?;
        Some(Renewal {
            item: self.item(key),
            value,
            cas,
        })
    }

    /// What a renewal's reply says; a renewal that took records the item's new CAS.
    fn renewed(&self, token: &str, r: &Reply) -> Result<LeaseCheck, LockError> {
        match r.code {
            "HD" => {
                if let Some(new) = r.cas
                    && let Some(h) = self.inner.held.locked().by_token(token)
                {
                    h.cas = new;
                }
                Ok(LeaseCheck::Ours)
            }
            "NF" => Ok(LeaseCheck::Missing),
            "EX" => Ok(LeaseCheck::Foreign),
            // Not stored: gone between the compare and the store.
            "NS" => Ok(LeaseCheck::Missing),
            _ => Err(unexpected("renewing a memcached lock", r)),
        }
    }
}

mod batch;
mod many;

/// `status` of a stored holder value and the item's remaining seconds.
fn holder_status(value: &str, ttl: Option<i64>) -> LockStatus {
    let owner = HolderValue::parse(value).label();
    // Less the seconds `item_ttl` adds: what the holder itself counts on.
    let slack = i64::try_from(CLOCK_SLACK).unwrap_or(0);
    let ttl = ttl
        .filter(|&t| t >= 0)
        .map(|t| Duration::from_secs(u64::try_from(t - slack).unwrap_or(0)));
    LockStatus::held(Some(owner), None, ttl)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiries_cover_the_clock_tick() {
        assert_eq!(item_ttl(Duration::from_secs(10)), 12);
        assert_eq!(item_ttl(Duration::from_millis(300)), 3);
        assert_eq!(item_ttl(Duration::from_millis(1500)), 4);
    }
}

/// What a held lock costs this engine: its record, in a map by token (a client holds 100,000).
#[cfg(all(test, target_pointer_width = "64"))]
#[test]
fn a_held_lock_is_a_record_of_32_bytes() {
    assert_eq!(std::mem::size_of::<Held>(), 32);
}
