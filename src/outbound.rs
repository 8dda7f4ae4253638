//! SSRF-guarded outbound HTTP client for tenant-supplied webhook URLs.
//!
//! Two paths reach a socket, and both are guarded:
//! - host names go through [`GuardedResolver`], which drops forbidden addresses; reqwest
//!   connects to exactly the addresses a custom resolver returns, so the address that was
//!   checked is the address that is connected (no DNS-rebinding window);
//! - IP-literal URLs never reach the resolver, so callers must run [`check_url`] before
//!   sending.

use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

use crate::domain::ErrorClass;

/// Operator-configured CIDRs that are reachable even though they are in forbidden ranges
/// (e.g. an internal receiver on 10.20.0.0/16).
#[derive(Clone, Debug, Default)]
pub struct AllowList(Vec<IpNet>);

impl AllowList {
    /// Parses comma-separated CIDRs or bare IPs. Empty entries are ignored so that an empty
    /// env var or a trailing comma does not fail startup.
    pub fn parse(csv: &str) -> Result<Self, String> {
        let mut nets = Vec::new();
        for entry in csv.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let net = entry
                .parse::<IpNet>()
                .or_else(|_| entry.parse::<IpAddr>().map(IpNet::from))
                .map_err(|_| {
                    format!("invalid allow-list entry {entry:?}: expected a CIDR or IP")
                })?;
            nets.push(net);
        }
        Ok(Self(nets))
    }

    /// An IPv4-mapped IPv6 address is admitted by an IPv4 entry too, since the kernel
    /// connects it as that IPv4 address.
    pub fn admits(&self, ip: IpAddr) -> bool {
        let canonical = ip.to_canonical();
        self.0
            .iter()
            .any(|net| net.contains(&ip) || net.contains(&canonical))
    }
}

/// True when `ip` must not be contacted unless allow-listed.
pub fn is_forbidden(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_forbidden_v4(v4),
        IpAddr::V6(v6) => is_forbidden_v6(v6),
    }
}

fn is_forbidden_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    a == 0 // "this network", includes 0.0.0.0 which Linux treats as localhost
        || a == 10
        || a == 127
        || (a == 100 && (64..128).contains(&b)) // CGNAT 100.64/10
        || (a == 169 && b == 254) // link-local, incl. cloud metadata 169.254.169.254
        || (a == 172 && (16..32).contains(&b))
        || (a == 192 && b == 168)
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments
        || (a == 198 && (b == 18 || b == 19)) // benchmarking 198.18/15
        // Documentation ranges: never legitimate destinations, and sometimes routed
        // internally in lab networks.
        || (a == 192 && b == 0 && c == 2)
        || (a == 198 && b == 51 && c == 100)
        || (a == 203 && b == 0 && c == 113)
        // Azure's wireserver (platform metadata and agent channel), reachable from every VM
        || ip == Ipv4Addr::new(168, 63, 129, 16)
        || a >= 224 // multicast 224/4, reserved 240/4, broadcast 255.255.255.255
}

fn is_forbidden_v6(ip: Ipv6Addr) -> bool {
    let seg = ip.segments();
    if ip.is_unspecified() || ip.is_loopback() {
        return true;
    }
    // Forms that carry an IPv4 address and may be translated to it by the OS or a
    // NAT64 gateway: judge them by the embedded address.
    if let Some(v4) = embedded_ipv4(ip) {
        return is_forbidden_v4(v4);
    }
    (seg[0] & 0xffc0) == 0xfe80 // link-local fe80::/10
        || (seg[0] & 0xffc0) == 0xfec0 // deprecated site-local fec0::/10
        || (seg[0] & 0xfe00) == 0xfc00 // unique-local fc00::/7 (incl. fd00:ec2::254)
        || (seg[0] & 0xff00) == 0xff00 // multicast
        || (seg[0] == 0x0100 && seg[1] == 0 && seg[2] == 0 && seg[3] == 0) // discard 100::/64
        || (seg[0] == 0x2001 && seg[1] == 0x0db8) // documentation
        // Teredo 2001::/32 tunnels to an (obfuscated) IPv4 address the relay chooses
        || (seg[0] == 0x2001 && seg[1] == 0)
}

