//! The workspace as crates.io and docs.rs will see it: which crates are published, that each
//! carries the metadata a registry page needs, that their READMEs' links work outside the
//! repository, and that no Cargo feature anywhere can switch on a seeded bug (they are behind
//! `--cfg distlock_seeded_bugs`, which only the fault harness and CI set).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

const PUBLISHED: [&str; 11] = [
    "distlock",
    "distlock-cli",
    "distlock-core",
    "distlock-etcd",
    "distlock-file",
    "distlock-memcached",
    "distlock-mysql",
    "distlock-postgres",
    "distlock-redis",
    "distlock-tls",
    "distlock-zookeeper",
];

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("crates/distlock is two levels down")
        .to_path_buf()
}

/// `cargo metadata` of the workspace's own packages.
fn packages() -> Vec<Value> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(workspace_root())
        .output()
        .expect("cargo metadata runs");
    assert!(out.status.success(), "cargo metadata: {out:?}");
    let meta: Value = serde_json::from_slice(&out.stdout).expect("cargo metadata's JSON");
    meta["packages"].as_array().expect("packages").clone()
}

fn is_published(p: &Value) -> bool {
    // `publish = false` reads as an empty list of registries.
    !p["publish"].as_array().is_some_and(Vec::is_empty)
}

#[test]
fn exactly_the_library_and_the_command_are_published() {
    let mut published: Vec<String> = packages()
        .iter()
        .filter(|p| is_published(p))
        .map(|p| p["name"].as_str().expect("a name").to_owned())
        .collect();
    published.sort();
    assert_eq!(published, PUBLISHED, "set `publish = false` on the others");
}

#[test]
fn published_crates_carry_what_a_registry_page_needs() {
    for p in packages().iter().filter(|p| is_published(p)) {
        let name = p["name"].as_str().expect("a name");
        for field in [
            "license",
            "description",
            "repository",
            "readme",
            "rust_version",
        ] {
            assert!(
                p[field].as_str().is_some_and(|v| !v.is_empty()),
                "{name}: no {field}"
            );
        }
        for list in ["keywords", "categories"] {
            let n = p[list].as_array().map_or(0, Vec::len);
            assert!((1..=5).contains(&n), "{name}: {n} {list} (1 to 5)");
        }
        assert!(
            p["metadata"]["docs"]["rs"].is_object(),
            "{name}: no [package.metadata.docs.rs]"
        );
        let manifest = Path::new(p["manifest_path"].as_str().expect("a manifest"));
        let readme = manifest
            .parent()
            .expect("a folder")
            .join(p["readme"].as_str().expect("a readme"));
        assert!(
            readme.starts_with(manifest.parent().expect("a folder")),
            "{name}: its README must be in its own folder, to be packaged"
        );
        let text = std::fs::read_to_string(&readme)
            .unwrap_or_else(|e| panic!("{name}: {}: {e}", readme.display()));
        // A relative link leads nowhere on docs.rs or crates.io.
        for (at, _) in text.match_indices("](") {
            let target = &text[at + 2..];
            assert!(
                target.starts_with("http") || target.starts_with('#'),
                "{name}: a relative link in its README: {}",
                &target[..target.find(')').unwrap_or(target.len()).min(60)]
            );
        }
    }
}

#[test]
fn no_feature_can_switch_a_seeded_bug_on() {
    for p in packages() {
        let name = p["name"].as_str().expect("a name");
        let features = p["features"].as_object().expect("features");
        for (feature, enables) in features {
            let text = format!("{feature} {enables}");
            assert!(
                !text.contains("seeded"),
                "{name}: feature {feature:?} reaches a seeded bug ({enables})"
            );
        }
    }
    // Nor does any source file gate one on a feature.
    let mut stack = vec![workspace_root().join("crates")];
    let mut files = 0;
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("a folder") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files += 1;
                let text = std::fs::read_to_string(&path).expect("a source file");
                assert!(
                    !text.contains("feature = \"seeded"),
                    "{} gates a seeded bug on a feature",
                    path.display()
                );
            }
        }
    }
    assert!(files > 50, "only {files} source files found");
    // This build has none: the flag was not given.
    assert_eq!(
        distlock_core::seeded::available(),
        cfg!(distlock_seeded_bugs)
    );
}
