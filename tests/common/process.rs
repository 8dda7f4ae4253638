//! The `hookd` binary as a child process: one builder for every test that runs a
//! component (`api`, `dispatch`, `controller`, `dev`, `receiver`) or a one-shot command.
//!
//! A spawned process is killed (SIGKILL) when its handle drops, so a failed assertion
//! never leaves a component holding a port or the test database; everything it prints is
//! kept and shown when the test fails, so a crash of the child explains itself.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::PgPool;

use super::{TEST_ENCRYPTION_KEY, TEST_KEY_ENV, database_url, hookd_bin, wait_until};

/// Which of the child's streams [`HookdProcess::lines`] yields (both are always kept for
/// failure messages).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lines {
    Stdout,
    Stderr,
    Both,
}

/// `hookd ARGS…` to be run: environment, listen address, and what to read of its output.
pub struct HookdCommand {
    cmd: Command,
    base: Option<String>,
    lines: Lines,
}

impl HookdCommand {
    /// `hookd` with `args` (the subcommand first).
    pub fn new<S: AsRef<OsStr>>(args: impl IntoIterator<Item = S>) -> HookdCommand {
        let mut cmd = Command::new(hookd_bin());
        cmd.args(args);
        HookdCommand {
            cmd,
            base: None,
            lines: Lines::Both,
        }
    }

    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Self {
        self.cmd.arg(arg);
        self
    }

    pub fn args<S: AsRef<OsStr>>(mut self, args: impl IntoIterator<Item = S>) -> Self {
        self.cmd.args(args);
        self
    }

    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Self {
        self.cmd.env(key, value);
        self
    }

    pub fn envs<K: AsRef<OsStr>, V: AsRef<OsStr>>(
        mut self,
        vars: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        self.cmd.envs(vars);
        self
    }

    pub fn env_remove(mut self, key: impl AsRef<OsStr>) -> Self {
        self.cmd.env_remove(key);
        self
    }

    pub fn current_dir(mut self, dir: impl AsRef<Path>) -> Self {
        self.cmd.current_dir(dir);
        self
    }

    /// DATABASE_URL of the test database behind `pool`.
    pub fn database(self, pool: &PgPool) -> Self {
        self.env("DATABASE_URL", database_url(pool))
    }

    /// The kit's encryption key, so the child reads what in-process fixtures wrote.
    pub fn test_key(self) -> Self {
        self.env(TEST_KEY_ENV, TEST_ENCRYPTION_KEY)
    }

    /// HOOKD_LISTEN on 127.0.0.1:`port`; [`HookdProcess::base`] is then its URL.
    pub fn listen(mut self, port: u16) -> Self {
        self.base = Some(format!("http://127.0.0.1:{port}"));
        self.env("HOOKD_LISTEN", format!("127.0.0.1:{port}"))
    }

    /// The URL [`HookdProcess::wait_ready`] polls, for components told their address by
    /// a flag rather than HOOKD_LISTEN.
    pub fn base_url(mut self, base: impl Into<String>) -> Self {
        self.base = Some(base.into());
        self
    }

    /// Which stream [`HookdProcess::lines`] yields (default: both).
    pub fn lines(mut self, lines: Lines) -> Self {
        self.lines = lines;
        self
    }

    /// Starts it (stdin closed, stdout and stderr read by the kit).
    pub fn spawn(mut self) -> HookdProcess {
        let mut child = self
            .cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn hookd");
        let output = Arc::new(Mutex::new(String::new()));
        let (tx, lines) = mpsc::channel();
        let (done_tx, done) = mpsc::channel();
        let streams: [(Box<dyn Read + Send>, bool); 2] = [
            (
                Box::new(child.stdout.take().unwrap()),
                self.lines != Lines::Stderr,
            ),
            (
                Box::new(child.stderr.take().unwrap()),
                self.lines != Lines::Stdout,
            ),
        ];
        for (stream, forward) in streams {
            let (output, tx, done_tx) = (output.clone(), tx.clone(), done_tx.clone());
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    let mut all = output.lock().unwrap();
                    all.push_str(&line);
                    all.push('\n');
                    drop(all);
                    if forward {
                        let _ = tx.send(line);
                    }
                }
                let _ = done_tx.send(());
            });
        }
        HookdProcess {
            child,
            base: self.base,
            lines,
            output,
            readers_done: done,
            exited: None,
        }
    }

    /// Starts it and waits until `/readyz` answers 2xx (see [`HookdProcess::wait_ready`]).
    pub async fn start(self) -> HookdProcess {
        let mut p = self.spawn();
        p.wait_ready().await;
        p
    }

    /// Runs it to completion (a one-shot command), stdin closed.
    pub fn output(mut self) -> Output {
        self.cmd.output().expect("run hookd")
    }

    /// Runs it to completion without blocking the runtime; killed if it takes over 60 s.
    pub async fn run(self) -> Output {
        let mut cmd = tokio::process::Command::from(self.cmd);
        cmd.kill_on_drop(true);
        tokio::time::timeout(Duration::from_secs(60), cmd.output())
            .await
            .expect("hookd exits within 60 s")
            .expect("run hookd")
    }
}

