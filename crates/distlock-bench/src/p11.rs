//! P11: a multi-name lock's uncontended cycle (`lock_many` of 2, 8 and 64 names, then its
//! release) beside P1's single name, one client on one Redis server, in interleaved rounds:
//! the cycle's time and the commands it sends. Bar: 8 names cost at most 1.5× P1's cycle.

use std::time::Instant;

use distlock_core::{LockClient, Released};
use distlock_redis::RedisBackend;

use crate::common::{distlock_cycles, median};

/// The sizes measured beside the single name.
pub(crate) const SIZES: [usize; 3] = [2, 8, 64];

/// One row: a number of names, its median cycle time and commands per cycle, and the raw
/// floor's cycle time.
pub(crate) struct Row {
    pub(crate) names: usize,
    pub(crate) cycle_us: f64,
    pub(crate) commands: f64,
    pub(crate) floor_us: f64,
}

/// The raw floor of a multi-name lock with a fence per name, on redis-rs: one script that takes
/// every name or none (`SET NX PX` each, undone if one is busy) and raises each name's fence
/// counter, then one script that deletes each name still holding the token. What any library
/// must do at least, in two round trips; distlock also keeps each name's holder and fence for
/// `status`, and hands a released name to a queued waiter.
const FLOOR_TAKE: &str = r"
local n = #KEYS / 2
for i = 1, n do
  if not redis.call('SET', KEYS[2 * i - 1], ARGV[1], 'NX', 'PX', 30000) then
    for j = 1, i - 1 do
      redis.call('DEL', KEYS[2 * j - 1])
    end
    return 0
  end
end
for i = 1, n do
  redis.call('ZINCRBY', KEYS[2 * i], 1, 'f')
end
return 1";
const FLOOR_GIVE: &str = r"
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[1] then
    redis.call('DEL', KEYS[i])
  end
end
return 1";

/// `cycles` raw multi-name cycles on `n` names (see [`FLOOR_TAKE`]); cycles per second.
async fn floor_cycles(
    conn: &mut redis::aio::MultiplexedConnection,
    n: usize,
    cycles: usize,
) -> f64 {
    let (take, give) = (
        redis::Script::new(FLOOR_TAKE),
        redis::Script::new(FLOOR_GIVE),
    );
    let locks: Vec<String> = (0..n).map(|i| format!("raw:{{order}}:{n}:{i}")).collect();
    let t0 = Instant::now();
    for c in 0..cycles {
        let token = format!("t{c}");
        let mut inv = take.prepare_invoke();
        for l in &locks {
            inv.key(l).key(format!("{l}:fence"));
        }
        let got: i64 = inv.arg(&token).invoke_async(conn).await.expect("take");
        assert_eq!(got, 1, "raw names busy");
        let mut inv = give.prepare_invoke();
        for l in &locks {
            inv.key(l);
        }
        let _: i64 = inv.arg(&token).invoke_async(conn).await.expect("give");
    }
    cycles as f64 / t0.elapsed().as_secs_f64()
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

/// Interleaved rounds of the single name (P1's cycle) and each size, on the server at `url`:
/// the rows, the single name's first.
pub(crate) async fn measure(url: &str, rounds: usize, cycles: usize) -> Vec<Row> {
    let client = LockClient::new(RedisBackend::connect(url).await.expect("connect"));
    let mut raw = redis::Client::open(url)
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("raw connection");
    let sets: Vec<Vec<String>> = SIZES
        .iter()
        .map(|&n| (0..n).map(|i| format!("p11:{{order}}:{n}:{i}")).collect())
        .collect();
    // Warm up: connections opened, scripts loaded.
    distlock_cycles(&client, "p11:{order}:one", 50).await;
    for set in &sets {
        many_cycles(&client, set, 20).await;
    }
    for &n in &SIZES {
        floor_cycles(&mut raw, n, 20).await;
    }
    let mut floors: Vec<Vec<f64>> = vec![Vec::new(); SIZES.len() + 1];
    let mut per_sec: Vec<Vec<f64>> = vec![Vec::new(); SIZES.len() + 1];
    let mut commands: Vec<Vec<f64>> = vec![Vec::new(); SIZES.len() + 1];
    for _ in 0..rounds {
        let before = sent(&client);
        per_sec[0].push(distlock_cycles(&client, "p11:{order}:one", cycles).await);
        commands[0].push((sent(&client) - before) as f64 / cycles as f64);
        for (i, set) in sets.iter().enumerate() {
            let before = sent(&client);
            per_sec[i + 1].push(many_cycles(&client, set, cycles).await);
            commands[i + 1].push((sent(&client) - before) as f64 / cycles as f64);
            floors[i + 1].push(floor_cycles(&mut raw, set.len(), cycles).await);
        }
    }
    floors[0].push(f64::NAN);
    std::iter::once(1)
        .chain(SIZES)
        .zip(per_sec.into_iter().zip(commands).zip(floors))
        .map(|(names, ((p, c), f))| Row {
            names,
            cycle_us: 1e6 / median(p),
            commands: median(c),
            floor_us: 1e6 / median(f),
        })
        .collect()
}

/// The table, with P1's cycle as the unit, and the bar.
pub(crate) fn render(rows: &[Row], rounds: usize, cycles: usize, pinning: &str) -> String {
    let mut out = format!(
        "P11 multi-name locks, uncontended lock_many + release, one client ({pinning}), \
         {rounds} interleaved round(s) × {cycles} cycles, medians\n\
         | names | cycle µs | vs one name | commands per cycle | raw floor µs | vs raw floor |\n\
         |---:|---:|---:|---:|---:|---:|\n"
    );
    let one = rows.first().map_or(f64::NAN, |r| r.cycle_us);
    for r in rows {
        let (floor, vs) = if r.floor_us.is_finite() {
            (
                format!("{:.1}", r.floor_us),
                format!("{:.2}", r.cycle_us / r.floor_us),
            )
        } else {
            ("-".to_owned(), "-".to_owned())
        };
        out.push_str(&format!(
            "| {} | {:.1} | {:.2} | {:.2} | {floor} | {vs} |\n",
            r.names,
            r.cycle_us,
            r.cycle_us / one,
            r.commands
        ));
    }
    if let Some(eight) = rows.iter().find(|r| r.names == 8) {
        let ratio = eight.cycle_us / one;
        out.push_str(&format!(
            "\nBar: 8 names at most 1.5× one name's cycle: {ratio:.2}× ({})\n",
            if ratio <= 1.5 { "met" } else { "**missed**" }
        ));
    }
    out
}
