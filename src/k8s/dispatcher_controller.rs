//! The WebhookDispatcher controller: each `WebhookDispatcher` owns one Deployment running
//! `hookd dispatch`, server-side-applied from a pure `desired_deployment`, with replicas
//! fixed by the spec or, with `autoscaling`, derived from the backlog in Postgres.
//!
//! No finalizer: the Deployment carries an owner reference, so Kubernetes' garbage
//! collector removes it with its WebhookDispatcher, and there is nothing in Postgres to
//! clean up (a stopped dispatcher's leases simply lapse).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStatus};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMapEnvSource, Container, ContainerPort, EmptyDirVolumeSource,
    EnvFromSource, EnvVar, EnvVarSource, HTTPGetAction, Pod, PodSecurityContext, PodSpec,
    PodTemplateSpec, Probe, ResourceRequirements, SeccompProfile, SecretKeySelector,
    SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};

use super::conditions::{condition, to_time};
use super::crd::{
    DISPATCHER_ENV_ALLOWED, WebhookDispatcher, WebhookDispatcherSpec, WebhookDispatcherStatus,
};
use super::{Context, Error, FIELD_MANAGER, ObjectEvent, Settings};
use crate::db;

pub const CONTROLLER: &str = "webhookdispatcher";
/// Label selecting every Deployment this controller manages (its owned-object watch).
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "hookd-controller");
/// Port of `hookd dispatch`'s health and metrics listener.
pub const METRICS_PORT: i32 = 8081;
/// The autoscaler scales up at once but down only after this long without a change, so
/// a backlog that drains in bursts does not make pods come and go.
pub const SCALE_DOWN_STABILIZATION: Duration = Duration::from_secs(120);

// `hookd dispatch`'s own defaults (one home: crate::config), as the spec's types hold them
const DEFAULT_CONCURRENCY: u32 = crate::config::DISPATCH_CONCURRENCY as u32;
const DEFAULT_LEASE_SECS: u32 = crate::config::DISPATCH_LEASE_SECS as u32;
const DEFAULT_REQUEST_TIMEOUT_SECS: u32 = crate::config::DISPATCH_REQUEST_TIMEOUT_SECS as u32;
pub const DEFAULT_SERVICE_ACCOUNT: &str = "hookd-dispatcher";
pub const DEFAULT_ENCRYPTION_SECRET: (&str, &str) = ("hookd-encryption", "key");
/// The key of the encryption Secret holding `HOOKD_ENCRYPTION_OLD_KEYS` during a rotation.
pub const OLD_KEYS_SECRET_KEY: &str = "old-keys";
/// uid/gid of the distroless image's `nonroot` user.
const NONROOT_UID: i64 = 65532;
/// The install's shared settings (`manifests/base/config.yaml`). Dispatcher pods load it
/// (optional: a pod starts without it) so that settings every dispatcher must share, such
/// as retention (HOOKD_RETENTION_DAYS, HOOKD_TENANT_RETENTION), are set in one place; the
/// container's own `env` wins over it.
pub const SHARED_CONFIG_MAP: &str = "hookd-config";
/// Pods read to say why dispatchers are not ready: enough to find a reason, bounded so a
/// large pool costs one small LIST.
const PODS_INSPECTED: u32 = 20;

/// The owned Deployment's name.
pub fn deployment_name(d: &WebhookDispatcher) -> String {
    format!("hookd-dispatcher-{}", d.name_any())
}

pub async fn reconcile(d: Arc<WebhookDispatcher>, ctx: Arc<Context>) -> Result<Action, Error> {
    let _timer = ctx.reconcile_timer(CONTROLLER);
    let result = apply(&d, &ctx).await;
    ctx.count_reconcile(CONTROLLER, result.is_ok());
    if result.is_ok() {
        ctx.reset_backoff(
            CONTROLLER,
            &d.namespace().unwrap_or_default(),
            &d.name_any(),
        );
    }
    result
}

/// Retries with per-object exponential backoff and jitter; refusals (403, 422) wait much
/// longer than outages.
pub fn error_policy(d: Arc<WebhookDispatcher>, err: &Error, ctx: Arc<Context>) -> Action {
    ctx.retry_after(
        CONTROLLER,
        &d.namespace().unwrap_or_default(),
        &d.name_any(),
        err,
    )
}

