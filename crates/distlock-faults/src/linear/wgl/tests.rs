//! The search on small hand-made histories, and against a brute-force search over every order
//! on random tiny ones.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;

const FENCED: Model = Model { read_raises: true };
const LIMIT: u64 = 1_000_000;

fn read(call: i64, ret: i64, fence: u64, value: i64) -> Op {
    Op {
        call,
        ret: Some(ret),
        action: Action::Read {
            fence: Some(fence),
            value: Some(value),
        },
    }
}

fn write(call: i64, ret: i64, fence: u64, value: i64, accepted: bool) -> Op {
    Op {
        call,
        ret: Some(ret),
        action: Action::Write {
            fence: Some(fence),
            value,
            accepted: Some(accepted),
        },
    }
}

fn outcome(model: Model, ops: &[Op]) -> Outcome {
    check(model, State::default(), ops, LIMIT).outcome
}

fn linearizable(ops: &[Op]) -> bool {
    outcome(FENCED, ops) == Outcome::Linearizable
}

/// Every order that places each completed operation (and any of the others) after the
/// operations that returned before its call, tried one by one: how many fit the model (up to
/// `cap`).
fn orders(model: Model, ops: &[Op], cap: usize) -> usize {
    fn go(model: Model, ops: &[Op], placed: &mut Vec<bool>, s: State, cap: usize) -> usize {
        let mut found = usize::from(
            ops.iter()
                .zip(placed.iter())
                .all(|(o, &p)| p || o.ret.is_none()),
        );
        for i in 0..ops.len() {
            if found >= cap {
                break;
            }
            let blocked = (0..ops.len())
                .any(|j| !placed[j] && j != i && ops[j].ret.is_some_and(|r| r < ops[i].call));
            if placed[i] || blocked {
                continue;
            }
            if let Some(next) = model.step(s, ops[i].action) {
                placed[i] = true;
                found += go(model, ops, placed, next, cap - found);
                placed[i] = false;
            }
        }
        found
    }
    go(
        model,
        ops,
        &mut vec![false; ops.len()],
        State::default(),
        cap,
    )
}

#[test]
fn a_sequential_history_that_follows_the_rules_is_linearizable() {
    let ops = [
        write(0, 1, 1, 1, true),
        read(2, 3, 1, 1),
        read(4, 5, 2, 1),
        write(6, 7, 1, 2, false),
        write(8, 9, 2, 2, true),
        read(10, 11, 2, 2),
    ];
    assert!(linearizable(&ops));
    assert!(linearizable(&[]));
}

#[test]
fn a_stale_write_applied_is_caught() {
    // Fence 2 read (the floor is 2), then fence 1's write accepted.
    let ops = [read(0, 1, 2, 0), write(2, 3, 1, 1, true)];
    assert_eq!(
        outcome(FENCED, &ops),
        Outcome::NotLinearizable {
            op: 1,
            placed: 1,
            state: State { value: 0, floor: 2 }
        }
    );
    // After a write with fence 2.
    assert!(!linearizable(&[
        write(0, 1, 2, 1, true),
        write(2, 3, 1, 2, true)
    ]));
    // The same write refused is what the register must do.
    assert!(linearizable(&[read(0, 1, 2, 0), write(2, 3, 1, 1, false)]));
    // A row whose read does not raise the fence accepts it.
    assert_eq!(
        outcome(Model { read_raises: false }, &ops),
        Outcome::Linearizable
    );
}

#[test]
fn a_current_write_refused_is_caught() {
    assert!(!linearizable(&[
        write(0, 1, 3, 1, true),
        write(2, 3, 3, 2, false)
    ]));
}

#[test]
fn a_write_without_a_fence_is_refused() {
    let bare = |accepted| Op {
        call: 0,
        ret: Some(1),
        action: Action::Write {
            fence: None,
            value: 1,
            accepted: Some(accepted),
        },
    };
    assert!(linearizable(&[bare(false)]));
    assert!(!linearizable(&[bare(true)]));
}

#[test]
fn a_read_of_a_value_never_written_is_caught() {
    let ops = [write(0, 1, 1, 1, true), read(2, 3, 1, 7)];
    assert!(matches!(
        outcome(FENCED, &ops),
        Outcome::NotLinearizable { op: 1, .. }
    ));
}

#[test]
fn a_lost_acknowledged_write_is_caught() {
    // The write was accepted and returned; a later read still sees 0.
    let ops = [
        write(0, 1, 1, 1, true),
        read(2, 3, 1, 1),
        write(4, 5, 2, 2, true),
        read(6, 7, 2, 1),
    ];
    assert!(matches!(
        outcome(FENCED, &ops),
        Outcome::NotLinearizable {
            op: 3,
            placed: 3,
            ..
        }
    ));
}

#[test]
fn overlapping_operations_with_a_single_valid_order_are_found_in_it() {
    // All four overlap, and are called in the reverse of the one order that fits:
    // write 1 (fence 3), the read of 1 (fence 4: the floor goes to 4), write 2 (fence 5),
    // and fence 4's write, refused only once the floor is 5.
    let ops = [
        write(0, 100, 4, 3, false),
        write(1, 100, 5, 2, true),
        read(2, 100, 4, 1),
        write(3, 100, 3, 1, true),
    ];
    assert!(linearizable(&ops));
    assert_eq!(orders(FENCED, &ops, 10), 1);
    // With fence 4's write returning before fence 5's was called, no order fits.
    let mut cut = ops;
    cut[0].ret = Some(1);
    cut[1].call = 2;
    assert!(!linearizable(&cut));
}

