//! P9: what the metrics and the spans cost the uncontended cycle on Redis (P1's cycle).
//!
//! The same binary (built with the `metrics` feature, as the command is) runs the cycle in two
//! kinds of child process, alternately, round after round: one with nothing installed (the
//! facade and `tracing` find no recorder and no subscriber), one with a Prometheus recorder
//! and a `tracing` registry subscriber at INFO (the acquire and release spans are built and
//! kept, as an OpenTelemetry layer would have them). A child process each, since neither a
//! recorder nor a subscriber can be taken back once installed.

use std::process::Command;
use std::time::Duration;

use distlock::redis::RedisBackend;
use distlock_core::LockClient;

use crate::common::{distlock_cycles, median, pin_self};

/// The medians of the two kinds of process, in cycles per second.
pub(crate) struct Figures {
    pub(crate) off: f64,
    pub(crate) on: f64,
    pub(crate) rounds: usize,
    pub(crate) cycles: usize,
}

impl Figures {
    /// How much slower the cycle is with them on (0.02: 2 % slower).
    pub(crate) fn slowdown(&self) -> f64 {
        if self.on > 0.0 {
            self.off / self.on - 1.0
        } else {
            f64::INFINITY
        }
    }

    pub(crate) fn render(&self, pinning: &str) -> String {
        format!(
            "P9 metrics and spans on the uncontended cycle (Redis, P1's cycle): the same build, \
             a process with nothing installed against one with a Prometheus recorder and a \
             tracing registry at INFO; {} interleaved round(s) × {} cycles, medians ({pinning})\n\n\
             | process | cycles/s | slower by |\n|---|---:|---:|\n\
             | nothing installed | {:.0} | - |\n\
             | metrics recorded, spans kept | {:.0} | {:.1} % |\n",
            self.rounds,
            self.cycles,
            self.off,
            self.on,
            self.slowdown() * 100.0
        )
    }

    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "off_cycles_per_s": self.off,
            "on_cycles_per_s": self.on,
            "slowdown": self.slowdown(),
            "rounds": self.rounds,
            "cycles": self.cycles,
        })
    }
}

/// Runs the rounds: one child with them off, one with them on, each round.
pub(crate) fn run(url: &str, rounds: usize, cycles: usize, pin: bool) -> Figures {
    let exe = std::env::current_exe().expect("own path");
    let child = |observe: bool| -> f64 {
        let mut cmd = Command::new(&exe);
        cmd.args([
            "observed-cycles",
            "--url",
            url,
            "--cycles",
            &cycles.to_string(),
        ]);
        if observe {
            cmd.arg("--observe");
        }
        if pin {
            cmd.arg("--pin");
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
    };
    let (mut off, mut on) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        off.push(child(false));
        on.push(child(true));
    }
    Figures {
        off: median(off),
        on: median(on),
        rounds,
        cycles,
    }
}

/// A child: installs the recorder and the subscriber when `observe`, then times `cycles`
/// uncontended cycles after a warm-up, and prints cycles per second.
pub(crate) fn child(url: &str, cycles: usize, observe: bool, pin: bool) {
    if pin {
        pin_self(0);
    }
    if observe {
        metrics_exporter_prometheus::PrometheusBuilder::new()
            .install_recorder()
            .expect("install the recorder");
        use tracing_subscriber::layer::SubscriberExt;
        let subscriber =
            tracing_subscriber::registry().with(tracing_subscriber::filter::LevelFilter::INFO);
        tracing::subscriber::set_global_default(subscriber).expect("install the subscriber");
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let per_sec = rt.block_on(async {
        let c = LockClient::new(RedisBackend::connect(url).await.expect("connect"));
        distlock_cycles(&c, "p9", 200).await;
        tokio::time::sleep(Duration::from_millis(10)).await;
        distlock_cycles(&c, "p9", cycles).await
    });
    println!("{per_sec:.1}");
}
