//! `hookd receiver` as a user (and the kind e2e) runs it: a real process on a real port,
//! deliveries signed the way the dispatcher signs them, and its JSON routes read over HTTP.

use crate::common;

use std::time::{Duration, Instant};

use hookd::receiver::{Received, fingerprint};
use hookd::signing::{SigningSecret, signature_header};
use serde_json::json;

use common::{HookdCommand, HookdProcess, Lines, SECRET_A, SECRET_B};

const SECRET_C: &str = "whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";

/// A running `hookd receiver` (killed on drop); `lines` of the process are its stdout.
struct ReceiverProc {
    process: HookdProcess,
    base: String,
    http: reqwest::Client,
}

/// `hookd receiver` with no secret from the test's environment.
fn receiver_command(args: &[&str]) -> HookdCommand {
    HookdCommand::new(["receiver"])
        .args(args)
        .env_remove("HOOKD_RECEIVER_SECRETS")
        .env_remove("HOOKD_RECEIVER_SECRET_FILES")
}

async fn start(args: &[&str], envs: &[(&str, &str)]) -> ReceiverProc {
    common::init();
    let base = format!("http://127.0.0.1:{}", common::free_port());
    let mut process = receiver_command(&["--listen", &base["http://".len()..]])
        .args(args)
        .envs(envs.iter().copied())
        .base_url(&base)
        .lines(Lines::Stdout)
        .spawn();
    process.wait_healthy("/healthz").await;
    ReceiverProc {
        process,
        base,
        http: reqwest::Client::new(),
    }
}

impl ReceiverProc {
    /// POSTs `body` as the dispatcher would, signed with each of `secrets` at `ts`.
    async fn deliver_at(
        &self,
        path: &str,
        id: &str,
        secrets: &[&str],
        ts: i64,
    ) -> reqwest::Response {
        let body = format!(r#"{{"id":"{id}"}}"#);
        let keys: Vec<SigningSecret> = secrets
            .iter()
            .map(|s| SigningSecret::parse(s).unwrap())
            .collect();
        self.http
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .header("webhook-id", id)
            .header("webhook-timestamp", ts.to_string())
            .header(
                "webhook-signature",
                signature_header(&keys, id, ts, body.as_bytes()),
            )
            .header("hookd-event-type", "test.event")
            .body(body)
            .send()
            .await
            .unwrap()
    }

    async fn deliver(&self, id: &str, secrets: &[&str]) -> u16 {
        let now = chrono::Utc::now().timestamp();
        self.deliver_at("/hooks", id, secrets, now)
            .await
            .status()
            .as_u16()
    }

    async fn received(&self) -> Received {
        let r = self
            .http
            .get(format!("{}/received", self.base))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        r.json().await.unwrap()
    }

    async fn put_control(&self, body: serde_json::Value) -> (u16, serde_json::Value) {
        let r = self
            .http
            .put(format!("{}/control", self.base))
            .json(&body)
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json().await.unwrap())
    }

    /// The next printed delivery line.
    fn next_delivery_line(&self) -> String {
        loop {
            let line = self
                .process
                .lines()
                .recv_timeout(Duration::from_secs(10))
                .expect("receiver printed a line per delivery");
            if line.starts_with("receiver: ") {
                return line;
            }
        }
    }
}

