//! The registers taken out of harness histories, and the verdict on them.

use serde_json::{Value, json};

use super::*;

const MS: i64 = 1_000_000;

fn read(n: u64, w: u64, sent: i64, t: i64, fence: u64, value: i64) -> Value {
    json!({"ev": "read", "n": n, "w": w, "sent": sent * MS, "t": t * MS, "key": "k",
        "fence": fence, "value": value, "uvalue": value})
}

fn write(n: u64, w: u64, sent: i64, t: i64, fence: u64, value: i64, accepted: bool) -> Value {
    json!({"ev": "write", "n": n, "w": w, "sent": sent * MS, "t": t * MS, "key": "k",
        "fence": fence, "value": value, "accepted": accepted, "uaccepted": true})
}

/// Two holders: op 1 (fence 10) reads, is paused; op 2 (fence 11) reads and writes; op 1's
/// write comes late and is refused.
fn paused_holder() -> Vec<Value> {
    vec![
        json!({"ev": "ok", "f": "acquire", "n": 1, "w": 0, "t": 0, "fence": 10}),
        read(1, 0, 1, 2, 10, 0),
        json!({"ev": "ok", "f": "acquire", "n": 2, "w": 1, "t": 5 * MS, "fence": 11}),
        read(2, 1, 6, 7, 11, 0),
        write(2, 1, 8, 9, 11, 1, true),
        write(1, 0, 10, 11, 10, 1, false),
        read(3, 1, 12, 13, 12, 1),
    ]
}

#[test]
fn a_refused_stale_write_is_linearizable() {
    let v = check_history(&paused_holder(), true);
    assert_eq!(v.registers.len(), 1);
    assert_eq!(v.registers[0].name, "k");
    assert_eq!(v.registers[0].ops, 5);
    assert_eq!(v.violations(), 0);
    assert!(
        v.summary()
            .starts_with("linearizable: 1 register (5 operations)")
    );
    assert_eq!(v.example(), None);
}

#[test]
fn an_accepted_stale_write_fails_and_names_its_operation() {
    let mut h = paused_holder();
    h[5]["accepted"] = json!(true);
    let v = check_history(&h, true);
    assert_eq!(v.violations(), 1);
    let r = v.offender().expect("an offender");
    let (o, s) = r.offender.as_ref().expect("an offender");
    assert_eq!((o.n, o.w, o.t), (1, Some(0), 11 * MS));
    assert_eq!(
        *s,
        State {
            value: 1,
            floor: 11
        }
    );
    assert!(
        v.summary().starts_with("NOT linearizable (k)"),
        "{}",
        v.summary()
    );
    let ex = v.example().expect("an example");
    assert!(
        ex.starts_with(
            "LIN: register k: op 1 (worker 0), a write of 1 with fence 10 that was accepted, \
             fits no order: after the longest order that fits (3 operations), the register \
             held 1 with fence floor 11"
        ),
        "{ex}"
    );
    assert_eq!(v.to_json()["registers"][0]["op"], 1);
    assert_eq!(v.to_json()["linearizable"], false);
}

#[test]
fn without_fencing_tokens_the_fenced_register_is_not_checked() {
    let v = check_history(&paused_holder(), false);
    assert!(v.registers.is_empty());
    assert!(v.summary().contains("n/a"));
}

#[test]
fn each_key_is_its_own_register() {
    let mut h = paused_holder();
    // Another name's register, written with a low fence: fine on its own.
    let mut other = write(4, 2, 3, 4, 1, 1, true);
    other["key"] = json!("other");
    h.push(other);
    let v = check_history(&h, true);
    let names: Vec<&str> = v.registers.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["k", "other"]);
    assert_eq!(v.violations(), 0);
}

#[test]
fn without_a_request_stamp_an_operation_starts_at_its_previous_event() {
    let mut h = paused_holder();
    for e in &mut h {
        if let Some(o) = e.as_object_mut() {
            o.remove("sent");
        }
    }
    assert_eq!(check_history(&h, true).violations(), 0);
    // Op 3's read (of 1) is then called at 12 ms at the earliest: after op 2's write.
    h[6]["value"] = json!(0);
    assert_eq!(check_history(&h, true).violations(), 1);
}

/// The SQL form's fields on the same history, both rows answering as the in-memory register.
fn with_sql(mut h: Vec<Value>) -> Vec<Value> {
    for e in &mut h {
        match e["ev"].as_str() {
            Some("read") => {
                let v = e["value"].clone();
                e["sw"] = v.clone();
                e["srw"] = v;
            }
            Some("write") => {
                let v = e["value"].clone();
                let a = e["accepted"].clone();
                e["sw"] = v.clone();
                e["srw"] = v;
                e["sw_accepted"] = a.clone();
                e["srw_accepted"] = a;
            }
            _ => {}
        }
    }
    h
}

#[test]
fn the_sql_rows_are_checked_with_their_own_rules() {
    let h = with_sql(paused_holder());
    let v = check_history(&h, true);
    let names: Vec<&str> = v.registers.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["k", "sql w", "sql rw"]);
    assert_eq!(v.violations(), 0, "{}", v.summary());
    // Op 1's write between op 2's read and op 2's write: row `w` (only the write fenced)
    // accepts it, as its rules say (a lost update CK2 counts, not a register's fault); row
    // `rw`, whose read raised the fence to 11, must refuse it.
    let mut late = h.clone();
    late.swap(4, 5);
    late[4]["sent"] = json!(7 * MS + MS / 2);
    late[4]["t"] = json!(8 * MS);
    late[4]["sw_accepted"] = json!(true);
    late[5]["sw"] = json!(1);
    late[6]["sw"] = json!(1);
    let v = check_history(&late, false);
    assert_eq!(v.registers.len(), 2);
    assert_eq!(v.violations(), 0, "{}", v.summary());
    late[4]["srw_accepted"] = json!(true);
    let v = check_history(&late, false);
    assert_eq!(v.violations(), 1);
    assert_eq!(v.offender().map(|r| r.name.as_str()), Some("sql rw"));
}

#[test]
fn a_failed_sql_request_may_have_taken_effect() {
    let mut h = with_sql(paused_holder());
    // Op 2's write failed with an error; op 3's read shows it happened anyway.
    for k in ["sw", "srw", "sw_accepted", "srw_accepted"] {
        h[4].as_object_mut().map(|o| o.remove(k));
    }
    h[4]["sql_error"] = json!("SQL resource, write w: connection reset");
    let v = check_history(&h, true);
    assert_eq!(v.violations(), 0, "{}", v.summary());
    // Op 3 reads 1 on row `rw`, which only op 2's lost write (its read, 0, plus one) explains.
    h[3]["srw"] = json!(5);
    assert_eq!(check_history(&h, true).violations(), 1);
}

#[test]
fn the_search_limit_makes_the_verdict_unknown() {
    // Twenty overlapping writes with fences going down, each accepted: no order fits, and the
    // search needs more than 10 steps to see it.
    let h: Vec<Value> = (0..20)
        .map(|i| write(i, 0, 0, 100, 20 - i, i as i64, true))
        .collect();
    let v = check_with_limit(&h, true, 10);
    assert_eq!((v.violations(), v.unknown()), (0, 1));
    assert!(
        v.summary()
            .starts_with("linearizability unknown (search limit)")
    );
    assert_eq!(
        v.to_json()["registers"][0]["verdict"],
        "unknown (search limit)"
    );
}
