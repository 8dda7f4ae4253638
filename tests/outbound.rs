//! Outbound hardening (issue 8, part 5), with DNS under the test's control: the address
//! checked is the address connected (DNS rebinding), redirects are refused and recorded,
//! IPv6 and IPv4-mapped/NAT64/6to4 forms of forbidden ranges are refused, and response
//! bodies are read up to the cap only. The unit tests in src/outbound.rs cover the
//! address table and the client; these go through the real dispatcher where they can.
//!
//! Every listener is on loopback. Forbidden addresses that are not loopback (metadata,
//! private, link-local, NAT64) are only ever checked, at the resolver and URL guards,
//! never connected to, so a broken guard cannot send traffic off this machine.

use crate::common;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use common::*;
use hookd::dispatch::DispatchConfig;
use hookd::domain::ErrorClass;
use hookd::outbound::{
    self, AllowList, ClientOptions, DestinationError, GuardedResolver, HostResolver, LookupFuture,
};
use reqwest::dns::{Name, Resolve};
use sqlx::PgPool;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use uuid::Uuid;

// ---- a scripted resolver and raw servers ----

/// Answers the n-th lookup with `script[n]` (the last entry repeats) and counts lookups.
struct ScriptedResolver {
    script: Vec<Vec<IpAddr>>,
    calls: AtomicUsize,
}

impl ScriptedResolver {
    fn new(script: &[&[&str]]) -> Arc<Self> {
        Arc::new(ScriptedResolver {
            script: script
                .iter()
                .map(|answer| answer.iter().map(|a| a.parse().unwrap()).collect())
                .collect(),
            calls: AtomicUsize::new(0),
        })
    }
    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

impl HostResolver for ScriptedResolver {
    fn lookup(&self, _host: &str, port: u16) -> LookupFuture {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        let answer = &self.script[n.min(self.script.len() - 1)];
        let addrs = answer.iter().map(|ip| SocketAddr::new(*ip, port)).collect();
        Box::pin(async move { Ok(addrs) })
    }
}

async fn read_head(sock: &mut TcpStream) {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match sock.read(&mut tmp).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&tmp[..n]),
        }
    }
}

/// A server on `listener` answering every request with `response` and closing the
/// connection (so every request needs a new connection, and so a new lookup). Counts
/// accepted connections.
fn serve_raw(listener: TcpListener, response: String) -> Arc<AtomicUsize> {
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = hits.clone();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
            let response = response.clone();
            tokio::spawn(async move {
                read_head(&mut sock).await;
                let _ = sock.write_all(response.as_bytes()).await;
                let _ = sock.shutdown().await;
            });
        }
    });
    hits
}

fn ok_close() -> String {
    "HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok".into()
}

/// Listeners on 127.0.0.2 (stands in for a public address, admitted by the allow list)
/// and 127.0.0.1 (the internal target) on one port, since a URL has one port.
async fn public_and_internal() -> (u16, TcpListener, TcpListener) {
    for _ in 0..50 {
        let public = TcpListener::bind("127.0.0.2:0").await.unwrap();
        let port = public.local_addr().unwrap().port();
        if let Ok(internal) = TcpListener::bind(("127.0.0.1", port)).await {
            return (port, public, internal);
        }
    }
    panic!("no port free on both 127.0.0.1 and 127.0.0.2");
}

fn client(allow: &str, resolver: Arc<dyn HostResolver>) -> reqwest::Client {
    outbound::build_client(ClientOptions {
        allow: AllowList::parse(allow).unwrap(),
        resolver: Some(resolver),
        connect_timeout: Duration::from_secs(2),
        user_agent: "hookd-test".into(),
        pool_max_idle_per_host: 0,
    })
}

fn settings(allowed: &str, retry_schedule: &str) -> hookd::config::DispatchSettings {
    hookd::config::DispatchSettings {
        allowed_destinations: allowed.into(),
        retry_schedule: retry_schedule.into(),
        ..dispatch_settings()
    }
}

