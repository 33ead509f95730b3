//! P11: a multi-name lock's uncontended cycle (`lock_many` of 2, 8 and 64 names, then its
//! release) beside P1's single name, one client on one Redis server, in interleaved rounds:
//! the cycle's time and the commands it sends, beside two raw floors on redis-rs (below).
//! Bar: 8 names cost at most 1.5× P1's cycle.

use std::time::Instant;

use distlock_core::{LockClient, Released};
use distlock_redis::RedisBackend;

use crate::common::{distlock_cycles, median};

/// The sizes measured beside the single name.
pub(crate) const SIZES: [usize; 3] = [2, 8, 64];

/// One row: a number of names, distlock's median cycle time and commands per cycle, and the
/// two floors' cycle times.
pub(crate) struct Row {
    pub(crate) names: usize,
    pub(crate) cycle_us: f64,
    pub(crate) commands: f64,
    pub(crate) least_us: f64,
    pub(crate) same_us: f64,
}

/// A raw multi-name lock: its two scripts, and the keys each takes of a name.
struct Floor {
    take: redis::Script,
    give: redis::Script,
    /// The suffixes of a name's keys the take script gets ('' is the lock key itself).
    take_keys: &'static [&'static str],
    give_keys: &'static [&'static str],
}

/// The least a client can ask of the server for a multi-name lock with a fence per name, in
/// two round trips: one script reads every name's lock key (one `MGET`), and when all are free
/// sets each (`SET PX`) and raises each name's fence counter (`INCR`, an integer: the cheapest
/// counter there is); one script reads them again (`MGET`) and deletes those still holding the
/// token (one `DEL`).
const LEAST_TAKE: &str = r"
local n = #KEYS / 2
local locks = {}
for i = 1, n do
  locks[i] = KEYS[2 * i - 1]
end
local cur = redis.call('MGET', unpack(locks))
for i = 1, n do
  if cur[i] then
    return 0
  end
end
for i = 1, n do
  redis.call('SET', locks[i], ARGV[1], 'PX', 30000)
  redis.call('INCR', KEYS[2 * i])
