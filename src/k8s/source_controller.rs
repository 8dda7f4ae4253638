//! The WebhookSource controller: a `WebhookSource` and its Secret become an inbound source
//! (`POST /in/{name}`) through the source rules (`inbound::sources`, the API's too), and
//! the outcome comes back as the object's status.
//!
//! - A finalizer (`hookd.dev/source`) deletes the source before the object goes away, so a
//!   deleted object's URL answers 401 like a name that never existed.
//! - A spec the rules refuse, a Secret that is missing or unusable, a tenant that is not
//!   the namespace's, or a name another namespace (or the API) holds: the last accepted
//!   source stays as it was (a provider keeps sending, and its events are not lost to a
//!   typo), and `Ready=False` says why.
//! - A new value in the Secret becomes the current secret; the previous one verifies for
//!   `secretRotationGraceSeconds` more, so the provider can be switched over.
//! - Secrets are watched metadata-only (their own watch) and mapped to the sources that
//!   reference them; the reconciler GETs the one Secret it needs.

use std::sync::Arc;

use chrono::Utc;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::PartialObjectMeta;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};

use super::conditions::{Refusal, condition, to_time};
use super::crd::{WebhookSource, WebhookSourceStatus};
use super::sync::{self, SecretProblem};
use super::{Context, Error, ObjectEvent};
use crate::db::sources::DeclaredWrite;
use crate::inbound::sources::{self, Declared, SourceError};

/// The finalizer that holds deletion until the source is deleted.
pub const FINALIZER: &str = "hookd.dev/source";
/// Label value in metrics and logs.
pub const CONTROLLER: &str = "webhooksource";

/// Entry point for the `Controller`: finalizer first, then apply or cleanup.
pub async fn reconcile(src: Arc<WebhookSource>, ctx: Arc<Context>) -> Result<Action, Error> {
    ctx.reconcile_finalized(
        CONTROLLER,
        FINALIZER,
        src,
        |s| {
            let ctx = &ctx;
            async move { apply(&s, ctx).await }
        },
        |s| {
            let ctx = &ctx;
            async move { cleanup(&s, ctx).await }
        },
    )
    .await
}

/// Retries with the same per-object backoff as the other controllers.
pub fn error_policy(src: Arc<WebhookSource>, err: &Error, ctx: Arc<Context>) -> Action {
    ctx.retry_after(
        CONTROLLER,
        &src.namespace().unwrap_or_default(),
        &src.name_any(),
        err,
    )
}

async fn apply(src: &WebhookSource, ctx: &Context) -> Result<Action, Error> {
    let ns = src.namespace().unwrap_or_default();
    let name = src.name_any();
    // a namespace's sources take events for its own tenant only, as its endpoints do
    let own_tenant = ctx.settings.namespace_tenants.tenant_of(&ns);
    let tenant = src
        .spec
        .tenant
        .clone()
        .unwrap_or_else(|| own_tenant.clone());
    let outcome = if tenant != own_tenant {
        Err(Refusal {
            reason: "TenantNotAllowed",
            message: format!(
                "spec.tenant {tenant:?} is not the tenant of namespace {ns:?} ({own_tenant:?}); an operator maps namespaces to tenants with HOOKD_AUTH_NAMESPACE_TENANTS"
            ),
        })
    } else {
        match read_secret(ctx, &ns, src).await? {
            Err(problem) => Err(Refusal {
                reason: problem.reason(),
                message: problem.to_string(),
            }),
            Ok(secret) => write(ctx, src, &ns, &name, &tenant, &secret).await?,
        }
    };
    let status = desired_status(src, &outcome, &to_time(Utc::now()));
    let was_ready = src
        .status
        .as_ref()
        .and_then(|s| super::conditions::find(&s.conditions, "Ready"))
        .map(|c| c.status == "True");
    if src.status.as_ref() != Some(&status) {
        ctx.apply_status(src, &status).await?;
    }
    match &outcome {
        Ok(DeclaredWrite::Created(id)) => {
            ctx.publish(
                src,
                ObjectEvent::normal(
                    "Created",
                    format!("source {id} takes requests at /in/{name}"),
                ),
            )
            .await
        }
        Ok(DeclaredWrite::Updated {
            secret_rotated: true,
            ..
        }) => {
            ctx.publish(
                src,
                ObjectEvent::normal(
                    "SecretRotated",
                    "the Secret's value is now the current secret; the previous one verifies for the grace period".into(),
                ),
            )
            .await
        }
        Err(r) if was_ready != Some(false) => {
            ctx.publish(src, ObjectEvent::warning(r.reason, r.message.clone()))
                .await
        }
        _ => {}
    }
    // A source has no figures to refresh from Postgres, and its Secret's changes come
    // through the Secret watch: a full pass only at resync, so idle sources cost the API
    // server a GET each per resync, not per status interval.
    Ok(Action::requeue(ctx.settings.resync))
}