async fn dispatcher(
    pool: &PgPool,
    allowed: &str,
    resolver: Option<Arc<dyn HostResolver>>,
    snippet_bytes: usize,
) -> TestDispatcher {
    let mut s = settings(allowed, "300");
    s.response_snippet_bytes = snippet_bytes;
    let mut cfg = DispatchConfig::from_settings(&s).unwrap();
    cfg.resolver = resolver;
    TestDispatcher::start_with(pool, cfg, test_keyring()).await
}

async fn enqueue_one(pool: &PgPool, tenant: &str) -> Uuid {
    let event: Uuid = sqlx::query_scalar("SELECT hookd.enqueue($1, 'net.test', '{}')")
        .bind(tenant)
        .fetch_one(pool)
        .await
        .unwrap();
    sqlx::query_scalar("SELECT id FROM hookd.deliveries WHERE event_id = $1")
        .bind(event)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn attempts_of(pool: &PgPool, id: Uuid) -> Vec<hookd::db::attempts::AttemptRow> {
    hookd::db::attempts::for_delivery(pool, id).await.unwrap()
}

async fn wait_attempt(pool: &PgPool, id: Uuid) -> hookd::db::attempts::AttemptRow {
    assert!(
        wait_until(Duration::from_secs(15), || async {
            !attempts_of(pool, id).await.is_empty()
        })
        .await,
        "delivery {id} was attempted"
    );
    attempts_of(pool, id).await.remove(0)
}

fn tenant_endpoint(tenant: &str, url: String) -> EndpointOpts {
    EndpointOpts {
        tenant: Some(tenant.into()),
        url,
        ..Default::default()
    }
}

// ---- DNS rebinding ----

/// A resolver answers an admitted address on its first lookup and 127.0.0.1 on every
/// later one. A single request resolves once and connects to the admitted address (a
/// guard that checked one lookup and connected another would reach loopback); the next
/// request, which gets 127.0.0.1, is refused before any connection. The loopback listener
/// never sees a connection.
#[tokio::test]
async fn dns_rebinding_never_reaches_the_loopback_listener() {
    init();
    let (port, public, internal) = public_and_internal().await;
    let public_hits = serve_raw(public, ok_close());
    let internal_hits = serve_raw(internal, ok_close());
    let resolver = ScriptedResolver::new(&[&["127.0.0.2"], &["127.0.0.1"]]);
    let c = client("127.0.0.2/32", resolver.clone());
    let url = format!("http://rebind.test:{port}/");

    let resp = c.get(&url).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resolver.calls(), 1, "checked and connected on one lookup");
    assert_eq!(public_hits.load(Ordering::SeqCst), 1);

    let err = c.get(&url).send().await.unwrap_err();
    assert_eq!(
        outbound::classify_error(&err),
        ErrorClass::DestinationForbidden,
        "{err:?}"
    );
    assert_eq!(resolver.calls(), 2);
    assert_eq!(internal_hits.load(Ordering::SeqCst), 0);
}

/// The same through the dispatcher: an endpoint whose host name rebinds from an admitted
/// address to 127.0.0.1 gets its first delivery, and the second is dead with
/// `destination_forbidden`; the loopback listener is never connected to.
#[sqlx::test]
async fn dispatcher_delivers_only_to_the_address_it_checked(pool: PgPool) {
    init();
    let (port, public, internal) = public_and_internal().await;
    let public_hits = serve_raw(public, ok_close());
    let internal_hits = serve_raw(internal, ok_close());
    endpoint(
        &pool,
        tenant_endpoint("rebind", format!("http://rebind.test:{port}/hook")),
    )
    .await;
    let resolver = ScriptedResolver::new(&[&["127.0.0.2"], &["127.0.0.1"]]);
    let d = dispatcher(&pool, "127.0.0.2/32", Some(resolver.clone()), 256).await;

    let first = enqueue_one(&pool, "rebind").await;
    assert_eq!(wait_attempt(&pool, first).await.status_code, Some(200));
    let second = enqueue_one(&pool, "rebind").await;
    let a = wait_attempt(&pool, second).await;
    assert_eq!(
        a.error_class,
        Some(ErrorClass::DestinationForbidden),
        "{a:?}"
    );
    // the tenant is told it was refused, not which internal address the name resolved
    // to (issue 19); the address is in the dispatcher's log
    assert!(!a.error.as_deref().unwrap().contains("127.0.0.1"), "{a:?}");
    assert!(
        wait_until(Duration::from_secs(5), || async {
            delivery_status(&pool, second).await.0 == "dead"
        })
        .await
    );
    d.stop().await;
    assert_eq!(public_hits.load(Ordering::SeqCst), 1);
    assert_eq!(internal_hits.load(Ordering::SeqCst), 0);
    assert_eq!(resolver.calls(), 2);
}