async fn apply(d: &WebhookDispatcher, ctx: &Context) -> Result<Action, Error> {
    let ns = d
        .namespace()
        .ok_or_else(|| Error::NoNamespace(d.name_any()))?;
    // Being deleted (foreground deletion, as Argo CD prunes): the garbage collector is
    // removing the owned Deployment; applying it again would recreate it and hold the
    // deletion up.
    if d.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    if let Err(reason) = check_privileges(&d.spec, &ctx.settings) {
        return refuse(d, ctx, &ns, &reason).await;
    }
    // Every pod can hold `concurrency` deliveries, so counting further than the most the
    // autoscaler could ask for tells it nothing.
    let cap = d
        .spec
        .autoscaling
        .as_ref()
        .map_or(1_000_000, |a| {
            i64::from(a.max_replicas).saturating_mul(a.target_backlog_per_replica)
        })
        .max(1);
    let backlog = match db::deliveries::dispatch_backlog(&ctx.pool, cap).await {
        Ok(b) => Some(b),
        Err(e) => {
            tracing::warn!(error = %e, "could not sample the backlog; keeping the current replicas");
            None
        }
    };
    let now = Utc::now();
    let scale = desired_replicas(&d.spec, d.status.as_ref(), backlog, now);
    let deployment = desired_deployment(d, &ctx.settings.image, scale.replicas);
    let applied = match Api::<Deployment>::namespaced(ctx.client.clone(), &ns)
        .patch(
            &deployment_name(d),
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&deployment),
        )
        .await
    {
        Ok(a) => a,
        Err(e) => {
            let err = Error::Kube(e);
            // Refused for good (403, 422): retrying will not fix it, so say so on the
            // object; error_policy retries with a long backoff in case RBAC or an
            // admission policy changes.
            if err.is_permanent() {
                let status = ready_false(
                    d,
                    "ApplyRejected",
                    &format!("the Deployment was refused: {err}"),
                );
                if d.status.as_ref() != Some(&status)
                    && let Err(pe) = ctx.apply_status(d, &status).await
                {
                    tracing::debug!(error = %pe, "could not report ApplyRejected");
                }
            }
            return Err(err);
        }
    };
    let ready = applied
        .status
        .as_ref()
        .and_then(|s| s.ready_replicas)
        .unwrap_or(0);
    // Why pods are missing is only looked for while some are.
    let problem = if ready < scale.replicas {
        let pods = dispatcher_pods(d, ctx, &ns).await;
        not_ready_reason(applied.status.as_ref(), &pods)
    } else {
        None
    };
    let status = desired_status(d, &scale, ready, problem.as_ref(), backlog, &to_time(now));
    let previous = d.status.as_ref().and_then(|s| s.replicas);
    if d.status.as_ref() != Some(&status) {
        ctx.apply_status(d, &status).await?;
    }
    if let Some(prev) = previous
        && prev != scale.replicas
    {
        ctx.publish(
            d,
            ObjectEvent::normal(
                if scale.replicas > prev {
                    "ScaledUp"
                } else {
                    "ScaledDown"
                },
                format!(
                    "replicas {prev} -> {} (backlog {})",
                    scale.replicas,
                    backlog.map_or("unknown".into(), |b| b.to_string())
                ),
            ),
        )
        .await;
    }
    // Autoscaling samples the backlog often, and pods that are not ready are looked at
    // again soon (their own changes bring no watch event here); otherwise a resync now and
    // then is enough (the owned-Deployment watch brings every rollout change in between).
    Ok(Action::requeue(
        if d.spec.autoscaling.is_some() || ready < scale.replicas {
            ctx.settings.status_interval
        } else {
            ctx.settings.resync
        },
    ))
}

/// The pods of this dispatcher, best effort: without them the status still says how many
/// are ready, only not why the others are not.
async fn dispatcher_pods(d: &WebhookDispatcher, ctx: &Context, ns: &str) -> Vec<Pod> {
    let selector = selector_labels(d)
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    match Api::<Pod>::namespaced(ctx.client.clone(), ns)
        .list(
            &ListParams::default()
                .labels(&selector)
                .limit(PODS_INSPECTED),
        )
        .await
    {
        Ok(list) => list.items,
        Err(e) => {
            tracing::debug!(error = %e, "could not list dispatcher pods");
            Vec::new()
        }
    }
}

/// Why some dispatcher pods are not ready.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotReadyReason {
    /// CamelCase, as Kubernetes spells it: FailedCreate, CreateContainerConfigError, ...
    pub reason: String,
    pub message: String,
}

/// Waiting reasons of a container that will not start by itself.
const CONTAINER_PROBLEMS: &[&str] = &[
    "CreateContainerConfigError",
    "CreateContainerError",
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
    "CrashLoopBackOff",
    "RunContainerError",
];

/// Pure: why dispatcher pods are not ready, from the owned Deployment's status and its
/// pods. In order: pods that cannot be created at all (the Deployment's `ReplicaFailure`,
/// which the deployment controller copies from the ReplicaSet's: refused by Pod Security
/// admission, over a ResourceQuota, a missing ServiceAccount), containers that cannot
/// start (a missing Secret or key, an image that cannot be pulled, a crash loop), pods no
/// node can take, then a rollout past its progress deadline. None: nothing is known to be
/// wrong (pods are starting, or not scheduled yet).
pub fn not_ready_reason(
    deployment: Option<&DeploymentStatus>,
    pods: &[Pod],
) -> Option<NotReadyReason> {
    let conditions = deployment
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or(&[]);
    if let Some(c) = conditions
        .iter()
        .find(|c| c.type_ == "ReplicaFailure" && c.status == "True")
    {
        return Some(NotReadyReason {
            reason: c.reason.clone().unwrap_or_else(|| "ReplicaFailure".into()),
            message: c.message.clone().unwrap_or_default(),
        });
    }
    let mut pods: Vec<&Pod> = pods.iter().collect();
    // the same pod first on every pass, so an unchanged world writes an unchanged status
    pods.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    for pod in &pods {
        let Some(status) = &pod.status else { continue };
        for c in status
            .init_container_statuses
            .iter()
            .flatten()
            .chain(status.container_statuses.iter().flatten())
        {
            if let Some(w) = c.state.as_ref().and_then(|s| s.waiting.as_ref())
                && let Some(reason) = w.reason.as_deref()
                && CONTAINER_PROBLEMS.contains(&reason)
            {
                return Some(NotReadyReason {
                    reason: reason.into(),
                    message: format!(
                        "pod {}: container {}: {}",
                        pod.metadata.name.as_deref().unwrap_or_default(),
                        c.name,
                        w.message.as_deref().unwrap_or(reason)
                    ),
                });
            }
        }
    }
    for pod in &pods {
        if let Some(c) = pod.status.as_ref().and_then(|s| {
            s.conditions.iter().flatten().find(|c| {
                c.type_ == "PodScheduled"
                    && c.status == "False"
                    && c.reason.as_deref() == Some("Unschedulable")
            })
        }) {
            return Some(NotReadyReason {
                reason: "Unschedulable".into(),
                message: format!(
                    "pod {}: {}",
                    pod.metadata.name.as_deref().unwrap_or_default(),
                    c.message.as_deref().unwrap_or("no node can take it")
                ),
            });
        }
    }
    conditions
        .iter()
        .find(|c| {
            c.type_ == "Progressing"
                && c.status == "False"
                && c.reason.as_deref() == Some("ProgressDeadlineExceeded")
        })
        .map(|c| NotReadyReason {
            reason: "ProgressDeadlineExceeded".into(),
            message: c.message.clone().unwrap_or_default(),
        })
}

