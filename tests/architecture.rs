//! The layering of `src/`, checked: which top-level module may use which, and where SQL
//! may be written. docs/architecture.md draws the same layers.
//!
//! Each top-level module of the library has a layer, and may use modules of lower layers
//! only, so dependencies point one way and no cycle can form. A new dependency that goes
//! up or sideways fails here; if it is right, the table below changes with it, in the same
//! review. Statements are written in `src/db/` only ("all SQL in `db/`").

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every top-level module of `src/lib.rs` with its layer, lowest first; `main` is the
/// binary's composition root (`src/main.rs`).
const LAYERS: &[(&str, u8)] = &[
    // leaves: no other hookd module
    ("crypto", 0),
    ("domain", 0),
    ("metrics", 0),
    ("pgtemp", 0),
    ("signing", 0),
    // SQL (db) and the outbound address policy, on the domain's types
    ("db", 1),
    ("outbound", 1),
    // services on db: credentials, settings, wake-ups, health, key rotation, the UI assets
    ("auth", 2),
    ("config", 2),
    ("notify", 2),
    ("ops", 2),
    ("rekey", 2),
    ("telemetry", 2),
    ("ui", 2),
    // the endpoint rules, the event-type catalog, the enqueue contract, retention, process
    // plumbing
    ("catalog", 3),
    ("endpoints", 3),
    ("inbound", 3),
    ("outbox", 3),
    ("retention", 3),
    ("runtime", 3),
    // the components, each with one `run`
    ("api", 4),
    ("dispatch", 4),
    ("k8s", 4),
    ("receiver", 4),
    // `hookd apply` (the CRD types of k8s without a cluster), `hookd dev` (all components
    // in one process), the command line
    ("apply", 5),
    ("dev", 6),
    ("cli", 7),
    ("main", 8),
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(path: &Path, out: &mut Vec<PathBuf>) {
    if path.is_dir() {
        for entry in std::fs::read_dir(path).unwrap() {
            rust_files(&entry.unwrap().path(), out);
        }
    } else if path.is_file() && path.extension().is_some_and(|e| e == "rs") {
        out.push(path.to_path_buf());
    }
}

/// The files of one top-level module: `src/NAME.rs` and everything under `src/NAME/`.
fn module_files(name: &str) -> Vec<PathBuf> {
    let mut files = Vec::new();
    rust_files(&src().join(format!("{name}.rs")), &mut files);
    rust_files(&src().join(name), &mut files);
    files
}

/// The source without comment lines: an intra-doc link is not a dependency.
fn code(file: &Path) -> String {
    std::fs::read_to_string(file)
        .unwrap()
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The top-level modules a piece of code names through `root::` (`crate` inside the
/// library, `hookd` in the binary): `root::NAME` and each first name of
/// `root::{A, B::c, ...}`.
fn used_modules(code: &str, root: &str) -> BTreeSet<String> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut used = BTreeSet::new();
    let prefix = format!("{root}::");
    for (at, _) in code.match_indices(&prefix) {
        // `foo_crate::x` is not `crate::x`
        if code[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            continue;
        }
        let rest = &code[at + prefix.len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0usize;
            let mut item_start = true;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => item_start = true,
                    c if c.is_whitespace() => {}
                    _ if item_start && depth == 0 => {
                        used.insert(ident(&group[i..]));
                        item_start = false;
                    }
                    _ => {}
                }
            }
        } else {
            used.insert(ident(rest));
        }
    }
    used
}

/// module -> the top-level modules it uses
fn graph() -> BTreeMap<&'static str, BTreeSet<String>> {
    let names: BTreeSet<&str> = LAYERS.iter().map(|(n, _)| *n).collect();
    LAYERS
        .iter()
        .map(|&(name, _)| {
            let (files, root) = if name == "main" {
                (vec![src().join("main.rs")], "hookd")
            } else {
                (module_files(name), "crate")
            };
            assert!(
                !files.is_empty(),
                "module {name} of LAYERS has no file in src/"
            );
            let used = files
                .iter()
                .flat_map(|f| used_modules(&code(f), root))
                .filter(|m| m != name && names.contains(m.as_str()))
                .collect();
            (name, used)
        })
        .collect()
}

#[test]
fn every_module_of_the_library_has_a_layer() {
    let lib = std::fs::read_to_string(src().join("lib.rs")).unwrap();
    let declared: BTreeSet<&str> = lib
        .lines()
        .filter_map(|l| l.trim().strip_prefix("pub mod "))
        .map(|l| l.trim_end_matches(';'))
        .collect();
    let layered: BTreeSet<&str> = LAYERS
        .iter()
        .map(|(n, _)| *n)
        .filter(|n| *n != "main")
        .collect();
    assert_eq!(
        declared, layered,
        "src/lib.rs's modules and the LAYERS table differ: give a new module its layer"
    );
}

