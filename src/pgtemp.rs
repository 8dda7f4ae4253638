//! Throwaway PostgreSQL clusters for `hookd dev`, benchmarks and crash tests.
//!
//! Same mechanism as `scripts/test.sh`: find the server binaries, `initdb` a
//! fresh cluster in a temp dir, start it with `pg_ctl` on a free 127.0.0.1
//! port and a private socket dir (so a system Postgres on 5432 is never
//! touched), and remove everything afterwards. `stop_immediate` + `restart`
//! let crash tests kill the server without a checkpoint and bring it back on
//! the same port and data dir.
//!
//! fsync and synchronous_commit are deliberately left at their defaults: the
//! crash tests and benchmarks that use this need real durability.
//!
//! A watchdog outlives us: a `/bin/sh` in its own process group (so a closing
//! terminal's SIGHUP does not reach it) reads a pipe whose write end only this
//! process holds. When this process dies by any means, SIGKILL included, the kernel
//! closes that end, the watchdog reads EOF, stops the server and removes the
//! directory. A clean shutdown cleans up itself and then kills the watchdog.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long to wait for the server to accept connections after a start.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Lines of the server log quoted in errors.
const LOG_TAIL_LINES: usize = 20;

#[derive(Debug, thiserror::Error)]
pub enum TempPgError {
    #[error(
        "no PostgreSQL server binaries found (looked in {0}); install the PostgreSQL server package or set DATABASE_URL"
    )]
    NoBinaries(String),
    #[error("{step} failed: {detail}")]
    Step { step: &'static str, detail: String },
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// A running (or deliberately stopped) throwaway cluster. Dropping it stops
/// the server and removes its directories; prefer [`TempPostgres::shutdown`]
/// in async code so errors are visible.
#[derive(Debug)]
pub struct TempPostgres {
    /// Temp dir owning everything below; removed on shutdown/drop.
    root: PathBuf,
    data_dir: PathBuf,
    socket_dir: PathBuf,
    log_file: PathBuf,
    bindir: PathBuf,
    /// Unprivileged user to run initdb/pg_ctl as, when we are root.
    run_as: Option<String>,
    port: u16,
    /// Whether we believe a postmaster is up, so drop/shutdown know whether
    /// a stop is needed. Atomic because stop/restart take `&self`.
    running: AtomicBool,
    /// Set once the dirs are gone, so Drop after `shutdown` does nothing.
    cleaned: AtomicBool,
    /// Cleans up if this process dies without doing so; see the module docs.
    watchdog: std::sync::Mutex<Option<std::process::Child>>,
}

impl TempPostgres {
    /// Creates a fresh cluster and starts it; returns once it accepts
    /// connections.
    pub async fn start() -> Result<Self, TempPgError> {
        let bindir = find_bindir()?;
        let run_as = run_as_user().await?;
        let root = make_temp_root()?;
        let mut pg = TempPostgres {
            data_dir: root.join("data"),
            socket_dir: root.join("sock"),
            log_file: root.join("postgres.log"),
            root,
            bindir,
            run_as,
            port: 0,
            running: AtomicBool::new(false),
            cleaned: AtomicBool::new(false),
            watchdog: std::sync::Mutex::new(None),
        };
        // From here on `pg`'s Drop removes the temp dir if anything fails.
        std::fs::create_dir(&pg.socket_dir)?;
        // Before initdb: from here on nothing of this cluster outlives this process.
        pg.spawn_watchdog()?;
        if let Some(user) = &pg.run_as {
            chown_to(user, &[&pg.root, &pg.socket_dir]).await?;
        }

        // --locale=C: deterministic collation and no dependency on which
        // locales the host has generated.
        let mut args = vec![OsString::from("-D"), pg.data_dir.clone().into()];
        args.extend(
            [
                "--auth=trust",
                "-U",
                "postgres",
                "--encoding=UTF8",
                "--locale=C",
                "--no-instructions",
            ]
            .map(OsString::from),
        );
        let out = pg.pg_command("initdb", args).output().await?;
        check("initdb", &out, None)?;

        // The free port we pick is released before postgres binds it, so
        // another process could grab it in between; retry with a new port.
        let mut last_err = None;
        for _ in 0..3 {
            pg.port = free_port()?;
            match pg.pg_ctl_start().await {
                Ok(()) => {
                    tracing::info!(url = %pg.url(), dir = %pg.root.display(), "temporary PostgreSQL started");
                    return Ok(pg);
                }
                Err(e) => {
                    tracing::warn!(port = pg.port, error = %e, "temporary PostgreSQL failed to start, retrying");
                    // A half-started server must not linger into the retry.
                    let _ = pg.pg_ctl_stop("immediate").await;
                    last_err = Some(e);
                }
            }
        }
        Err(last_err.expect("loop ran at least once"))
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres` (trust auth, no password).
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `pg_ctl stop -m immediate`: the server exits without a checkpoint, so
    /// the next start runs crash recovery, like after a power cut (minus the
    /// OS page cache loss).
    pub async fn stop_immediate(&self) -> Result<(), TempPgError> {
        self.pg_ctl_stop("immediate").await
    }

    /// Starts the server again on the same port and data dir and waits until
    /// it accepts connections (i.e. recovery is done).
    pub async fn restart(&self) -> Result<(), TempPgError> {
        if self.running.load(Ordering::SeqCst) {
            self.pg_ctl_stop("fast").await?;
        }
        self.pg_ctl_start().await
    }

    /// The temp dir holding the cluster (removed on shutdown, drop, or by the watchdog).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Starts the watchdog: `sh` reading its stdin until EOF, then stopping the server
    /// (as the cluster's user) and removing the temp dir. SIGHUP, SIGINT and SIGTERM are
    /// ignored, so only EOF (our death) or our SIGKILL (a clean shutdown) ends it.
    fn spawn_watchdog(&self) -> Result<(), TempPgError> {
        use std::os::unix::process::CommandExt;
        let (program, argv) = self.argv("pg_ctl", self.stop_args("immediate"));
        let stop = std::iter::once(&program)
            .chain(&argv)
            .map(|a| sh_quote(&a.to_string_lossy()))
            .collect::<Vec<_>>()
            .join(" ");
        let pid_file = sh_quote(&self.data_dir.join("postmaster.pid").to_string_lossy());
        let root = sh_quote(&self.root.to_string_lossy());
        let script = format!(
            "trap '' HUP INT TERM\n\
             while read -r _; do :; done\n\
             {stop} >/dev/null 2>&1 || {{ pid=$(head -n1 {pid_file} 2>/dev/null) && kill -KILL \"$pid\"; }}\n\
             rm -rf {root}\n"
        );
        let child = std::process::Command::new("/bin/sh")
            .args(["-c", &script])
            .current_dir("/")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .process_group(0)
            .spawn()?;
        *self.watchdog.lock().unwrap_or_else(|e| e.into_inner()) = Some(child);
        Ok(())
    }

    /// After a clean stop and removal: the watchdog has nothing left to do.
    fn dismiss_watchdog(&self) {
        if let Some(mut child) = self
            .watchdog
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the server (fast mode) and removes its directories.
    pub async fn shutdown(self) -> Result<(), TempPgError> {
        let stopped = if self.running.load(Ordering::SeqCst) {
            match self.pg_ctl_stop("fast").await {
                Ok(()) => Ok(()),
                // Still try not to leak a server before reporting.
                Err(e) => {
                    let _ = self.pg_ctl_stop("immediate").await;
                    Err(e)
                }
            }
        } else {
            Ok(())
        };
        let root = self.root.clone();
        let removed = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(root))
            .await
            .map_err(|e| TempPgError::Step {
                step: "removing temp dir",
                detail: e.to_string(),
            })?;
        self.cleaned.store(true, Ordering::SeqCst);
        self.dismiss_watchdog();
        stopped?;
        removed?;
        Ok(())
    }

    /// `pg_ctl start -w`, then a protocol-level readiness check over TCP.
    async fn pg_ctl_start(&self) -> Result<(), TempPgError> {
        let args = vec![
            "start".into(),
            "-D".into(),
            self.data_dir.clone().into(),
            "-l".into(),
            self.log_file.clone().into(),
            "-o".into(),
            self.server_options().into(),
            "-w".into(),
            "-t".into(),
            READY_TIMEOUT.as_secs().to_string().into(),
        ];
        // Set before spawning: a failed or cancelled pg_ctl may still leave
        // a postmaster behind, so assume the worst and let Drop stop it.
        self.running.store(true, Ordering::SeqCst);
        let out = self.pg_command("pg_ctl", args).output().await?;
        check("pg_ctl start", &out, Some(&self.log_file))?;
        wait_ready(self.port, READY_TIMEOUT)
            .await
            .map_err(|detail| TempPgError::Step {
                step: "waiting for PostgreSQL to accept connections",
                detail: format!("{detail}{}", log_tail(&self.log_file)),
            })
    }

    async fn pg_ctl_stop(&self, mode: &str) -> Result<(), TempPgError> {
        let out = self
            .pg_command("pg_ctl", self.stop_args(mode))
            .output()
            .await?;
        check("pg_ctl stop", &out, Some(&self.log_file))?;
        self.running.store(false, Ordering::SeqCst);
        Ok(())
    }

    /// Passed via `pg_ctl -o`, which hands the string to `/bin/sh`; the
    /// socket dir is quoted for it.
    fn server_options(&self) -> String {
        format!(
            "-c listen_addresses=127.0.0.1 -c port={} -c unix_socket_directories={} \
             -c max_connections=200 -c shared_buffers=256MB",
            self.port,
            sh_quote(&self.socket_dir.to_string_lossy()),
        )
    }

    fn stop_args(&self, mode: &str) -> Vec<OsString> {
        let mut args = vec!["stop".into(), "-D".into(), self.data_dir.clone().into()];
        args.extend(["-m", mode, "-w", "-t", "30"].map(OsString::from));
        args
    }

    fn pg_command(&self, tool: &str, args: Vec<OsString>) -> tokio::process::Command {
        let (program, argv) = self.argv(tool, args);
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(argv)
            // The unprivileged user may not be able to access our cwd, and
            // initdb/postgres want to resolve it.
            .current_dir(&self.root)
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true);
        cmd
    }

    /// Full argv for running `tool` from the bindir, as the unprivileged
    /// user when we are root.
    fn argv(&self, tool: &str, args: Vec<OsString>) -> (OsString, Vec<OsString>) {
        let bin = self.bindir.join(tool).into_os_string();
        match &self.run_as {
            None => (bin, args),
            Some(user) if has_runuser() => {
                let mut argv = vec!["-u".into(), user.into(), "--".into(), bin];
                argv.extend(args);
                ("runuser".into(), argv)
            }
            Some(user) => {
                // su takes one shell string, so quote every word for /bin/sh.
                let cmd = std::iter::once(&bin)
                    .chain(&args)
                    .map(|a| sh_quote(&a.to_string_lossy()))
                    .collect::<Vec<_>>()
                    .join(" ");
                let argv = [user.as_str(), "-s", "/bin/sh", "-c", &cmd].map(OsString::from);
                ("su".into(), argv.to_vec())
            }
        }
    }

    /// Synchronous best-effort stop for Drop (no runtime available there).
    fn stop_immediate_blocking(&self) {
        let (program, args) = self.argv("pg_ctl", self.stop_args("immediate"));
        let ok = std::process::Command::new(program)
            .args(args)
            .current_dir(&self.root)
            .stdin(std::process::Stdio::null())
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        if !ok {
            // Last resort so a test run does not leak a server: SIGKILL the
            // postmaster named in our own data dir's pid file.
            if let Some(pid) = std::fs::read_to_string(self.data_dir.join("postmaster.pid"))
                .ok()
                .and_then(|s| s.lines().next().map(str::trim).map(str::to_owned))
                .filter(|p| p.parse::<u32>().is_ok())
            {
                let _ = std::process::Command::new("kill")
                    .args(["-KILL", &pid])
                    .output();
            }
        }
    }
}

impl Drop for TempPostgres {
    fn drop(&mut self) {
        if self.cleaned.load(Ordering::SeqCst) {
            return;
        }
        if self.running.load(Ordering::SeqCst) {
            self.stop_immediate_blocking();
        }
        if let Err(e) = std::fs::remove_dir_all(&self.root) {
            // eprintln, not tracing: Drop often runs while a test is
            // panicking, when nobody may be collecting tracing output.
            eprintln!(
                "warning: could not remove temporary PostgreSQL dir {}: {e}",
                self.root.display()
            );
        }
        self.dismiss_watchdog();
    }
}

// --- helpers -------------------------------------------------------------------

/// HOOKD_PG_BINDIR, else /usr/lib/postgresql/*/bin (highest major first:
/// Debian keeps server binaries there and only client wrappers on PATH), else
/// `pg_config --bindir`, else the dir of `postgres` on PATH.
pub fn find_bindir() -> Result<PathBuf, TempPgError> {
    if let Some(dir) = std::env::var_os("HOOKD_PG_BINDIR") {
        let dir = PathBuf::from(dir);
        return if has_server_bins(&dir) {
            Ok(dir)
        } else {
            Err(TempPgError::NoBinaries(format!(
                "HOOKD_PG_BINDIR={}",
                dir.display()
            )))
        };
    }
    let mut candidates = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/usr/lib/postgresql") {
        let mut versioned: Vec<(Vec<u32>, PathBuf)> = entries
            .filter_map(Result::ok)
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let version = name
                    .split('.')
                    .map(str::parse)
                    .collect::<Result<Vec<u32>, _>>()
                    .ok()?;
                Some((version, e.path().join("bin")))
            })
            .collect();
        versioned.sort_by(|a, b| b.0.cmp(&a.0));
        candidates.extend(versioned.into_iter().map(|(_, p)| p));
    }
    if let Ok(out) = std::process::Command::new("pg_config")
        .arg("--bindir")
        .output()
        && out.status.success()
    {
        let dir = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        if !dir.is_empty() {
            candidates.push(PathBuf::from(dir));
        }
    }
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path));
    }
    candidates
        .iter()
        .find(|d| has_server_bins(d))
        .cloned()
        .ok_or_else(|| {
            TempPgError::NoBinaries("/usr/lib/postgresql/*/bin, pg_config --bindir, PATH".into())
        })
}

fn has_server_bins(dir: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    ["initdb", "pg_ctl", "postgres"].iter().all(|b| {
        std::fs::metadata(dir.join(b))
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    })
}

/// initdb/pg_ctl/postgres refuse to run as root. As root, use the `postgres`
/// system user if there is one, else `nobody`.
async fn run_as_user() -> Result<Option<String>, TempPgError> {
    if effective_uid()? != 0 {
        return Ok(None);
    }
    let has_postgres = tokio::process::Command::new("id")
        .arg("postgres")
        .output()
        .await
        .map(|o| o.status.success())
        .unwrap_or(false);
    Ok(Some(
        if has_postgres { "postgres" } else { "nobody" }.to_owned(),
    ))
}

/// std has no geteuid; /proc/self/status has it on Linux, `id -u` elsewhere.
fn effective_uid() -> Result<u32, TempPgError> {
    if let Ok(status) = std::fs::read_to_string("/proc/self/status")
        && let Some(euid) = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|rest| rest.split_whitespace().nth(1))
            .and_then(|s| s.parse().ok())
    {
        return Ok(euid);
    }
    let out = std::process::Command::new("id").arg("-u").output()?;
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .map_err(|e| TempPgError::Step {
            step: "determining effective uid",
            detail: format!("{e}"),
        })
}

fn has_runuser() -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join("runuser").is_file()))
}

/// Fresh private dir under /tmp. Not $TMPDIR: the unprivileged user must be
/// able to traverse the parent, which e.g. /root/tmp would not allow.
fn make_temp_root() -> Result<PathBuf, TempPgError> {
    use std::os::unix::fs::DirBuilderExt;
    for _ in 0..16 {
        let name = format!("hookd-pg.{:016x}", rand::random::<u64>());
        let path = Path::new("/tmp").join(name);
        match std::fs::DirBuilder::new().mode(0o700).create(&path) {
            Ok(()) => return Ok(path),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(TempPgError::Step {
        step: "creating temp dir",
        detail: "16 random names already existed".into(),
    })
}

async fn chown_to(user: &str, paths: &[&Path]) -> Result<(), TempPgError> {
    let mut cmd = tokio::process::Command::new("chown");
    cmd.arg(format!("{user}:")).args(paths);
    let out = cmd.output().await?;
    check("chown", &out, None)
}

/// Bind port 0, read the port the kernel picked, close.
fn free_port() -> Result<u16, TempPgError> {
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0))?;
    Ok(listener.local_addr()?.port())
}

/// Polls until a startup handshake reaches ReadyForQuery. A bare TCP connect
/// is not enough: during crash recovery the postmaster accepts the socket and
/// then answers "the database system is starting up".
async fn wait_ready(port: u16, timeout: Duration) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    let mut last = String::from("no attempt made");
    while Instant::now() < deadline {
        match tokio::time::timeout(Duration::from_secs(2), handshake(port)).await {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(e)) => last = e,
            Err(_) => last = "handshake timed out".into(),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!(
        "not ready on 127.0.0.1:{port} after {timeout:?}: {last}"
    ))
}

/// Minimal v3 protocol startup as user/database `postgres` with trust auth.
async fn handshake(port: u16) -> Result<(), String> {
    let mut s = TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let mut body = Vec::new();
    body.extend_from_slice(&196_608u32.to_be_bytes()); // protocol 3.0
    for kv in ["user", "postgres", "database", "postgres"] {
        body.extend_from_slice(kv.as_bytes());
        body.push(0);
    }
    body.push(0);
    let mut msg = ((body.len() + 4) as u32).to_be_bytes().to_vec();
    msg.extend_from_slice(&body);
    s.write_all(&msg).await.map_err(|e| format!("write: {e}"))?;
    loop {
        let tag = s.read_u8().await.map_err(|e| format!("read: {e}"))?;
        let len = s.read_u32().await.map_err(|e| format!("read: {e}"))? as usize;
        let mut payload = vec![0; len.saturating_sub(4)];
        s.read_exact(&mut payload)
            .await
            .map_err(|e| format!("read: {e}"))?;
        match tag {
            b'Z' => {
                // Terminate politely so the server log stays quiet.
                let _ = s.write_all(&[b'X', 0, 0, 0, 4]).await;
                return Ok(());
            }
            b'E' => {
                // Fields are (code byte, cstring)*; 'M' is the message.
                let text = payload
                    .split(|b| *b == 0)
                    .find_map(|f| f.strip_prefix(b"M"))
                    .map(|m| String::from_utf8_lossy(m).into_owned())
                    .unwrap_or_else(|| "unknown error".into());
                return Err(format!("server: {text}"));
            }
            // AuthenticationOk, ParameterStatus, BackendKeyData, notices.
            _ => {}
        }
    }
}

fn check(step: &'static str, out: &Output, log: Option<&Path>) -> Result<(), TempPgError> {
    if out.status.success() {
        return Ok(());
    }
    let mut detail = format!(
        "{}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout).trim(),
        String::from_utf8_lossy(&out.stderr).trim(),
    );
    if let Some(log) = log {
        detail.push_str(&log_tail(log));
    }
    Err(TempPgError::Step { step, detail })
}

fn log_tail(log: &Path) -> String {
    match std::fs::read_to_string(log) {
        Ok(text) => {
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(LOG_TAIL_LINES)..];
            format!(
                "\nlast {} lines of {}:\n{}",
                tail.len(),
                log.display(),
                tail.join("\n")
            )
        }
        Err(e) => format!("\n(could not read {}: {e})", log.display()),
    }
}

/// Single-quotes `s` for /bin/sh.
fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs a query through the cluster's own psql over TCP, which proves the
    /// server is reachable the way the application connects.
    async fn psql(pg: &TempPostgres, sql: &str) -> String {
        let out = tokio::process::Command::new(pg.bindir.join("psql"))
            .args([&pg.url(), "-XAtc", sql])
            .output()
            .await
            .expect("run psql");
        assert!(
            out.status.success(),
            "psql failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    #[tokio::test]
    async fn start_crash_restart_shutdown() {
        let pg = TempPostgres::start().await.expect("start");
        assert_eq!(
            pg.url(),
            format!("postgres://postgres@127.0.0.1:{}/postgres", pg.port())
        );
        assert_eq!(psql(&pg, "select 1").await, "1");
        // Durability settings must stay at their defaults.
        assert_eq!(psql(&pg, "show fsync").await, "on");
        assert_eq!(psql(&pg, "show synchronous_commit").await, "on");
        assert_eq!(psql(&pg, "show max_connections").await, "200");

        // A committed row must survive an immediate (no checkpoint) stop.
        psql(&pg, "create table t (x int); insert into t values (42)").await;
        pg.stop_immediate().await.expect("stop_immediate");
        assert!(
            TcpStream::connect(("127.0.0.1", pg.port())).await.is_err(),
            "server still accepting connections after stop_immediate"
        );
        pg.restart().await.expect("restart");
        assert_eq!(psql(&pg, "select x from t").await, "42");
        let log = std::fs::read_to_string(&pg.log_file).unwrap();
        assert!(
            log.contains("not properly shut down"),
            "expected crash recovery in log:\n{log}"
        );

        let root = pg.root.clone();
        let port = pg.port();
        pg.shutdown().await.expect("shutdown");
        assert!(!root.exists(), "{} not removed", root.display());
        assert!(TcpStream::connect(("127.0.0.1", port)).await.is_err());
    }

    #[tokio::test]
    async fn two_clusters_get_different_ports() {
        let (a, b) = tokio::join!(TempPostgres::start(), TempPostgres::start());
        let (a, b) = (a.expect("start a"), b.expect("start b"));
        assert_ne!(a.port(), b.port());
        assert_ne!(a.root, b.root);
        assert_eq!(psql(&a, "select 1").await, "1");
        assert_eq!(psql(&b, "select 2").await, "2");
        a.shutdown().await.expect("shutdown a");
        b.shutdown().await.expect("shutdown b");
    }

    #[tokio::test]
    async fn drop_stops_server_and_removes_dirs() {
        let pg = TempPostgres::start().await.expect("start");
        let (root, port) = (pg.root.clone(), pg.port());
        drop(pg);
        assert!(!root.exists(), "{} not removed", root.display());
        assert!(TcpStream::connect(("127.0.0.1", port)).await.is_err());
    }

    #[tokio::test]
    async fn drop_after_stop_immediate_is_clean() {
        let pg = TempPostgres::start().await.expect("start");
        pg.stop_immediate().await.expect("stop_immediate");
        let root = pg.root.clone();
        drop(pg);
        assert!(!root.exists());
    }

    /// What happens when this process dies: the watchdog's pipe closes. Closing it by
    /// hand (dropping its stdin) must stop the server and remove the directory.
    #[tokio::test]
    async fn watchdog_cleans_up_when_its_pipe_closes() {
        let pg = TempPostgres::start().await.expect("start");
        let (root, port) = (pg.root.clone(), pg.port());
        let mut child = pg.watchdog.lock().unwrap().take().expect("a watchdog");
        drop(child.stdin.take());
        let status = tokio::task::spawn_blocking(move || child.wait())
            .await
            .unwrap()
            .unwrap();
        assert!(status.success(), "{status}");
        assert!(!root.exists(), "{} not removed", root.display());
        assert!(TcpStream::connect(("127.0.0.1", port)).await.is_err());
        // nothing left for Drop to do but notice
        pg.cleaned.store(true, Ordering::SeqCst);
        pg.running.store(false, Ordering::SeqCst);
    }

    #[test]
    fn sh_quote_escapes_single_quotes() {
        assert_eq!(sh_quote("a'b"), r"'a'\''b'");
    }
}