/// The spec asks for something beyond what the operator allows: nothing is applied (a
/// Deployment already running keeps its last accepted spec), the status and a Warning
/// say why, and only a change of the object brings it back.
async fn refuse(
    d: &WebhookDispatcher,
    ctx: &Context,
    _ns: &str,
    reason: &str,
) -> Result<Action, Error> {
    let status = ready_false(d, "NotAllowed", reason);
    let was_refused = d
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.reason == "NotAllowed");
    if d.status.as_ref() != Some(&status) {
        ctx.apply_status(d, &status).await?;
    }
    if !was_refused {
        ctx.publish(d, ObjectEvent::warning("NotAllowed", reason.to_string()))
            .await;
    }
    Ok(Action::await_change())
}

/// Pure: the previous status with `Ready=False` for `reason`.
fn ready_false(d: &WebhookDispatcher, reason: &str, message: &str) -> WebhookDispatcherStatus {
    let mut status = d.status.clone().unwrap_or_default();
    let now = to_time(Utc::now());
    let ready = condition(
        &status.conditions,
        "Ready",
        "False",
        reason,
        message,
        d.metadata.generation,
        &now,
    );
    status.conditions.retain(|c| c.type_ != "Ready");
    status.conditions.insert(0, ready);
    status.observed_generation = d.metadata.generation;
    status
}

/// Pure: whether a spec stays inside the privilege boundary. Whoever may create a
/// WebhookDispatcher in the install namespace gets pods that can read the encryption key
/// and the database, so the image and service account come from operator allow-lists and
/// `env` only tunes `hookd dispatch` (the CRD's CEL rule says the same at admission; this
/// also covers objects stored before that rule existed).
pub fn check_privileges(spec: &WebhookDispatcherSpec, settings: &Settings) -> Result<(), String> {
    if let Some(image) = &spec.image
        && *image != settings.image
        && !settings.dispatcher_images.iter().any(|i| i == image)
    {
        return Err(format!(
            "image {image:?} is not allowed: the controller runs dispatchers from its own image ({:?}) or one listed in HOOKD_DISPATCHER_IMAGES",
            settings.image
        ));
    }
    if let Some(sa) = &spec.service_account_name
        && sa != DEFAULT_SERVICE_ACCOUNT
        && !settings.dispatcher_service_accounts.iter().any(|s| s == sa)
    {
        return Err(format!(
            "serviceAccountName {sa:?} is not allowed: use {DEFAULT_SERVICE_ACCOUNT:?} or one listed in HOOKD_DISPATCHER_SERVICE_ACCOUNTS"
        ));
    }
    if let Some(class) = &spec.priority_class_name
        && class.starts_with("system-")
    {
        return Err(format!(
            "priorityClassName {class:?} is not allowed: the system- classes are for the cluster's own components; create a PriorityClass for dispatchers"
        ));
    }
    for e in &spec.env {
        if e.value_from.is_some() {
            return Err(format!(
                "env {}: valueFrom is not allowed (it could read any Secret of the namespace); give a plain value",
                e.name
            ));
        }
        if !DISPATCHER_ENV_ALLOWED.contains(&e.name.as_str()) {
            return Err(format!(
                "env {} is not a hookd dispatch tuning setting; allowed: {}",
                e.name,
                DISPATCHER_ENV_ALLOWED.join(", ")
            ));
        }
    }
    Ok(())
}

/// The autoscaler's decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scale {
    pub replicas: i32,
    pub last_scale_time: Option<Time>,
}

/// Pure: replicas for the spec and the sampled backlog. Without autoscaling, the spec's
/// `replicas` (default 1). With it, `ceil(backlog / target)` within [min, max]: up at
/// once, down only after `SCALE_DOWN_STABILIZATION` since the last change; an unknown
/// backlog (database unreachable) keeps the current count.
pub fn desired_replicas(
    spec: &WebhookDispatcherSpec,
    status: Option<&WebhookDispatcherStatus>,
    backlog: Option<i64>,
    now: DateTime<Utc>,
) -> Scale {
    let Some(a) = &spec.autoscaling else {
        return Scale {
            replicas: spec.replicas.unwrap_or(1),
            last_scale_time: None,
        };
    };
    let last = status.and_then(|s| s.last_scale_time.clone());
    let current = status
        .and_then(|s| s.replicas)
        .map(|r| r.clamp(a.min_replicas, a.max_replicas));
    let Some(backlog) = backlog else {
        return Scale {
            replicas: current.unwrap_or(a.min_replicas),
            last_scale_time: last,
        };
    };
    let target = a.target_backlog_per_replica.max(1);
    let wanted = backlog.max(0).saturating_add(target - 1) / target;
    let wanted = i32::try_from(wanted)
        .unwrap_or(i32::MAX)
        .clamp(a.min_replicas, a.max_replicas);
    let changed = |replicas| Scale {
        replicas,
        last_scale_time: Some(to_time(now)),
    };
    match current {
        None => changed(wanted),
        Some(c) if wanted > c => changed(wanted),
        Some(c) if wanted < c => {
            let quiet = last.as_ref().is_none_or(|t| {
                t.0.as_second() + SCALE_DOWN_STABILIZATION.as_secs() as i64 <= now.timestamp()
            });
            if quiet {
                changed(wanted)
            } else {
                Scale {
                    replicas: c,
                    last_scale_time: last,
                }
            }
        }
        Some(c) => Scale {
            replicas: c,
            last_scale_time: last,
        },
    }
}

