//! What the API derives from its settings (`config::ApiSettings`, which stays a leaf of
//! plain values): request limits, listener limits, the ingest byte budget and the
//! ServiceAccount policy.

use std::time::Duration;

use super::Limits;
use super::server::ListenerLimits;
use crate::auth::service_account::ServiceAccountPolicy;
use crate::config::ApiSettings;

impl ApiSettings {
    /// What ServiceAccount callers are allowed.
    pub fn service_account_policy(&self) -> ServiceAccountPolicy {
        ServiceAccountPolicy {
            scopes: self.auth_sa_scopes.clone(),
            namespace_tenants: self.auth_namespace_tenants.clone(),
        }
    }

    pub fn listener_limits(&self) -> ListenerLimits {
        ListenerLimits {
            header_timeout: Duration::from_secs(self.api_header_timeout_secs.max(1)),
            max_connections: self.api_max_connections.clamp(1, 1 << 20),
            // hyper's own cap on a request head, well above ours so that a merely large
            // head gets our JSON 414/431 and only an absurd one is cut off by hyper
            max_head_bytes: (self.api_max_header_bytes + self.api_max_url_bytes) * 2 + 8192,
        }
    }

    /// (process, tenant) bytes-in-flight bounds of the ingest routes.
    pub fn ingest_budget(&self) -> (usize, usize) {
        let process = self.api_max_inflight_bytes.max(1);
        let tenant = self
            .api_tenant_inflight_bytes
            .unwrap_or_else(|| (process / 4).max(self.limits().max_batch_body_bytes));
        (process, tenant.clamp(1, process))
    }

    pub fn limits(&self) -> Limits {
        // The envelope around a payload (tenant, type, key, quoting) is small; 16 KiB of
        // slack keeps the 413 about the payload, with its exact size in the message.
        let max_body_bytes = self.max_payload_bytes + 16 * 1024;
        Limits {
            max_payload_bytes: self.max_payload_bytes,
            max_body_bytes,
            max_batch: self.max_batch,
            max_batch_body_bytes: max_body_bytes
                .saturating_mul(self.max_batch.max(1))
                .min(64 << 20),
            request_timeout: Duration::from_secs(self.api_request_timeout_secs.max(1)),
            max_header_bytes: self.api_max_header_bytes,
            max_url_bytes: self.api_max_url_bytes,
        }
    }
}
