//! What engines parse back from their stores beyond holder values (those are
//! `holder_value`'s): the file engine's lock files (a record any process with write access to
//! the directory could have written) and the holder label a PostgreSQL session shows in its
//! `application_name` (any client of the server can set its own). The first byte picks the
//! format.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&which, bytes)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(bytes);
    match which % 2 {
        0 => {
            let _ = distlock_file::fuzzing::lock_file(&text);
        }
        _ => {
            if let Some((_fence, _ttl, owner)) = distlock_postgres::fuzzing::holder_label(&text) {
                assert!(text.ends_with(owner.as_str()));
            }
        }
    }
});
