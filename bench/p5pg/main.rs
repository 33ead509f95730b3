//! P5 on PostgreSQL, taken apart: the raw floor, the engine's statements with one part taken
//! away at a time (raw tokio-postgres, prepared, one connection), and distlock's cycle. Run it
//! with `bash bench/p5pg.sh`, which also counts the server's instructions under callgrind.
//!
//! `p5pg time URL ROUNDS N MODE...`: interleaved rounds of N cycles of each mode, medians (µs
//! a cycle). `p5pg count URL MODE N`: N cycles of one mode, then the pids of the server's
//! client backends (for the callgrind counts).
//!
//! Modes: `floor`; `nextval` (the floor with the fence); `engine`, the statements of
//! `73ecd8a` (the tickets' checks, the settings, a `SELECT 1` behind the acquire), then
//! `no-select1`, `no-check` (the acquire's check), `no-notify` (the release's), `no-label` (the
//! two `set_config`), `no-fence`, each without one part more; `m-bare`, `m-flat`, `m-sub`, the
//! marker's probe in place of the checks (bare, then with the settings as NULL parameters, flat
//! or in a subquery: the forms weighed for the fast statement); `distlock`, the engine of this
//! checkout through `LockClient`.

use std::time::Instant;

use tokio_postgres::{Client, NoTls, Statement};

/// The engine's statements as `open_session` prepared them before this probe's commit, and
/// those without one part each.
const CHECK: &str = "EXISTS (SELECT 1 FROM public.distlock_waiters w \
     WHERE w.lock_id = $1::bigint AND w.until > now() \
     AND ($4::bigint IS NULL OR w.seq < $4::bigint) AND true)";
const LABEL: &str = "set_config('idle_session_timeout', $2::text, false) \
     || set_config('application_name', left('distlock - ' || $2::text || ' ' || $3::text, 63), false)";
const NOTIFY: &str = "CASE WHEN EXISTS (SELECT 1 FROM public.distlock_waiters w \
     WHERE w.lock_id = $1::bigint AND w.until > now() - interval '1 minute') \
     THEN pg_notify('distlock:' || $1::bigint::text, '') END";

/// A release that notifies when a marker is held (two int4 keys $2, $3).
const MARKED_UNLOCK: &str = "SELECT pg_advisory_unlock($1::bigint), \
     CASE WHEN NOT pg_try_advisory_xact_lock($2::int, $3::int) \
     THEN pg_notify('distlock:' || $1::bigint::text, '') END";

/// A mode's acquire and release statements, and whether a `SELECT 1` follows the acquire.
struct Mode {
    acquire: String,
    release: String,
    committed: bool,
    /// Parameters $1..$4 (else $1 only); with a marker, $5 and $6 too (and $2, $3 to the
    /// release).
    four: bool,
    marker: bool,
}