end
return 1";
const LEAST_GIVE: &str = r"
local cur = redis.call('MGET', unpack(KEYS))
local ours = {}
for i = 1, #KEYS do
  if cur[i] == ARGV[1] then
    ours[#ours + 1] = KEYS[i]
  end
end
if #ours > 0 then
  redis.call('DEL', unpack(ours))
end
return 1";

/// The same two round trips with the writes distlock makes a name: the fence from a counter
/// that never goes back after a restart (`ZADD GT CH` with the server's clock, as the Redis
/// crate's `fence.lua`), and on the way out a look for queued clients (one `EXISTS` for all)
/// before the one `DEL`. What distlock's own scripts add to it is their checks: a resent
/// request, a holder's token in a longer value, the client's own floor for each fence.
const SAME_TAKE: &str = r"
local n = #KEYS / 2
local locks = {}
for i = 1, n do
  locks[i] = KEYS[2 * i - 1]
end
local cur = redis.call('MGET', unpack(locks))
for i = 1, n do
  if cur[i] then
    return 0
  end
end
local now = redis.call('TIME')
local floor = string.format('%d', tonumber(now[1]) * 1000000 + tonumber(now[2]) + 1)
local out = {1}
for i = 1, n do
  local f = floor
  if redis.call('ZADD', KEYS[2 * i], 'GT', 'CH', f, 'f') == 0 then
    f = redis.call('ZINCRBY', KEYS[2 * i], 1, 'f')
  end
  redis.call('SET', locks[i], ARGV[1], 'PX', 30000)
  out[i + 1] = tonumber(f)
end
return out";
const SAME_GIVE: &str = r"
local n = #KEYS / 2
local locks, queues = {}, {}
for i = 1, n do
  locks[i], queues[i] = KEYS[2 * i - 1], KEYS[2 * i]
end
local cur = redis.call('MGET', unpack(locks))
local ours = {}
for i = 1, n do
  if cur[i] == ARGV[1] then
    ours[#ours + 1] = locks[i]
  end
end
if redis.call('EXISTS', unpack(queues)) == 0 and #ours > 0 then
  redis.call('DEL', unpack(ours))
end
return 1";

impl Floor {
    fn least() -> Floor {
        Floor {
            take: redis::Script::new(LEAST_TAKE),
            give: redis::Script::new(LEAST_GIVE),
            take_keys: &["", ":fence"],
            give_keys: &[""],
        }
    }

    fn same_writes() -> Floor {
        Floor {
            take: redis::Script::new(SAME_TAKE),
            give: redis::Script::new(SAME_GIVE),
            take_keys: &["", ":fence"],
            give_keys: &["", ":queue"],
        }
    }

    /// `cycles` raw cycles on `n` names (its own keys, under `tag`); cycles per second.
    async fn cycles(
        &self,
        conn: &mut redis::aio::MultiplexedConnection,
        tag: &str,
        n: usize,
        cycles: usize,
    ) -> f64 {
        let locks: Vec<String> = (0..n)
            .map(|i| format!("raw{tag}:{{order}}:{n}:{i}"))
            .collect();
        let t0 = Instant::now();
        for c in 0..cycles {
            let token = format!("t{c}");
            let mut inv = self.take.prepare_invoke();
            for l in &locks {
                for suffix in self.take_keys {
                    inv.key(format!("{l}{suffix}"));
                }
            }
            let got: redis::Value = inv.arg(&token).invoke_async(conn).await.expect("take");
            assert!(
                !matches!(got, redis::Value::Int(0)),
                "raw names busy: {got:?}"
            );
            let mut inv = self.give.prepare_invoke();
            for l in &locks {
                for suffix in self.give_keys {
                    inv.key(format!("{l}{suffix}"));
                }
            }
            let _: i64 = inv.arg(&token).invoke_async(conn).await.expect("give");
        }
        cycles as f64 / t0.elapsed().as_secs_f64()
    }
}

/// `cycles` multi-name cycles on `names`; cycles per second.
async fn many_cycles(client: &LockClient, names: &[String], cycles: usize) -> f64 {
    let t0 = Instant::now();
    for _ in 0..cycles {
        let g = client
            .lock_many(names.iter().cloned())
            .try_acquire()
            .await
            .expect("acquire")
            .expect("uncontended");
        assert_eq!(g.release().await.expect("release"), Released::Held);
    }
    cycles as f64 / t0.elapsed().as_secs_f64()
}

/// The commands a client has sent so far.
fn sent(client: &LockClient) -> u64 {
    client
        .engine::<RedisBackend>()
        .expect("a Redis client")
        .commands_sent()
}

/// Interleaved rounds of the single name (P1's cycle) and each size, and of both floors at
/// every size (one name included), on the server at `url`: the rows, the single name's first.
pub(crate) async fn measure(url: &str, rounds: usize, cycles: usize) -> Vec<Row> {
    let client = LockClient::new(RedisBackend::connect(url).await.expect("connect"));
    let mut raw = redis::Client::open(url)
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("raw connection");
    let (least, same) = (Floor::least(), Floor::same_writes());
    let sizes: Vec<usize> = std::iter::once(1).chain(SIZES).collect();
    let sets: Vec<Vec<String>> = SIZES
        .iter()
        .map(|&n| (0..n).map(|i| format!("p11:{{order}}:{n}:{i}")).collect())
        .collect();
    // Warm up: connections opened, scripts loaded.
    distlock_cycles(&client, "p11:{order}:one", 50).await;
    for set in &sets {
        many_cycles(&client, set, 20).await;
    }
    for &n in &sizes {
        least.cycles(&mut raw, "l", n, 20).await;
        same.cycles(&mut raw, "s", n, 20).await;
    }
    let k = sizes.len();
    let (mut per_sec, mut commands) = (vec![Vec::new(); k], vec![Vec::new(); k]);
    let (mut leasts, mut sames) = (vec![Vec::new(); k], vec![Vec::new(); k]);
    for _ in 0..rounds {
        for (i, &n) in sizes.iter().enumerate() {
            let before = sent(&client);
            per_sec[i].push(if i == 0 {
                distlock_cycles(&client, "p11:{order}:one", cycles).await
            } else {
                many_cycles(&client, &sets[i - 1], cycles).await
            });
            commands[i].push((sent(&client) - before) as f64 / cycles as f64);
            leasts[i].push(least.cycles(&mut raw, "l", n, cycles).await);
            sames[i].push(same.cycles(&mut raw, "s", n, cycles).await);
        }
    }
    let us = |v: Vec<f64>| 1e6 / median(v);
    sizes
        .into_iter()
        .zip(per_sec.into_iter().zip(commands))
        .zip(leasts.into_iter().zip(sames))
        .map(|((names, (p, c)), (l, s))| Row {
            names,
            cycle_us: us(p),
            commands: median(c),
            least_us: us(l),
            same_us: us(s),
        })
        .collect()
}

/// The table, with P1's cycle as the unit (each floor with its own single name's), and the
/// bar.
pub(crate) fn render(rows: &[Row], rounds: usize, cycles: usize, pinning: &str) -> String {
    let mut out = format!(
        "P11 multi-name locks, uncontended lock_many + release, one client ({pinning}), \
         {rounds} interleaved round(s) × {cycles} cycles, medians; floors: raw scripts on \
         redis-rs, the least a fenced multi-name lock asks, and the same with distlock's writes\n\
         | names | cycle µs | vs one name | commands per cycle | least floor µs | its vs its one name \
         | same-writes floor µs | its vs its one name | distlock vs same-writes floor |\n\
         |---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    );
    let Some(first) = rows.first() else {
        return out;
    };
    for r in rows {
        out.push_str(&format!(
            "| {} | {:.1} | {:.2} | {:.2} | {:.1} | {:.2} | {:.1} | {:.2} | {:.2} |\n",
            r.names,
            r.cycle_us,
            r.cycle_us / first.cycle_us,
            r.commands,
            r.least_us,
            r.least_us / first.least_us,
            r.same_us,
            r.same_us / first.same_us,
            r.cycle_us / r.same_us,
        ));
    }
    if let Some(eight) = rows.iter().find(|r| r.names == 8) {
        let ratio = eight.cycle_us / first.cycle_us;
        out.push_str(&format!(
            "\nBar: 8 names at most 1.5× one name's cycle: {ratio:.2}× ({}); the least floor's 8 \
             names {:.2}× P1's cycle, the same-writes floor's {:.2}×\n",
            if ratio <= 1.5 { "met" } else { "**missed**" },
            eight.least_us / first.cycle_us,
            eight.same_us / first.cycle_us,
        ));
    }
    out
}