/// Pure: the status for the applied Deployment and the sampled backlog.
pub fn desired_status(
    d: &WebhookDispatcher,
    scale: &Scale,
    ready_replicas: i32,
    problem: Option<&NotReadyReason>,
    backlog: Option<i64>,
    now: &Time,
) -> WebhookDispatcherStatus {
    let prev = d
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or(&[]);
    let generation = d.metadata.generation;
    let ready = if ready_replicas >= scale.replicas {
        condition(
            prev,
            "Ready",
            "True",
            if scale.replicas == 0 {
                "ScaledToZero"
            } else {
                "Available"
            },
            format!("{ready_replicas}/{} dispatcher pods ready", scale.replicas),
            generation,
            now,
        )
    } else {
        let counted = format!("{ready_replicas}/{} dispatcher pods ready", scale.replicas);
        match problem {
            Some(p) => condition(
                prev,
                "Ready",
                "False",
                &p.reason,
                format!("{counted}: {}", p.message),
                generation,
                now,
            ),
            None => condition(
                prev,
                "Ready",
                "False",
                "Progressing",
                counted,
                generation,
                now,
            ),
        }
    };
    let mut conditions = vec![ready];
    if let Some(a) = &d.spec.autoscaling {
        conditions.push(match backlog {
            Some(_) => condition(
                prev,
                "BacklogKnown",
                "True",
                "Sampled",
                format!(
                    "replicas follow the backlog: one pod per {} due deliveries, between {} and {}",
                    a.target_backlog_per_replica, a.min_replicas, a.max_replicas
                ),
                generation,
                now,
            ),
            None => condition(
                prev,
                "BacklogKnown",
                "False",
                "DatabaseUnavailable",
                "the backlog could not be read; replicas are kept as they are",
                generation,
                now,
            ),
        });
    }
    WebhookDispatcherStatus {
        observed_generation: generation,
        conditions,
        deployment: Some(deployment_name(d)),
        replicas: Some(scale.replicas),
        ready_replicas: Some(ready_replicas),
        backlog: backlog.or_else(|| d.status.as_ref().and_then(|s| s.backlog)),
        last_scale_time: scale.last_scale_time.clone(),
    }
}

fn labels(d: &WebhookDispatcher) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".into(), "hookd".into()),
        ("app.kubernetes.io/component".into(), "dispatcher".into()),
        ("app.kubernetes.io/instance".into(), d.name_any()),
        ("app.kubernetes.io/part-of".into(), "hookd".into()),
        (MANAGED_BY.0.into(), MANAGED_BY.1.into()),
    ])
}

/// The labels of `labels` that select the Deployment's pods: fixed for the object's life
/// (a Deployment's selector cannot change).
fn selector_labels(d: &WebhookDispatcher) -> BTreeMap<String, String> {
    labels(d)
        .into_iter()
        .filter(|(k, _)| {
            k.as_str() == "app.kubernetes.io/component"
                || k.as_str() == "app.kubernetes.io/instance"
                || k.as_str() == "app.kubernetes.io/name"
        })
        .collect()
}

fn secret_env(name: &str, secret: &str, key: &str) -> EnvVar {
    secret_env_optional(name, secret, key, false)
}

fn secret_env_optional(name: &str, secret: &str, key: &str, optional: bool) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: secret.into(),
                key: key.into(),
                optional: Some(optional),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn value_env(name: &str, value: impl ToString) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.to_string()),
        ..Default::default()
    }
}

/// The container's environment: hookd's settings from the spec, then the spec's own
/// `env`, which replaces a same-named variable rather than duplicating it (server-side
/// apply refuses duplicate names in a list keyed by name).
fn environment(spec: &WebhookDispatcherSpec) -> Vec<EnvVar> {
    let timeout = spec
        .request_timeout_seconds
        .unwrap_or(DEFAULT_REQUEST_TIMEOUT_SECS);
    let (enc_name, enc_key) = spec.encryption_key_secret_ref.as_ref().map_or(
        (DEFAULT_ENCRYPTION_SECRET.0, DEFAULT_ENCRYPTION_SECRET.1),
        |r| (r.name.as_str(), r.key.as_str()),
    );
    let mut env = vec![
        secret_env(
            "DATABASE_URL",
            &spec.database_secret_ref.name,
            &spec.database_secret_ref.key,
        ),
        secret_env("HOOKD_ENCRYPTION_KEY", enc_name, enc_key),
        // Present only during a key rotation (see `hookd rekey`): dispatchers must still
        // decrypt rows sealed under the old keys until rekey has finished.
        secret_env_optional(
            "HOOKD_ENCRYPTION_OLD_KEYS",
            enc_name,
            OLD_KEYS_SECRET_KEY,
            true,
        ),
        value_env("HOOKD_LISTEN", format!("0.0.0.0:{METRICS_PORT}")),
        value_env(
            "HOOKD_CONCURRENCY",
            spec.concurrency.unwrap_or(DEFAULT_CONCURRENCY),
        ),
        value_env(
            "HOOKD_LEASE_SECS",
            spec.lease_seconds.unwrap_or(DEFAULT_LEASE_SECS),
        ),
        value_env("HOOKD_REQUEST_TIMEOUT_SECS", timeout),
        // in-flight deliveries may take a whole request timeout to finish on SIGTERM
        value_env("HOOKD_SHUTDOWN_GRACE_SECS", timeout + 5),
        value_env("HOOKD_LOG_FORMAT", "json"),
    ];
    if let Some(c) = spec.endpoint_concurrency {
        env.push(value_env("HOOKD_ENDPOINT_CONCURRENCY", c));
    }
    if !spec.allowed_destinations.is_empty() {
        env.push(value_env(
            "HOOKD_ALLOWED_DESTINATIONS",
            spec.allowed_destinations.join(","),
        ));
    }
    for extra in &spec.env {
        match env.iter_mut().find(|e| e.name == extra.name) {
            Some(slot) => *slot = extra.clone(),
            None => env.push(extra.clone()),
        }
    }
    env
}

fn http_probe(path: &str, period: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::String("http".into()),
            ..Default::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(3),
        ..Default::default()
    }
}

