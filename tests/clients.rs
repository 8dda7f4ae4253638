//! The producer clients of issue 31: the Rust client (clients/rust, crate `hookd-client`,
//! generated from clients/openapi.json) against a real `hookd api` process on the test's
//! database, and the README's client examples as written. (The TypeScript client runs
//! against a live API in scripts/clients.sh; its README example is checked here to be the
//! file that run executes.)

use crate::common;

use std::time::Duration;

use common::*;
use hookd::auth::Scope;
use hookd_client::types::MessageIn;
use hookd_client::{Client, Error};
use reqwest::StatusCode;
use sqlx::PgPool;

// The README's Rust example is the body of this function, verbatim
// (`the_readme_examples_are_the_ones_tested` holds the two equal).
async fn enqueue(base: &str, token: &str) -> Result<uuid::Uuid, Box<dyn std::error::Error>> {
    // base: "http://127.0.0.1:8080"; token: a hookd_… token with scope produce
    let hookd = hookd_client::Client::with_token(base, token)?;
    let event = hookd_client::types::MessageIn::builder()
        .event_type("invoice.paid")
        .payload(serde_json::json!({"invoice": "in_1", "amount": 4200}));
    let sent = hookd
        .create_message()
        .idempotency_key("order-1")
        .body(event)
        .send()
        .await?; // an Err holds the API's {"error": {"code", "message"}} and status
    println!("{} {:?}", sent.event_id, sent.delivery_ids);
    Ok(sent.event_id)
}

async fn start_api(pool: &PgPool) -> HookdProcess {
    init();
    HookdCommand::new(["api"])
        .database(pool)
        .listen(free_port())
        .env_remove("KUBECONFIG")
        .env("HOOKD_LOG", "warn")
        .start()
        .await
}

#[sqlx::test]
async fn the_rust_client_enqueues_reads_back_and_keeps_idempotency(pool: PgPool) {
    // one subscribed endpoint of tenant team-a, so the event fans out to a delivery
    endpoint(&pool, EndpointOpts::default()).await;
    let token = mint_token(&pool, DEFAULT_TENANT, &[Scope::Produce, Scope::Read]).await;
    let api = start_api(&pool).await;

    // the README's example, as written
    let event_id = tokio::time::timeout(Duration::from_secs(60), enqueue(api.base(), &token))
        .await
        .expect("the enqueue answers")
        .expect("the README example enqueues");

    let hookd = Client::with_token(api.base(), &token).unwrap();
    let me = hookd.whoami().send().await.unwrap();
    assert_eq!(me.tenant.as_deref(), Some(DEFAULT_TENANT));

    let message = hookd.get_message().id(event_id).send().await.unwrap();
    assert_eq!(message.status(), StatusCode::OK);
    assert_eq!(message.event_type, "invoice.paid");
    assert_eq!(message.tenant, DEFAULT_TENANT);
    assert_eq!(message.idempotency_key.as_deref(), Some("order-1"));
    assert_eq!(
        message.payload,
        serde_json::json!({"invoice": "in_1", "amount": 4200})
    );
    assert_eq!(message.deliveries.len(), 1, "one subscribed endpoint");

    // the same key again: the original ids, answered 200 rather than 201
    let again = hookd
        .create_message()
        .body(
            MessageIn::builder()
                .event_type("invoice.paid")
                .payload(serde_json::json!({"invoice": "in_1", "amount": 4200}))
                .idempotency_key(Some("order-1".try_into().unwrap())),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), StatusCode::OK);
    assert_eq!(again.event_id, event_id);
    assert_eq!(again.delivery_ids, message_delivery_ids(&message));

    // the same key with other content: a typed 409
    let conflict = hookd
        .create_message()
        .idempotency_key("order-1")
        .body(
            MessageIn::builder()
                .event_type("invoice.paid")
                .payload(serde_json::json!({"invoice": "in_2"})),
        )
        .send()
        .await
        .unwrap_err();
    let Error::ErrorResponse(answer) = conflict else {
        panic!("a documented error answer, got {conflict:?}")
    };
    assert_eq!(answer.status(), StatusCode::CONFLICT);
    assert_eq!(answer.error.code, "idempotency_key_conflict");

    // the listing sees exactly the one event
    let page = hookd.list_messages().send().await.unwrap();
    assert_eq!(page.items.len(), 1);
    assert_eq!(page.items[0].id, event_id);
}

