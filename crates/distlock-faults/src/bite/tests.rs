//! The bite's state and its verdicts.

use super::*;

#[test]
fn every_scenario_has_a_bite_or_a_reason() {
    for s in crate::scenario::all() {
        match plan(&s) {
            Plan::Bite(_) => {}
            Plan::Cannot(why) => assert!(!why.is_empty(), "{}", s.name),
        }
    }
    let cannot = |n: &str| matches!(plan(&crate::scenario::by_name(n).unwrap()), Plan::Cannot(_));
    for n in [
        "redis-release-after-expiry",
        "redis-kill-holder",
        "redis-lost-replies",
        "redis-server-faults",
        "sentinel-wait",
        "redlock-restarts",
    ] {
        assert!(cannot(n), "{n}");
    }
    assert_eq!(
        plan(&crate::scenario::by_name("redis-partition").unwrap()),
        Plan::Bite(Kind::Cut)
    );
}

#[test]
fn a_check_of_an_armed_writer_starts_the_bite_and_its_write_is_held() {
    let mut b = Bite {
        kind: Some(Kind::Cut),
        ..Bite::default()
    };
    let ok = json!({"ev": "ok", "f": "acquire", "n": 3, "t": 10, "kind": "exclusive"});
    assert_eq!(b.observe(1, 99, &ok), None);
    assert!(!b.intercept(1, "read", &json!({"n": 3, "key": "k"})));
    let check = json!({"ev": "check", "n": 3, "t": 20});
    assert_eq!(b.observe(1, 99, &check), None, "not armed yet");
    b.armed = Some(0);
    assert_eq!(b.observe(1, 99, &check), Some(Kind::Cut));
    assert!(b.intercept(1, "write", &json!({"n": 3, "key": "k"})));
    assert!(!b.intercept(2, "write", &json!({"n": 4, "key": "k"})));
    b.wrote(4, "k");
    let a = b.active.unwrap();
    assert!(a.other_wrote);
    assert_eq!(a.held.len(), 1);
}

#[test]
fn a_semaphore_bite_takes_over_once_others_hold_every_permit() {
    let mut b = Bite {
        kind: Some(Kind::Pause),
        armed: Some(0),
        permits: 2,
        ..Bite::default()
    };
    let ok = json!({"ev": "ok", "f": "acquire", "n": 3, "t": 10, "kind": "permit"});
    b.observe(0, 1, &ok);
    assert_eq!(
        b.observe(0, 1, &json!({"ev": "check", "n": 3, "t": 20})),
        Some(Kind::Pause)
    );
    b.held_by(1);
    assert!(!b.active.as_ref().unwrap().other_wrote);
    b.held_by(2);
    assert!(b.active.as_ref().unwrap().other_wrote);
}

#[test]
fn cancelled_operations_are_not_bitten_and_a_full_run_without_a_bite_is_a_complaint() {
    let mut b = Bite {
        kind: Some(Kind::Pause),
        armed: Some(0),
        ..Bite::default()
    };
    b.sent(3, &json!({"end": "cancel"}));
    b.observe(
        0,
        1,
        &json!({"ev": "ok", "f": "acquire", "n": 3, "t": 1, "kind": "exclusive"}),
    );
    assert_eq!(
        b.observe(0, 1, &json!({"ev": "check", "n": 3, "t": 2})),
        None
    );
    let s = crate::scenario::by_name("redis-holder-pause").unwrap();
    assert!(complaint(&s, &Tally::default(), 0).is_some());
    let landed = Tally {
        landed: 1,
        ..Tally::default()
    };
    assert!(complaint(&s, &landed, 0).is_some(), "nothing lost");
    assert_eq!(complaint(&s, &landed, 1), None);
    let kill = crate::scenario::by_name("redis-kill-holder").unwrap();
    assert_eq!(complaint(&kill, &Tally::default(), 0), None);
    assert!(clause(&kill, &Tally::default(), 0, 5).starts_with("no fault here can break"));
}

#[test]
fn readers_are_not_bitten() {
    let mut b = Bite {
        kind: Some(Kind::Pause),
        armed: Some(0),
        ..Bite::default()
    };
    let ok = json!({"ev": "ok", "f": "acquire", "n": 3, "t": 10, "kind": "shared"});
    b.observe(0, 1, &ok);
    assert_eq!(
        b.observe(0, 1, &json!({"ev": "check", "n": 3, "t": 20})),
        None
    );
}

#[test]
fn a_run_of_thirty_seconds_or_ten_ttls_is_held_to_its_bite() {
    let s = Duration::from_secs;
    assert!(held_to_it(s(12), Duration::from_millis(1000)));
    assert!(!held_to_it(s(12), s(2)));
    assert!(held_to_it(s(30), s(5)));
    assert!(!held_to_it(s(5), Duration::from_millis(1000)));
}
