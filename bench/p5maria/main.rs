//! P5 on MariaDB, taken apart: the raw client's cycle with text and prepared statements, with
//! the sequence read that gives the fence, and distlock's cycle, in interleaved rounds (pinned:
//! this process and the server on CPU 0). Run it with `bash bench/p5maria.sh`.

use std::time::Instant;

use mysql_async::prelude::Queryable;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let pid = std::process::id().to_string();
    let pinned = std::process::Command::new("taskset")
        .args(["-acp", "0", &pid])
        .output()
        .is_ok_and(|o| o.status.success());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let db = distlock_testkit::MariaDb::start().expect("mariadbd");
    if pinned {
        db.pin_to_cpu(0);
    }
    let url = db.url("");
    let (rounds, n) = (8, 2000);
    rt.block_on(async {
        let mut raw = mysql_async::Conn::new(mysql_async::Opts::from_url(&url).expect("url"))
            .await
            .expect("connect");
        raw.query_drop("CREATE SEQUENCE IF NOT EXISTS probe_seq")
            .await
            .expect("sequence");
        let ours = distlock_core::LockClient::new(
            distlock_mysql::MysqlBackend::connect(&url)
                .await
                .expect("connect"),
        );
        let names = [
            "text GET_LOCK + RELEASE_LOCK",
            "prepared GET_LOCK + RELEASE_LOCK (the P5 floor)",
            "prepared, + NEXTVAL of a cached sequence",
            "distlock try_acquire + release",
        ];
        let mut res: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
        for round in 0..=rounds {
            let t0 = Instant::now();
            for _ in 0..n {
                let got: Option<i64> = raw.query_first("SELECT GET_LOCK('raw', 0)").await.unwrap();
                assert_eq!(got, Some(1));
                raw.query_drop("SELECT RELEASE_LOCK('raw')").await.unwrap();
            }
            let text = t0.elapsed().as_secs_f64() / n as f64;
            let t0 = Instant::now();
            for _ in 0..n {
                let got: Option<i64> =
                    raw.exec_first("SELECT GET_LOCK(?, 0)", ("raw",)).await.unwrap();
                assert_eq!(got, Some(1));
                let _: Option<i64> = raw.exec_first("SELECT RELEASE_LOCK(?)", ("raw",)).await.unwrap();
            }
            let prepared = t0.elapsed().as_secs_f64() / n as f64;
            let t0 = Instant::now();
            for _ in 0..n {
                let got: Option<i64> = raw
                    .exec_first(
                        "SELECT IF(GET_LOCK(?, 0) = 1, NEXTVAL(probe_seq), NULL)",
                        ("raw",),
                    )
                    .await
                    .unwrap();
                assert!(got.is_some());
                let _: Option<i64> = raw.exec_first("SELECT RELEASE_LOCK(?)", ("raw",)).await.unwrap();
            }
            let nextval = t0.elapsed().as_secs_f64() / n as f64;
            let t0 = Instant::now();
            for _ in 0..n {
                let g = ours.try_acquire("p5").await.unwrap().expect("free");
                g.release().await.unwrap();
            }
            let distlock = t0.elapsed().as_secs_f64() / n as f64;
            // Round 0 warms up.
            if round > 0 {
                for (r, v) in res.iter_mut().zip([text, prepared, nextval, distlock]) {
                    r.push(v * 1e6);
                }
            }
        }
        let floor = median(res[1].clone());
        println!(
            "MariaDB, one client, {} ({rounds} interleaved rounds of {n} cycles, medians)",
            if pinned { "pinned to CPU 0 with the server" } else { "not pinned" }
        );
        println!("| cycle | µs | vs the prepared floor |");
        println!("|---|---:|---:|");
        for (name, v) in names.iter().zip(res) {
            let m = median(v);
            println!("| {name} | {m:.1} | {:.2} |", floor / m);
        }
    });
}