#[tokio::test]
async fn verifies_counts_and_prints_every_delivery() {
    let rx = start(&["--secret", SECRET_A], &[]).await;
    let now = chrono::Utc::now().timestamp();

    assert_eq!(rx.deliver("id-1", &[SECRET_A]).await, 200);
    let line = rx.next_delivery_line();
    assert_eq!(
        line, r#"receiver: test.event webhook-id=id-1 signature=verified body={"id":"id-1"}"#,
        "the line format `hookd dev` users (and tests/dev.rs) read"
    );
    // Any path is a delivery, even one of the JSON routes; two secrets as during a rotation.
    let both = rx
        .deliver_at("/received", "id-2", &[SECRET_B, SECRET_A], now)
        .await;
    assert_eq!(both.status(), 200);
    assert!(
        rx.next_delivery_line()
            .contains("webhook-id=id-2 signature=verified")
    );
    assert_eq!(rx.deliver("id-1", &[SECRET_A]).await, 200, "a resend");
    assert!(
        rx.next_delivery_line()
            .contains("webhook-id=id-1 signature=verified")
    );
    // Signed with a secret the receiver does not hold, and a replayed old timestamp.
    assert_eq!(rx.deliver("id-3", &[SECRET_B]).await, 401);
    assert!(
        rx.next_delivery_line()
            .contains("webhook-id=id-3 signature=INVALID")
    );
    let stale = rx.deliver_at("/", "id-4", &[SECRET_A], now - 400).await;
    assert_eq!(stale.status(), 401);
    let err: serde_json::Value = stale.json().await.unwrap();
    assert_eq!(err["error"]["code"], "invalid_signature");
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("tolerance"),
        "{err}"
    );

    let r = rx.received().await;
    // the page is unauthenticated: secrets are named by source, never by a hash of them
    assert_eq!(r.secrets, vec!["secret #1"]);
    assert_eq!(
        (
            r.deliveries,
            r.verified,
            r.invalid,
            r.unique,
            r.duplicates,
            r.in_flight
        ),
        (5, 3, 2, 2, 1, 0)
    );
    let id1 = &r.ids["id-1"];
    assert_eq!((id1.count, id1.verified, id1.invalid), (2, 2, 0));
    assert_eq!(id1.key.as_deref(), Some("secret #1"));
    assert_eq!((id1.signatures, id1.last_status), (1, 200));
    assert_eq!(id1.event_type.as_deref(), Some("test.event"));
    assert_eq!(r.ids["id-2"].signatures, 2);
    let id3 = &r.ids["id-3"];
    assert_eq!((id3.count, id3.verified, id3.invalid), (1, 0, 1));
    assert_eq!((id3.key.as_deref(), id3.last_status), (None, 401));

    // DELETE /received forgets the deliveries but keeps the secrets.
    let del = rx
        .http
        .delete(format!("{}/received", rx.base))
        .send()
        .await
        .unwrap();
    assert_eq!(del.status(), 204);
    let r = rx.received().await;
    assert_eq!((r.deliveries, r.ids.len()), (0, 0));
    assert_eq!(r.secrets, vec!["secret #1"]);
}

