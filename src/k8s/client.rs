//! The Kubernetes client's configuration shared by every client `hookd controller` builds.

/// The User-Agent of every request to the API server. kube sends none by itself, and the
/// API server names the field manager of a write that gives none (the finalizer's JSON
/// patch, Events, the Lease) after the agent's first word: without one, managedFields and
/// audit logs show an empty manager.
pub const USER_AGENT: &str = concat!("hookd/", env!("CARGO_PKG_VERSION"));

/// `config` with hookd's User-Agent on every request.
pub fn with_user_agent(mut config: kube::Config) -> kube::Config {
    config
        .headers
        .retain(|(name, _)| name != http::header::USER_AGENT);
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(USER_AGENT),
    ));
    config
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A client built the way the controller builds its own sends `hookd/<version>`: read
    /// off the wire by a one-request HTTP server on loopback.
    #[tokio::test]
    async fn requests_carry_hookds_user_agent() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url: http::Uri = format!("http://{}", listener.local_addr().unwrap())
            .parse()
            .unwrap();
        let server = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            let mut buf = [0u8; 4096];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = conn.read(&mut buf).await.unwrap();
                assert!(n > 0, "connection closed before the request head");
                head.extend_from_slice(&buf[..n]);
            }
            let body = br#"{"kind":"Status","apiVersion":"v1","status":"Failure","code":404,"reason":"NotFound","message":"x"}"#;
            let reply = format!(
                "HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            );
            conn.write_all(reply.as_bytes()).await.unwrap();
            conn.write_all(body).await.unwrap();
            String::from_utf8_lossy(&head).to_lowercase()
        });
        let client = kube::Client::try_from(with_user_agent(kube::Config::new(url))).unwrap();
        let api: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
            kube::Api::namespaced(client, "default");
        let _ = api.get_opt("x").await;
        let head = tokio::time::timeout(std::time::Duration::from_secs(30), server)
            .await
            .expect("the request arrives")
            .unwrap();
        let agents: Vec<&str> = head
            .lines()
            .filter_map(|l| l.strip_prefix("user-agent:"))
            .map(str::trim)
            .collect();
        assert_eq!(agents, vec![USER_AGENT.to_lowercase().as_str()], "{head}");
    }
}
