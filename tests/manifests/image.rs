//! The image's build context: the crate builds from exactly the files the Dockerfile
//! copies and `.dockerignore` admits.
//!
//! No container engine runs here (and the base images live in registries this machine
//! cannot reach), so the test does what `docker build` would do with the sources: it reads
//! `.dockerignore` with Docker's rules, walks the context, replays the builder stage's
//! COPY instructions into a temporary directory and runs `cargo check -p hookd --locked
//! --offline` there. A file the crate embeds at compile time (`include_str!`, `sqlx::migrate!`)
//! that the context leaves out fails the check, as it failed the real build (issue 28).

#[allow(unused_imports)]
use super::*;

// ---------------------------------------------------------------------------------------
// .dockerignore (Docker's rules: github.com/moby/patternmatcher)
// ---------------------------------------------------------------------------------------

/// One `.dockerignore` line: a pattern, and whether it is an exception (`!pattern`).
#[derive(Debug, Clone)]
pub(crate) struct IgnorePattern {
    pub(crate) parts: Vec<String>,
    pub(crate) exception: bool,
}

pub(crate) fn parse_dockerignore(text: &str) -> Vec<IgnorePattern> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (exception, p) = match l.strip_prefix('!') {
                Some(rest) => (true, rest.trim()),
                None => (false, l),
            };
            assert!(
                !p.contains(['[', '\\']),
                ".dockerignore pattern {p:?}: character classes and escapes are not understood by this test; extend it"
            );
            // Docker cleans each pattern (filepath.Clean) and drops a leading slash.
            let parts: Vec<String> = p
                .split('/')
                .filter(|s| !s.is_empty() && *s != ".")
                .map(String::from)
                .collect();
            assert!(
                !parts.iter().any(|s| s == ".."),
                ".dockerignore pattern {p:?}: `..` is not understood by this test"
            );
            IgnorePattern { parts, exception }
        })
        .collect()
}

/// `*` and `?` within one path element (filepath.Match).
pub(crate) fn element_matches(pattern: &str, name: &str) -> bool {
    fn go(p: &[char], n: &[char]) -> bool {
        match p.split_first() {
            None => n.is_empty(),
            Some(('*', rest)) => (0..=n.len()).any(|i| go(rest, &n[i..])),
            Some(('?', rest)) => !n.is_empty() && go(rest, &n[1..]),
            Some((c, rest)) => n.first() == Some(c) && go(rest, &n[1..]),
        }
    }
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    go(&p, &n)
}

/// A pattern's elements against a path's; `**` spans any number of elements.
pub(crate) fn path_matches(pattern: &[String], path: &[&str]) -> bool {
    match pattern.split_first() {
        None => path.is_empty(),
        Some((p, rest)) if p == "**" => (0..=path.len()).any(|i| path_matches(rest, &path[i..])),
        Some((p, rest)) => match path.split_first() {
            Some((n, tail)) => element_matches(p, n) && path_matches(rest, tail),
            None => false,
        },
    }
}

/// Whether `.dockerignore` keeps `path` out of the context: the last pattern that matches
/// the path or one of its parent directories decides (moby's MatchesOrParentMatches).
pub(crate) fn excluded(patterns: &[IgnorePattern], path: &str) -> bool {
    let parts: Vec<&str> = path.split('/').collect();
    let mut out = false;
    for p in patterns {
        if (1..=parts.len()).any(|n| path_matches(&p.parts, &parts[..n])) {
            out = !p.exception;
        }
    }
    out
}

/// Whether an exception pattern could admit something below the excluded directory
/// `dir`, so the walk must look inside it (as Docker does; otherwise it skips the
/// directory, which keeps `target/` out of the walk).
fn exception_below(patterns: &[IgnorePattern], dir: &str) -> bool {
    let parts: Vec<&str> = dir.split('/').collect();
    patterns.iter().filter(|p| p.exception).any(|p| {
        for (i, d) in parts.iter().enumerate() {
            match p.parts.get(i) {
                Some(s) if s == "**" => return true,
                Some(s) if element_matches(s, d) => {}
                _ => return false,
            }
        }
        p.parts.len() > parts.len()
    })
}

/// Every file of the context `.dockerignore` admits, as paths relative to `root`.
pub(crate) fn context_files(root: &Path, patterns: &[IgnorePattern]) -> BTreeSet<String> {
    fn walk(root: &Path, rel: &str, patterns: &[IgnorePattern], out: &mut BTreeSet<String>) {
        let dir = if rel.is_empty() {
            root.to_path_buf()
        } else {
            root.join(rel)
        };
        let mut entries: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap())
            .collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let name = e.file_name().into_string().expect("UTF-8 file names");
            let path = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            let ty = e.file_type().unwrap();
            if ty.is_dir() {
                if !excluded(patterns, &path) || exception_below(patterns, &path) {
                    walk(root, &path, patterns, out);
                }
            } else if !excluded(patterns, &path) {
                out.insert(path);
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(root, "", patterns, &mut out);
    out
}

// ---------------------------------------------------------------------------------------
// Dockerfile
// ---------------------------------------------------------------------------------------

/// One COPY of the build context into a stage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ContextCopy {
    pub(crate) sources: Vec<String>,
    /// absolute, resolved against the stage's WORKDIR
    pub(crate) dest: String,
    pub(crate) dest_is_dir: bool,
}

