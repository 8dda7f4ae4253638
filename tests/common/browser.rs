//! Real parts for tests/browser.rs: a `hookd dev` child process on the test's database,
//! headless Chromium driven through chromedriver (W3C WebDriver, via fantoccini), and a
//! receiver that keeps each request's headers so a test can verify signatures itself.
//!
//! Chromium is required: without it these tests fail with what to install, unless
//! `HOOKD_SKIP_BROWSER=1` says to skip them on purpose.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use fantoccini::{Client, ClientBuilder, Locator};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::common::{HookdCommand, HookdProcess, free_port};

/// A directory of its own under the system temp dir, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(prefix: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("{prefix}-{}", uuid::Uuid::now_v7().simple()));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `hookd dev` (the API and a dispatcher in one process, the same `run` functions as in a
/// cluster) on the test's database, with quick retries. Its built-in example endpoint is
/// in tenant `default`, which the tests do not use.
pub struct Hookd {
    pub base: String,
    process: HookdProcess,
}

impl Hookd {
    pub async fn start(pool: &PgPool, envs: &[(&str, &str)]) -> Hookd {
        let (api, rx, metrics) = (free_port(), free_port(), free_port());
        let base = format!("http://127.0.0.1:{api}");
        let process = HookdCommand::new(["dev", "--listen", &format!("127.0.0.1:{api}")])
            .args(["--receiver-listen", &format!("127.0.0.1:{rx}")])
            .args(["--dispatch-listen", &format!("127.0.0.1:{metrics}")])
            .database(pool)
            .test_key()
            .env("HOOKD_LOG", "warn")
            .env("HOOKD_POLL_MS", "100")
            .env("HOOKD_RETRY_SCHEDULE", "1")
            .env("HOOKD_RETRY_JITTER", "0")
            .env("HOOKD_ALLOWED_DESTINATIONS", "127.0.0.0/8")
            .envs(envs.iter().copied())
            .base_url(&base)
            .start()
            .await;
        Hookd { base, process }
    }

    /// Everything `hookd dev` printed so far.
    pub fn log(&self) -> String {
        self.process.output()
    }