// ---- redirects ----

/// A receiver answering 302 to another admitted URL: the redirect is not followed (the
/// target never sees a request), and the attempt is a failure with status 302, retried
/// later on the schedule.
#[sqlx::test]
async fn redirect_is_not_followed_and_is_recorded_as_a_failure(pool: PgPool) {
    init();
    let target = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let target_addr = target.local_addr().unwrap();
    let target_hits = serve_raw(target, ok_close());
    let redirector = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let redirector_addr = redirector.local_addr().unwrap();
    let redirector_hits = serve_raw(
        redirector,
        format!(
            "HTTP/1.1 302 Found\r\nlocation: http://{target_addr}/landing\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
        ),
    );
    endpoint(
        &pool,
        tenant_endpoint("redirect", format!("http://{redirector_addr}/hook")),
    )
    .await;
    let d = dispatcher(&pool, "127.0.0.0/8", None, 256).await;
    let id = enqueue_one(&pool, "redirect").await;
    let a = wait_attempt(&pool, id).await;
    d.stop().await;
    assert_eq!(a.status_code, Some(302));
    assert_eq!(a.error_class, Some(ErrorClass::HttpStatus));
    assert_eq!(a.error.as_deref(), Some("HTTP 302"));
    assert_eq!(delivery_status(&pool, id).await, ("failed".to_string(), 1));
    assert_eq!(redirector_hits.load(Ordering::SeqCst), 1);
    assert_eq!(target_hits.load(Ordering::SeqCst), 0, "redirect followed");
}

// ---- forbidden ranges in every spelling ----

/// Loopback, private, link-local, unique-local, metadata and reserved destinations in
/// their IPv6, IPv4-mapped, IPv4-compatible, NAT64 (64:ff9b::/96) and 6to4 forms are
/// refused both when a name resolves to them (the connector is handed nothing) and as IP
/// literals in the URL; public addresses in the same forms pass.
#[tokio::test]
async fn ipv6_and_mapped_forms_of_forbidden_ranges_are_refused() {
    init();
    let forbidden = [
        "::1",
        "::",
        "::ffff:127.0.0.1",
        "::ffff:7f00:2",
        "::ffff:169.254.169.254",
        "::ffff:10.1.2.3",
        "::ffff:192.168.0.1",
        "::127.0.0.1",
        "fe80::1",
        "febf:ffff::1",
        "fc00::1",
        "fd00:ec2::254",
        "64:ff9b::7f00:1",
        "64:ff9b::169.254.169.254",
        "64:ff9b::10.0.0.1",
        "64:ff9b:1::1",
        "2002:7f00:1::1",
        "2002:a9fe:a9fe::1",
        "ff02::1",
        "169.254.169.254",
        "127.0.0.1",
        "10.0.0.1",
        "0.0.0.0",
    ];
    let allowed = [
        "2606:4700:4700::1111",
        "::ffff:8.8.8.8",
        "64:ff9b::8.8.8.8",
        "8.8.8.8",
    ];
    let none = AllowList::default();
    for addr in forbidden {
        let ip: IpAddr = addr.parse().unwrap();
        let guard = GuardedResolver::new(ScriptedResolver::new(&[&[addr]]), none.clone());
        let name: Name = "forbidden.test".parse().unwrap();
        let err = match guard.resolve(name).await {
            Ok(handed) => panic!(
                "{addr}: resolver handed {:?} to the connector",
                handed.collect::<Vec<_>>()
            ),
            Err(e) => e,
        };
        assert!(
            matches!(err.downcast_ref::<DestinationError>(), Some(DestinationError::Forbidden(x)) if *x == ip),
            "{addr}: {err}"
        );
        let literal = if ip.is_ipv6() {
            format!("http://[{addr}]:8080/hook")
        } else {
            format!("http://{addr}:8080/hook")
        };
        let url = reqwest::Url::parse(&literal).unwrap();
        assert!(
            matches!(
                outbound::check_url(&url, &none),
                Err(DestinationError::Forbidden(_))
            ),
            "{literal}"
        );
    }
    for addr in allowed {
        let guard = GuardedResolver::new(ScriptedResolver::new(&[&[addr]]), none.clone());
        let name: Name = "public.test".parse().unwrap();
        let handed: Vec<SocketAddr> = guard.resolve(name).await.unwrap().collect();
        assert_eq!(handed, vec![SocketAddr::new(addr.parse().unwrap(), 0)]);
        let ip: IpAddr = addr.parse().unwrap();
        let literal = if ip.is_ipv6() {
            format!("http://[{addr}]/")
        } else {
            format!("http://{addr}/")
        };
        outbound::check_url(&reqwest::Url::parse(&literal).unwrap(), &none).unwrap();
    }
    // a mixed answer keeps only what passed: the connector never sees the rest
    let guard = GuardedResolver::new(
        ScriptedResolver::new(&[&["::ffff:127.0.0.1", "fe80::1", "2606:4700:4700::1111"]]),
        none,
    );
    let handed: Vec<SocketAddr> = guard
        .resolve("mixed.test".parse().unwrap())
        .await
        .unwrap()
        .collect();
    assert_eq!(handed, vec!["[2606:4700:4700::1111]:0".parse().unwrap()]);
}

