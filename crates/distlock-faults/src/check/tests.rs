use super::*;

fn bounds() -> Bounds {
    Bounds {
        free_within_ns: 3_000_000_000,
        detect_within_ns: 1_000_000_000,
        caveat_window_ns: 1_000_000_000,
        split_brain: false,
    }
}

fn acq(n: u64, t: i64, fence: u64, vu: i64) -> Value {
    json!({"ev": "ok", "f": "acquire", "n": n, "t": t, "fence": fence, "vu": vu,
        "validity_ms": 900})
}

#[test]
fn a_claim_ends_when_its_holder_learns_it_is_lost() {
    let ms = 1_000_000;
    let lost = |n: u64, t: i64| json!({"ev": "lost", "n": n, "t": t, "reason": "Stolen"});
    // Told at 300 ms, before the next holder came at 400 ms: no violation. Told after it:
    // one.
    for (told, violations) in [(300 * ms, 0), (450 * ms, 1)] {
        let events = vec![
            acq(1, 0, 1, 900 * ms),
            lost(1, told),
            acq(2, 400 * ms, 2, 1300 * ms),
        ];
        let r = Register::default();
        let f = check(&events, Some(&r), &r, bounds(), 2000 * ms);
        assert_eq!(f.ck5, violations, "told at {told}");
    }
}

#[test]
fn a_check_that_passed_past_its_deadline_is_ck9() {
    let ms = 1_000_000;
    let check = |n: u64, checked: i64, vu: i64| json!({"ev": "check", "n": n, "t": checked + ms, "checked": checked, "vu": vu});
    let events = vec![
        acq(1, 0, 1, 900 * ms),
        // In time (sent late: a pause after the check is no violation of its own).
        check(1, 800 * ms, 900 * ms),
        acq(2, 1000 * ms, 2, 1900 * ms),
        check(2, 1950 * ms, 1900 * ms),
    ];
    let r = Register::default();
    let f = check_events(&events, &r);
    assert_eq!(f.ck9, 1, "{:?}", f.examples);
    assert_eq!(f.violations(), 1);
}

fn check_events(events: &[Value], r: &Register) -> Figures {
    check(events, Some(r), r, bounds(), 3000 * 1_000_000)
}

#[test]
fn an_acquisition_inside_an_earlier_claim_is_ck5() {
    let ms = 1_000_000;
    let events = vec![
        acq(1, 0, 1, 900 * ms),
        acq(2, 500 * ms, 2, 1400 * ms),
        json!({"ev": "invoke", "f": "release", "n": 2, "t": 600 * ms}),
    ];
    let r = Register::default();
    let f = check(&events, Some(&r), &r, bounds(), 2000 * ms);
    assert_eq!((f.ck5, f.ck3, f.ck6), (1, 0, 0));
}

fn with_kind(mut v: Value, kind: &str, permits: u64) -> Value {
    v["kind"] = json!(kind);
    v["permits"] = json!(permits);
    v
}

#[test]
fn readers_may_overlap_each_other_but_never_a_writer() {
    let ms = 1_000_000;
    let r = Register::default();
    // Two readers at once, with one fence: no violation.
    let readers = vec![
        with_kind(acq(1, 0, 5, 900 * ms), "shared", 0),
        with_kind(acq(2, 100 * ms, 5, 1000 * ms), "shared", 0),
    ];
    let f = check(&readers, Some(&r), &r, bounds(), 2000 * ms);
    assert_eq!((f.ck5, f.ck3, f.ck6), (0, 0, 0));
    // A writer inside a reader's claim, and a reader inside a writer's: two CK5.
    let mixed = vec![
        with_kind(acq(1, 0, 5, 900 * ms), "shared", 0),
        with_kind(acq(2, 100 * ms, 6, 1000 * ms), "exclusive", 0),
        with_kind(acq(3, 200 * ms, 6, 1100 * ms), "shared", 0),
    ];
    let f = check(&mixed, Some(&r), &r, bounds(), 2000 * ms);
    assert_eq!(f.ck5, 2);
}

#[test]
fn permits_overlap_up_to_n_and_no_further() {
    let ms = 1_000_000;
    let r = Register::default();
    let two = |n, t, fence| with_kind(acq(n, t * ms, fence, (t + 900) * ms), "permit", 2);
    let f = check(
        &[two(1, 0, 1), two(2, 100, 2)],
        Some(&r),
        &r,
        bounds(),
        2000 * ms,
    );
    assert_eq!((f.ck5, f.ck3), (0, 0));
    let f = check(
        &[two(1, 0, 1), two(2, 100, 2), two(3, 200, 3)],
        Some(&r),
        &r,
        bounds(),
        2000 * ms,
    );
    assert_eq!(f.ck5, 1, "a third holder of two permits");
    // Permits' fences are held to CK3 like writers'.
    let f = check(
        &[two(1, 0, 2), two(2, 100, 2)],
        Some(&r),
        &r,
        bounds(),
        2000 * ms,
    );
    assert_eq!(f.ck3, 1);
}