#[test]
fn real_time_order_is_kept() {
    // Fence 5's write returned before fence 3's was called: fence 3's cannot be accepted.
    assert!(!linearizable(&[
        write(0, 1, 5, 2, true),
        write(2, 3, 3, 1, true)
    ]));
    // Overlapping, fence 3's may go first.
    assert!(linearizable(&[
        write(0, 3, 5, 2, true),
        write(1, 4, 3, 1, true)
    ]));
    // A read returned the value of a write called after it returned.
    assert!(!linearizable(&[read(0, 1, 1, 1), write(2, 3, 1, 1, true)]));
}

#[test]
fn an_operation_that_never_completed_may_take_effect_or_not() {
    let unknown = |call, fence, value| Op {
        call,
        ret: None,
        action: Action::Write {
            fence: Some(fence),
            value,
            accepted: None,
        },
    };
    // Never seen: it did not happen (or was refused).
    assert!(linearizable(&[unknown(0, 1, 5), read(1, 2, 1, 0)]));
    // Seen by a later read: it happened.
    assert!(linearizable(&[unknown(0, 1, 5), read(10, 11, 1, 5)]));
    // Seen by a read that returned before it was called: impossible.
    assert!(!linearizable(&[read(0, 1, 1, 5), unknown(2, 1, 5)]));
    // A read with an unknown answer still raises the floor, or does not.
    let raise = Op {
        call: 0,
        ret: None,
        action: Action::Read {
            fence: Some(9),
            value: None,
        },
    };
    assert!(linearizable(&[raise, write(1, 2, 3, 1, true)]));
    assert!(linearizable(&[raise, write(1, 2, 3, 1, false)]));
}

#[test]
fn the_search_gives_up_at_its_limit() {
    let ops: Vec<Op> = (0..20).map(|i| write(0, 100, i, i as i64, true)).collect();
    assert_eq!(
        check(FENCED, State::default(), &ops, 5).outcome,
        Outcome::Unknown
    );
}

#[test]
fn a_long_history_of_four_workers_checks_quickly() {
    // 4 workers, 3,000 operations, each worker's operations back to back and the workers'
    // overlapping: read then write with a rising fence, as the harness's holders do.
    let mut ops = Vec::new();
    let (mut value, mut floor) = (0i64, 0u64);
    for k in 0..1500u64 {
        let t = k as i64 * 10;
        let fence = k / 4 * 4 + 1;
        // Recorded in the order they were applied; intervals overlap their neighbours'.
        floor = floor.max(fence);
        ops.push(read(t - 15, t, fence, value));
        let accepted = fence >= floor;
        if accepted {
            value += 1;
            floor = fence;
        }
        ops.push(write(t - 10, t + 5, fence, value, accepted));
    }
    let started = std::time::Instant::now();
    let s = check(FENCED, State::default(), &ops, LIMIT);
    assert_eq!(s.outcome, Outcome::Linearizable);
    assert!(s.steps < 20 * ops.len() as u64, "{} steps", s.steps);
    assert!(started.elapsed().as_secs() < 5);
}

/// A random tiny history: half of them the record of a real execution (each operation applied
/// at a random moment of its interval), perhaps with one answer changed.
fn random_history(rng: &mut StdRng) -> (Model, Vec<Op>) {
    let model = Model {
        read_raises: rng.random_bool(0.7),
    };
    let n = rng.random_range(1..=6);
    let mut ops: Vec<Op> = (0..n)
        .map(|_| {
            let call = rng.random_range(0..20);
            let ret = (!rng.random_bool(0.15)).then(|| call + rng.random_range(0..10));
            let fence = (!rng.random_bool(0.1)).then(|| rng.random_range(0..4));
            let action = if rng.random_bool(0.4) {
                Action::Read {
                    fence,
                    value: (!rng.random_bool(0.1)).then(|| rng.random_range(0..3)),
                }
            } else {
                Action::Write {
                    fence,
                    value: rng.random_range(1..3),
                    accepted: (!rng.random_bool(0.1)).then(|| rng.random_bool(0.6)),
                }
            };
            Op { call, ret, action }
        })
        .collect();
    if rng.random_bool(0.5) {
        // Replay: each at a moment of its interval, the answers what the model gives.
        let mut at: Vec<(i64, usize)> = ops
            .iter()
            .enumerate()
            .map(|(i, o)| (rng.random_range(o.call..=o.ret.unwrap_or(o.call + 10)), i))
            .collect();
        at.sort_unstable();
        let mut s = State::default();
        for (_, i) in at {
            let a = &mut ops[i].action;
            match a {
                Action::Read { value, .. } => *value = Some(s.value),
                Action::Write {
                    fence, accepted, ..
                } => *accepted = Some(fence.is_some_and(|f| f >= s.floor)),
            }
            s = model.step(s, *a).expect("a replayed answer fits");
        }
        if rng.random_bool(0.5) {
            let i = rng.random_range(0..ops.len());
            match &mut ops[i].action {
                Action::Read { value, .. } => *value = Some(rng.random_range(0..3)),
                Action::Write { accepted, .. } => *accepted = accepted.map(|a| !a),
            }
        }
    }
    (model, ops)
}

#[test]
fn the_search_agrees_with_trying_every_order_on_random_tiny_histories() {
    let mut rng = StdRng::seed_from_u64(46);
    let (mut yes, mut no) = (0, 0);
    for case in 0..20_000 {
        let (model, ops) = random_history(&mut rng);
        let brute = orders(model, &ops, 1) > 0;
        let wgl = check(model, State::default(), &ops, LIMIT).outcome;
        assert_ne!(wgl, Outcome::Unknown);
        assert_eq!(
            wgl == Outcome::Linearizable,
            brute,
            "case {case}: {model:?} {ops:#?}"
        );
        if brute {
            yes += 1;
        } else {
            no += 1;
        }
    }
    // Both answers are well represented.
    assert!(yes > 3000 && no > 3000, "{yes} linearizable, {no} not");
}