/// A build stage: its WORKDIR, its COPYs from the context, and whether it runs `cargo build`.
#[derive(Debug, Default)]
pub(crate) struct Stage {
    pub(crate) workdir: String,
    pub(crate) copies: Vec<ContextCopy>,
    pub(crate) builds: bool,
}

/// The instructions of a Dockerfile: continuation lines joined, comments dropped.
pub(crate) fn instructions(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && current.is_empty()) {
            continue;
        }
        match trimmed.strip_suffix('\\') {
            Some(head) => {
                current.push_str(head);
                current.push(' ');
            }
            None => {
                current.push_str(trimmed);
                let (op, args) = current.trim().split_once(char::is_whitespace).unwrap();
                out.push((op.to_uppercase(), args.trim().to_string()));
                current.clear();
            }
        }
    }
    assert!(current.is_empty(), "Dockerfile ends inside a continuation");
    out
}

fn resolve(workdir: &str, path: &str) -> String {
    let joined = if path.starts_with('/') {
        path.to_string()
    } else {
        format!("{}/{path}", workdir.trim_end_matches('/'))
    };
    let mut parts: Vec<&str> = Vec::new();
    for p in joined.split('/') {
        match p {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    format!("/{}", parts.join("/"))
}

pub(crate) fn parse_dockerfile(text: &str) -> Vec<Stage> {
    let mut stages: Vec<Stage> = Vec::new();
    for (op, args) in instructions(text) {
        match op.as_str() {
            "FROM" => stages.push(Stage {
                workdir: "/".into(),
                ..Default::default()
            }),
            "WORKDIR" => {
                let stage = stages.last_mut().expect("FROM first");
                stage.workdir = resolve(&stage.workdir, &args);
            }
            "RUN" if args.contains("cargo build") => {
                stages.last_mut().expect("FROM first").builds = true;
            }
            "COPY" | "ADD" => {
                let stage = stages.last_mut().expect("FROM first");
                let words: Vec<String> = if args.starts_with('[') {
                    serde_json::from_str(&args).expect("COPY in JSON form is a string array")
                } else {
                    args.split_whitespace().map(String::from).collect()
                };
                let (flags, rest): (Vec<String>, Vec<String>) =
                    words.into_iter().partition(|w| w.starts_with("--"));
                if flags.iter().any(|f| f.starts_with("--from")) {
                    continue; // from another stage or image, not the context
                }
                for f in &flags {
                    assert!(
                        f.starts_with("--chown") || f.starts_with("--chmod") || f == "--link",
                        "COPY flag {f} is not understood by this test; extend it"
                    );
                }
                let (dest, sources) = rest.split_last().expect("COPY <src>... <dest>");
                for s in sources {
                    assert!(
                        !s.contains(['*', '?', '[']) && !s.starts_with("http"),
                        "COPY source {s}: wildcards and URLs are not understood by this test; extend it"
                    );
                }
                stage.copies.push(ContextCopy {
                    sources: sources.to_vec(),
                    dest: resolve(&stage.workdir, dest),
                    dest_is_dir: dest.ends_with('/') || sources.len() > 1,
                });
            }
            _ => {}
        }
    }
    stages
}

/// Where each admitted file lands in the stage's filesystem (absolute paths), or the
/// error `docker build` gives for a source missing from the context.
pub(crate) fn replay_copies(
    stage: &Stage,
    context: &BTreeSet<String>,
) -> Result<BTreeMap<String, String>, String> {
    let mut placed = BTreeMap::new();
    for copy in &stage.copies {
        for src in &copy.sources {
            let src = resolve("/", src).trim_start_matches('/').to_string();
            let below = format!("{src}/");
            let under: Vec<&String> = context.iter().filter(|f| f.starts_with(&below)).collect();
            if context.contains(&src) {
                let name = src.rsplit('/').next().unwrap();
                let target = if copy.dest_is_dir {
                    format!("{}/{name}", copy.dest.trim_end_matches('/'))
                } else {
                    copy.dest.clone()
                };
                placed.insert(target, src.clone());
            } else if !under.is_empty() {
                // a directory: its contents go into dest
                for f in under {
                    let target =
                        format!("{}/{}", copy.dest.trim_end_matches('/'), &f[below.len()..]);
                    placed.insert(target, f.clone());
                }
            } else {
                return Err(format!(
                    "COPY {src}: not found in the build context or excluded by .dockerignore"
                ));
            }
        }
    }
    Ok(placed)
}

/// The stage that builds hookd, and the directory it builds in.
fn builder(stages: &[Stage]) -> &Stage {
    let builders: Vec<&Stage> = stages.iter().filter(|s| s.builds).collect();
    assert_eq!(builders.len(), 1, "one stage runs `cargo build`");
    builders[0]
}

/// The files the builder stage's WORKDIR holds when `cargo build` runs, relative to it.
pub(crate) fn build_tree(root: &Path) -> Result<BTreeMap<String, String>, String> {
    let patterns = parse_dockerignore(&read(&root.join(".dockerignore")));
    let stages = parse_dockerfile(&read(&root.join("Dockerfile")));
    let stage = builder(&stages);
    let context = context_files(root, &patterns);
    let placed = replay_copies(stage, &context)?;
    let prefix = format!("{}/", stage.workdir.trim_end_matches('/'));
    let mut tree = BTreeMap::new();
    for (target, src) in placed {
        let rel = target.strip_prefix(&prefix).ok_or_else(|| {
            format!(
                "COPY {src} -> {target}: outside the WORKDIR {}",
                stage.workdir
            )
        })?;
        tree.insert(rel.to_string(), src);
    }
    Ok(tree)
}

/// The target directory this test binary was built into (`<target>/debug/deps/<bin>`).
fn own_target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.ancestors()
        .nth(3)
        .expect("the test binary lives in <target>/<profile>/deps")
        .to_path_buf()
}

// ---------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------

#[test]
pub(crate) fn dockerignore_follows_dockers_rules() {
    let p = parse_dockerignore("# comment\n*\n!src\n!examples/endpoint.yaml\n**/*.swp\n");
    assert!(excluded(&p, "target"));
    assert!(excluded(&p, "README.md"));
    assert!(!excluded(&p, "src"));
    assert!(
        !excluded(&p, "src/k8s/mod.rs"),
        "a parent directory matches"
    );
    assert!(excluded(&p, "src/k8s/.mod.rs.swp"), "the last match wins");
    assert!(!excluded(&p, "examples/endpoint.yaml"));
    assert!(excluded(&p, "examples/other.yaml"));
    assert!(exception_below(&p, "examples"));
    assert!(!exception_below(&p, "target"));
    assert!(element_matches("*.y?ml", "a.yaml") && !element_matches("*.yml", "a.yaml"));
}

#[test]
pub(crate) fn dockerfile_copies_are_replayed() {
    let stages = parse_dockerfile(
        "FROM rust AS builder\nWORKDIR /src\n# c\nCOPY a.toml b.lock \\\n  ./\nCOPY bench/Cargo.toml ./bench/\nCOPY src ./src\nRUN cargo build\nFROM distroless\nCOPY --from=builder /out/x /x\n",
    );
    let b = builder(&stages);
    assert_eq!(b.workdir, "/src");
    assert_eq!(b.copies.len(), 3);
    let context: BTreeSet<String> = ["a.toml", "b.lock", "bench/Cargo.toml", "src/main.rs"]
        .into_iter()
        .map(String::from)
        .collect();
    let placed = replay_copies(b, &context).unwrap();
    assert_eq!(placed["/src/a.toml"], "a.toml");
    assert_eq!(placed["/src/bench/Cargo.toml"], "bench/Cargo.toml");
    assert_eq!(placed["/src/src/main.rs"], "src/main.rs");
    let mut missing = context.clone();
    missing.remove("src/main.rs");
    assert!(replay_copies(b, &missing).unwrap_err().contains("COPY src"));
}

/// The crate builds from what the image build sees: every file the Dockerfile copies
/// (after `.dockerignore`), and nothing else, checked with `cargo check --locked
/// --offline` in a directory of its own.
///
/// Run time: the copy lives at a fixed place (`<target>/docker-context/`) and is checked
/// with this build's own target dir, so the dependencies' check artifacts that `cargo
/// clippy` leaves there (CI runs clippy first) are reused and only the copied crate is
/// checked, incrementally from the last run. (A test process holds no cargo lock, so the
/// nested cargo does not wait for the one that built this test.)
#[test]
pub(crate) fn crate_builds_from_the_docker_context() {
    let root = repo("");
    let tree = build_tree(&root).unwrap_or_else(|e| panic!("docker build would fail: {e}"));
    for needed in ["Cargo.toml", "Cargo.lock", "src/main.rs", "src/lib.rs"] {
        assert!(tree.contains_key(needed), "the image build has no {needed}");
    }
    let target = own_target_dir();
    let dir = target.join("docker-context");
    // exactly the copied files: nothing left over from an earlier run
    if dir.exists() {
        std::fs::remove_dir_all(&dir).unwrap();
    }
    for (rel, src) in &tree {
        let to = dir.join(rel);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(root.join(src), &to).unwrap();
    }
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args([
            "check",
            "-p",
            "hookd",
            "--locked",
            "--offline",
            "--message-format",
            "short",
        ])
        .current_dir(&dir)
        .env("CARGO_TARGET_DIR", &target)
        .env("CARGO_TERM_COLOR", "never")
        .output()
        .expect("cargo runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "hookd does not build from the Docker context ({} files: {:?}):\n{}",
        tree.len(),
        tree.keys()
            .filter(|k| !k.starts_with("src/"))
            .collect::<Vec<_>>(),
        stderr
            .lines()
            .filter(|l| !l.trim_start().starts_with("Compiling")
                && !l.trim_start().starts_with("Checking"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