/// Through the dispatcher with no allow-list: IPv6 loopback and IPv4-mapped loopback,
/// as URL literals and behind host names, are dead at once with
/// `destination_forbidden`, and the listeners on ::1 and 127.0.0.1 are never connected.
#[sqlx::test]
async fn dispatcher_refuses_ipv6_and_mapped_loopback(pool: PgPool) {
    init();
    let v6 = TcpListener::bind("[::1]:0").await.unwrap();
    let port = v6.local_addr().unwrap().port();
    let v4 = TcpListener::bind(("127.0.0.1", port)).await;
    let v6_hits = serve_raw(v6, ok_close());
    let v4_hits = v4.ok().map(|l| serve_raw(l, ok_close()));
    let urls = [
        format!("http://[::1]:{port}/hook"),
        format!("http://[::ffff:127.0.0.1]:{port}/hook"),
        format!("http://[::ffff:7f00:1]:{port}/hook"),
        format!("http://v6-loopback.test:{port}/hook"),
        format!("http://mapped-loopback.test:{port}/hook"),
    ];
    for (i, url) in urls.iter().enumerate() {
        endpoint(&pool, tenant_endpoint(&format!("v6-{i}"), url.clone())).await;
    }
    // the two names: ::1, and ::ffff:127.0.0.1 (the resolver is shared; both answers
    // are forbidden, whichever name asks first)
    let resolver = ScriptedResolver::new(&[&["::1"], &["::ffff:127.0.0.1"]]);
    let d = dispatcher(&pool, "", Some(resolver.clone()), 256).await;
    for (i, url) in urls.iter().enumerate() {
        let id = enqueue_one(&pool, &format!("v6-{i}")).await;
        let a = wait_attempt(&pool, id).await;
        assert_eq!(
            a.error_class,
            Some(ErrorClass::DestinationForbidden),
            "{url}: {a:?}"
        );
        assert!(
            wait_until(Duration::from_secs(5), || async {
                delivery_status(&pool, id).await.0 == "dead"
            })
            .await
        );
    }
    d.stop().await;
    assert_eq!(resolver.calls(), 2, "literals never reach the resolver");
    assert_eq!(v6_hits.load(Ordering::SeqCst), 0);
    if let Some(h) = v4_hits {
        assert_eq!(h.load(Ordering::SeqCst), 0);
    }
}

// ---- response bodies ----

