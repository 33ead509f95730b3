//! The cost of an engine chosen at run time (issue 42): P1's uncontended cycle and P9's
//! observed cycle, each through the concrete `RedisBackend` and through `AnyBackend` (the engine
//! behind a pointer, every primitive's future boxed), in interleaved rounds on one server.

use std::process::Command;

use distlock_core::LockClient;
use distlock_core::engine::AnyBackend;
use distlock_redis::RedisBackend;

use crate::common::{RELEASE_LUA, distlock_cycles, median};
use crate::p1::floor_async;

/// Medians over the rounds, in cycles per second.
pub(crate) struct Figures {
    rounds: usize,
    cycles: usize,
    floor: f64,
    concrete: f64,
    any: f64,
    /// P9's four kinds of process: (observed, through `AnyBackend`).
    observed: [(bool, bool, f64); 4],
}

/// P1's rounds: the async floor, the concrete client and the boxed one, in turn.
pub(crate) async fn measure(
    url: &str,
    async_conn: &mut redis::aio::MultiplexedConnection,
    rounds: usize,
    cycles: usize,
    pin: bool,
) -> Figures {
    let script = redis::Script::new(RELEASE_LUA);
    let concrete = LockClient::new(RedisBackend::connect(url).await.expect("connect"));
    let any = LockClient::new(AnyBackend::new(
        RedisBackend::connect(url).await.expect("connect"),
    ));
    floor_async(async_conn, &script, 50).await;
    distlock_cycles(&concrete, "dispatch-c", 50).await;
    distlock_cycles(&any, "dispatch-a", 50).await;
    let (mut f, mut c, mut a) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        f.push(floor_async(async_conn, &script, cycles).await);
        // Alternate which of the two goes first, so neither always follows the floor.
        if round % 2 == 0 {
            c.push(distlock_cycles(&concrete, "dispatch-c", cycles).await);
            a.push(distlock_cycles(&any, "dispatch-a", cycles).await);
        } else {
            a.push(distlock_cycles(&any, "dispatch-a", cycles).await);
            c.push(distlock_cycles(&concrete, "dispatch-c", cycles).await);
        }
    }
    let kinds = [(false, false), (false, true), (true, false), (true, true)];
    let mut runs: Vec<Vec<f64>> = vec![Vec::new(); kinds.len()];
    for round in 0..rounds {
        for i in 0..kinds.len() {
            // Rotate the order of the four children from round to round.
            let k = (i + round) % kinds.len();
            let (observe, boxed) = kinds[k];
            runs[k].push(observed_child(url, cycles * 2, observe, boxed, pin));
        }
    }
    let mut observed = [(false, false, 0.0); 4];
    for (k, v) in runs.into_iter().enumerate() {
        observed[k] = (kinds[k].0, kinds[k].1, median(v));
    }
    Figures {
        rounds,
        cycles,
        floor: median(f),
        concrete: median(c),
        any: median(a),
        observed,
    }
}

/// One P9 child (see `p9::child`), through `AnyBackend` when `boxed`.
fn observed_child(url: &str, cycles: usize, observe: bool, boxed: bool, pin: bool) -> f64 {
    let exe = std::env::current_exe().expect("own path");
    let mut cmd = Command::new(exe);
    cmd.args([
        "observed-cycles",
        "--url",
        url,
        "--cycles",
        &cycles.to_string(),
    ]);
    for (on, flag) in [(observe, "--observe"), (boxed, "--any"), (pin, "--pin")] {
        if on {
            cmd.arg(flag);
        }
    }
    let out = cmd.output().expect("run a P9 child");
    assert!(
        out.status.success(),
        "P9 child: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("cycles per second")
}

impl Figures {
    pub(crate) fn render(&self, pinning: &str) -> String {
        let mut s = format!(
            "Engine chosen at run time ({pinning}; {} interleaved round(s), medians)\n\n\
             P1's cycle, {} cycles a round:\n\n\
             | client | cycles/s | × the concrete |\n|---|---:|---:|\n\
             | redis-rs async floor | {:.0} | {:.3} |\n\
             | LockClient<RedisBackend> | {:.0} | 1.000 |\n\
             | LockClient<AnyBackend> | {:.0} | {:.3} |\n\n\
             P9's cycle, {} cycles a child process:\n\n\
             | process | engine | cycles/s |\n|---|---|---:|\n",
            self.rounds,
            self.cycles,
            self.floor,
            self.floor / self.concrete,
            self.concrete,
            self.any,
            self.any / self.concrete,
            self.cycles * 2,
        );
        for (observe, boxed, v) in self.observed {
            s.push_str(&format!(
                "| {} | {} | {v:.0} |\n",
                if observe {
                    "metrics recorded, spans kept"
                } else {
                    "nothing installed"
                },
                if boxed { "AnyBackend" } else { "RedisBackend" },
            ));
        }
        s
    }
}