/// A running `hookd`, SIGKILLed when dropped.
pub struct HookdProcess {
    child: Child,
    base: Option<String>,
    lines: mpsc::Receiver<String>,
    output: Arc<Mutex<String>>,
    readers_done: mpsc::Receiver<()>,
    exited: Option<ExitStatus>,
}

impl HookdProcess {
    /// `http://127.0.0.1:PORT` of [`HookdCommand::listen`] or [`HookdCommand::base_url`].
    pub fn base(&self) -> &str {
        self.base.as_deref().expect("no listen address was given")
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Lines as the child prints them (the stream chosen with [`HookdCommand::lines`]).
    pub fn lines(&self) -> &mpsc::Receiver<String> {
        &self.lines
    }

    /// Everything it printed so far, stdout and stderr.
    pub fn output(&self) -> String {
        self.output.lock().unwrap().clone()
    }

    /// Polls `/readyz` until it answers 2xx; panics with what the child printed if it
    /// exits first or is not ready within 30 s.
    pub async fn wait_ready(&mut self) {
        self.wait_healthy("/readyz").await;
    }

    /// [`Self::wait_ready`] on another path (the test receiver has only `/healthz`).
    pub async fn wait_healthy(&mut self, path: &str) {
        let url = format!("{}{path}", self.base());
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        let mut exited = None;
        let ready = wait_until(Duration::from_secs(30), || {
            if let Ok(Some(status)) = self.child.try_wait() {
                exited = Some(status);
            }
            let (client, url, exited) = (client.clone(), url.clone(), exited.is_some());
            async move {
                exited
                    || client
                        .get(url)
                        .send()
                        .await
                        .is_ok_and(|r| r.status().is_success())
            }
        })
        .await;
        if let Some(status) = exited {
            self.exited = Some(status);
            self.drain_readers();
            panic!(
                "hookd exited ({status}) before {url} was ready; it printed:\n{}",
                self.output()
            );
        }
        assert!(
            ready,
            "{url} not ready within 30 s; hookd printed:\n{}",
            self.output()
        );
    }

    /// Whether it has not exited yet.
    pub fn is_running(&mut self) -> bool {
        if self.exited.is_none()
            && let Some(status) = self.child.try_wait().unwrap()
        {
            self.exited = Some(status);
        }
        self.exited.is_none()
    }

    /// Sends `signal` (a name `kill` knows: TERM, INT, HUP, KILL…).
    pub fn signal(&self, signal: &str) {
        let sent = Command::new("kill")
            .args([&format!("-{signal}"), &self.pid().to_string()])
            .status()
            .unwrap();
        assert!(sent.success(), "kill -{signal} {}", self.pid());
    }

    /// SIGKILL, as a crash: no handler runs. Waits until it is gone.
    pub fn kill(&mut self) -> ExitStatus {
        self.start_kill();
        self.wait()
    }

    /// Sends SIGKILL without waiting (as tokio's `Child::start_kill`), for a test that
    /// looks at the world in the instant of the kill; [`Self::wait`] reaps it.
    pub fn start_kill(&mut self) {
        if self.exited.is_none() {
            let _ = self.child.kill();
        }
    }

    /// Waits for it to exit (after a signal, or for a command that ends by itself); its
    /// output is then complete.
    pub fn wait(&mut self) -> ExitStatus {
        let status = match self.exited {
            Some(s) => s,
            None => self.child.wait().unwrap(),
        };
        self.exited = Some(status);
        self.drain_readers();
        status
    }

    /// [`Self::wait`] for at most `timeout` without blocking the runtime; None if it
    /// still runs.
    pub async fn wait_timeout(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(status) = self.exited.or_else(|| self.child.try_wait().unwrap()) {
                self.exited = Some(status);
                self.drain_readers();
                return Some(status);
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Lets the readers take the last lines. Bounded: a grandchild (the Postgres of
    /// `hookd dev`) may hold the pipes open after the child is gone.
    fn drain_readers(&self) {
        for _ in 0..2 {
            if self
                .readers_done
                .recv_timeout(Duration::from_secs(2))
                .is_err()
            {
                break;
            }
        }
    }
}

impl Drop for HookdProcess {
    fn drop(&mut self) {
        if self.exited.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            eprintln!(
                "---- output of hookd (pid {}) ----\n{}",
                self.pid(),
                self.output()
            );
        }
    }
}
