//! The WebhookEventType controller: a `WebhookEventType` becomes an entry of its
//! namespace's tenant's event-type catalog through the catalog rules (`catalog`, the API's
//! too), and the outcome comes back as the object's status.
//!
//! - A finalizer (`hookd.dev/event-type`) removes the entry before the object goes away.
//! - A spec the rules refuse (a schema that does not compile, an example that does not
//!   match it, a reserved name) or a name the API (or another object) holds: the last
//!   accepted entry stays as it was, so producers validating against it are not stopped by a
//!   typo, and `Ready=False` says why.

use std::sync::Arc;

use chrono::Utc;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::runtime::controller::Action;

use super::conditions::{Refusal, condition, to_time};
use super::crd::{WebhookEventType, WebhookEventTypeStatus};
use super::{Context, Error, ObjectEvent};
use crate::catalog::{self, CatalogError};
use crate::db::event_types::DeclaredWrite;

/// The finalizer that holds deletion until the catalog entry is removed.
pub const FINALIZER: &str = "hookd.dev/event-type";
/// Label value in metrics and logs.
pub const CONTROLLER: &str = "webhookeventtype";

/// Entry point for the `Controller`: finalizer first, then apply or cleanup.
pub async fn reconcile(et: Arc<WebhookEventType>, ctx: Arc<Context>) -> Result<Action, Error> {
    ctx.reconcile_finalized(
        CONTROLLER,
        FINALIZER,
        et,
        |o| {
            let ctx = &ctx;
            async move { apply(&o, ctx).await }
        },
        |o| {
            let ctx = &ctx;
            async move { cleanup(&o, ctx).await }
        },
    )
    .await
}

/// Retries with the same per-object backoff as the other controllers.
pub fn error_policy(et: Arc<WebhookEventType>, err: &Error, ctx: Arc<Context>) -> Action {
    ctx.retry_after(
        CONTROLLER,
        &et.namespace().unwrap_or_default(),
        &et.name_any(),
        err,
    )
}

async fn apply(et: &WebhookEventType, ctx: &Context) -> Result<Action, Error> {
    let ns = et.namespace().unwrap_or_default();
    let tenant = ctx.settings.namespace_tenants.tenant_of(&ns);
    let name = et.event_type();
    let outcome = write(ctx, et, &ns, &tenant, &name).await?;
    let status = desired_status(et, &name, &outcome, &to_time(Utc::now()));
    let was_ready = et
        .status
        .as_ref()
        .and_then(|s| super::conditions::find(&s.conditions, "Ready"))
        .map(|c| c.status == "True");
    if et.status.as_ref() != Some(&status) {
        ctx.apply_status(et, &status).await?;
    }
    match &outcome {
        Ok(DeclaredWrite::Created) => {
            ctx.publish(
                et,
                ObjectEvent::normal(
                    "Created",
                    format!("event type {name} is in tenant {tenant}'s catalog"),
                ),
            )
            .await
        }
        Err(r) if was_ready != Some(false) => {
            ctx.publish(et, ObjectEvent::warning(r.reason, r.message.clone()))
                .await
        }
        _ => {}
    }
    // nothing to refresh from Postgres: a full pass only at resync
    Ok(Action::requeue(ctx.settings.resync))
}

/// Writes the declared entry; a refusal of the rules or of the database is the object's
/// problem (its status), an outage is the controller's (retried).
async fn write(
    ctx: &Context,
    et: &WebhookEventType,
    ns: &str,
    tenant: &str,
    name: &str,
) -> Result<Result<DeclaredWrite, Refusal>, Error> {
    let declared = et.declared(ns, tenant, name);
    let written = async {
        let mut tx = crate::db::begin(&ctx.pool).await?;
        let written = catalog::apply_declared(&mut tx, &declared).await?;
        tx.commit().await.map_err(crate::db::DbError::from)?;
        Ok::<_, CatalogError>(written)
    };
    Ok(match written.await {
        Ok(DeclaredWrite::NameTaken) => Err(Refusal {
            reason: "NameTaken",
            message: format!(
                "tenant {tenant:?} has event type {name:?} already, made through the API or declared by another WebhookEventType"
            ),
        }),
        Ok(DeclaredWrite::TenantLimit) => Err(Refusal {
            reason: "TenantEventTypeLimit",
            message: format!(
                "tenant {tenant:?} has {} event types, the most one tenant may have",
                catalog::MAX_EVENT_TYPES_PER_TENANT
            ),
        }),
        Ok(written) => Ok(written),
        Err(CatalogError::Db(e)) => return Err(e.into()),
        Err(CatalogError::InvalidSchema(problem)) => Err(Refusal {
            reason: "InvalidSchema",
            message: format!("spec.schema: {problem}"),
        }),
        Err(other) => Err(Refusal {
            reason: "InvalidSpec",
            message: format!("spec: {other}"),
        }),
    })
}

/// The object is being deleted: its entry leaves the catalog.
async fn cleanup(et: &WebhookEventType, ctx: &Context) -> Result<Action, Error> {
    let ns = et.namespace().unwrap_or_default();
    let mut conn = ctx.pool.acquire().await.map_err(crate::db::DbError::from)?;
    match catalog::remove_declared(&mut conn, &ns, &et.name_any()).await {
        Ok(Some((tenant, name))) => {
            tracing::info!(%tenant, event_type = %name, "WebhookEventType deleted; catalog entry removed");
            // best effort: a namespace being deleted refuses new Events
            ctx.publish(
                et,
                ObjectEvent::normal("Deleted", format!("event type {name} removed")),
            )
            .await;
        }
        Ok(None) => {}
        Err(CatalogError::Db(e)) => return Err(e.into()),
        Err(other) => tracing::warn!(error = %other, "removing a declared event type"),
    }
    Ok(Action::await_change())
}

/// Pure: the status for what the write did. An unchanged world gives an identical status
/// (conditions keep their transition time), so no write.
pub fn desired_status(
    et: &WebhookEventType,
    name: &str,
    outcome: &Result<DeclaredWrite, Refusal>,
    now: &Time,
) -> WebhookEventTypeStatus {
    let prev = et.status.clone().unwrap_or_default();
    let generation = et.metadata.generation;
    let ready = match outcome {
        Ok(_) => condition(
            &prev.conditions,
            "Ready",
            "True",
            "Ready",
            format!("event type {name} is in the catalog"),
            generation,
            now,
        ),
        Err(r) => condition(
            &prev.conditions,
            "Ready",
            "False",
            r.reason,
            format!(
                "{} The last accepted declaration, if any, stays in force",
                r.message
            ),
            generation,
            now,
        ),
    };
    WebhookEventTypeStatus {
        observed_generation: generation,
        conditions: vec![ready],
        event_type: match outcome {
            Ok(_) => Some(name.to_string()),
            Err(_) => prev.event_type,
        },
    }
}
