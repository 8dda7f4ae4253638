//! `hookd token create|list|revoke`: its arguments and what it does.
//!
//! `create` prints the token alone on the last line of stdout, so that
//! `TOKEN=$(hookd token create …)` captures exactly the token; everything else goes to
//! stderr. No other command, log line or error ever shows a token.

use chrono::{DateTime, SecondsFormat, Utc};

use crate::auth::tokens::{self, TokenRequest};
use clap::{Args, Subcommand};

use crate::config::DbArgs;
use crate::db;
use crate::domain::Scope;
use crate::runtime;

pub async fn run(cmd: TokenCommand) -> anyhow::Result<()> {
    match cmd {
        TokenCommand::Create(args) => {
            let pool = runtime::open_checked(&args.db).await?;
            let req = TokenRequest {
                tenant: args.tenant,
                consumer: args.consumer,
                scopes: args.scopes,
                name: args.name,
                expires_at: args.expires_at,
            };
            let created = tokens::create(&pool, &req).await?;
            let scopes: Vec<&str> = req.scopes.iter().map(|s| s.as_str()).collect();
            eprintln!(
                "token {} ({}…) created for tenant {}{} with scope(s) {}{}; it is shown once, store it now",
                created.id,
                created.prefix,
                req.tenant,
                req.consumer
                    .as_deref()
                    .map(|c| format!(", consumer {c}"))
                    .unwrap_or_default(),
                scopes.join(","),
                req.expires_at
                    .map(|at| format!(", expiring {}", fmt_time(at)))
                    .unwrap_or_default(),
            );
            println!("{}", created.token);
            Ok(())
        }
        TokenCommand::List(args) => {
            let pool = runtime::open_checked(&args.db).await?;
            let rows = db::tokens::list(&pool, args.tenant.as_deref()).await?;
            let now = Utc::now();
            let mut table = vec![[
                "ID".to_string(),
                "PREFIX".into(),
                "TENANT".into(),
                "SCOPES".into(),
                "NAME".into(),
                "CREATED".into(),
                "EXPIRES".into(),
                "STATUS".into(),
            ]];
            for t in rows {
                let status = match (t.revoked_at, t.expires_at) {
                    (Some(at), _) => format!("revoked {}", fmt_time(at)),
                    (None, Some(at)) if at <= now => "expired".to_string(),
                    _ => "active".to_string(),
                };
                table.push([
                    t.id.to_string(),
                    format!("{}…", t.prefix),
                    match &t.consumer {
                        Some(c) => format!("{}/{c}", t.tenant),
                        None => t.tenant,
                    },
                    t.scopes.join(","),
                    t.name.unwrap_or_else(|| "-".into()),
                    fmt_time(t.created_at),
                    t.expires_at.map(fmt_time).unwrap_or_else(|| "-".into()),
                    status,
                ]);
            }
            print!("{}", render(&table));
            Ok(())
        }
        TokenCommand::Revoke(args) => {
            let pool = runtime::open_checked(&args.db).await?;
            match db::tokens::revoke(&pool, args.id).await? {
                db::tokens::Revoked::Now => println!(
                    "token {} revoked; the API refuses it within {} s",
                    args.id,
                    tokens::CACHE_TTL.as_secs()
                ),
                db::tokens::Revoked::Already(at) => {
                    println!("token {} was already revoked at {}", args.id, fmt_time(at))
                }
                db::tokens::Revoked::NotFound => anyhow::bail!("no token with id {}", args.id),
            }
            Ok(())
        }
    }
}

fn fmt_time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// Left-aligned columns separated by two spaces.
fn render<const N: usize>(rows: &[[String; N]]) -> String {
    let mut widths = [0usize; N];
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let line: Vec<String> = row
            .iter()
            .zip(widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Create a token; it is printed once, alone on the last line of stdout
    Create(TokenCreateArgs),
    /// List tokens (never the tokens themselves: their id, prefix, tenant and scopes)
    List(TokenListArgs),
    /// Revoke a token by id; the API stops accepting it within 5 seconds
    Revoke(TokenRevokeArgs),
}

#[derive(Debug, Clone, Args)]
pub struct TokenCreateArgs {
    #[command(flatten)]
    pub db: DbArgs,
    /// Tenant the token acts for
    #[arg(long)]
    pub tenant: String,
    /// Confine the token to this consumer of the tenant: it sees and manages only that consumer's endpoints, messages and deliveries
    #[arg(long)]
    pub consumer: Option<String>,
    /// What the token may do (repeatable, or comma-separated): produce, read, operate, manage
    #[arg(long = "scope", required = true, value_delimiter = ',')]
    pub scopes: Vec<Scope>,
    /// A note for `hookd token list`, e.g. who holds it
    #[arg(long)]
    pub name: Option<String>,
    /// Expiry as an RFC 3339 time, e.g. 2027-01-01T00:00:00Z, or a date (its midnight UTC), e.g. 2027-01-01 (default: none)
    #[arg(long, value_name = "RFC3339", value_parser = crate::domain::parse_time_bound)]
    pub expires_at: Option<chrono::DateTime<chrono::Utc>>,
}

#[derive(Debug, Clone, Args)]
pub struct TokenListArgs {
    #[command(flatten)]
    pub db: DbArgs,
    /// Only this tenant's tokens
    #[arg(long)]
    pub tenant: Option<String>,
}

#[derive(Debug, Clone, Args)]
pub struct TokenRevokeArgs {
    #[command(flatten)]
    pub db: DbArgs,
    /// Id of the token (from `hookd token create` or `hookd token list`)
    pub id: uuid::Uuid,
}