/// Pure: the Deployment a WebhookDispatcher asks for, ready for server-side apply.
pub fn desired_deployment(d: &WebhookDispatcher, default_image: &str, replicas: i32) -> Deployment {
    let spec = &d.spec;
    let labels = labels(d);
    let selector = selector_labels(d);
    let timeout = i64::from(
        spec.request_timeout_seconds
            .unwrap_or(DEFAULT_REQUEST_TIMEOUT_SECS),
    );
    let resources = spec
        .resources
        .clone()
        .unwrap_or_else(|| ResourceRequirements {
            requests: Some(BTreeMap::from([
                ("cpu".into(), Quantity("100m".into())),
                ("memory".into(), Quantity("64Mi".into())),
            ])),
            // a CPU limit too, so a pool that spins (a tight retry loop, a TLS storm)
            // cannot starve its node's other tenants
            limits: Some(BTreeMap::from([
                ("cpu".into(), Quantity("1".into())),
                ("memory".into(), Quantity("512Mi".into())),
            ])),
            ..Default::default()
        });
    let container = Container {
        name: "dispatcher".into(),
        image: Some(spec.image.clone().unwrap_or_else(|| default_image.into())),
        image_pull_policy: Some(
            spec.image_pull_policy
                .clone()
                .unwrap_or_else(|| "IfNotPresent".into()),
        ),
        args: Some(vec!["dispatch".into()]),
        env_from: Some(vec![EnvFromSource {
            config_map_ref: Some(ConfigMapEnvSource {
                name: SHARED_CONFIG_MAP.into(),
                optional: Some(true),
            }),
            ..Default::default()
        }]),
        env: Some(environment(spec)),
        ports: Some(vec![ContainerPort {
            name: Some("http".into()),
            container_port: METRICS_PORT,
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        liveness_probe: Some(http_probe("/healthz", 10)),
        readiness_probe: Some(http_probe("/readyz", 5)),
        resources: Some(resources),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            run_as_non_root: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                ..Default::default()
            }),
            ..Default::default()
        }),
        volume_mounts: Some(vec![VolumeMount {
            name: "tmp".into(),
            mount_path: "/tmp".into(),
            ..Default::default()
        }]),
        ..Default::default()
    };
    Deployment {
        metadata: ObjectMeta {
            name: Some(deployment_name(d)),
            namespace: d.namespace(),
            labels: Some(labels.clone()),
            owner_references: d.controller_owner_ref(&()).map(|o| vec![o]),
            ..Default::default()
        },
        spec: Some(DeploymentSpec {
            replicas: Some(replicas),
            selector: LabelSelector {
                match_labels: Some(selector),
                ..Default::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    annotations: Some(BTreeMap::from([
                        ("prometheus.io/scrape".into(), "true".into()),
                        ("prometheus.io/port".into(), METRICS_PORT.to_string()),
                        ("prometheus.io/path".into(), "/metrics".into()),
                    ])),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    service_account_name: Some(
                        spec.service_account_name
                            .clone()
                            .unwrap_or_else(|| DEFAULT_SERVICE_ACCOUNT.into()),
                    ),
                    // dispatchers talk to Postgres and receivers, never to the API server
                    automount_service_account_token: Some(false),
                    // SIGTERM drains in-flight deliveries for up to timeout + 5 s; leave room
                    termination_grace_period_seconds: Some(timeout + 15),
                    security_context: Some(PodSecurityContext {
                        run_as_non_root: Some(true),
                        // distroless `nonroot`; numeric so the kubelet can check runAsNonRoot
                        run_as_user: Some(NONROOT_UID),
                        run_as_group: Some(NONROOT_UID),
                        seccomp_profile: Some(SeccompProfile {
                            type_: "RuntimeDefault".into(),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    containers: vec![container],
                    image_pull_secrets: (!spec.image_pull_secrets.is_empty())
                        .then(|| spec.image_pull_secrets.clone()),
                    node_selector: (!spec.node_selector.is_empty())
                        .then(|| spec.node_selector.clone()),
                    tolerations: (!spec.tolerations.is_empty()).then(|| spec.tolerations.clone()),
                    affinity: spec.affinity.clone(),
                    priority_class_name: spec.priority_class_name.clone(),
                    volumes: Some(vec![Volume {
                        name: "tmp".into(),
                        empty_dir: Some(EmptyDirVolumeSource::default()),
                        ..Default::default()
                    }]),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::k8s::crd::DispatcherAutoscaling;
    use k8s_openapi::jiff::Timestamp;

    fn dispatcher(spec: serde_json::Value) -> WebhookDispatcher {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "hookd.dev/v1alpha1", "kind": "WebhookDispatcher",
            "metadata": {"name": "default", "namespace": "hookd-system", "uid": "u-1", "generation": 2},
            "spec": spec,
        }))
        .unwrap()
    }

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(secs, 0).unwrap()
    }

    #[test]
    fn deployment_runs_dispatch_with_the_spec() {
        let d = dispatcher(serde_json::json!({
            "replicas": 3, "concurrency": 100, "requestTimeoutSeconds": 20, "leaseSeconds": 90,
            "databaseSecretRef": {"name": "db"},
            "allowedDestinations": ["10.244.0.0/16", "10.96.0.0/12"],
            "env": [{"name": "HOOKD_RETRY_SCHEDULE", "value": "1,2"},
                    {"name": "HOOKD_CONCURRENCY", "value": "7"}],
        }));
        let dep = desired_deployment(&d, "hookd:test", 3);
        assert_eq!(
            dep.metadata.name.as_deref(),
            Some("hookd-dispatcher-default")
        );
        assert_eq!(dep.metadata.namespace.as_deref(), Some("hookd-system"));
        let owner = &dep.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
            ("WebhookDispatcher", "u-1", Some(true))
        );
        let spec = dep.spec.as_ref().unwrap();
        assert_eq!(spec.replicas, Some(3));
        let pod = spec.template.spec.as_ref().unwrap();
        assert_eq!(
            pod.termination_grace_period_seconds,
            Some(35),
            "longer than the request timeout"
        );
        assert_eq!(pod.automount_service_account_token, Some(false));
        assert_eq!(
            pod.service_account_name.as_deref(),
            Some("hookd-dispatcher")
        );
        let c = &pod.containers[0];
        assert_eq!(c.image.as_deref(), Some("hookd:test"));
        assert_eq!(c.args.as_deref(), Some(&["dispatch".to_string()][..]));
        let env: BTreeMap<_, _> = c
            .env
            .as_ref()
            .unwrap()
            .iter()
            .map(|e| (e.name.as_str(), e))
            .collect();
        assert_eq!(
            env.len(),
            c.env.as_ref().unwrap().len(),
            "no duplicate names"
        );
        let secret_ref = |n: &str| {
            env[n]
                .value_from
                .as_ref()
                .and_then(|v| v.secret_key_ref.clone())
                .unwrap_or_else(|| panic!("{n} comes from a Secret"))
        };
        let db = secret_ref("DATABASE_URL");
        assert_eq!((db.name.as_str(), db.key.as_str()), ("db", "url"));
        let key = secret_ref("HOOKD_ENCRYPTION_KEY");
        assert_eq!(
            (key.name.as_str(), key.key.as_str()),
            ("hookd-encryption", "key")
        );
        // old keys come from the same Secret, and their absence must not block the pod
        let old = secret_ref("HOOKD_ENCRYPTION_OLD_KEYS");
        assert_eq!(
            (old.name.as_str(), old.key.as_str(), old.optional),
            ("hookd-encryption", "old-keys", Some(true))
        );
        assert_eq!(key.optional, Some(false));
        let v = |n: &str| env[n].value.as_deref();
        assert_eq!(v("HOOKD_CONCURRENCY"), Some("7"), "the spec's env wins");
        assert_eq!(v("HOOKD_LEASE_SECS"), Some("90"));
        assert_eq!(v("HOOKD_REQUEST_TIMEOUT_SECS"), Some("20"));
        assert_eq!(v("HOOKD_SHUTDOWN_GRACE_SECS"), Some("25"));
        assert_eq!(
            v("HOOKD_ALLOWED_DESTINATIONS"),
            Some("10.244.0.0/16,10.96.0.0/12")
        );
        assert_eq!(v("HOOKD_RETRY_SCHEDULE"), Some("1,2"));
        assert_eq!(v("HOOKD_LISTEN"), Some("0.0.0.0:8081"));
        for probe in [&c.liveness_probe, &c.readiness_probe] {
            let get = probe.as_ref().unwrap().http_get.as_ref().unwrap();
            assert_eq!(get.port, IntOrString::String("http".into()));
        }
        let sc = c.security_context.as_ref().unwrap();
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        let pod_sc = pod.security_context.as_ref().unwrap();
        assert_eq!(
            (pod_sc.run_as_non_root, pod_sc.run_as_user),
            (Some(true), Some(65532))
        );
        // the selector is a subset of the pod labels, and stable across spec changes
        let sel = spec.selector.match_labels.as_ref().unwrap();
        let pod_labels = spec
            .template
            .metadata
            .as_ref()
            .unwrap()
            .labels
            .as_ref()
            .unwrap();
        assert!(sel.iter().all(|(k, v)| pod_labels.get(k) == Some(v)));
        // serializes for server-side apply: apiVersion/kind present, no nulls
        let json = serde_json::to_value(&dep).unwrap();
        assert_eq!(json["apiVersion"], "apps/v1");
        assert_eq!(json["kind"], "Deployment");
        assert!(!json.to_string().contains("null"), "{json}");
    }

    #[test]
    fn image_defaults_and_overrides() {
        let d = dispatcher(
            serde_json::json!({"databaseSecretRef": {"name": "db", "key": "dsn"},
            "image": "registry/hookd:1.2", "imagePullPolicy": "Always",
            "encryptionKeySecretRef": {"name": "k"}}),
        );
        let dep = desired_deployment(&d, "hookd:default", 1);
        let c = &dep.spec.unwrap().template.spec.unwrap().containers[0];
        assert_eq!(c.image.as_deref(), Some("registry/hookd:1.2"));
        assert_eq!(c.image_pull_policy.as_deref(), Some("Always"));
        let env = c.env.as_ref().unwrap();
        let key = env
            .iter()
            .find(|e| e.name == "HOOKD_ENCRYPTION_KEY")
            .unwrap();
        let r = key
            .value_from
            .as_ref()
            .unwrap()
            .secret_key_ref
            .as_ref()
            .unwrap();
        assert_eq!((r.name.as_str(), r.key.as_str()), ("k", "key"));
        let url = env.iter().find(|e| e.name == "DATABASE_URL").unwrap();
        assert_eq!(
            url.value_from
                .as_ref()
                .unwrap()
                .secret_key_ref
                .as_ref()
                .unwrap()
                .key,
            "dsn"
        );
    }

    fn autoscaling(min: i32, max: i32, target: i64) -> WebhookDispatcherSpec {
        let mut d = dispatcher(serde_json::json!({"databaseSecretRef": {"name": "db"}}));
        d.spec.autoscaling = Some(DispatcherAutoscaling {
            min_replicas: min,
            max_replicas: max,
            target_backlog_per_replica: target,
        });
        d.spec
    }

    fn status(replicas: i32, last: i64) -> WebhookDispatcherStatus {
        WebhookDispatcherStatus {
            replicas: Some(replicas),
            last_scale_time: Some(Time(Timestamp::from_second(last).unwrap())),
            ..Default::default()
        }
    }

    #[test]
    fn fixed_replicas_without_autoscaling() {
        let d = dispatcher(serde_json::json!({"databaseSecretRef": {"name": "db"}}));
        assert_eq!(
            desired_replicas(&d.spec, None, Some(1_000_000), at(0)).replicas,
            1
        );
        let d = dispatcher(serde_json::json!({"replicas": 4, "databaseSecretRef": {"name": "db"}}));
        assert_eq!(desired_replicas(&d.spec, None, None, at(0)).replicas, 4);
    }

    #[test]
    fn autoscaler_follows_backlog_within_bounds() {
        let spec = autoscaling(1, 10, 1000);
        assert_eq!(
            desired_replicas(&spec, None, Some(0), at(0)).replicas,
            1,
            "min"
        );
        assert_eq!(
            desired_replicas(&spec, None, Some(2500), at(0)).replicas,
            3,
            "ceil"
        );
        assert_eq!(
            desired_replicas(&spec, None, Some(10_000_000), at(0)).replicas,
            10,
            "max"
        );
        // up at once, with a new scale time
        let up = desired_replicas(&spec, Some(&status(2, 0)), Some(5000), at(10));
        assert_eq!(up.replicas, 5);
        assert_eq!(up.last_scale_time.unwrap().0.as_second(), 10);
        // down only after the quiet period
        let early = desired_replicas(&spec, Some(&status(5, 100)), Some(0), at(150));
        assert_eq!(early.replicas, 5);
        assert_eq!(
            early.last_scale_time.unwrap().0.as_second(),
            100,
            "unchanged"
        );
        let later = desired_replicas(&spec, Some(&status(5, 100)), Some(0), at(100 + 120));
        assert_eq!(later.replicas, 1);
        // unknown backlog keeps what runs
        assert_eq!(
            desired_replicas(&spec, Some(&status(5, 0)), None, at(1000)).replicas,
            5
        );
        // scale to zero is allowed when min is 0
        assert_eq!(
            desired_replicas(&autoscaling(0, 3, 10), None, Some(0), at(0)).replicas,
            0
        );
    }

    #[test]
    fn status_reports_readiness_and_backlog() {
        let d = dispatcher(serde_json::json!({"databaseSecretRef": {"name": "db"}}));
        let now = Time(Timestamp::from_second(50).unwrap());
        let scale = Scale {
            replicas: 2,
            last_scale_time: None,
        };
        let s = desired_status(&d, &scale, 1, None, Some(12), &now);
        let ready = &s.conditions[0];
        assert_eq!(
            (
                ready.type_.as_str(),
                ready.status.as_str(),
                ready.reason.as_str()
            ),
            ("Ready", "False", "Progressing")
        );
        assert_eq!(s.backlog, Some(12));
        assert_eq!(s.deployment.as_deref(), Some("hookd-dispatcher-default"));
        let mut d2 = d.clone();
        d2.status = Some(s.clone());
        let s2 = desired_status(
            &d2,
            &scale,
            2,
            None,
            Some(12),
            &Time(Timestamp::from_second(60).unwrap()),
        );
        assert_eq!(s2.conditions[0].status, "True");
        assert_eq!(s2.conditions[0].last_transition_time.0.as_second(), 60);
        let mut d3 = d.clone();
        d3.status = Some(s2.clone());
        let s3 = desired_status(
            &d3,
            &scale,
            2,
            None,
            Some(12),
            &Time(Timestamp::from_second(90).unwrap()),
        );
        assert_eq!(s3, s2, "steady state: identical status, no write");
    }

    /// Retention is set once, in ConfigMap hookd-config, and every dispatcher prunes: the
    /// pods load the ConfigMap (optional, so a missing one blocks nothing), and their own
    /// env still wins over it.
    #[test]
    fn pods_load_the_shared_config_map() {
        let d = dispatcher(serde_json::json!({"databaseSecretRef": {"name": "db"}}));
        let dep = desired_deployment(&d, "hookd:test", 1);
        let c = &dep.spec.unwrap().template.spec.unwrap().containers[0];
        let from = c.env_from.as_ref().expect("envFrom");
        let cm = from[0].config_map_ref.as_ref().expect("a ConfigMap");
        assert_eq!(
            (cm.name.as_str(), cm.optional),
            ("hookd-config", Some(true))
        );
        assert!(from[0].prefix.is_none() && from[0].secret_ref.is_none());
        let names: Vec<&str> = c.env.iter().flatten().map(|e| e.name.as_str()).collect();
        assert!(
            !names.contains(&"HOOKD_RETENTION_DAYS"),
            "retention is not pinned by the controller: {names:?}"
        );
    }

    /// Retention may also be tuned per pool through `env`, which the privilege check admits.
    #[test]
    fn retention_settings_are_allowed_in_env() {
        let d = dispatcher(serde_json::json!({"databaseSecretRef": {"name": "db"},
            "env": [{"name": "HOOKD_RETENTION_DAYS", "value": "90"},
                    {"name": "HOOKD_TENANT_RETENTION", "value": "billing=365"},
                    {"name": "HOOKD_PRUNE_INTERVAL_SECS", "value": "0"}]}));
        let settings = Settings {
            status_interval: Duration::from_secs(10),
            image: "hookd:test".into(),
            namespace_tenants: Default::default(),
            concurrency: 1,
            resync: Duration::from_secs(600),
            dispatcher_images: vec![],
            dispatcher_service_accounts: vec![],
        };
        assert_eq!(check_privileges(&d.spec, &settings), Ok(()));
        let dep = desired_deployment(&d, "hookd:test", 1);
        let c = &dep.spec.unwrap().template.spec.unwrap().containers[0];
        let env = c.env.as_ref().unwrap();
        let v = |n: &str| {
            env.iter()
                .find(|e| e.name == n)
                .and_then(|e| e.value.clone())
        };
        assert_eq!(v("HOOKD_RETENTION_DAYS").as_deref(), Some("90"));
        assert_eq!(v("HOOKD_TENANT_RETENTION").as_deref(), Some("billing=365"));
        // a system- priority class stays the cluster's
        let mut high = d.clone();
        high.spec.priority_class_name = Some("system-node-critical".into());
        assert!(
            check_privileges(&high.spec, &settings)
                .unwrap_err()
                .contains("system-")
        );
        high.spec.priority_class_name = Some("hookd-high".into());
        assert_eq!(check_privileges(&high.spec, &settings), Ok(()));
    }

    /// Private registries and placement: the spec's pull secrets, node selector,
    /// tolerations, affinity and priority class reach the pod template as they are.
    #[test]
    fn pod_placement_and_pull_secrets_reach_the_pods() {
        let d = dispatcher(serde_json::json!({
            "databaseSecretRef": {"name": "db"},
            "imagePullSecrets": [{"name": "regcred"}],
            "nodeSelector": {"pool": "egress"},
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "egress", "effect": "NoSchedule"}],
            "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 100, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                  "labelSelector": {"matchLabels": {"app.kubernetes.io/instance": "default"}}}}]}},
            "priorityClassName": "hookd-high",
        }));
        let dep = desired_deployment(&d, "hookd:test", 2);
        let pod = dep.spec.unwrap().template.spec.unwrap();
        let json = serde_json::to_value(&pod).unwrap();
        assert_eq!(
            json["imagePullSecrets"],
            serde_json::json!([{"name": "regcred"}])
        );
        assert_eq!(json["nodeSelector"], serde_json::json!({"pool": "egress"}));
        assert_eq!(json["tolerations"][0]["key"], "dedicated");
        assert_eq!(json["tolerations"][0]["effect"], "NoSchedule");
        assert_eq!(
            json["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
                [0]["weight"],
            100
        );
        assert_eq!(json["priorityClassName"], "hookd-high");
        // absent in the spec: absent in the pod (no empty lists sent by server-side apply)
        let plain = dispatcher(serde_json::json!({"databaseSecretRef": {"name": "db"}}));
        let pod = serde_json::to_value(
            desired_deployment(&plain, "hookd:test", 1)
                .spec
                .unwrap()
                .template
                .spec
                .unwrap(),
        )
        .unwrap();
        for field in [
            "imagePullSecrets",
            "nodeSelector",
            "tolerations",
            "affinity",
            "priorityClassName",
        ] {
            assert!(pod.get(field).is_none(), "{field}: {pod}");
        }
        // the default resources carry a CPU limit as well as a memory one
        let c = &pod["containers"][0];
        assert_eq!(c["resources"]["limits"]["cpu"], "1");
        assert_eq!(c["resources"]["limits"]["memory"], "512Mi");
    }

    fn deployment_status(conditions: serde_json::Value) -> DeploymentStatus {
        serde_json::from_value(serde_json::json!({"replicas": 2, "conditions": conditions}))
            .unwrap()
    }

    fn pod(name: &str, status: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "hookd-system"},
            "status": status,
        }))
        .unwrap()
    }

    /// Pod Security admission refuses the pods: the ReplicaSet's FailedCreate, copied onto
    /// the Deployment as ReplicaFailure, is what the status says.
    #[test]
    fn refused_pods_are_reported_from_the_deployment() {
        let refused = "pods \"hookd-dispatcher-default-7d9f-x2k\" is forbidden: violates PodSecurity \"restricted:latest\": seccompProfile";
        let status = deployment_status(serde_json::json!([
            {"type": "Available", "status": "False", "reason": "MinimumReplicasUnavailable",
             "message": "Deployment does not have minimum availability."},
            {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate", "message": refused},
            {"type": "Progressing", "status": "True", "reason": "ReplicaSetUpdated", "message": "x"},
        ]));
        let why = not_ready_reason(Some(&status), &[]).unwrap();
        assert_eq!(why.reason, "FailedCreate");
        assert_eq!(why.message, refused);
        // over quota: the same condition, another message
        let quota = deployment_status(serde_json::json!([
            {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate",
             "message": "pods \"p\" is forbidden: exceeded quota: compute, requested: cpu=100m, used: cpu=2, limited: cpu=2"},
        ]));
        assert!(
            not_ready_reason(Some(&quota), &[])
                .unwrap()
                .message
                .contains("exceeded quota")
        );
        // and it goes into the Ready condition, with the count
        let d = dispatcher(serde_json::json!({"databaseSecretRef": {"name": "db"}}));
        let scale = Scale {
            replicas: 2,
            last_scale_time: None,
        };
        let now = Time(Timestamp::from_second(50).unwrap());
        let s = desired_status(&d, &scale, 0, Some(&why), None, &now);
        let ready = &s.conditions[0];
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "FailedCreate")
        );
        assert!(
            ready
                .message
                .starts_with("0/2 dispatcher pods ready: pods \"hookd-dispatcher-default-7d9f-x2k\" is forbidden: violates PodSecurity"),
            "{}",
            ready.message
        );
    }

    /// Pods that exist but cannot start: a missing Secret, an image that cannot be pulled;
    /// pods no node can take; a rollout past its deadline; and nothing when pods are only
    /// on their way.
    #[test]
    fn pods_that_cannot_start_are_reported() {
        let waiting = |reason: &str, message: &str| {
            serde_json::json!({"phase": "Pending", "containerStatuses": [{
                "name": "dispatcher", "image": "hookd:test", "imageID": "", "ready": false,
                "restartCount": 0,
                "state": {"waiting": {"reason": reason, "message": message}}}]})
        };
        let missing = pod(
            "p-b",
            waiting(
                "CreateContainerConfigError",
                "secret \"hookd-database\" not found",
            ),
        );
        let why = not_ready_reason(None, std::slice::from_ref(&missing)).unwrap();
        assert_eq!(why.reason, "CreateContainerConfigError");
        assert_eq!(
            why.message,
            "pod p-b: container dispatcher: secret \"hookd-database\" not found"
        );
        let pull = pod(
            "p-a",
            waiting(
                "ImagePullBackOff",
                "Back-off pulling image \"registry.example/hookd:1.2\"",
            ),
        );
        // the same answer whatever order the API lists pods in
        let both = not_ready_reason(None, &[missing.clone(), pull.clone()]).unwrap();
        assert_eq!(both, not_ready_reason(None, &[pull, missing]).unwrap());
        assert_eq!(both.reason, "ImagePullBackOff");

        let unschedulable = pod(
            "p-c",
            serde_json::json!({"phase": "Pending", "conditions": [{"type": "PodScheduled",
                "status": "False", "reason": "Unschedulable",
                "message": "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector."}]}),
        );
        let why = not_ready_reason(None, &[unschedulable]).unwrap();
        assert_eq!(why.reason, "Unschedulable");
        assert!(why.message.contains("didn't match Pod's node affinity"));

        let stuck = deployment_status(serde_json::json!([
            {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
             "message": "ReplicaSet \"hookd-dispatcher-default-7d9f\" has timed out progressing."},
        ]));
        assert_eq!(
            not_ready_reason(Some(&stuck), &[]).unwrap().reason,
            "ProgressDeadlineExceeded"
        );

        // creating, pulling, not scheduled yet: nothing is wrong yet
        let starting = pod("p-d", waiting("ContainerCreating", ""));
        let pending = pod("p-e", serde_json::json!({"phase": "Pending"}));
        let fine = deployment_status(serde_json::json!([
            {"type": "Progressing", "status": "True", "reason": "ReplicaSetUpdated", "message": "x"},
        ]));
        assert_eq!(not_ready_reason(Some(&fine), &[starting, pending]), None);
        assert_eq!(not_ready_reason(None, &[]), None);
    }
}