fn embedded_ipv4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let seg = ip.segments();
    let low = Ipv4Addr::new(
        (seg[6] >> 8) as u8,
        seg[6] as u8,
        (seg[7] >> 8) as u8,
        seg[7] as u8,
    );
    match seg {
        // IPv4-mapped ::ffff:a.b.c.d
        [0, 0, 0, 0, 0, 0xffff, _, _] => Some(low),
        // IPv4-translated (SIIT) ::ffff:0:a.b.c.d, RFC 2765
        [0, 0, 0, 0, 0xffff, 0, _, _] => Some(low),
        // IPv4-compatible ::a.b.c.d (deprecated, :: and ::1 are handled by the caller)
        [0, 0, 0, 0, 0, 0, _, _] => Some(low),
        // NAT64 well-known prefix 64:ff9b::/96
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] => Some(low),
        // Local-use NAT64 64:ff9b:1::/48; RFC 8215 allows several layouts, so treat the
        // whole prefix as pointing into the operator's own network.
        [0x64, 0xff9b, 1, ..] => Some(Ipv4Addr::UNSPECIFIED),
        // 6to4 2002:AABB:CCDD::/48 tunnels to the IPv4 address in bits 16..48.
        [0x2002, hi, lo, ..] => Some(Ipv4Addr::new(
            (hi >> 8) as u8,
            hi as u8,
            (lo >> 8) as u8,
            lo as u8,
        )),
        _ => None,
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DestinationError {
    /// The address stays out of the message, which reaches tenants through the attempt log
    /// and `lastError`: what a name resolves to inside the cluster is the operator's to
    /// know. It is logged where the refusal happens.
    #[error(
        "the destination is not allowed: it is, or resolves to, a private, loopback, link-local or metadata address"
    )]
    Forbidden(IpAddr),
    #[error("could not resolve {host}: {reason}")]
    Resolve { host: String, reason: String },
    #[error("invalid destination URL: {0}")]
    BadUrl(String),
}

pub fn check_ip(ip: IpAddr, allow: &AllowList) -> Result<(), DestinationError> {
    if is_forbidden(ip) && !allow.admits(ip) {
        tracing::warn!(%ip, "outbound destination refused");
        Err(DestinationError::Forbidden(ip))
    } else {
        Ok(())
    }
}

/// Must be called before sending to a tenant URL: IP literals are connected directly by
/// reqwest without consulting the resolver, so this is their only check.
pub fn check_url(url: &reqwest::Url, allow: &AllowList) -> Result<(), DestinationError> {
    match url.scheme() {
        "http" | "https" => {}
        other => {
            return Err(DestinationError::BadUrl(format!(
                "scheme {other:?} is not http or https"
            )));
        }
    }
    // `url` is not a direct dependency, so work from `host_str`: the parser has already
    // normalised IPv4 spellings (decimal, hex, short forms) to dotted quads and wraps
    // IPv6 literals in brackets.
    let host = url
        .host_str()
        .filter(|h| !h.is_empty())
        .ok_or_else(|| DestinationError::BadUrl("missing host".into()))?;
    let literal = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    match literal.parse::<IpAddr>() {
        Ok(ip) => check_ip(ip, allow),
        Err(_) => Ok(()),
    }
}

/// Future returned by [`HostResolver::lookup`].
pub type LookupFuture = Pin<Box<dyn Future<Output = io::Result<Vec<SocketAddr>>> + Send>>;

/// DNS lookup abstraction so tests can script answers (e.g. DNS rebinding).
pub trait HostResolver: Send + Sync + 'static {
    fn lookup(&self, host: &str, port: u16) -> LookupFuture;
}

/// Resolves through the OS (getaddrinfo on tokio's blocking pool).
#[derive(Clone, Debug, Default)]
pub struct SystemResolver;

impl HostResolver for SystemResolver {
    fn lookup(&self, host: &str, port: u16) -> LookupFuture {
        let host = host.to_owned();
        Box::pin(async move {
            Ok(tokio::net::lookup_host((host.as_str(), port))
                .await?
                .collect())
        })
    }
}

/// reqwest resolver that only ever hands checked addresses to the connector.
pub struct GuardedResolver {
    inner: Arc<dyn HostResolver>,
    allow: AllowList,
}

impl GuardedResolver {
    pub fn new(inner: Arc<dyn HostResolver>, allow: AllowList) -> Self {
        Self { inner, allow }
    }
}