/// A receiver answering 200 and then streaming an endless chunked body. The attempt
/// ends at once with the snippet cut at the cap (256 bytes), the delivery succeeds, and
/// the receiver's writes fail soon after because hookd hung up: it read a few buffers'
/// worth, never the stream.
#[sqlx::test]
async fn endless_response_body_is_read_up_to_the_cap_only(pool: PgPool) {
    init();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let sent = Arc::new(AtomicUsize::new(0));
    let hung_up = Arc::new(AtomicBool::new(false));
    {
        let (sent, hung_up) = (sent.clone(), hung_up.clone());
        tokio::spawn(async move {
            let (mut sock, _) = listener.accept().await.unwrap();
            read_head(&mut sock).await;
            let head =
                "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n\r\n";
            if sock.write_all(head.as_bytes()).await.is_err() {
                hung_up.store(true, Ordering::SeqCst);
                return;
            }
            let data = vec![b'x'; 64 * 1024];
            let chunk = [
                format!("{:x}\r\n", data.len()).into_bytes(),
                data,
                b"\r\n".to_vec(),
            ]
            .concat();
            // endless, until the client goes away (bounded so a broken client cannot
            // keep this test writing forever: 1 GiB)
            for _ in 0..16 * 1024 {
                if sock.write_all(&chunk).await.is_err() {
                    hung_up.store(true, Ordering::SeqCst);
                    return;
                }
                sent.fetch_add(chunk.len(), Ordering::SeqCst);
            }
        });
    }
    endpoint(
        &pool,
        tenant_endpoint("endless", format!("http://{addr}/stream")),
    )
    .await;
    let d = dispatcher(&pool, "127.0.0.0/8", None, 256).await;
    let id = enqueue_one(&pool, "endless").await;
    let a = wait_attempt(&pool, id).await;
    assert_eq!(a.status_code, Some(200));
    let snippet = a.response_snippet.unwrap();
    assert_eq!(snippet.len(), 256);
    assert!(snippet.bytes().all(|b| b == b'x'));
    assert!(a.duration_ms < 5_000, "{} ms", a.duration_ms);
    assert_eq!(delivery_status(&pool, id).await.0, "succeeded");
    assert!(
        wait_until(Duration::from_secs(10), || async {
            hung_up.load(Ordering::SeqCst)
        })
        .await,
        "hookd closed the connection"
    );
    let total = sent.load(Ordering::SeqCst);
    assert!(
        total < 64 << 20,
        "{total} bytes were pushed before hookd hung up"
    );
    d.stop().await;
}

/// A receiver that sends its headers and then one byte every 50 ms forever: the
/// endpoint's 1 s timeout ends the attempt, with what arrived so far as the snippet.
#[sqlx::test]
async fn trickling_response_body_is_cut_by_the_timeout(pool: PgPool) {
    init();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let hung_up = Arc::new(AtomicBool::new(false));
    {
        let hung_up = hung_up.clone();
        tokio::spawn(async move {
            let (mut sock, _) = listener.accept().await.unwrap();
            read_head(&mut sock).await;
            let head = "HTTP/1.1 200 OK\r\ncontent-length: 1000000\r\n\r\n";
            let _ = sock.write_all(head.as_bytes()).await;
            // at most 60 s of trickle
            for _ in 0..1200 {
                if sock.write_all(b"y").await.is_err() {
                    hung_up.store(true, Ordering::SeqCst);
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
    }
    endpoint(
        &pool,
        EndpointOpts {
            timeout_seconds: Some(1),
            ..tenant_endpoint("trickle", format!("http://{addr}/slow"))
        },
    )
    .await;
    let d = dispatcher(&pool, "127.0.0.0/8", None, 256).await;
    let id = enqueue_one(&pool, "trickle").await;
    let a = wait_attempt(&pool, id).await;
    d.stop().await;
    assert!(a.duration_ms < 3_000, "{} ms", a.duration_ms);
    let snippet = a.response_snippet.unwrap_or_default();
    assert!(
        !snippet.is_empty() && snippet.len() < 256 && snippet.bytes().all(|b| b == b'y'),
        "{snippet:?}"
    );
    assert!(
        wait_until(Duration::from_secs(5), || async {
            hung_up.load(Ordering::SeqCst)
        })
        .await,
        "hookd closed the connection"
    );
}
