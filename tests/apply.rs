//! Acceptance tests for `hookd apply -f` (issue 3): WebhookEndpoint and Secret YAML
//! applied to Postgres through the endpoint sync core, idempotently, with secret
//! rotation grace, and refused as a whole (naming file, document, object and problem)
//! when any document is invalid. Runs the real binary as a subprocess.

use crate::common;

use std::path::PathBuf;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use common::*;
use sqlx::PgPool;
use uuid::Uuid;

/// A temp YAML file, removed on drop.
struct YamlFile(PathBuf);

impl YamlFile {
    fn new(text: &str) -> YamlFile {
        let path =
            std::env::temp_dir().join(format!("hookd-apply-{}.yaml", Uuid::now_v7().simple()));
        std::fs::write(&path, text).unwrap();
        YamlFile(path)
    }
    fn rewrite(&self, text: &str) {
        std::fs::write(&self.0, text).unwrap();
    }
    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for YamlFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

struct Run {
    ok: bool,
    stdout: String,
    stderr: String,
}

async fn apply(pool: &PgPool, file: &YamlFile) -> Run {
    let out = HookdCommand::new(["apply", "-f", file.path()])
        .database(pool)
        .test_key()
        .env("HOOKD_LOG", "warn")
        .run()
        .await;
    Run {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn secret_string_data(name: &str, key: &str, value: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: {name}\n  namespace: team-a\nstringData:\n  {key}: \"{value}\"\n"
    )
}

fn secret_data(name: &str, key: &str, value: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: {name}\n  namespace: team-a\ntype: Opaque\ndata:\n  {key}: {}\n",
        STANDARD.encode(value)
    )
}

/// A WebhookEndpoint; `extra_spec` lines are appended to its spec (indented by 2).
fn endpoint_doc(name: &str, secret: &str, key: &str, extra_spec: &str) -> String {
    format!(
        "apiVersion: hookd.dev/v1alpha1\nkind: WebhookEndpoint\nmetadata:\n  name: {name}\n  namespace: team-a\nspec:\n  url: https://receiver.example.com/hooks/{name}\n  eventTypes: [\"invoice.*\", \"user.created\"]\n  secretRef:\n    name: {secret}\n    key: {key}\n{extra_spec}"
    )
}

fn docs(parts: &[String]) -> String {
    parts.join("---\n")
}

/// (endpoints, endpoint_secrets) row counts.
async fn counts(pool: &PgPool) -> (i64, i64) {
    sqlx::query_as(
        "SELECT (SELECT count(*) FROM hookd.endpoints), (SELECT count(*) FROM hookd.endpoint_secrets)",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Row versions of every endpoint and secret row: unchanged xmin means not written.
async fn row_versions(pool: &PgPool) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT 'e' || id::text || ':' || xmin::text FROM hookd.endpoints
         UNION ALL SELECT 's' || id::text || ':' || xmin::text FROM hookd.endpoint_secrets
         ORDER BY 1",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

/// (endpoint id, key id, ciphertext, not_after offset, active)
type StoredRow = (Uuid, String, Vec<u8>, Option<f64>, bool);

/// (secret, seconds from now()+grace to not_after (None when unset), active). Secrets
/// are stored encrypted under the test key; this decrypts them.
async fn secrets_of(pool: &PgPool, name: &str, grace: f64) -> Vec<(String, Option<f64>, bool)> {
    let rows: Vec<StoredRow> = sqlx::query_as(
        "SELECT s.endpoint_id, s.key_id, s.ciphertext,
                extract(epoch FROM s.not_after - (now() + make_interval(secs => $2)))::float8,
                (s.not_after IS NULL OR s.not_after > now())
         FROM hookd.endpoint_secrets s JOIN hookd.endpoints e ON e.id = s.endpoint_id
         WHERE e.k8s_namespace = 'team-a' AND e.k8s_name = $1 ORDER BY s.id",
    )
    .bind(name)
    .bind(grace)
    .fetch_all(pool)
    .await
    .unwrap();
    let keyring = test_keyring();
    rows.into_iter()
        .map(|(ep, key_id, ct, offset, active)| {
            let plain = keyring.decrypt(ep, &key_id, &ct).unwrap();
            (plain.to_string(), offset, active)
        })
        .collect()
}

/// A Secret (stringData) and a WebhookEndpoint in one multi-document file become one
/// endpoint row and one secret row; applying the same file again reports `unchanged`
/// and writes no row.
#[sqlx::test]
async fn apply_creates_endpoint_and_is_idempotent(pool: PgPool) {
    let file = YamlFile::new(&docs(&[
        secret_string_data("orders-secret", "secret", SECRET_A),
        endpoint_doc("orders", "orders-secret", "secret", "  tenant: billing\n"),
    ]));
    let run = apply(&pool, &file).await;
    assert!(run.ok, "{}", run.stderr);
    assert!(
        run.stdout.contains("webhookendpoint/team-a/orders created"),
        "{}",
        run.stdout
    );

    let ep = hookd::db::endpoints::get_declared(&pool, "team-a", "orders")
        .await
        .unwrap()
        .expect("endpoint row");
    assert_eq!(ep.tenant, "billing");
    assert_eq!(ep.url, "https://receiver.example.com/hooks/orders");
    assert_eq!(ep.event_types, vec!["invoice.*", "user.created"]);
    assert_eq!(ep.state, hookd::domain::EndpointState::Active);
    assert_eq!(ep.id.get_version_num(), 7);
    assert!(run.stdout.contains(&ep.id.to_string()), "{}", run.stdout);
    assert_eq!(
        secrets_of(&pool, "orders", 0.0).await,
        vec![(SECRET_A.to_string(), None, true)]
    );
    assert_eq!(counts(&pool).await, (1, 1));

    let before = row_versions(&pool).await;
    let run = apply(&pool, &file).await;
    assert!(run.ok, "{}", run.stderr);
    assert!(
        run.stdout
            .contains("webhookendpoint/team-a/orders unchanged"),
        "{}",
        run.stdout
    );
    assert_eq!(
        row_versions(&pool).await,
        before,
        "a repeat apply writes nothing"
    );
    assert_eq!(counts(&pool).await, (1, 1));
}

/// A Secret given as base64 `data` works like `stringData`; the tenant defaults to the
/// namespace.
#[sqlx::test]
async fn apply_reads_base64_secret_data(pool: PgPool) {
    let file = YamlFile::new(&docs(&[
        endpoint_doc("orders", "orders-secret", "signing", ""),
        secret_data("orders-secret", "signing", SECRET_B),
    ]));
    let run = apply(&pool, &file).await;
    assert!(run.ok, "{}", run.stderr);
    let ep = hookd::db::endpoints::get_declared(&pool, "team-a", "orders")
        .await
        .unwrap()
        .expect("endpoint row");
    assert_eq!(ep.tenant, "team-a");
    assert_eq!(
        secrets_of(&pool, "orders", 0.0).await,
        vec![(SECRET_B.to_string(), None, true)]
    );
}

/// Changing the Secret rotates: the previous secret keeps signing until now + the
/// declared grace, the new one has no deadline, and two secrets are active. With grace
/// 0 the old secret stops at once and one is active.
#[sqlx::test]
async fn secret_rotation_keeps_the_old_secret_for_the_grace_period(pool: PgPool) {
    let file = YamlFile::new(&docs(&[
        secret_string_data("s", "secret", SECRET_A),
        endpoint_doc(
            "graceful",
            "s",
            "secret",
            "  secretRotationGraceSeconds: 3600\n",
        ),
        endpoint_doc("abrupt", "s", "secret", "  secretRotationGraceSeconds: 0\n"),
    ]));
    let run = apply(&pool, &file).await;
    assert!(run.ok, "{}", run.stderr);
    assert_eq!(counts(&pool).await, (2, 2));

    file.rewrite(&docs(&[
        secret_string_data("s", "secret", SECRET_B),
        endpoint_doc(
            "graceful",
            "s",
            "secret",
            "  secretRotationGraceSeconds: 3600\n",
        ),
        endpoint_doc("abrupt", "s", "secret", "  secretRotationGraceSeconds: 0\n"),
    ]));
    let run = apply(&pool, &file).await;
    assert!(run.ok, "{}", run.stderr);
    assert!(
        run.stdout
            .contains("webhookendpoint/team-a/graceful secret rotated"),
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains("2 active secret(s)"), "{}", run.stdout);

    let graceful = secrets_of(&pool, "graceful", 3600.0).await;
    assert_eq!(graceful.len(), 2, "{graceful:?}");
    let (old, old_offset, old_active) = &graceful[0];
    assert_eq!(old, SECRET_A);
    let offset = old_offset.expect("old secret has a deadline");
    assert!(
        offset.abs() < 60.0,
        "old not_after is now + 3600 s (off by {offset} s)"
    );
    assert!(old_active);
    assert_eq!(graceful[1], (SECRET_B.to_string(), None, true));

    let abrupt = secrets_of(&pool, "abrupt", 0.0).await;
    assert_eq!(abrupt.len(), 2, "{abrupt:?}");
    assert_eq!(abrupt[0].0, SECRET_A);
    assert!(
        !abrupt[0].2,
        "with grace 0 the old secret is no longer active"
    );
    assert_eq!(abrupt[1], (SECRET_B.to_string(), None, true));
    let active: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM hookd.endpoint_secrets s JOIN hookd.endpoints e ON e.id = s.endpoint_id
         WHERE e.k8s_name = 'abrupt' AND (s.not_after IS NULL OR s.not_after > now())",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(active, 1);

    // The same rotated file again changes nothing; the only write allowed is pruning the
    // secret whose grace has already run out.
    let expired: i64 =
        sqlx::query_scalar("SELECT id FROM hookd.endpoint_secrets WHERE not_after <= now()")
            .fetch_one(&pool)
            .await
            .unwrap();
    let before: Vec<String> = row_versions(&pool)
        .await
        .into_iter()
        .filter(|r| !r.starts_with(&format!("s{expired}:")))
        .collect();
    let run = apply(&pool, &file).await;
    assert!(run.ok, "{}", run.stderr);
    assert!(
        run.stdout
            .contains("webhookendpoint/team-a/graceful unchanged")
            && run
                .stdout
                .contains("webhookendpoint/team-a/abrupt unchanged"),
        "{}",
        run.stdout
    );
    assert_eq!(row_versions(&pool).await, before);
}

/// Every invalid document is refused: exit non-zero, the message names the file, the
/// document, the object and the problem, and nothing is written, not even the valid
/// endpoint that precedes the bad document in the same file.
#[sqlx::test]
async fn invalid_documents_are_refused_and_nothing_is_applied(pool: PgPool) {
    let good = [
        secret_string_data("good-secret", "secret", SECRET_A),
        endpoint_doc("good", "good-secret", "secret", ""),
    ];
    let short = format!("whsec_{}", STANDARD.encode([7u8; 16]));
    // (what, bad documents, document number, object, problem)
    let cases: Vec<(&str, Vec<String>, usize, &str, String)> = vec![
        (
            "missing Secret",
            vec![endpoint_doc("bad", "nope", "secret", "")],
            3,
            "WebhookEndpoint team-a/bad",
            "Secret team-a/nope not found".into(),
        ),
        (
            "Secret without the key",
            vec![endpoint_doc("bad", "good-secret", "other", "")],
            3,
            "WebhookEndpoint team-a/bad",
            r#"Secret team-a/good-secret has no key "other""#.into(),
        ),
        (
            "secret without whsec_ prefix",
            vec![
                secret_string_data("bad-secret", "secret", "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
                endpoint_doc("bad", "bad-secret", "secret", ""),
            ],
            4,
            "WebhookEndpoint team-a/bad",
            "must start with whsec_".into(),
        ),
        (
            "secret that is not base64",
            vec![
                secret_string_data("bad-secret", "secret", "whsec_!!!not*base64!!!"),
                endpoint_doc("bad", "bad-secret", "secret", ""),
            ],
            4,
            "WebhookEndpoint team-a/bad",
            "not valid base64".into(),
        ),
        (
            "secret of 16 bytes",
            vec![
                secret_string_data("bad-secret", "secret", &short),
                endpoint_doc("bad", "bad-secret", "secret", ""),
            ],
            4,
            "WebhookEndpoint team-a/bad",
            "24-64 bytes, got 16".into(),
        ),
        (
            "ftp URL",
            vec![endpoint_doc("bad", "good-secret", "secret", "")
                .replace("url: https://", "url: ftp://")],
            3,
            "WebhookEndpoint team-a/bad",
            "url must be an absolute http:// or https:// URL".into(),
        ),
        (
            "eventTypes entry a..b",
            vec![endpoint_doc("bad", "good-secret", "secret", "")
                .replace(r#"["invoice.*", "user.created"]"#, r#"["a..b"]"#)],
            3,
            "WebhookEndpoint team-a/bad",
            "each eventTypes entry must be".into(),
        ),
        (
            "unknown kind",
            vec!["apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: bad\n  namespace: team-a\ndata:\n  a: b\n".into()],
            3,
            "ConfigMap team-a/bad",
            "unsupported object v1/ConfigMap".into(),
        ),
        (
            "timeoutSeconds 0",
            vec![endpoint_doc("bad", "good-secret", "secret", "  timeoutSeconds: 0\n")],
            3,
            "WebhookEndpoint team-a/bad",
            "timeoutSeconds".into(),
        ),
        (
            "timeoutSeconds 301",
            vec![endpoint_doc("bad", "good-secret", "secret", "  timeoutSeconds: 301\n")],
            3,
            "WebhookEndpoint team-a/bad",
            "timeoutSeconds".into(),
        ),
        (
            "maxAttempts 101",
            vec![endpoint_doc("bad", "good-secret", "secret", "  maxAttempts: 101\n")],
            3,
            "WebhookEndpoint team-a/bad",
            "maxAttempts".into(),
        ),
        (
            "empty retrySchedule",
            vec![endpoint_doc("bad", "good-secret", "secret", "  retrySchedule: []\n")],
            3,
            "WebhookEndpoint team-a/bad",
            "retrySchedule".into(),
        ),
    ];
    for (what, bad, index, object, problem) in cases {
        let mut all = good.to_vec();
        all.extend(bad);
        let file = YamlFile::new(&docs(&all));
        let run = apply(&pool, &file).await;
        assert!(!run.ok, "{what}: apply succeeded: {}", run.stdout);
        let err = &run.stderr;
        assert!(err.contains(file.path()), "{what}: names the file: {err}");
        assert!(
            err.contains(&format!("document {index}")),
            "{what}: names document {index}: {err}"
        );
        assert!(err.contains(object), "{what}: names {object}: {err}");
        assert!(err.contains(&problem), "{what}: says {problem:?}: {err}");
        assert_eq!(counts(&pool).await, (0, 0), "{what}: nothing is written");
    }

    // the good documents alone do apply, so the refusals above were about the bad ones
    let file = YamlFile::new(&docs(&good));
    let run = apply(&pool, &file).await;
    assert!(run.ok, "{}", run.stderr);
    assert_eq!(counts(&pool).await, (1, 1));
}

/// A fresh secret for tests that must not use a published test vector.
const FRESH_SECRET: &str = "whsec_3q8JNv6QYhT0mZf1xk2Wc9bLr4sPaGdE";

/// Issue 17: misspelt fields are refused like `kubectl apply` refuses them, naming the
/// document, the field and the likely intended one, and nothing is written.
#[sqlx::test]
async fn unknown_fields_are_refused_naming_the_field(pool: PgPool) {
    let secret = secret_string_data("s", "secret", FRESH_SECRET);
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "spec.eventType",
            endpoint_doc("bad", "s", "secret", "").replace("eventTypes:", "eventType:"),
            "unknown field spec.eventType (did you mean eventTypes?)",
        ),
        (
            "spec.pause",
            endpoint_doc("bad", "s", "secret", "  pause: true\n"),
            "unknown field spec.pause (did you mean paused?)",
        ),
        (
            "spec.secretRef.nmae",
            endpoint_doc("bad", "s", "secret", "")
                .replace("    name: s\n", "    name: s\n    nmae: s\n"),
            "unknown field spec.secretRef.nmae (did you mean name?)",
        ),
        (
            "metadata.namspace",
            endpoint_doc("bad", "s", "secret", "").replace(
                "  namespace: team-a\n",
                "  namespace: team-a\n  namspace: x\n",
            ),
            "unknown field metadata.namspace (did you mean namespace?)",
        ),
        (
            "top-level specs",
            endpoint_doc("bad", "s", "secret", "").replace("spec:", "specs: {}\nspec:"),
            "unknown field specs (did you mean spec?)",
        ),
        (
            "Secret stringdata",
            endpoint_doc("bad", "s", "secret", "")
                + "---\n"
                + &secret_string_data("s2", "secret", FRESH_SECRET)
                    .replace("stringData:", "stringdata:"),
            "unknown field stringdata (did you mean stringData?)",
        ),
    ];
    for (what, bad, problem) in cases {
        let file = YamlFile::new(&docs(&[secret.clone(), bad]));
        let run = apply(&pool, &file).await;
        assert!(!run.ok, "{what}: apply succeeded: {}", run.stdout);
        assert!(run.stderr.contains("document "), "{what}: {}", run.stderr);
        assert!(
            run.stderr.contains(problem),
            "{what}: says {problem:?}: {}",
            run.stderr
        );
        assert_eq!(counts(&pool).await, (0, 0), "{what}: nothing is written");
    }
}

/// Issue 19: common mistakes with a Secret never echo the secret in the error.
#[sqlx::test]
async fn errors_never_echo_a_signing_secret(pool: PgPool) {
    let body = FRESH_SECRET.trim_start_matches("whsec_");
    let cases: Vec<(&str, String)> = vec![
        (
            "secret pasted as secretRef.key",
            docs(&[
                secret_string_data("s", "secret", FRESH_SECRET),
                endpoint_doc("bad", "s", FRESH_SECRET, ""),
            ]),
        ),
        (
            "whsec_ value under data (not base64)",
            docs(&[
                format!(
                    "apiVersion: v1\nkind: Secret\nmetadata:\n  name: s\n  namespace: team-a\ndata:\n  secret: {FRESH_SECRET}\n"
                ),
                endpoint_doc("bad", "s", "secret", ""),
            ]),
        ),
        (
            "stringData as a string",
            docs(&[
                format!(
                    "apiVersion: v1\nkind: Secret\nmetadata:\n  name: s\n  namespace: team-a\nstringData: {FRESH_SECRET}\n"
                ),
                endpoint_doc("bad", "s", "secret", ""),
            ]),
        ),
        (
            "stringData value as a list",
            docs(&[
                format!(
                    "apiVersion: v1\nkind: Secret\nmetadata:\n  name: s\n  namespace: team-a\nstringData:\n  secret: [{FRESH_SECRET}]\n"
                ),
                endpoint_doc("bad", "s", "secret", ""),
            ]),
        ),
        (
            "secret without a prefix-terminated value (trailing junk)",
            docs(&[
                secret_string_data("s", "secret", &format!("{FRESH_SECRET} extra")),
                endpoint_doc("bad", "s", "secret", ""),
            ]),
        ),
    ];
    for (what, text) in cases {
        let file = YamlFile::new(&text);
        let run = apply(&pool, &file).await;
        assert!(!run.ok, "{what}: apply succeeded: {}", run.stdout);
        assert!(run.stderr.contains("document "), "{what}: {}", run.stderr);
        assert!(
            !run.stderr.contains(body) && !run.stderr.contains(&body[..12]),
            "{what}: the secret is echoed: {}",
            run.stderr
        );
    }
}

/// YAML the parser refuses (a duplicate key, bad indentation, an alias bomb) is refused as a
/// whole file, at once, with the line and column, and without quoting the file: a Secret's
/// base64 `data` next to the mistake would otherwise be printed (the parser's default error
/// shows the lines around it, and base64 is not recognisable as a secret to redact).
#[sqlx::test]
async fn yaml_the_parser_refuses_is_reported_without_quoting_the_file(pool: PgPool) {
    let b64 = STANDARD.encode(FRESH_SECRET);
    let secret = |extra: &str| {
        format!(
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: s\n  namespace: team-a\ndata:\n  secret: {b64}\n{extra}"
        )
    };
    let mut bomb = String::from("a: &a [x, x, x, x, x, x, x, x, x]\n");
    for (i, c) in ('b'..='j').enumerate() {
        let prev = (b'a' + i as u8) as char;
        bomb.push_str(&format!(
            "{c}: &{c} [{}]\n",
            vec![format!("*{prev}"); 9].join(", ")
        ));
    }
    let cases = [
        ("a duplicate key", secret("  secret: again\n"), "duplicate"),
        ("bad indentation", secret("   oops: [\n"), "line"),
        ("an alias bomb", bomb, "budget"),
    ];
    for (what, text, says) in cases {
        let file = YamlFile::new(&text);
        let started = std::time::Instant::now();
        let run = apply(&pool, &file).await;
        assert!(!run.ok, "{what}: apply succeeded: {}", run.stdout);
        assert!(
            run.stderr.contains("not valid YAML"),
            "{what}: {}",
            run.stderr
        );
        assert!(
            run.stderr.contains(says),
            "{what}: says {says:?}: {}",
            run.stderr
        );
        assert!(
            !run.stderr.contains(&b64[..16]) && !run.stderr.contains("x, x"),
            "{what}: the file is quoted: {}",
            run.stderr
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{what}: {:?}",
            started.elapsed()
        );
        assert_eq!(counts(&pool).await, (0, 0), "{what}: nothing is written");
    }
}

/// Issue 19: deeply nested YAML is refused at once instead of parsed in quadratic time.
#[sqlx::test]
async fn deeply_nested_yaml_is_refused_quickly(pool: PgPool) {
    let depth = 100_000;
    let nested = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    let text = endpoint_doc("deep", "s", "secret", &format!("  headers: {nested}\n"));
    let file = YamlFile::new(&text);
    let started = std::time::Instant::now();
    let run = apply(&pool, &file).await;
    assert!(!run.ok);
    assert!(run.stderr.contains("nested"), "{}", run.stderr);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );

    let huge = YamlFile::new(&format!("# {}\n", "x".repeat(2 << 20)));
    let run = apply(&pool, &huge).await;
    assert!(!run.ok);
    assert!(run.stderr.contains("at most 1048576"), "{}", run.stderr);
}

/// Issue 19: a header value with CR/LF is refused with the header's name, not dropped.
#[sqlx::test]
async fn header_values_with_cr_lf_are_refused(pool: PgPool) {
    for value in [r#""a\r\nX-Injected: 1""#, r#""line\nbreak""#] {
        let file = YamlFile::new(&docs(&[
            secret_string_data("s", "secret", FRESH_SECRET),
            endpoint_doc(
                "bad",
                "s",
                "secret",
                &format!("  headers:\n    X-Team: {value}\n"),
            ),
        ]));
        let run = apply(&pool, &file).await;
        assert!(!run.ok, "{value}: {}", run.stdout);
        assert!(
            run.stderr.contains(&format!(
                "spec.headers.X-Team: {}",
                hookd::endpoints::HEADER_VALUE_RULE
            )),
            "{}",
            run.stderr
        );
        assert_eq!(counts(&pool).await, (0, 0));
    }
}

/// Issue 19: the published test-vector secret is applied with a warning that names the
/// endpoint, not the secret; a fresh secret gets no warning.
#[sqlx::test]
async fn published_test_vector_secret_is_warned_about(pool: PgPool) {
    let file = YamlFile::new(&docs(&[
        secret_string_data("s", "secret", SECRET_A),
        endpoint_doc("vector", "s", "secret", ""),
    ]));
    let run = apply(&pool, &file).await;
    assert!(run.ok, "{}", run.stderr);
    assert!(
        run.stderr
            .contains("webhookendpoint/team-a/vector signs with a published Standard Webhooks test-vector secret"),
        "{}",
        run.stderr
    );
    assert!(!run.stderr.contains(SECRET_A), "{}", run.stderr);

    let file = YamlFile::new(&docs(&[
        secret_string_data("s2", "secret", FRESH_SECRET),
        endpoint_doc("fresh", "s2", "secret", ""),
    ]));
    let run = apply(&pool, &file).await;
    assert!(run.ok, "{}", run.stderr);
    assert!(!run.stderr.contains("published"), "{}", run.stderr);
}

/// Issue 17, the 410 contract: re-applying the same declaration keeps a disabled endpoint
/// disabled and says why and what to do; applying it with `paused: true` and then without
/// re-enables it, as the README documents.
#[sqlx::test]
async fn a_disabled_endpoint_says_why_and_the_documented_way_re_enables_it(pool: PgPool) {
    let secret = secret_string_data("s", "secret", FRESH_SECRET);
    let file = YamlFile::new(&docs(&[
        secret.clone(),
        endpoint_doc("gone", "s", "secret", ""),
    ]));
    assert!(apply(&pool, &file).await.ok);
    // what the completer writes when the receiver answers 410
    let mut conn = pool.acquire().await.unwrap();
    let ep = hookd::db::endpoints::get_declared(&pool, "team-a", "gone")
        .await
        .unwrap()
        .unwrap();
    let version: i64 =
        sqlx::query_scalar("SELECT config_version FROM hookd.endpoints WHERE id = $1")
            .bind(ep.id)
            .fetch_one(&pool)
            .await
            .unwrap();
    hookd::db::endpoints::disable(
        &mut conn,
        &[(ep.id, version)],
        "receiver answered 410 Gone; change the WebhookEndpoint to re-enable it",
    )
    .await
    .unwrap();
    drop(conn);

    let run = apply(&pool, &file).await;
    assert!(run.ok, "{}", run.stderr);
    assert!(
        run.stdout.contains("unchanged")
            && run
                .stdout
                .contains("disabled because: receiver answered 410 Gone"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains("apply it once with `paused: true`"),
        "{}",
        run.stdout
    );

    file.rewrite(&docs(&[
        secret.clone(),
        endpoint_doc("gone", "s", "secret", "  paused: true\n"),
    ]));
    let run = apply(&pool, &file).await;
    assert!(run.stdout.contains("state paused"), "{}", run.stdout);
    file.rewrite(&docs(&[secret, endpoint_doc("gone", "s", "secret", "")]));
    let run = apply(&pool, &file).await;
    assert!(run.stdout.contains("state active"), "{}", run.stdout);
}

/// `hookd ARGS` with `stdin` as its standard input, on the test database.
fn hookd_with_stdin(pool: &PgPool, args: &[&str], stdin: &str) -> Run {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new(hookd_bin())
        .args(args)
        .env("DATABASE_URL", database_url(pool))
        .env(TEST_KEY_ENV, TEST_ENCRYPTION_KEY)
        .env("HOOKD_LOG", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    Run {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

async fn state_of(pool: &PgPool, name: &str) -> (String, Option<String>) {
    sqlx::query_as(
        "SELECT state, state_reason FROM hookd.endpoints WHERE k8s_namespace = 'team-a' AND k8s_name = $1",
    )
    .bind(name)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Issue 31 item 4: an endpoint from `hookd apply` without a cluster can be removed
/// (`hookd delete -f`, the same file), its unsent deliveries are cancelled, its history
/// stays, a second delete says "not found", and applying again brings it back. `-f DIR`
/// and `-f -` work for both commands. The API keeps refusing to change it, and says how.
#[sqlx::test]
async fn apply_then_delete_without_a_cluster(pool: PgPool) {
    let dir = std::env::temp_dir().join(format!("hookd-apply-dir-{}", Uuid::now_v7().simple()));
    std::fs::create_dir(&dir).unwrap();
    let orders = docs(&[
        secret_string_data("orders-secret", "secret", SECRET_A),
        endpoint_doc("orders", "orders-secret", "secret", ""),
    ]);
    let billing = docs(&[
        secret_string_data("billing-secret", "secret", SECRET_B),
        endpoint_doc("billing", "billing-secret", "secret", ""),
    ]);
    std::fs::write(dir.join("orders.yaml"), &orders).unwrap();
    std::fs::write(dir.join("billing.yaml"), &billing).unwrap();
    std::fs::write(dir.join("notes.txt"), "not yaml, not read").unwrap();
    let dir_arg = dir.to_str().unwrap();

    // a directory applies every *.yaml in it
    let r = hookd_with_stdin(&pool, &["apply", "-f", dir_arg], "");
    assert!(r.ok, "{}", r.stderr);
    assert!(
        r.stdout.contains("webhookendpoint/team-a/orders created"),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout.contains("webhookendpoint/team-a/billing created"),
        "{}",
        r.stdout
    );

    // an event waits for orders (no dispatcher runs)
    let api = TestApi::start(&pool).await;
    let (_, deliveries) = api.enqueue("team-a", "invoice.paid", r#"{"n":1}"#).await;
    assert_eq!(deliveries.len(), 2);
    let orders_id: Uuid = sqlx::query_scalar(
        "SELECT id FROM hookd.endpoints WHERE k8s_namespace = 'team-a' AND k8s_name = 'orders'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();

    // the API refuses, naming both ways that work
    let (status, v) = send(
        api.request_as(
            "team-a",
            reqwest::Method::DELETE,
            &format!("/v1/endpoints/{orders_id}"),
        )
        .await,
    )
    .await;
    assert_eq!(status, reqwest::StatusCode::CONFLICT, "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    for hint in ["kubectl", "hookd delete -f FILE", "paused: true"] {
        assert!(message.contains(hint), "{hint}: {message}");
    }

    // `-f -`: standard input names what to delete
    let r = hookd_with_stdin(&pool, &["delete", "-f", "-"], &orders);
    assert!(r.ok, "{}", r.stderr);
    assert!(
        r.stdout.contains(&format!(
            "webhookendpoint/team-a/orders deleted (id {orders_id}, 1 unfinished deliveries cancelled)"
        )),
        "{}",
        r.stdout
    );
    let (state, reason) = state_of(&pool, "orders").await;
    assert_eq!(state, "disabled");
    assert!(reason.unwrap().contains("hookd delete"));
    assert_eq!(state_of(&pool, "billing").await.0, "active");
    let statuses: Vec<String> =
        sqlx::query_scalar("SELECT status::text FROM hookd.deliveries WHERE endpoint_id = $1")
            .bind(orders_id)
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(statuses, ["cancelled"], "history stays, cancelled");

    // a second delete: not found, exit 1, unless --ignore-not-found
    let r = hookd_with_stdin(&pool, &["delete", "-f", "-"], &orders);
    assert!(!r.ok);
    assert!(
        r.stderr.contains("webhookendpoint/team-a/orders not found"),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("--ignore-not-found"), "{}", r.stderr);
    let r = hookd_with_stdin(&pool, &["delete", "--ignore-not-found", "-f", "-"], &orders);
    assert!(r.ok, "{}", r.stderr);

    // applying again brings it back, same id; `-f -` applies too
    let r = hookd_with_stdin(&pool, &["apply", "-f", "-"], &orders);
    assert!(r.ok, "{}", r.stderr);
    assert!(
        r.stdout.contains(&format!("id {orders_id}, state active")),
        "{}",
        r.stdout
    );

    // a directory deletes every endpoint its *.yaml declare
    let r = hookd_with_stdin(&pool, &["delete", "-f", dir_arg], "");
    assert!(r.ok, "{}", r.stderr);
    assert!(
        r.stdout.contains("webhookendpoint/team-a/orders deleted"),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout.contains("webhookendpoint/team-a/billing deleted"),
        "{}",
        r.stdout
    );
    assert_eq!(state_of(&pool, "billing").await.0, "disabled");

    // a directory without YAML is refused, naming it
    let empty = dir.join("empty");
    std::fs::create_dir(&empty).unwrap();
    let r = hookd_with_stdin(&pool, &["delete", "-f", empty.to_str().unwrap()], "");
    assert!(!r.ok);
    assert!(r.stderr.contains("without *.yaml files"), "{}", r.stderr);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An apply that creates many endpoints leaves the planner statistics that count them.
/// Autovacuum can sample the table while the apply's one transaction is open and record
/// its new pages as holding no rows; until its next pass every plan that joins endpoints
/// expects one (`scale::statistics_that_see_no_endpoints_…` shows what that cost). Here the
/// sample is taken on purpose while the apply runs: whatever it saw, the counts after the
/// apply are the committed ones. Before: never analyzed (reltuples -1), or the sample's 0.
#[sqlx::test]
async fn a_bulk_apply_leaves_statistics_that_count_its_endpoints(pool: PgPool) {
    let n = hookd::apply::ANALYZE_AFTER_CREATING;
    let mut parts = vec![secret_string_data("bulk-secret", "secret", SECRET_A)];
    parts.extend((0..n).map(|i| endpoint_doc(&format!("bulk-{i}"), "bulk-secret", "secret", "")));
    let file = YamlFile::new(&docs(&parts));
    let sampler = {
        let pool = pool.clone();
        tokio::spawn(async move {
            // sample while the apply's rows are uncommitted, as autovacuum may
            loop {
                let open: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM pg_locks l
                     WHERE l.relation = 'hookd.endpoints'::regclass AND l.mode = 'RowExclusiveLock'
                       AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())",
                )
                .fetch_one(&pool)
                .await
                .unwrap();
                if open > 0 {
                    sqlx::query("ANALYZE hookd.endpoints")
                        .execute(&pool)
                        .await
                        .unwrap();
                    return;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    let run = apply(&pool, &file).await;
    assert!(run.ok, "{}", run.stderr);
    tokio::time::timeout(Duration::from_secs(5), sampler)
        .await
        .expect("the sample was taken during the apply")
        .unwrap();
    let tuples: f32 = sqlx::query_scalar(
        "SELECT reltuples FROM pg_class WHERE oid = 'hookd.endpoints'::regclass",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        tuples, n as f32,
        "the statistics count the applied endpoints"
    );
}

/// A WebhookSource in a file: stored with the source rules, its Secret's new value rotated
/// in, refused with the CRD's message when the API server would refuse it, refused whole
/// (nothing of the file applied) when its name is another's, and removed by `hookd delete`.
#[sqlx::test]
async fn a_webhook_source_is_applied_rotated_refused_and_deleted(pool: PgPool) {
    const STRIPE_1: &str = "whsec_apply_7Hd2Lp9Qx4Vm1Zc8Rn3Kt6Yw";
    const STRIPE_2: &str = "whsec_apply_2Bf8Jw5Ns1Xq7Gv4Mc9Pd3Hy";
    let source_doc = |extra: &str| {
        format!(
            "apiVersion: hookd.dev/v1alpha1\nkind: WebhookSource\nmetadata:\n  name: stripe-in\n  namespace: team-a\nspec:\n  provider: stripe\n  secretRef: {{name: stripe-in-secret}}\n{extra}"
        )
    };
    let file = YamlFile::new(&docs(&[
        secret_string_data("stripe-in-secret", "secret", STRIPE_1),
        source_doc(""),
    ]));
    let run = apply(&pool, &file).await;
    assert!(run.ok, "{}", run.stderr);
    assert!(
        run.stdout
            .contains("webhooksource/team-a/stripe-in created")
            && run.stdout.contains("/in/stripe-in"),
        "{}",
        run.stdout
    );
    let row = hookd::db::sources::get(&pool, "stripe-in", Some("team-a"))
        .await
        .unwrap()
        .expect("stored");
    assert_eq!(row.managed_by, hookd::domain::ManagedBy::Kubernetes);

    let run = apply(&pool, &file).await;
    assert!(
        run.stdout
            .contains("webhooksource/team-a/stripe-in configured"),
        "{}",
        run.stdout
    );
    file.rewrite(&docs(&[
        secret_string_data("stripe-in-secret", "secret", STRIPE_2),
        source_doc(""),
    ]));
    let run = apply(&pool, &file).await;
    assert!(run.stdout.contains("secret rotated"), "{}", run.stdout);
    let live: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM hookd.source_secrets WHERE source_id = $1 AND (not_after IS NULL OR not_after > now())",
    )
    .bind(row.id)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(live, 2);

    // what the API server would refuse, with its message; and the source rules' own
    for (extra, says) in [
        (
            "  provider: hmac\n",
            "spec.hmac is required for provider hmac",
        ),
        ("  maxBodyBytes: 0\n", "maxBodyBytes"),
        ("  eventTypePrefix: \"a b\"\n", "eventTypePrefix"),
    ] {
        let doc = source_doc(extra).replace(
            "  provider: stripe\n",
            if extra.contains("provider") {
                ""
            } else {
                "  provider: stripe\n"
            },
        );
        let bad = YamlFile::new(&docs(&[
            secret_string_data("stripe-in-secret", "secret", STRIPE_2),
            doc,
        ]));
        let run = apply(&pool, &bad).await;
        assert!(!run.ok, "{extra}: applied");
        assert!(run.stderr.contains(says), "{extra}: {}", run.stderr);
        assert!(!run.stderr.contains(STRIPE_2), "the secret is never echoed");
    }

    // a name another door holds: the whole file is refused, its endpoint included
    let (api_source, _) = hookd::inbound::sources::create(
        &pool,
        &common::keyring(common::TEST_ENCRYPTION_KEY, ""),
        hookd::inbound::sources::NewSource {
            name: "taken".into(),
            tenant: "team-b".into(),
            consumer: None,
            provider: "github".into(),
            hmac: None,
            secret: None,
            event_type_prefix: None,
            max_body_bytes: None,
            description: None,
            max_body_allowed: 1 << 20,
        },
    )
    .await
    .unwrap();
    let clash = YamlFile::new(&docs(&[
        secret_string_data("stripe-in-secret", "secret", STRIPE_2),
        secret_string_data("orders-secret", "secret", SECRET_A),
        endpoint_doc("orders", "orders-secret", "secret", ""),
        source_doc("").replace("name: stripe-in\n", "name: taken\n"),
    ]));
    let before = counts(&pool).await;
    let run = apply(&pool, &clash).await;
    assert!(!run.ok);
    assert!(
        run.stderr.contains("webhooksource/team-a/taken")
            && run.stderr.contains("nothing was applied"),
        "{}",
        run.stderr
    );
    assert_eq!(
        counts(&pool).await,
        before,
        "the file's endpoint was not applied either"
    );
    assert_eq!(
        hookd::db::sources::get(&pool, "taken", None)
            .await
            .unwrap()
            .unwrap()
            .id,
        api_source.id
    );

    let r = hookd_with_stdin(&pool, &["delete", "-f", "-"], &docs(&[source_doc("")]));
    assert!(r.ok, "{}", r.stderr);
    assert!(
        r.stdout.contains("webhooksource/team-a/stripe-in deleted"),
        "{}",
        r.stdout
    );
    assert!(
        hookd::db::sources::get(&pool, "stripe-in", None)
            .await
            .unwrap()
            .is_none()
    );
}
