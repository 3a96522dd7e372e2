//! `podnet trace SRC http[s]://HOST[:PORT]/PATH`: the route a request
//! would take through `podnet gateway`, from the cluster's objects (a
//! lab's, or this node's cluster's) compiled as the gateway compiles
//! them: the listener, the host pattern, the matching rule, its filters
//! and the backends with their endpoints
//! ([`podnet_gateway::model::explain`]).

use std::net::IpAddr;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use podnet_gateway::model::build::{self, endpoints, Config, World};
use podnet_gateway::model::matcher::Request;
use podnet_gateway::model::Bind;

/// Every object the gateway reads, listed once through the source.
async fn world(mut source: podnet_source::Source) -> Result<World> {
    let mut sub = source.subscribe(podnet_gateway::KINDS);
    let _running = source.start();
    let mut w = World::default();
    let read = async {
        while let Some(b) = sub.next_batch().await {
            for d in b.deltas {
                match d.object() {
                    Some(o) => w.put(o.clone()),
                    None => {
                        let k = d.key();
                        w.remove(d.kind(), k.namespace.as_deref(), &k.name);
                    }
                }
            }
            if b.ready {
                return Ok(());
            }
        }
        Err(anyhow!("the object source ended"))
    };
    tokio::time::timeout(Duration::from_secs(15), read)
        .await
        .map_err(|_| anyhow!("the cluster's objects did not arrive within 15s (in a cluster without the Gateway API CRDs this waits for them)"))??;
    Ok(w)
}

/// Runs the trace of `url` and prints it.
pub async fn run(
    target: &crate::trace::Target,
    url: &str,
    output: &str,
    cfg: &Config,
) -> Result<()> {
    let uri: http::Uri = url
        .parse()
        .with_context(|| format!("{url:?} is not a URL"))?;
    let https = match uri.scheme_str() {
        Some("http") => false,
        Some("https") => true,
        _ => bail!("{url:?}: want http:// or https://"),
    };
    let host = uri
        .host()
        .context("the URL names no host")?
        .trim_matches(['[', ']'])
        .to_ascii_lowercase();
    let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
    let (_ctx, source) = crate::trace::TraceContext::open(target).await?;
    let w = world(source).await?;
    let built = build::build(&w, cfg);
    let eps = endpoints::resolve(&w, &built.backends);
    // An address a Gateway holds is that Gateway's; anything else is the
    // gateway's shared address.
    let ip = host.parse::<IpAddr>().ok().filter(|ip| {
        built
            .statuses
            .gateways
            .values()
            .any(|g| g.address == Some(*ip))
    });
    let headers = http::HeaderMap::new();
    let path = uri.path();
    let req = Request {
        method: &http::Method::GET,
        path,
        query: uri.query(),
        headers: &headers,
    };
    let e = podnet_gateway::model::explain::explain(
        &built.table,
        &built.statuses,
        &eps,
        Bind { ip, port },
        &host,
        &req,
        &[cfg.ingress_http_port, cfg.ingress_https_port],
    );
    match output {
        "json" => println!("{}", serde_json::to_string_pretty(&e.json())?),
        _ => print!("GET {url}\n{}", e.text()),
    }
    Ok(())
}
