//! A new label for a lock's holder, the lock kept (an election's leader publishing a new
//! value): the lock file's `owner=` line is written again, under our flock, and nothing else
//! of the record changes (the fence, the start, the key).

use distlock_core::engine::{ErrorKind, LeaseCheck, LeaseKind, LeaseRef, LockError, Relabel};

use crate::FileBackend;
use crate::flock::still_at;
use crate::record::{read_all, write_record};

#[distlock_core::engine::async_trait]
impl Relabel for FileBackend {
    async fn relabel(&self, lease: &LeaseRef<'_>, owner: &str) -> Result<LeaseCheck, LockError> {
        let (key, token, kind) = (
            lease.name.to_owned(),
            lease.token.as_str().to_owned(),
            lease.kind,
        );
        let owner = owner.replace('\n', " ");
        if kind != LeaseKind::Exclusive {
            return Err(LockError::new(
                ErrorKind::Unsupported,
                "only an exclusive lease's holder is written in its lock file",
            ));
        }
        self.blocking(move |me| relabel_blocking(me, &key, &token, &owner))
            .await
    }
}

fn relabel_blocking(
    me: &FileBackend,
    key: &str,
    token: &str,
    owner: &str,
) -> Result<LeaseCheck, LockError> {
    let mut held = me.held();
    let Some(h) = held.get_mut(token).filter(|h| h.key == key) else {
        return Ok(LeaseCheck::Missing);
    };
    if !still_at(&h.path, h.id) {
        // A forced release put another file at the path: the lock is not ours any more.
        return Ok(LeaseCheck::Missing);
    }
    let text = read_all(&mut h.file.lock, &h.path)?;
    let mut body = String::with_capacity(text.len() + owner.len());
    let mut written = false;
    for line in text.lines() {
        if line.starts_with("owner=") {
            body.push_str("owner=");
            body.push_str(owner);
            written = true;
        } else {
            body.push_str(line);
        }
        body.push('\n');
    }
    if !written {
        body.push_str("owner=");
        body.push_str(owner);
        body.push('\n');
    }
    write_record(&mut h.file.writer, &h.path, &body)?;
    Ok(LeaseCheck::Ours)
}