#[tokio::test]
async fn a_rotated_secret_file_takes_effect_without_a_restart() {
    let dir = std::env::temp_dir().join(format!(
        "hookd-receiver-test-{}",
        uuid::Uuid::now_v7().simple()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("secret");
    std::fs::write(&file, format!("{SECRET_B}\n")).unwrap();
    // fingerprints (opt-in) tell the old and new secret of one file apart, as the e2e does
    let rx = start(
        &["--show-fingerprints"],
        &[("HOOKD_RECEIVER_SECRET_FILES", file.to_str().unwrap())],
    )
    .await;
    assert_eq!(rx.deliver("before", &[SECRET_B]).await, 200);
    assert_eq!(
        rx.received().await.ids["before"].key,
        Some(fingerprint(SECRET_B))
    );

    // Replace the file the way the kubelet updates a mounted Secret: write aside, rename over.
    let aside = dir.join("secret.new");
    std::fs::write(&aside, SECRET_C).unwrap();
    std::fs::rename(&aside, &file).unwrap();
    assert_eq!(rx.received().await.secrets, vec![fingerprint(SECRET_C)]);
    assert_eq!(rx.deliver("old-only", &[SECRET_B]).await, 401);
    assert_eq!(rx.deliver("during-grace", &[SECRET_C, SECRET_B]).await, 200);
    let r = rx.received().await;
    let grace = &r.ids["during-grace"];
    assert_eq!(grace.key, Some(fingerprint(SECRET_C)));
    assert_eq!(grace.signatures, 2);
    assert_eq!(r.ids["old-only"].invalid, 1);

    // An unusable file contributes no secrets (and the receiver keeps running).
    std::fs::write(&file, "not-a-secret").unwrap();
    assert!(rx.received().await.secrets.is_empty());
    assert_eq!(rx.deliver("garbage", &[SECRET_C]).await, 401);
    std::fs::remove_file(&file).unwrap();
    assert_eq!(rx.deliver("missing", &[SECRET_C]).await, 401);
    std::fs::write(&file, SECRET_C).unwrap();
    assert_eq!(rx.deliver("restored", &[SECRET_C]).await, 200);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn answers_slowly_or_with_an_error_when_told_to() {
    let rx = start(&["--secret", SECRET_A, "--status", "202"], &[]).await;
    let control: serde_json::Value = rx
        .http
        .get(format!("{}/control", rx.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(control, json!({"delayMs": 0, "status": 202}));
    assert_eq!(rx.deliver("a", &[SECRET_A]).await, 202);

    // An error status keeps deliveries pending at hookd; they are still recorded as verified.
    let (code, now) = rx.put_control(json!({"status": 503})).await;
    assert_eq!((code, now), (200, json!({"delayMs": 0, "status": 503})));
    assert_eq!(rx.deliver("b", &[SECRET_A]).await, 503);
    let r = rx.received().await;
    assert_eq!((r.ids["b"].verified, r.ids["b"].last_status), (1, 503));
    assert_eq!(r.behaviour.status, 503);

    // A delay holds deliveries in flight, visible in /received while they wait.
    let delay = Duration::from_millis(1500);
    rx.put_control(json!({"delayMs": delay.as_millis() as u64, "status": 200}))
        .await;
    let started = Instant::now();
    let slow = {
        let (http, base) = (rx.http.clone(), rx.base.clone());
        let now = chrono::Utc::now().timestamp();
        let key = SigningSecret::parse(SECRET_A).unwrap();
        let sig = signature_header(&[key], "slow", now, b"{}");
        tokio::spawn(async move {
            http.post(format!("{base}/hooks"))
                .header("webhook-id", "slow")
                .header("webhook-timestamp", now.to_string())
                .header("webhook-signature", sig)
                .body("{}")
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        })
    };
    assert!(
        common::wait_until(Duration::from_secs(5), || async {
            rx.received().await.in_flight == 1
        })
        .await,
        "the slow delivery is counted in flight"
    );
    assert_eq!(slow.await.unwrap(), 200);
    assert!(started.elapsed() >= delay);
    assert_eq!(rx.received().await.in_flight, 0);

    // A client that gives up (a dispatcher killed mid-request) is no longer in flight.
    rx.put_control(json!({"delayMs": 60_000})).await;
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let now = chrono::Utc::now().timestamp();
    let key = SigningSecret::parse(SECRET_A).unwrap();
    let gave_up = impatient
        .post(format!("{}/hooks", rx.base))
        .header("webhook-id", "abandoned")
        .header("webhook-timestamp", now.to_string())
        .header(
            "webhook-signature",
            signature_header(&[key], "abandoned", now, b"{}"),
        )
        .body("{}")
        .send()
        .await;
    assert!(gave_up.is_err());
    assert!(
        common::wait_until(Duration::from_secs(5), || async {
            rx.received().await.in_flight == 0
        })
        .await,
        "an abandoned delivery leaves in_flight"
    );
    assert_eq!(rx.received().await.ids["abandoned"].verified, 1);

    // Bad control input is refused and changes nothing.
    for bad in [
        json!({"status": 99}),
        json!({"status": 600}),
        json!({"delay": 5}),
    ] {
        let (code, body) = rx.put_control(bad.clone()).await;
        assert_eq!(code, 422, "{bad}: {body}");
        assert_eq!(body["error"]["code"], "invalid_control");
    }
    assert_eq!(
        rx.received().await.behaviour,
        hookd::receiver::Behaviour {
            delay_ms: 60_000,
            status: 200
        }
    );
}

#[test]
fn refuses_to_start_without_a_usable_secret() {
    let run = |args: &[&str]| {
        let out = receiver_command(&["--listen", "127.0.0.1:0"])
            .args(args)
            .output();
        assert!(!out.status.success(), "{args:?} must fail");
        String::from_utf8(out.stderr).unwrap()
    };
    let none = run(&[]);
    assert!(none.contains("no signing secret"), "{none}");
    let short = run(&["--secret", "whsec_c2hvcnQ="]);
    assert!(short.contains("signing secret #0"), "{short}");
    assert!(
        !short.contains("c2hvcnQ"),
        "the secret is never printed: {short}"
    );
    let bad_status = run(&["--secret", SECRET_A, "--status", "42"]);
    assert!(bad_status.contains("status 42"), "{bad_status}");
}

/// Issue 19: a sender cannot forge output lines through the fields the receiver prints.
#[tokio::test]
async fn printed_fields_are_escaped() {
    let rx = start(&["--secret", SECRET_A], &[]).await;
    let now = chrono::Utc::now().timestamp();
    let key = SigningSecret::parse(SECRET_A).unwrap();
    let body = "{\"a\":1}\nreceiver: invoice.paid webhook-id=forged signature=verified body={}";
    let r = rx
        .http
        .post(format!("{}/hooks", rx.base))
        .header("webhook-id", "id-x")
        .header("webhook-timestamp", now.to_string())
        .header(
            "webhook-signature",
            signature_header(&[key], "id-x", now, body.as_bytes()),
        )
        .header("hookd-event-type", "test.event")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let line = rx.next_delivery_line();
    assert!(
        line.contains("body={\"a\":1}\\nreceiver: invoice.paid"),
        "{line}"
    );
    let deadline = Instant::now() + Duration::from_millis(300);
    while Instant::now() < deadline {
        if let Ok(extra) = rx.process.lines().recv_timeout(Duration::from_millis(50)) {
            panic!("a second line was printed: {extra}");
        }
    }
}