async fn guarded_lookup(
    inner: Arc<dyn HostResolver>,
    allow: AllowList,
    host: String,
) -> Result<Vec<SocketAddr>, DestinationError> {
    // Port 0: reqwest substitutes the URL's explicit port or the scheme default.
    let addrs = inner
        .lookup(&host, 0)
        .await
        .map_err(|e| DestinationError::Resolve {
            host: host.clone(),
            reason: e.to_string(),
        })?;
    let mut first_refused = None;
    let allowed: Vec<SocketAddr> = addrs
        .into_iter()
        .filter(|a| match check_ip(a.ip(), &allow) {
            Ok(()) => true,
            Err(_) => {
                first_refused.get_or_insert(a.ip());
                false
            }
        })
        .collect();
    if !allowed.is_empty() {
        return Ok(allowed);
    }
    Err(match first_refused {
        Some(ip) => {
            tracing::warn!(%host, %ip, "outbound destination refused: every address is forbidden");
            DestinationError::Forbidden(ip)
        }
        None => DestinationError::Resolve {
            host,
            reason: "no addresses returned".into(),
        },
    })
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let inner = self.inner.clone();
        let allow = self.allow.clone();
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let addrs = guarded_lookup(inner, allow, host).await?;
            Ok(Box::new(addrs.into_iter()) as Addrs)
        })
    }
}

pub struct ClientOptions {
    pub allow: AllowList,
    /// `None` uses [`SystemResolver`].
    pub resolver: Option<Arc<dyn HostResolver>>,
    pub connect_timeout: Duration,
    pub user_agent: String,
    pub pool_max_idle_per_host: usize,
}

const FALLBACK_USER_AGENT: &str = "hookd";

/// Builds the dispatcher's client. Callers must still run [`check_url`] per request
/// (IP literals bypass the resolver).
pub fn build_client(opts: ClientOptions) -> reqwest::Client {
    // reqwest is built with `rustls-no-provider`, and building a client without a
    // process-wide provider panics. Err only means one is already installed.
    let _ = rustls::crypto::ring::default_provider().install_default();

    let resolver = GuardedResolver::new(
        opts.resolver
            .unwrap_or_else(|| Arc::new(SystemResolver) as Arc<dyn HostResolver>),
        opts.allow,
    );
    // An invalid configured UA would make `build()` fail; degrade to a fixed UA instead.
    let user_agent = reqwest::header::HeaderValue::from_str(&opts.user_agent)
        .unwrap_or_else(|_| reqwest::header::HeaderValue::from_static(FALLBACK_USER_AGENT));

    reqwest::Client::builder()
        // Following a redirect would send the request to a tenant-controlled second URL
        // that never passed `check_url`; delivery attempts report the 3xx instead.
        .redirect(reqwest::redirect::Policy::none())
        // An env-configured proxy would make the resolver see the proxy's host instead of
        // the destination, silently disabling the guard.
        .no_proxy()
        .dns_resolver(resolver)
        .connect_timeout(opts.connect_timeout)
        .user_agent(user_agent)
        .tcp_nodelay(true)
        .pool_max_idle_per_host(opts.pool_max_idle_per_host)
        .pool_idle_timeout(Duration::from_secs(90))
        // HTTP/1.1 and HTTP/2 are both offered over ALPN (the `http2` feature), so no
        // version is forced here.
        .build()
        // Only fails if TLS initialisation fails, which is a broken build/environment
        // rather than bad input; nothing can be delivered in that state.
        .expect("failed to initialise HTTP client (TLS backend)")
}

/// Reads at most `cap` bytes of the body for the attempt log. Reading stops as soon as the
/// cap is exceeded so a tenant endpoint streaming gigabytes cannot exhaust memory or
/// stall the worker. Returns the lossy-UTF-8 text and whether anything was cut off.
/// A body error mid-stream returns what was read so far.
pub async fn read_capped(mut resp: reqwest::Response, cap: usize) -> (String, bool) {
    let mut buf: Vec<u8> = Vec::with_capacity(cap.min(64 * 1024));
    let mut truncated = false;
    loop {
        match resp.chunk().await {
            Ok(Some(chunk)) => {
                let room = cap - buf.len();
                if chunk.len() > room {
                    buf.extend_from_slice(&chunk[..room]);
                    truncated = true;
                    break;
                }
                buf.extend_from_slice(&chunk);
            }
            Ok(None) | Err(_) => break,
        }
        if buf.len() == cap {
            // Exactly at the cap: one more chunk tells whether the body really ended.
            // Empty chunks are possible, so skip them.
            loop {
                match resp.chunk().await {
                    Ok(Some(c)) if c.is_empty() => continue,
                    Ok(Some(_)) => truncated = true,
                    Ok(None) | Err(_) => {}
                }
                break;
            }
            break;
        }
    }
    if truncated {
        // Drop a multi-byte character cut in half by the cap rather than rendering it
        // as a replacement character.
        if let Err(e) = std::str::from_utf8(&buf)
            && e.error_len().is_none()
        {
            buf.truncate(e.valid_up_to());
        }
    }
    let mut text = String::from_utf8_lossy(&buf).into_owned();
    // Replacement characters are 3 bytes, so lossy conversion of invalid input can grow
    // the text; keep the promise of at most `cap` bytes.
    if text.len() > cap {
        let mut end = cap;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        truncated = true;
    }
    (text, truncated)
}