#[test]
fn dependencies_between_modules_point_down_the_layers() {
    let layer: BTreeMap<&str, u8> = LAYERS.iter().copied().collect();
    let mut wrong = Vec::new();
    for (module, used) in graph() {
        for other in used {
            if layer[other.as_str()] >= layer[module] {
                wrong.push(format!(
                    "{module} (layer {}) uses {other} (layer {})",
                    layer[module],
                    layer[other.as_str()]
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "dependencies that do not point down (see tests/architecture.rs and docs/architecture.md):\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_check_sees_dependencies() {
    // the parser itself: plain paths, groups with nested groups, and lookalikes
    let code = "use crate::db::{self, x};\nuse crate::{api::Y, k8s::{A, B}, ops};\nlet z = crate::metrics::f();\nfoo_crate::retention::g();";
    let used = used_modules(code, "crate");
    let expected: BTreeSet<String> = ["api", "db", "k8s", "metrics", "ops"]
        .into_iter()
        .map(String::from)
        .collect();
    assert_eq!(used, expected);
    // and the real graph has the edges everyone knows are there
    let g = graph();
    assert!(g["api"].contains("db") && g["dispatch"].contains("db"));
    assert!(g["main"].contains("cli"));
}

#[test]
fn statements_are_written_in_db_only() {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let db = src().join("db");
    let markers = [
        "sqlx::query",
        "query_as(",
        "query_scalar(",
        "query_as_with(",
        "sqlx::raw_sql",
    ];
    let outside: Vec<String> = files
        .iter()
        .filter(|f| !f.starts_with(&db))
        .filter(|f| {
            let code = code(f);
            markers.iter().any(|m| code.contains(m))
        })
        .map(|f| f.display().to_string())
        .collect();
    assert!(
        outside.is_empty(),
        "SQL outside src/db/ (all statements live in db/): {outside:?}"
    );
}

/// The schema every migration adds up to, in one file (`docs/schema.sql`), as `pg_dump`
/// prints it from a freshly migrated database. The history days (named by date) are left
/// out, and the bound of the days before them is a placeholder: both depend on the day the
/// database was migrated (a snapshot written one day failed the next).
#[sqlx::test]
async fn the_schema_snapshot_is_what_the_migrations_build(pool: sqlx::PgPool) {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/schema.sql");
    let version: i32 = sqlx::query_scalar("SELECT current_setting('server_version_num')::int")
        .fetch_one(&pool)
        .await
        .unwrap();
    let major = version / 10_000;
    const MAJOR: i32 = 15;
    if major != MAJOR {
        // pg_dump prints each major's catalog its own way; CI runs Debian 12's 15
        eprintln!("skipped: docs/schema.sql is PostgreSQL {MAJOR}'s dump, this server is {major}");
        return;
    }
    let bindir = hookd::pgtemp::find_bindir().expect("PostgreSQL's binaries (pg_dump)");
    let out = std::process::Command::new(bindir.join("pg_dump"))
        .args([
            "--schema-only",
            "--schema=hookd",
            "--no-owner",
            "--no-privileges",
            "--exclude-table=hookd.*_2[0-9][0-9][0-9][0-9][0-9][0-9][0-9]",
            "--dbname",
        ])
        .arg(crate::common::database_url(&pool))
        .output()
        .expect("run pg_dump");
    assert!(
        out.status.success(),
        "pg_dump failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dump = String::from_utf8(out.stdout).unwrap();
    // what changes from run to run or machine to machine: the dump's random \restrict key
    // and the versions in its header
    let body: String = dump
        .lines()
        .filter(|l| {
            !l.starts_with("\\restrict")
                && !l.starts_with("\\unrestrict")
                && !l.starts_with("-- Dumped from")
                && !l.starts_with("-- Dumped by")
        })
        .map(|l| format!("{}\n", day_bound_left_out(l)))
        .collect();
    let snapshot = format!(
        "-- hookd's schema after every migration in migrations/, as pg_dump (PostgreSQL {MAJOR})\n\
         -- prints it from a freshly migrated database, without the history days (named by date).\n\
         -- Generated, do not edit: HOOKD_UPDATE_DOCS=1 cargo nextest run -E 'test(schema_snapshot)'\n\
         -- rewrites it; a test fails when it and the migrations differ.\n{body}"
    );
    if std::env::var_os("HOOKD_UPDATE_DOCS").is_some() {
        std::fs::write(&file, &snapshot).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&file).unwrap_or_default();
    assert!(
        committed == snapshot,
        "docs/schema.sql differs from what the migrations build; rerun with HOOKD_UPDATE_DOCS=1 \
         cargo nextest run -E 'test(schema_snapshot)' and commit it"
    );
}

/// `line` with the bound of a `*_before_0014` partition (the first history day of the
/// database, the day migration 0014 ran) written as a placeholder: the snapshot is the
/// same whatever day the migrations run on. Other lines as they are.
fn day_bound_left_out(line: &str) -> std::borrow::Cow<'_, str> {
    const BOUND: &str = "_before_0014 FOR VALUES FROM (MINVALUE) TO ('";
    match line.find(BOUND) {
        Some(at) => {
            let start = at + BOUND.len();
            let end = line[start..].find('\'').map_or(line.len(), |e| start + e);
            format!(
                "{}<the day of migration 0014>{}",
                &line[..start],
                &line[end..]
            )
            .into()
        }
        None => line.into(),
    }
}
