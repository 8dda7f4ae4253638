//! `hookd dev` as a user runs it: the printed `curl ` line, pasted into a shell, answers
//! with the 201 JSON of the messages API (it carries the printed token), the token reads
//! the event back, and the example receiver prints the delivery with a verified signature.

use crate::common;

use std::process::Command;
use std::time::Duration;

use common::{HookdCommand, Lines};
use sqlx::PgPool;

#[sqlx::test]
async fn dev_prints_a_working_curl_line(pool: PgPool) {
    common::init();
    let (api, rx_port, metrics) = (
        common::free_port(),
        common::free_port(),
        common::free_port(),
    );
    // The example endpoint points at 127.0.0.1:9000; give dev a copy aimed at our port.
    let dir = tempdir();
    let example = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/endpoint.yaml"
    ))
    .unwrap();
    std::fs::write(
        dir.join("endpoint.yaml"),
        example.replace("127.0.0.1:9000", &format!("127.0.0.1:{rx_port}")),
    )
    .unwrap();
    let mut child = HookdCommand::new([
        "dev",
        "--listen",
        &format!("127.0.0.1:{api}"),
        "--receiver-listen",
        &format!("127.0.0.1:{rx_port}"),
        "--dispatch-listen",
        &format!("127.0.0.1:{metrics}"),
    ])
    .arg("--examples")
    .arg(&dir)
    .database(&pool)
    // no HOOKD_ENCRYPTION_KEY: dev falls back to a local key file; keep it out of HOME
    .env_remove("HOOKD_ENCRYPTION_KEY")
    .env("HOOKD_ENCRYPTION_KEY_FILE", dir.join("encryption-key"))
    .lines(Lines::Stdout)
    .spawn();
    let lines = child.lines();
    let next_matching = |pred: &dyn Fn(&str) -> bool| loop {
        let line = lines
            .recv_timeout(Duration::from_secs(30))
            .expect("hookd dev kept printing");
        if pred(&line) {
            return line;
        }
    };
    let token_line = next_matching(&|l| l.contains("API token"));
    let token = token_line.rsplit(' ').next().unwrap().to_string();
    assert!(token.starts_with("hookd_"), "{token_line}");
    let curl = next_matching(&|l| l.starts_with("curl "));
    assert!(
        curl.contains(&format!("authorization: Bearer {token}")),
        "{curl}"
    );
    // wait until the API answers before pasting the line
    assert!(
        common::wait_until(Duration::from_secs(20), || async {
            reqwest::get(format!("http://127.0.0.1:{api}/readyz"))
                .await
                .is_ok_and(|r| r.status().is_success())
        })
        .await
    );
    let out = Command::new("sh")
        .args(["-c", &format!("{curl} -w '\\n%{{http_code}}'")])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let (body, code) = text.trim().rsplit_once('\n').unwrap();
    assert_eq!(code, "201", "{text}");
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    let delivery = v["deliveryIds"][0].as_str().unwrap().to_string();
    // the same token reads the event back (it carries every scope of its tenant)
    let event = v["eventId"].as_str().unwrap();
    let r = reqwest::Client::new()
        .get(format!("http://127.0.0.1:{api}/v1/messages/{event}"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let read: serde_json::Value = r.json().await.unwrap();
    assert_eq!(read["tenant"], "default");
    assert_eq!(read["payload"]["invoice"], "in_1");
    assert_eq!(read["deliveries"][0]["deliveryId"], delivery.as_str());
    let received = next_matching(&|l| l.starts_with("receiver: "));
    assert!(
        received.contains(&format!("webhook-id={delivery}")),
        "{received}"
    );
    assert!(received.contains("signature=verified"), "{received}");
    // the dispatcher's metrics are served, and count what it did
    let m = reqwest::get(format!("http://127.0.0.1:{metrics}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        m.lines()
            .any(|l| l.starts_with("hookd_claimed_total") && !l.ends_with(" 0")),
        "{m}"
    );
    // the dispatcher's log names the address it listens on, not its default 0.0.0.0
    // (issue 31 item 9), and the first screen is no SQL (item 2)
    let printed = child.output();
    let starting = printed
        .lines()
        .find(|l| l.contains("dispatcher starting"))
        .unwrap_or_else(|| panic!("{printed}"));
    assert!(
        starting.contains(&format!("127.0.0.1:{metrics}")),
        "{starting}"
    );
    assert!(!printed.contains("0.0.0.0"), "{printed}");
    assert!(!printed.contains("slow statement"), "{printed}");

    // A user's own endpoint, with its own secret, aimed at the example receiver: the
    // receiver knows every secret of the dev database, so it verifies (issue 17).
    let own = dir.join("own.yaml");
    std::fs::write(
        &own,
        format!(
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: own\nstringData:\n  secret: whsec_3q8JNv6QYhT0mZf1xk2Wc9bLr4sPaGdE\n---\napiVersion: hookd.dev/v1alpha1\nkind: WebhookEndpoint\nmetadata:\n  name: own\nspec:\n  url: http://127.0.0.1:{rx_port}/own\n  eventTypes: [\"order.*\"]\n  secretRef: {{name: own, key: secret}}\n"
        ),
    )
    .unwrap();
    let applied = HookdCommand::new(["apply", "-f"])
        .arg(&own)
        .database(&pool)
        .env_remove("HOOKD_ENCRYPTION_KEY")
        .env("HOOKD_ENCRYPTION_KEY_FILE", dir.join("encryption-key"))
        .output();
    assert!(applied.status.success(), "{applied:?}");
    let r = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{api}/v1/messages"))
        .bearer_auth(&token)
        .header("content-type", "application/json")
        .body(r#"{"eventType":"order.created","payload":{"order":1}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 201);
    let v: serde_json::Value = r.json().await.unwrap();
    let own_delivery = v["deliveryIds"][0].as_str().unwrap().to_string();
    // (a delivery sent within a second of the apply may be refused once, then retried)
    let received =
        next_matching(&|l| l.contains(&own_delivery) && l.contains("signature=verified"));
    assert!(
        received.starts_with("receiver: order.created"),
        "{received}"
    );

    // Ctrl-C, as a user stops it
    child.signal("INT");
    assert!(child.wait().success(), "hookd dev exits 0 on Ctrl-C");
    // its connections close asynchronously; the test database can only be dropped after
    assert!(
        common::wait_until(Duration::from_secs(10), || async {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()",
            )
            .fetch_one(&pool)
            .await
            .unwrap()
                == 0
        })
        .await
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn tempdir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("hookd-dev-test-{}", uuid::Uuid::now_v7().simple()));
    std::fs::create_dir_all(&d).unwrap();
    d
}