fn mode(name: &str) -> Option<Mode> {
    let full = |check: bool, label: bool, fence: &str| {
        let ahead = if check { CHECK } else { "$4::bigint < 0" };
        let label = if label { LABEL } else { "$2::text || $3::text" };
        format!(
            "SELECT g.fence, CASE WHEN g.fence IS NOT NULL THEN {label} END \
             FROM (SELECT CASE WHEN {ahead} THEN NULL \
                               WHEN pg_try_advisory_lock($1::bigint) THEN {fence} END AS fence) g"
        )
    };
    let nextval = "nextval('public.distlock_fence')";
    let unlock = "SELECT pg_advisory_unlock($1::bigint)".to_owned();
    let unlock_notify = format!("SELECT pg_advisory_unlock($1::bigint), {NOTIFY}");
    let marker = name.starts_with("m-");
    let m = |acquire: String, release: String, committed, four| Mode {
        acquire,
        release,
        committed,
        four,
        marker,
    };
    Some(match name {
        "floor" => m(
            "SELECT pg_try_advisory_lock($1)".into(),
            "SELECT pg_advisory_unlock($1)".into(),
            false,
            false,
        ),
        "nextval" => m(
            format!("SELECT CASE WHEN pg_try_advisory_lock($1::bigint) THEN {nextval} END"),
            unlock.clone(),
            false,
            false,
        ),
        "engine" => m(full(true, true, nextval), unlock_notify.clone(), true, true),
        "no-select1" => m(
            full(true, true, nextval),
            unlock_notify.clone(),
            false,
            true,
        ),
        "no-check" => m(
            full(false, true, nextval),
            unlock_notify.clone(),
            false,
            true,
        ),
        "no-notify" => m(full(false, true, nextval), unlock.clone(), false, true),
        "no-label" => m(full(false, false, nextval), unlock.clone(), false, true),
        // The marker test in place of the check (two int4 keys $5, $6), the settings only when
        // they change (NULL here: the steady state).
        "m-sub" => m(
            format!(
                "SELECT g.fence, CASE WHEN g.fence > 0 THEN concat( \
                   CASE WHEN $2::text IS NOT NULL THEN set_config('idle_session_timeout', $2, false) END, \
                   CASE WHEN $3::text IS NOT NULL THEN set_config('application_name', $3, false) END) END \
                 FROM (SELECT CASE WHEN NOT pg_try_advisory_xact_lock($5::int, $6::int) THEN -1 \
                                   WHEN $4::bigint IS NOT NULL THEN -1 \
                                   WHEN pg_try_advisory_lock($1::bigint) THEN {nextval} END AS fence) g"
            ),
            MARKED_UNLOCK.into(),
            false,
            true,
        ),
        "m-flat" => m(
            format!(
                "SELECT CASE WHEN NOT pg_try_advisory_xact_lock($5::int, $6::int) THEN -1 \
                             WHEN $4::bigint IS NOT NULL THEN -1 \
                             WHEN pg_try_advisory_lock($1::bigint) THEN {nextval} \
                               + 0 * length(concat( \
                   CASE WHEN $2::text IS NOT NULL THEN set_config('idle_session_timeout', $2, false) END, \
                   CASE WHEN $3::text IS NOT NULL THEN set_config('application_name', $3, false) END)) END"
            ),
            MARKED_UNLOCK.into(),
            false,
            true,
        ),
        "m-bare" => m(
            format!(
                "SELECT CASE WHEN NOT pg_try_advisory_xact_lock($2::int, $3::int) THEN -1 \
                             WHEN pg_try_advisory_lock($1::bigint) THEN {nextval} END"
            ),
            MARKED_UNLOCK.into(),
            false,
            true,
        ),
        "no-fence" => m(full(false, false, "1::bigint"), unlock.clone(), false, true),
        _ => return None,
    })
}

struct Raw {
    client: Client,
    acquire: Statement,
    release: Statement,
    committed: Option<Statement>,
    four: bool,
    marker: bool,
}

async fn raw(url: &str, m: &Mode) -> Raw {
    let (client, conn) = tokio_postgres::connect(url, NoTls).await.expect("connect");
    tokio::spawn(conn);
    client
        .batch_execute("SET synchronous_commit = on")
        .await
        .expect("set");
    Raw {
        acquire: client.prepare(&m.acquire).await.expect("prepare"),
        release: client.prepare(&m.release).await.expect("prepare"),
        committed: if m.committed {
            Some(client.prepare("SELECT 1").await.expect("prepare"))
        } else {
            None
        },
        four: m.four,
        marker: m.marker,
        client,
    }
}