    /// `POST /v1/messages` with `token`; the eventId.
    pub async fn send(&self, token: &str, event_type: &str, payload: &str) -> String {
        let body = format!(r#"{{"eventType":"{event_type}","payload":{payload}}}"#);
        let r = reqwest::Client::new()
            .post(format!("{}/v1/messages", self.base))
            .bearer_auth(token)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
        let v: serde_json::Value = r.json().await.unwrap();
        v["eventId"].as_str().unwrap().to_string()
    }

    /// A JSON call to the API; (status, body).
    pub async fn call(
        &self,
        token: &str,
        method: reqwest::Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> (u16, serde_json::Value) {
        let mut req = reqwest::Client::new()
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(token);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or_default())
    }
}

/// Headless Chromium under chromedriver, both started by the test and killed with it.
pub struct Browser {
    pub client: Client,
    _driver: DriverProcess,
    profile_dir: TempDir,
}

/// chromedriver, in a process group of its own that holds the Chromium it launches: on
/// drop (a test's end or its panic, from the moment it is spawned) the whole group is
/// killed, so no browser outlives its test.
struct DriverProcess(Child);

impl Drop for DriverProcess {
    fn drop(&mut self) {
        let group = libc::pid_t::try_from(self.0.id()).expect("a pid");
        // SAFETY: kill(2) with a negative pid signals that process group; this group was
        // created for this chromedriver (process_group(0)) and holds only what it started.
        unsafe {
            libc::kill(-group, libc::SIGKILL);
        }
        let _ = self.0.wait();
    }
}

fn find_program(env: &str, names: &[&str]) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(env) {
        return Some(PathBuf::from(p)).filter(|p| p.is_file());
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    names.iter().find_map(|name| {
        std::env::split_paths(&path)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    })
}

impl Browser {
    /// None only when `HOOKD_SKIP_BROWSER=1`; panics, saying what to install, when
    /// Chromium or chromedriver is missing (a test that silently passes without a browser
    /// would prove nothing).
    pub async fn start() -> Option<Browser> {
        crate::common::init();
        if std::env::var("HOOKD_SKIP_BROWSER").as_deref() == Ok("1") {
            eprintln!("HOOKD_SKIP_BROWSER=1: browser test skipped");
            return None;
        }
        let missing = |what: &str| -> ! {
            panic!(
                "{what} not found. The browser tests need Debian's chromium and chromium-driver \
                 (`apt-get install chromium chromium-driver`; .ci/run installs them), or \
                 HOOKD_CHROMIUM / HOOKD_CHROMEDRIVER naming them. Set HOOKD_SKIP_BROWSER=1 to skip \
                 these tests on purpose."
            )
        };
        let chromium = find_program("HOOKD_CHROMIUM", &["chromium", "chromium-browser"])
            .unwrap_or_else(|| missing("chromium"));
        let chromedriver = find_program("HOOKD_CHROMEDRIVER", &["chromedriver"])
            .unwrap_or_else(|| missing("chromedriver"));
        let profile = TempDir::new("hookd-chromium");
        let port = free_port();
        let driver = DriverProcess({
            use std::os::unix::process::CommandExt;
            Command::new(&chromedriver)
                .arg(format!("--port={port}"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                // its own process group, so Drop can end chromedriver and the Chromium
                // processes it started (and only those) at once
                .process_group(0)
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start {}: {e}", chromedriver.display()))
        });
        let webdriver = format!("http://127.0.0.1:{port}");
        let up = crate::common::wait_until(Duration::from_secs(15), || async {
            reqwest::get(format!("{webdriver}/status"))
                .await
                .is_ok_and(|r| r.status().is_success())
        })
        .await;
        assert!(up, "chromedriver did not answer on {webdriver}");
        let caps = serde_json::json!({
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": [
                    "--headless=new",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-dev-shm-usage",
                    "--disable-background-networking",
                    "--disable-component-update",
                    "--disable-default-apps",
                    "--disable-sync",
                    "--no-first-run",
                    "--no-default-browser-check",
                    // crashpad runs outside the process group and writes under $HOME
                    "--disable-crash-reporter",
                    "--disable-breakpad",
                    "--window-size=1280,900",
                    format!("--user-data-dir={}", profile.path().display()),
                ],
            },
        });
        let serde_json::Value::Object(caps) = caps else {
            unreachable!()
        };
        let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps)
            .connect(&webdriver)
            .await
            .unwrap_or_else(|e| panic!("chromedriver could not start Chromium: {e}"));
        Some(Browser {
            client,
            _driver: driver,
            profile_dir: profile,
        })
    }

    /// The `--user-data-dir` of this Chromium (a fresh directory per browser).
    pub fn profile(&self) -> &Path {
        self.profile_dir.path()
    }

    /// Ends the WebDriver session: chromedriver closes Chromium the way a user quitting it
    /// would, so the profile (History, session restore files, storage) is written out.
    pub async fn quit(&self) {
        self.client.clone().close().await.unwrap();
    }

    pub async fn goto(&self, url: &str) {
        self.client.goto(url).await.unwrap();
    }

    /// The first element matching `css`, waiting up to 30 s for it to appear.
    pub async fn wait_for(&self, css: &str) -> fantoccini::elements::Element {
        self.client
            .wait()
            .at_most(Duration::from_secs(30))
            .for_element(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("no {css:?} within 30 s: {e}"))
    }

    /// Waits until the text of the first `css` element contains `needle`; that text.
    pub async fn wait_for_text(&self, css: &str, needle: &str) -> String {
        let last = std::cell::RefCell::new(String::new());
        // generous: nextest runs these beside the rest of the suite on small CI machines
        let found = crate::common::wait_until(Duration::from_secs(30), || async {
            let text = self.text(css).await.unwrap_or_default();
            let found = text.contains(needle);
            *last.borrow_mut() = text;
            found
        })
        .await;
        let last = last.into_inner();
        assert!(
            found,
            "{css:?} never contained {needle:?}; last text: {last:?}"
        );
        last
    }