/// Classifies a send error for the attempt log.
pub fn classify_error(e: &reqwest::Error) -> ErrorClass {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if let Some(dest) = err.downcast_ref::<DestinationError>() {
            return match dest {
                DestinationError::Forbidden(_) => ErrorClass::DestinationForbidden,
                DestinationError::Resolve { .. } => ErrorClass::Dns,
                DestinationError::BadUrl(_) => ErrorClass::Request,
            };
        }
        source = err.source();
    }
    if e.is_timeout() {
        ErrorClass::Timeout
    } else if e.is_connect() {
        // Checked after the chain walk: resolver failures also surface as connect errors.
        ErrorClass::Connect
    } else if e.is_body() || e.is_decode() {
        ErrorClass::Body
    } else {
        ErrorClass::Request
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn forbidden_table() {
        let forbidden = [
            "127.0.0.1",
            "127.255.255.254",
            "10.0.0.1",
            "10.255.255.255",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.0.1",
            "169.254.169.254",
            "100.64.0.1",
            "100.127.255.255",
            "0.0.0.0",
            "0.1.2.3",
            "224.0.0.1",
            "239.255.255.250",
            "255.255.255.255",
            "192.0.0.8",
            "198.18.0.1",
            "198.19.255.255",
            "240.0.0.1",
            "192.0.2.1",
            "::",
            "::1",
            "fe80::1",
            "febf::1",
            "fc00::1",
            "fd00:ec2::254",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::ffff:10.0.0.1",
            "::127.0.0.1",
            "::10.0.0.1",
            "64:ff9b::a00:1",
            "64:ff9b::127.0.0.1",
            "64:ff9b::169.254.169.254",
            "64:ff9b:1::1",
            "2002:7f00:1::1",
            "2002:a9fe:a9fe::1",
            "2001:db8::1",
            "::ffff:0:127.0.0.1",
            "::ffff:0:a9fe:a9fe",
            "2001:0:4136:e378:8000:63bf:3fff:fdd2",
            "168.63.129.16",
        ];
        for s in forbidden {
            assert!(is_forbidden(ip(s)), "{s} should be forbidden");
        }
        let allowed = [
            "8.8.8.8",
            "1.1.1.1",
            "2606:4700::1111",
            "2001:4860:4860::8888",
            "100.63.255.255",
            "100.128.0.0",
            "172.15.255.255",
            "172.32.0.0",
            "169.253.255.255",
            "198.17.255.255",
            "198.20.0.0",
            "192.0.1.1",
            "223.255.255.255",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "2002:808:808::1",
            "fe7f::1",
            "::ffff:0:808:808",
            "168.63.129.17",
        ];
        for s in allowed {
            assert!(!is_forbidden(ip(s)), "{s} should be allowed");
        }
    }

    #[test]
    fn allow_list_parse() {
        assert!(AllowList::parse("").unwrap().0.is_empty());
        assert!(AllowList::parse("  ").unwrap().0.is_empty());
        let list = AllowList::parse("127.0.0.0/8, 10.1.2.3 ,fd00::/8,").unwrap();
        assert!(list.admits(ip("127.0.0.1")));
        assert!(list.admits(ip("::ffff:127.0.0.1")));
        assert!(list.admits(ip("10.1.2.3")));
        assert!(!list.admits(ip("10.1.2.4")));
        assert!(list.admits(ip("fd00:ec2::254")));
        assert!(!list.admits(ip("169.254.169.254")));

        for bad in [
            "10.0.0.0/33",
            "not-an-ip",
            "127.0.0.1/8/2",
            "10.0.0.0/8,zzz",
        ] {
            let err = AllowList::parse(bad).unwrap_err();
            let entry = bad.rsplit(',').next().unwrap();
            assert!(err.contains(entry), "{err:?} should name {entry:?}");
        }
    }

    #[test]
    fn check_ip_respects_allow_list() {
        let empty = AllowList::default();
        let lo = AllowList::parse("127.0.0.0/8").unwrap();
        assert!(matches!(
            check_ip(ip("127.0.0.1"), &empty),
            Err(DestinationError::Forbidden(_))
        ));
        assert!(check_ip(ip("127.0.0.1"), &lo).is_ok());
        assert!(check_ip(ip("10.0.0.1"), &lo).is_err());
        assert!(check_ip(ip("8.8.8.8"), &empty).is_ok());
    }

    #[test]
    fn check_url_cases() {
        let empty = AllowList::default();
        let u = |s: &str| reqwest::Url::parse(s).unwrap();
        assert!(check_url(&u("https://example.com/hook"), &empty).is_ok());
        assert!(check_url(&u("http://8.8.8.8/"), &empty).is_ok());
        for bad in [
            "http://127.0.0.1/",
            "http://[::1]/",
            "http://[::ffff:169.254.169.254]/",
            "http://169.254.169.254/latest/meta-data",
            // Alternative IPv4 spellings are normalised by the URL parser.
            "http://2130706433/",
            "http://0x7f.1/",
            "http://0/",
        ] {
            assert!(
                matches!(
                    check_url(&u(bad), &empty),
                    Err(DestinationError::Forbidden(_))
                ),
                "{bad}"
            );
        }
        for bad in ["ftp://example.com/", "file:///etc/passwd", "unix:/run/x"] {
            assert!(
                matches!(check_url(&u(bad), &empty), Err(DestinationError::BadUrl(_))),
                "{bad}"
            );
        }
    }

    /// Minimal HTTP/1.1 server on 127.0.0.1 answering every connection with `response`
    /// (headers + body) and counting accepted connections.
    async fn serve(response: Vec<u8>) -> (SocketAddr, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let hits = Arc::new(AtomicUsize::new(0));
        let counter = hits.clone();
        let response = Arc::new(response);
        tokio::spawn(async move {
            loop {
                let Ok((sock, _)) = listener.accept().await else {
                    return;
                };
                counter.fetch_add(1, Ordering::SeqCst);
                let response = response.clone();
                tokio::spawn(async move {
                    let mut sock = sock;
                    read_head(&mut sock).await;
                    let _ = sock.write_all(&response).await;
                    let _ = sock.shutdown().await;
                });
            }
        });
        (addr, hits)
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

    fn ok_response() -> Vec<u8> {
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok".to_vec()
    }

    fn opts(allow: &str, resolver: Option<Arc<dyn HostResolver>>) -> ClientOptions {
        ClientOptions {
            allow: AllowList::parse(allow).unwrap(),
            resolver,
            connect_timeout: Duration::from_secs(2),
            user_agent: "hookd-test/1".into(),
            pool_max_idle_per_host: 4,
        }
    }

    /// Scripted DNS: answers every lookup with fixed addresses and records the calls.
    struct FixedResolver {
        answer: Vec<IpAddr>,
        calls: AtomicUsize,
    }

    impl FixedResolver {
        fn new(answer: &[&str]) -> Arc<Self> {
            Arc::new(Self {
                answer: answer.iter().map(|s| ip(s)).collect(),
                calls: AtomicUsize::new(0),
            })
        }
    }

    impl HostResolver for FixedResolver {
        fn lookup(&self, _host: &str, port: u16) -> LookupFuture {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let addrs = self
                .answer
                .iter()
                .map(|ip| SocketAddr::new(*ip, port))
                .collect();
            Box::pin(async move { Ok(addrs) })
        }
    }

    struct FailingResolver;
    impl HostResolver for FailingResolver {
        fn lookup(&self, _host: &str, _port: u16) -> LookupFuture {
            Box::pin(async { Err(io::Error::other("NXDOMAIN")) })
        }
    }

    #[tokio::test]
    async fn ip_literal_refused_without_allow_list_and_allowed_with_it() {
        let (addr, hits) = serve(ok_response()).await;
        let url = reqwest::Url::parse(&format!("http://127.0.0.1:{}/", addr.port())).unwrap();

        let strict = opts("", None);
        assert!(matches!(
            check_url(&url, &strict.allow),
            Err(DestinationError::Forbidden(_))
        ));

        let o = opts("127.0.0.0/8", None);
        check_url(&url, &o.allow).unwrap();
        let client = build_client(o);
        let resp = client.get(url).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.text().await.unwrap(), "ok");
        assert_eq!(hits.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn rebinding_to_private_address_is_refused() {
        let (addr, hits) = serve(ok_response()).await;
        let resolver = FixedResolver::new(&["10.0.0.1"]);
        let client = build_client(opts("127.0.0.0/8", Some(resolver.clone())));
        let url = reqwest::Url::parse(&format!("http://evil.test:{}/", addr.port())).unwrap();
        check_url(&url, &AllowList::default()).unwrap();

        let err = client.get(url).send().await.unwrap_err();
        assert_eq!(
            classify_error(&err),
            ErrorClass::DestinationForbidden,
            "{err:?}"
        );
        assert_eq!(resolver.calls.load(Ordering::SeqCst), 1);
        assert_eq!(hits.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn loopback_name_refused_without_allow_list() {
        let resolver = FixedResolver::new(&["127.0.0.1", "::1"]);
        let client = build_client(opts("", Some(resolver)));
        let err = client
            .get("http://localhost.test:9/")
            .send()
            .await
            .unwrap_err();
        assert_eq!(classify_error(&err), ErrorClass::DestinationForbidden);
    }

    #[tokio::test]
    async fn mixed_answer_connects_only_to_checked_address() {
        let (addr, hits) = serve(ok_response()).await;
        let allow = AllowList::parse("127.0.0.0/8").unwrap();
        let resolver = FixedResolver::new(&["10.0.0.1", "127.0.0.1", "169.254.169.254"]);

        // What the connector receives is exactly what the guard returns.
        let guard = GuardedResolver::new(resolver.clone(), allow.clone());
        let name: Name = "evil.test".parse().unwrap();
        let handed: Vec<SocketAddr> = guard.resolve(name).await.unwrap().collect();
        assert_eq!(handed, vec!["127.0.0.1:0".parse().unwrap()]);

        // End to end: `evil.test` has no real DNS entry (.test is reserved), so success
        // means the scripted resolver was the only path and 127.0.0.1 was connected.
        let client = build_client(opts("127.0.0.0/8", Some(resolver.clone())));
        let resp = client
            .get(format!("http://evil.test:{}/", addr.port()))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(hits.load(Ordering::SeqCst), 1);
        assert_eq!(resolver.calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn resolver_failure_is_dns() {
        let client = build_client(opts("", Some(Arc::new(FailingResolver))));
        let err = client.get("http://nowhere.test/").send().await.unwrap_err();
        assert_eq!(classify_error(&err), ErrorClass::Dns, "{err:?}");

        let empty = FixedResolver::new(&[]);
        let client = build_client(opts("", Some(empty)));
        let err = client.get("http://nowhere.test/").send().await.unwrap_err();
        assert_eq!(classify_error(&err), ErrorClass::Dns, "{err:?}");
    }

    #[tokio::test]
    async fn refused_connection_is_connect() {
        // Bind then drop to get a port with (almost certainly) no listener.
        let port = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let client = build_client(opts("127.0.0.0/8", None));
        let err = client
            .get(format!("http://127.0.0.1:{port}/"))
            .send()
            .await
            .unwrap_err();
        assert_eq!(classify_error(&err), ErrorClass::Connect, "{err:?}");
    }

    #[tokio::test]
    async fn slow_server_is_timeout() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            // Accept and hold the connection open without answering.
            let mut held = Vec::new();
            while let Ok((s, _)) = listener.accept().await {
                held.push(s);
            }
        });
        let client = build_client(opts("127.0.0.0/8", None));
        let err = client
            .get(format!("http://{addr}/"))
            .timeout(Duration::from_millis(200))
            .send()
            .await
            .unwrap_err();
        assert_eq!(classify_error(&err), ErrorClass::Timeout, "{err:?}");
    }

    #[tokio::test]
    async fn redirects_are_not_followed() {
        let (target, target_hits) = serve(ok_response()).await;
        let redirect = format!(
            "HTTP/1.1 302 Found\r\nlocation: http://{target}/\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
        );
        let (addr, _) = serve(redirect.into_bytes()).await;
        let client = build_client(opts("127.0.0.0/8", None));
        let resp = client.get(format!("http://{addr}/")).send().await.unwrap();
        assert_eq!(resp.status(), 302);
        assert_eq!(
            resp.headers()["location"].to_str().unwrap(),
            format!("http://{target}/")
        );
        assert_eq!(target_hits.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn read_capped_stops_early_on_huge_body() {
        const TOTAL: usize = 10 * 1024 * 1024;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let sent = Arc::new(AtomicUsize::new(0));
        let sent_srv = sent.clone();
        tokio::spawn(async move {
            let (mut sock, _) = listener.accept().await.unwrap();
            read_head(&mut sock).await;
            let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {TOTAL}\r\n\r\n");
            sock.write_all(head.as_bytes()).await.unwrap();
            let chunk = vec![b'x'; 64 * 1024];
            for _ in 0..TOTAL / chunk.len() {
                if sock.write_all(&chunk).await.is_err() {
                    return;
                }
                sent_srv.fetch_add(chunk.len(), Ordering::SeqCst);
            }
        });
        let client = build_client(opts("127.0.0.0/8", None));
        let resp = client.get(format!("http://{addr}/")).send().await.unwrap();
        let start = std::time::Instant::now();
        let (text, truncated) = read_capped(resp, 4096).await;
        assert!(start.elapsed() < Duration::from_secs(2));
        assert!(truncated);
        assert_eq!(text.len(), 4096);
        assert!(text.bytes().all(|b| b == b'x'));
        // Give the server a moment: it must be blocked/failed well short of 10 MB
        // because the client stopped reading and dropped the connection.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(sent.load(Ordering::SeqCst) < TOTAL, "whole body was sent");
    }

    #[tokio::test]
    async fn read_capped_small_and_exact_bodies() {
        let body = |b: &str| {
            format!(
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{b}",
                b.len()
            )
            .into_bytes()
        };
        let client = build_client(opts("127.0.0.0/8", None));
        let cases: [(&str, usize, &str, bool); 5] = [
            ("hello", 10, "hello", false),
            ("hello", 5, "hello", false),
            ("hello", 4, "hell", true),
            ("", 0, "", false),
            // Cap falls inside the 2-byte 'é': the half character is dropped.
            ("aé", 2, "a", true),
        ];
        for (b, cap, want, want_trunc) in cases {
            let (addr, _) = serve(body(b)).await;
            let resp = client.get(format!("http://{addr}/")).send().await.unwrap();
            assert_eq!(read_capped(resp, cap).await, (want.to_string(), want_trunc));
        }
        // Invalid UTF-8 is replaced, never exceeding the cap in bytes.
        let mut raw = b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\nconnection: close\r\n\r\n".to_vec();
        raw.extend_from_slice(&[0xff, 0xfe, b'a', b'b']);
        let (addr, _) = serve(raw).await;
        let resp = client.get(format!("http://{addr}/")).send().await.unwrap();
        let (text, _) = read_capped(resp, 4).await;
        assert!(text.len() <= 4, "{text:?}");
    }

    #[tokio::test]
    async fn user_agent_is_sent_and_bad_one_falls_back() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                let mut buf = vec![0u8; 4096];
                let n = sock.read(&mut buf).await.unwrap_or(0);
                let _ = tx.send(String::from_utf8_lossy(&buf[..n]).into_owned());
                let _ = sock.write_all(&ok_response()).await;
            }
        });
        let client = build_client(opts("127.0.0.0/8", None));
        client.get(format!("http://{addr}/")).send().await.unwrap();
        let head = rx.recv().await.unwrap().to_ascii_lowercase();
        assert!(head.contains("user-agent: hookd-test/1"), "{head}");

        let mut o = opts("127.0.0.0/8", None);
        o.user_agent = "bad\nua".into();
        let client = build_client(o);
        client.get(format!("http://{addr}/")).send().await.unwrap();
        let head = rx.recv().await.unwrap().to_ascii_lowercase();
        assert!(head.contains("user-agent: hookd\r\n"), "{head}");
    }
}

#[cfg(test)]
mod refusal_text_tests {
    use super::*;

    /// The refusal reaches tenants (attempt log, lastError): it must not say which internal
    /// address the receiver's name resolved to.
    #[test]
    fn a_forbidden_destination_does_not_name_the_address() {
        for ip in ["10.1.2.3", "169.254.169.254", "fd00::1"] {
            let e = DestinationError::Forbidden(ip.parse().unwrap());
            assert!(!e.to_string().contains(ip), "{e}");
        }
    }
}