#[test]
fn a_release_before_the_next_acquire_is_no_violation() {
    let ms = 1_000_000;
    let events = vec![
        acq(1, 0, 1, 900 * ms),
        json!({"ev": "invoke", "f": "release", "n": 1, "t": 100 * ms}),
        json!({"ev": "ok", "f": "release", "n": 1, "t": 101 * ms, "held": true}),
        acq(2, 102 * ms, 2, 1000 * ms),
    ];
    let r = Register::default();
    let f = check(&events, Some(&r), &r, bounds(), 2000 * ms);
    assert_eq!(f.violations(), 0);
}

#[test]
fn a_renewal_sent_after_the_next_acquire_is_ck6_and_a_lower_token_ck3() {
    let ms = 1_000_000;
    let events = vec![
        acq(1, 0, 5, 900 * ms),
        acq(2, 1000 * ms, 4, 1900 * ms),
        // Sent at 1100 ms (claimed 2000 − validity 900).
        json!({"ev": "renewed", "n": 1, "t": 1101 * ms, "vu": 2000 * ms}),
    ];
    let r = Register::default();
    let f = check(&events, Some(&r), &r, bounds(), 3000 * ms);
    assert_eq!((f.ck6, f.ck3), (1, 1));
    // The renewal's claim also covers op 2's acquire.
    assert_eq!(f.ck5, 1);
}

#[test]
fn server_side_faults_excuse_early_acquisitions_but_never_a_token_regression() {
    let ms = 1_000_000;
    let events = vec![
        acq(1, 0, 7, 900 * ms),
        json!({"ev": "fault", "kind": "restart-volatile", "start": 300 * ms,
            "end": 350 * ms, "server_side": true, "t": 350 * ms}),
        acq(2, 400 * ms, 1, 1300 * ms),
    ];
    let r = Register::default();
    let f = check(&events, Some(&r), &r, bounds(), 3000 * ms);
    assert_eq!((f.ck5, f.ck5_caveat, f.ck3), (0, 1, 1));
}

#[test]
fn split_brain_excuses_renewals_on_the_old_master_only_within_the_fault_s_window() {
    let ms = 1_000_000;
    let events = |split_brain: bool| {
        let ev = vec![
            acq(1, 0, 5, 900 * ms),
            json!({"ev": "fault", "kind": "pause-server", "start": 100 * ms,
                "end": 800 * ms, "server_side": true, "t": 800 * ms}),
            acq(2, 850 * ms, 6, 1750 * ms),
            // Sent at 1000 ms, in the window (which ends at 1800 ms), and at 2500 ms.
            json!({"ev": "renewed", "n": 1, "t": 1001 * ms, "vu": 1900 * ms}),
            json!({"ev": "renewed", "n": 1, "t": 2501 * ms, "vu": 3400 * ms}),
        ];
        let r = Register::default();
        let b = Bounds {
            split_brain,
            ..bounds()
        };
        check(&ev, Some(&r), &r, b, 5000 * ms)
    };
    let f = events(true);
    assert_eq!((f.ck6, f.ck6_caveat), (1, 1), "{:?}", f.examples);
    let f = events(false);
    assert_eq!((f.ck6, f.ck6_caveat), (2, 0));
}

#[test]
fn a_lock_nobody_gets_after_an_abandon_is_ck7() {
    let ms = 1_000_000;
    let events = vec![
        acq(1, 0, 1, 900 * ms),
        json!({"ev": "abandon", "n": 1, "t": 100 * ms}),
    ];
    let r = Register::default();
    let f = check(&events, Some(&r), &r, bounds(), 10_000 * ms);
    assert_eq!((f.ck7_probes, f.ck7), (1, 1));
}

#[test]
fn a_copy_that_stays_is_a_leak_and_one_seen_now_and_then_is_not() {
    let ms = 1_000_000;
    let audit = |t: i64, tok: &str| {
        let copies = if tok.is_empty() {
            json!([])
        } else {
            json!([[3, tok, "worker-1"]])
        };
        json!({"ev": "audit", "t": t * ms, "copies": copies})
    };
    let mut events = vec![json!({"ev": "start", "t": 0, "ttl_ms": 1000})];
    // Seen twice, 1.2 s apart, with empty audits between: two short attempts.
    events.push(audit(0, "aaaa"));
    for k in 1..6 {
        events.push(audit(200 * k, ""));
    }
    events.push(audit(1200, "aaaa"));
    // Seen in every audit for 600 ms: a leak.
    for k in 7..11 {
        events.push(audit(200 * k, "bbbb"));
    }
    let r = Register::default();
    let f = check(&events, Some(&r), &r, bounds(), 3000 * ms);
    assert_eq!(f.ck7, 1, "{:?}", f.examples);
    assert!(f.examples[0].contains("bbbb"));
}