fn message_delivery_ids(m: &hookd_client::types::MessageOut) -> Vec<uuid::Uuid> {
    m.deliveries.iter().map(|d| d.delivery_id).collect()
}

#[sqlx::test]
async fn the_rust_client_answers_errors_typed(pool: PgPool) {
    let token = mint_token(&pool, DEFAULT_TENANT, &[Scope::Read]).await;
    let api = start_api(&pool).await;
    let body = || {
        MessageIn::builder()
            .event_type("invoice.paid")
            .payload(serde_json::json!({}))
    };

    // 401: a token the API does not know, with the JSON error shape
    let stranger = Client::with_token(api.base(), "hookd_not-a-real-token").unwrap();
    let err = stranger
        .create_message()
        .body(body())
        .send()
        .await
        .unwrap_err();
    let Error::ErrorResponse(answer) = err else {
        panic!("a documented error answer, got {err:?}")
    };
    assert_eq!(answer.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(answer.error.code, "invalid_credential");
    assert!(!answer.error.message.is_empty());

    // 403: a valid token without scope produce
    let reader = Client::with_token(api.base(), &token).unwrap();
    let err = reader
        .create_message()
        .body(body())
        .send()
        .await
        .unwrap_err();
    let Error::ErrorResponse(answer) = err else {
        panic!("a documented error answer, got {err:?}")
    };
    assert_eq!(answer.status(), StatusCode::FORBIDDEN);
    assert_eq!(answer.error.code, "insufficient_scope");

    // 404: an unknown event, typed as well
    let err = reader
        .get_message()
        .id(uuid::Uuid::now_v7())
        .send()
        .await
        .unwrap_err();
    let Error::ErrorResponse(answer) = err else {
        panic!("a documented error answer, got {err:?}")
    };
    assert_eq!(answer.status(), StatusCode::NOT_FOUND);

    // the document's patterns are checked before anything is sent
    let err = reader
        .create_message()
        .body(
            MessageIn::builder()
                .event_type("not a type")
                .payload(serde_json::json!({})),
        )
        .send()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidRequest(_)), "{err:?}");
}

/// The README shows the clients with the examples these tests run: the Rust block is
/// `enqueue` above, the TypeScript block is clients/typescript/examples/enqueue.ts, which
/// scripts/clients.sh runs against a live API.
#[test]
fn the_readme_examples_are_the_ones_tested() {
    let root = env!("CARGO_MANIFEST_DIR");
    let read = |path: &str| std::fs::read_to_string(format!("{root}/{path}")).unwrap();
    let readme = read("README.md");
    let section = readme
        .split_once("**From code: the typed clients.**")
        .expect("the README has the paragraph on the typed clients")
        .1;
    let block = |lang: &str| -> String {
        let rest = section.split_once(&format!("```{lang}\n")).unwrap().1;
        rest.split_once("```").unwrap().0.to_string()
    };
    // Line by line, indentation aside: in the test the example is a function's body.
    let lines = |text: &str| -> Vec<String> {
        text.lines()
            .map(|l| l.trim().to_string())
            .filter(|l| !l.is_empty())
            .collect()
    };
    let contains = |file: &str, example: &str| {
        let (file, example) = (lines(file), lines(example));
        !example.is_empty() && file.windows(example.len()).any(|w| w == example)
    };
    let rust = block("rust");
    assert!(
        contains(&read("tests/clients.rs"), &rust),
        "the README's Rust example is the body of `enqueue` in tests/clients.rs:\n{rust}"
    );
    let typescript = block("ts");
    assert!(
        contains(&read("clients/typescript/examples/enqueue.ts"), &typescript),
        "the README's TypeScript example is clients/typescript/examples/enqueue.ts:\n{typescript}"
    );
}