/// Writes the declared source; a refusal of the rules or of the database is the object's
/// problem (its status), an outage is the controller's (retried).
async fn write(
    ctx: &Context,
    src: &WebhookSource,
    ns: &str,
    name: &str,
    tenant: &str,
    secret: &str,
) -> Result<Result<DeclaredWrite, Refusal>, Error> {
    let s = &src.spec;
    let declared = Declared {
        namespace: ns,
        name,
        tenant,
        consumer: s.consumer.as_deref(),
        provider: &s.provider,
        hmac: s.hmac.as_ref(),
        secret,
        event_type_prefix: s.event_type_prefix.as_deref(),
        max_body_bytes: s.max_body_bytes,
        description: s.description.as_deref(),
        secret_rotation_grace_seconds: s.secret_rotation_grace_seconds,
    };
    let written = async {
        let mut tx = crate::db::begin(&ctx.pool).await?;
        let written = sources::apply_declared(&mut tx, &ctx.keys, &declared).await?;
        tx.commit().await.map_err(crate::db::DbError::from)?;
        Ok::<_, SourceError>(written)
    };
    match written.await {
        Ok(DeclaredWrite::NameTaken) => Ok(Err(Refusal {
            reason: "NameTaken",
            message: format!(
                "another namespace's WebhookSource or a source made through the API already takes /in/{name}; source names are unique across the cluster"
            ),
        })),
        Ok(DeclaredWrite::TenantLimit) => Ok(Err(Refusal {
            reason: "TenantSourceLimit",
            message: format!(
                "tenant {tenant:?} has {} sources, the most one tenant may have",
                sources::MAX_SOURCES_PER_TENANT
            ),
        })),
        Ok(written) => Ok(Ok(written)),
        Err(SourceError::Invalid(problem)) => Ok(Err(Refusal {
            reason: "InvalidSpec",
            message: format!("spec: {problem}"),
        })),
        Err(SourceError::Db(e)) => Err(e.into()),
        Err(other) => Ok(Err(Refusal {
            reason: "InvalidSpec",
            message: other.to_string(),
        })),
    }
}

/// The object is being deleted: its source goes, and its URL answers 401 from then on.
async fn cleanup(src: &WebhookSource, ctx: &Context) -> Result<Action, Error> {
    let ns = src.namespace().unwrap_or_default();
    let mut conn = ctx.pool.acquire().await.map_err(crate::db::DbError::from)?;
    match sources::remove_declared(&mut conn, &ns, &src.name_any()).await {
        Ok(Some(id)) => {
            tracing::info!(source = %id, "WebhookSource deleted; source deleted");
            // best effort: a namespace being deleted refuses new Events
            ctx.publish(
                src,
                ObjectEvent::normal("Deleted", format!("source {id} deleted")),
            )
            .await;
        }
        Ok(None) => {}
        Err(SourceError::Db(e)) => return Err(e.into()),
        Err(other) => tracing::warn!(error = %other, "deleting a declared source"),
    }
    Ok(Action::await_change())
}

/// The text of the referenced Secret's key; a Secret the controller may not read is the
/// object's problem, reported in its status.
async fn read_secret(
    ctx: &Context,
    ns: &str,
    src: &WebhookSource,
) -> Result<Result<String, SecretProblem>, Error> {
    let r = &src.spec.secret_ref;
    Ok(ctx
        .get_secret(ns, &r.name)
        .await?
        .and_then(|s| sync::secret_text(ns, &r.name, &r.key, s.as_ref())))
}

/// Pure: the status for what the write did. An unchanged world gives an identical status
/// (conditions keep their transition time), so no write.
pub fn desired_status(
    src: &WebhookSource,
    outcome: &Result<DeclaredWrite, Refusal>,
    now: &Time,
) -> WebhookSourceStatus {
    let prev = src.status.clone().unwrap_or_default();
    let generation = src.metadata.generation;
    let ready = match outcome {
        Ok(_) => condition(
            &prev.conditions,
            "Ready",
            "True",
            "Ready",
            format!(
                "takes {} requests at /in/{}",
                src.spec.provider,
                src.name_any()
            ),
            generation,
            now,
        ),
        Err(r) => condition(
            &prev.conditions,
            "Ready",
            "False",
            r.reason,
            format!(
                "{} The last accepted configuration, if any, stays in force",
                r.message
            ),
            generation,
            now,
        ),
    };
    let source_id = match outcome {
        Ok(DeclaredWrite::Created(id)) | Ok(DeclaredWrite::Updated { id, .. }) => {
            Some(id.to_string())
        }
        _ => prev.source_id.clone(),
    };
    WebhookSourceStatus {
        observed_generation: generation,
        conditions: vec![ready],
        path: source_id
            .as_ref()
            .map(|_| format!("/in/{}", src.name_any())),
        source_id,
    }
}

/// The sources that reference a (metadata-only) Secret: a scan of the watched sources,
/// which are few (at most 100 per tenant).
pub fn sources_for(
    store: &Store<WebhookSource>,
    secret: &PartialObjectMeta<Secret>,
) -> Vec<ObjectRef<WebhookSource>> {
    let ns = secret.namespace().unwrap_or_default();
    let name = secret.name_any();
    store
        .state()
        .iter()
        .filter(|s| s.namespace().as_deref() == Some(ns.as_str()) && s.spec.secret_ref.name == name)
        .map(|s| ObjectRef::from_obj(s.as_ref()))
        .collect()
}
