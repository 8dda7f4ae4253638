//! `hookd token create|list|revoke`.
//!
//! `create` prints the token alone on the last line of stdout, so that
//! `TOKEN=$(hookd token create …)` captures exactly the token; everything else goes to
//! stderr. No other command, log line or error ever shows a token.

use chrono::{DateTime, SecondsFormat, Utc};

use crate::auth::tokens::{self, TokenRequest};
use crate::config::TokenCommand;
use crate::db;
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
