//! The protected resource, served to the workers: each read or write applied to the in-memory
//! registers (and the SQL form's rows), recorded in the history, and answered.

use std::sync::Arc;

use serde_json::{Value, json};

use super::workers::send;
use crate::mono;
use crate::sql::SqlResource;
use crate::state::{SharedRef, lock};

/// Serves a read or a write of the protected resource, and records it. With the SQL form,
/// its statements run first, in a task of their own.
pub(super) fn serve(
    shared: &SharedRef,
    id: usize,
    req: &str,
    v: Value,
    fenced_engine: bool,
    sql: Option<&Arc<SqlResource>>,
) {
    // The bitten holder's write is held until the bite lets it go.
    if lock(shared).bite.intercept(id, req, &v) {
        return;
    }
    let Some(sql) = sql.cloned() else {
        apply(shared, id, req, &v, fenced_engine, Value::Null);
        return;
    };
    let shared = shared.clone();
    let req = req.to_owned();
    tokio::spawn(async move {
        let fence = v.get("fence").and_then(Value::as_u64);
        let part = if req == "read" {
            match sql.read(fence).await {
                Ok(r) => json!({"sw": r.w, "srw": r.rw}),
                Err(e) => json!({"sql_error": e}),
            }
        } else {
            let w = v.get("sw").and_then(Value::as_i64).unwrap_or(0);
            let rw = v.get("srw").and_then(Value::as_i64).unwrap_or(0);
            match sql.write(fence, w, rw).await {
                Ok((a, b)) => {
                    json!({"sw": w, "srw": rw, "sw_accepted": a, "srw_accepted": b})
                }
                Err(e) => json!({"sql_error": e}),
            }
        };
        apply(&shared, id, &req, &v, fenced_engine, part);
    });
}

/// The in-memory registers' part of a request, the history record and the reply; `sql` is
/// what the SQL form answered (merged into both).
fn apply(shared: &SharedRef, id: usize, req: &str, v: &Value, fenced_engine: bool, sql: Value) {
    let n = v.get("n").and_then(Value::as_u64).unwrap_or(0);
    let fence = v.get("fence").and_then(Value::as_u64);
    let merge = |mut a: Value| {
        if let (Some(o), Some(x)) = (a.as_object_mut(), sql.as_object()) {
            for (k, val) in x {
                o.insert(k.clone(), val.clone());
            }
        }
        a
    };
    let key = v.get("key").and_then(Value::as_str).unwrap_or("k");
    let reply = {
        let mut guard = lock(shared);
        let s = &mut *guard;
        let t = mono::now_ns();
        // The scenario's one key's registers, or another name's (a multi-name scenario).
        let (fenced, unfenced) = if key == "k" {
            (&mut s.fenced, &mut s.unfenced)
        } else {
            let r = s.keyed.entry(key.to_owned()).or_default();
            (&mut r.0, &mut r.1)
        };
        if req == "read" {
            let value = fenced.read(true, fence);
            let uvalue = unfenced.read(false, fence);
            s.history.record(merge(
                json!({"ev": "read", "w": id, "n": n, "t": t, "key": key,
                "fence": fence, "value": value, "uvalue": uvalue, "sent": v.get("t")}),
            ));
            merge(json!({"reply": "read", "n": n, "value": value, "uvalue": uvalue}))
        } else {
            let value = v.get("value").and_then(Value::as_i64).unwrap_or(0);
            let uvalue = v.get("uvalue").and_then(Value::as_i64).unwrap_or(0);
            let accepted = fenced_engine && fenced.write(true, n, fence, value);
            let uaccepted = unfenced.write(false, n, fence, uvalue);
            s.history.record(merge(
                json!({"ev": "write", "w": id, "n": n, "t": t, "key": key,
                "fence": fence, "value": value, "accepted": accepted,
                "uaccepted": uaccepted, "sent": v.get("t")}),
            ));
            s.bite.wrote(n, key);
            json!({"reply": "write", "n": n, "accepted": accepted, "uaccepted": uaccepted})
        }
    };
    send(shared, id, &reply);
}
