//! Lock URLs as a user, a config file or an environment variable could give them: the core's
//! URL helpers (several hosts, parameters, durations, credentials, redaction) and the URL
//! parsers of the engines the facade's schemes open (Redis: one server, Cluster, Sentinel,
//! Redlock; memcached; etcd; PostgreSQL). Redaction must hide a password wherever the URL
//! puts it.
#![no_main]

use distlock_core::url::{
    MultiHostUrl, decode, percent_encode, redact, split_scheme, with_password,
};
use libfuzzer_sys::fuzz_target;

/// A password the fuzzer's text does not contain (checked), to look for after redaction.
const SECRET: &str = "Zq9SECRETxY";

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };

    // The engines' own URL parsers: `Ok` or a typed error.
    let _ = distlock_redis::RedisConfig::from_url(text);
    let _ = distlock_redis::ClusterConfig::from_url(text);
    let _ = distlock_redis::SentinelConfig::from_url(text);
    let _ = distlock_redis::RedlockConfig::from_url(text);
    let _ = distlock_memcached::MemcachedConfig::from_url(text);
    let _ = distlock_etcd::EtcdConfig::from_url(text);
    let _ = distlock_postgres::PgConfig::from_url(text);

    // The core's helpers, as the engines call them.
    if let Ok((_, rest)) = split_scheme(text, "etcd", "etcds")
        && let Ok(mut url) = MultiHostUrl::parse(rest)
    {
        let _ = url.credentials();
        let _ = url.require_ports(2379);
        let (mut connect, mut response) = Default::default();
        let _ = url.take_timeouts(&mut connect, &mut response);
        let _ = url.take("lock_prefix");
        let _ = url.rest_query();
        let _ = url.no_more_params("etcd", "connect_timeout, response_timeout");
    }
    let _ = distlock_core::parse_duration(text);
    let _ = redact(text);

    // Percent-encoding reads back as it was.
    assert_eq!(decode(&percent_encode(text)), text);

    // A password put in by `with_password`, or given as a parameter, never shows.
    if !text.contains(SECRET) {
        for scheme in ["redis", "redis+unix", "etcd", "postgres"] {
            let url = with_password(&format!("{scheme}://{text}"), Some(SECRET));
            let shown = redact(&url);
            assert!(!shown.contains(SECRET), "{url:?} redacted as {shown:?}");
        }
        let url = format!("redis://h:1/0?{text}&password={SECRET}");
        let shown = redact(&url);
        assert!(!shown.contains(SECRET), "{url:?} redacted as {shown:?}");
    }
});