    /// The rendered text (`textContent`) of the first `css` element, if there is one.
    pub async fn text(&self, css: &str) -> Option<String> {
        let v = self
            .client
            .execute(
                "const e = document.querySelector(arguments[0]); return e ? e.textContent : null;",
                vec![css.into()],
            )
            .await
            .unwrap();
        v.as_str().map(str::to_owned)
    }

    pub async fn js(&self, script: &str) -> serde_json::Value {
        self.client.execute(script, vec![]).await.unwrap()
    }

    /// Runs `body` (which must end by calling `done(value)`) and returns that value.
    pub async fn js_async(&self, body: &str) -> serde_json::Value {
        let script = format!("const done = arguments[arguments.length - 1]; {body}");
        self.client.execute_async(&script, vec![]).await.unwrap()
    }

    pub async fn click(&self, css: &str) {
        self.wait_for(css).await.click().await.unwrap();
    }

    pub async fn type_into(&self, css: &str, text: &str) {
        let e = self.wait_for(css).await;
        e.clear().await.unwrap();
        e.send_keys(text).await.unwrap();
    }

    /// No alert, confirm or prompt dialog is open.
    pub async fn assert_no_dialog(&self) {
        match self.client.get_alert_text().await {
            Err(fantoccini::error::CmdError::Standard(e))
                if e.error == fantoccini::error::ErrorStatus::NoSuchAlert => {}
            other => panic!("a dialog is open (or the check failed): {other:?}"),
        }
    }

    /// Saves a PNG of the page as `target/screenshots/<name>.png`, and as
    /// `docs/screenshots/<name>.png` when `HOOKD_UPDATE_SCREENSHOTS=1` (so an ordinary
    /// test run never rewrites files under version control).
    pub async fn screenshot(&self, name: &str) {
        let png = self.client.screenshot().await.unwrap();
        assert!(png.starts_with(b"\x89PNG"), "not a PNG");
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut dirs = vec![root.join("target/screenshots")];
        if std::env::var("HOOKD_UPDATE_SCREENSHOTS").as_deref() == Ok("1") {
            dirs.push(root.join("docs/screenshots"));
        }
        for dir in dirs {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join(format!("{name}.png")), &png).unwrap();
        }
    }
}

/// One request as a receiver saw it: all headers, and the body bytes.
#[derive(Debug, Clone)]
pub struct Seen {
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// A receiver on 127.0.0.1 that answers `status` (changeable) and keeps every request.
pub struct RecordingReceiver {
    pub addr: SocketAddr,
    pub seen: Arc<Mutex<Vec<Seen>>>,
    status: Arc<AtomicU16>,
    stop: CancellationToken,
}

impl RecordingReceiver {
    pub async fn start(status: u16) -> RecordingReceiver {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let status = Arc::new(AtomicU16::new(status));
        let (s, st) = (seen.clone(), status.clone());
        let app = axum::Router::new().fallback(axum::routing::post(
            move |uri: axum::http::Uri, headers: HeaderMap, body: Bytes| {
                let (s, st) = (s.clone(), st.clone());
                async move {
                    s.lock().unwrap().push(Seen {
                        path: uri.path().to_string(),
                        headers,
                        body,
                    });
                    let code = StatusCode::from_u16(st.load(Ordering::SeqCst)).unwrap();
                    // a body a page must show as text, never as markup
                    (
                        code,
                        "<b>receiver</b> said <script>alert('snippet')</script>",
                    )
                }
            },
        ));
        let (addr, stop) = crate::common::serve_local(app).await;
        RecordingReceiver {
            addr,
            seen,
            status,
            stop,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn set_status(&self, status: u16) {
        self.status.store(status, Ordering::SeqCst);
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for RecordingReceiver {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