async fn raw_cycles(r: &Raw, n: usize) {
    let id = 42i64;
    let (ttl, owner, seq) = ("30000", "host/1", None::<i64>);
    let (none, k1, k2) = (None::<&str>, -1i32, 42i32);
    for _ in 0..n {
        let p4: [&(dyn tokio_postgres::types::ToSql + Sync); 4] = [&id, &ttl, &owner, &seq];
        let p6: [&(dyn tokio_postgres::types::ToSql + Sync); 6] =
            [&id, &none, &none, &seq, &k1, &k2];
        let params: &[&(dyn tokio_postgres::types::ToSql + Sync)] = if r.marker {
            if r.acquire.params().len() == 3 {
                &[&id, &k1, &k2]
            } else {
                &p6
            }
        } else if r.four {
            &p4
        } else {
            &p4[..1]
        };
        let row = r.client.query_opt(&r.acquire, params);
        match &r.committed {
            Some(c) => {
                let (row, one) = tokio::join!(row, r.client.query_one(c, &[]));
                one.expect("select 1");
                row.expect("acquire").expect("a row");
            }
            None => {
                row.await.expect("acquire").expect("a row");
            }
        }
        if r.marker {
            r.client
                .query_one(&r.release, &[&id, &k1, &k2])
                .await
                .expect("release");
        } else {
            r.client
                .query_one(&r.release, &[&id])
                .await
                .expect("release");
        }
    }
}

type Ours = distlock_core::LockClient;

async fn ours_cycles(c: &Ours, n: usize) {
    for _ in 0..n {
        let g = c.try_acquire("p5").await.expect("acquire").expect("free");
        assert!(g.release().await.expect("release").was_held());
    }
}

enum Runner {
    Raw(Raw),
    Ours(Ours),
}

async fn runner(url: &str, name: &str) -> Runner {
    if name == "distlock" {
        let b = distlock_postgres::PgBackend::connect(url)
            .await
            .expect("connect");
        return Runner::Ours(distlock_core::LockClient::new(b));
    }
    Runner::Raw(raw(url, &mode(name).unwrap_or_else(|| panic!("no mode {name}"))).await)
}

async fn run(r: &Runner, n: usize) {
    match r {
        Runner::Raw(r) => raw_cycles(r, n).await,
        Runner::Ours(c) => ours_cycles(c, n).await,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        // The engine's objects (sequence, tables), as its first connect creates them.
        let url = &args[1];
        drop(
            distlock_postgres::PgBackend::connect(url)
                .await
                .expect("connect"),
        );
        match args[0].as_str() {
            "count" => {
                let r = runner(url, &args[2]).await;
                let n: usize = args[3].parse().expect("N");
                run(&r, n).await;
                let (c, conn) = tokio_postgres::connect(url, NoTls).await.expect("connect");
                tokio::spawn(conn);
                let pids: Vec<String> = c
                    .query(
                        "SELECT pid::text FROM pg_stat_activity \
                         WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()",
                        &[],
                    )
                    .await
                    .expect("pids")
                    .iter()
                    .map(|r| r.get(0))
                    .collect();
                println!("pids {}", pids.join(" "));
            }
            "time" => {
                let rounds: usize = args[2].parse().expect("ROUNDS");
                let n: usize = args[3].parse().expect("N");
                let names = &args[4..];
                let mut runners = Vec::new();
                for name in names {
                    runners.push(runner(url, name).await);
                }
                let mut res = vec![Vec::new(); names.len()];
                for round in 0..=rounds {
                    for (r, out) in runners.iter().zip(res.iter_mut()) {
                        let t0 = Instant::now();
                        run(r, n).await;
                        // Round 0 warms up.
                        if round > 0 {
                            out.push(t0.elapsed().as_secs_f64() * 1e6 / n as f64);
                        }
                    }
                }
                let floor = names
                    .iter()
                    .position(|n| n == "floor")
                    .map(|i| median(res[i].clone()));
                println!("| cycle | µs | vs floor |\n|---|---:|---:|");
                for (name, v) in names.iter().zip(res) {
                    let m = median(v);
                    let ratio = floor.map(|f| format!("{:.2}", f / m)).unwrap_or_default();
                    println!("| {name} | {m:.1} | {ratio} |");
                }
            }
            other => panic!("no command {other}"),
        }
    });
}
